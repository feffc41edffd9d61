#!/usr/bin/env bash
# silofl's torch backend vs Opacus on a lent GPU (issue 25 item 2): one command, ~3 minutes.
# Run from the repo root on the device machine (torch with CUDA there; silofl from src):
#
#     bash benchmarks/run_device_torch.sh
#
# Opacus (pure Python) is compared when importable: put its package and opt_einsum's in a
# folder and pass it, e.g. EXTRA_SITE=.gpu-site (carry that ignored folder); without it
# only silofl is timed. The table lands in $OUT/torch_gpu.txt (and on stdout).
set -uo pipefail
PY=${PY:-python3}
OUT=${OUT:?set OUT to the folder that comes back}
export PYTHONPATH=src${EXTRA_SITE:+:$EXTRA_SITE} PYTHONUNBUFFERED=1
{
    echo "== $(date -u +%FT%TZ) $(nproc --all) cores; PYTHONPATH=$PYTHONPATH"
    "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; \
print('torch', torch.__version__, torch.cuda.get_device_name())" || exit 1
    timeout 240 "$PY" benchmarks/bench_torch_opacus.py --device cuda --silos 1 8 \
        --pairs 5 --steps 10 --noise secure "$@"
    echo "== exit $? at $(date -u +%FT%TZ)"
} 2>&1 | tee "$OUT/torch_gpu.txt"

#!/usr/bin/env bash
# silofl's torch backend vs Opacus on a lent GPU (issue 25 item 2): one command, ≤ 5 minutes.
# Run from the repo root on the device machine (torch with CUDA there; silofl from src):
#
#     bash benchmarks/run_device_torch.sh
#
# Wheels in .whl/ (pydantic, dp-accounting, cryptography, … as for run_device.sh) go to
# /tmp/site when .whl/ exists. Opacus (pure Python) is compared when importable: copy its
# package and opt_einsum's into a folder of the checkout and name it, e.g.
#     cp -r .venv/lib/python3.11/site-packages/{opacus,opt_einsum} .gpu-site/
#     EXTRA_SITE=.gpu-site bash benchmarks/run_device_torch.sh
# (carry .gpu-site and .whl); without it only silofl is timed. Extra arguments go to
# bench_torch_opacus.py. The table lands in $OUT/torch_gpu.txt (and on stdout).
set -uo pipefail
PY=${PY:-python3}
OUT=${OUT:?set OUT to the folder that comes back}
SITE=${SITE:-/tmp/site}
if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl || { echo "wheel install failed"; exit 1; }
    PYTHONPATH="$SITE":src
else
    PYTHONPATH=src
fi
export PYTHONPATH="$PYTHONPATH${EXTRA_SITE:+:$EXTRA_SITE}" PYTHONUNBUFFERED=1
{
    echo "== $(date -u +%FT%TZ) $(nproc --all) cores; PYTHONPATH=$PYTHONPATH"
    "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; \
print('torch', torch.__version__, torch.cuda.get_device_name())" || exit 1
    timeout 240 "$PY" benchmarks/bench_torch_opacus.py --device cuda --silos 1 8 \
        --pairs 5 --steps 10 --noise secure "$@"
    echo "== exit $? at $(date -u +%FT%TZ)"
} 2>&1 | tee "$OUT/torch_gpu.txt"

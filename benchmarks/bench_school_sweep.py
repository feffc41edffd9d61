"""School figure sweep benchmark (figures printed, not asserted).

Runs examples/school.toml — or a subset of it — into a fresh temporary results file and
prints the wall time, runs/s, mean seconds per run for each method, and a projection of
the full grid's wall time from the measured per-method run times and the measured
parallel speed-up. Target: the full School grid in ≤ 15 min on a 2-core machine.

    .venv/bin/python benchmarks/bench_school_sweep.py                      # every method
    .venv/bin/python benchmarks/bench_school_sweep.py --methods local,fedavg,mrmtl
    .venv/bin/python benchmarks/bench_school_sweep.py --quick              # ~1-2 min subset
    .venv/bin/python benchmarks/bench_school_sweep.py --seeds 1 --lrs 1    # 1/9 of the grid

Methods the registry does not implement yet are left out (and listed).
--quick keeps seed 0, ε ∈ {1, 6}, λ ∈ {0.01, 0.3, 10} and lr 0.01.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import tomllib
from collections import defaultdict
from pathlib import Path

from silofl.algorithms import LAMBDA_METHODS, make_algorithm
from silofl.errors import ConfigError
from silofl.experiments.sweep import expand, run_sweep
from silofl.experiments.sweep_config import sweep_config_from_dict
from silofl.experiments.sweep_results import read_results

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "school.toml"


def implemented(methods: list[str]) -> tuple[list[str], list[str]]:
    ok, missing = [], []
    for m in methods:
        try:
            make_algorithm(m)
            ok.append(m)
        except ConfigError:
            missing.append(m)
    return ok, missing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--methods", help="comma-separated subset of the config's methods")
    ap.add_argument("--quick", action="store_true", help="a small slice of the grid")
    ap.add_argument("--workers", type=int, help="processes (default: the config's)")
    ap.add_argument("--seeds", type=int, help="keep only the first N seeds")
    ap.add_argument("--lrs", type=int, help="keep only the first N learning rates")
    args = ap.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)

    raw = tomllib.loads(args.config.read_text())
    full_raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    sw = raw["sweep"]
    wanted = args.methods.split(",") if args.methods else list(sw["methods"])
    sw["methods"], missing = implemented(wanted)
    if missing:
        print(f"left out (not implemented yet): {', '.join(missing)}")
    if args.seeds:
        sw["seeds"] = sw["seeds"][: args.seeds]
    if args.lrs:
        sw["lr"] = sw["lr"][: args.lrs]
    if args.quick:
        sw.update(seeds=[0], epsilon=[1, 6], lam=[0.01, 0.3, 10], lr=[0.01])
        raw.get("report", {}).pop("epsilon", None)
    with tempfile.TemporaryDirectory() as tmp:
        sw["results"] = str(Path(tmp) / "bench.jsonl")
        sc = sweep_config_from_dict(raw, args.config.resolve().parent)
        workers = args.workers or sc.sweep.workers
        n = len(expand(sc))
        print(f"School sweep: {', '.join(sc.sweep.methods)}; ε {sc.sweep.epsilon}"
              f"{' + non-private' if sc.sweep.nonprivate else ''}; {len(sc.sweep.lam)} λ, "
              f"{len(sc.sweep.lr)} lr, {len(sc.sweep.seeds)} seeds; "
              f"{sc.base.training.rounds} rounds; {n} runs on {workers} workers")
        t0 = time.perf_counter()
        out = run_sweep(sc, workers=workers)
        wall = time.perf_counter() - t0
        head, records = read_results(out.results)
    per = defaultdict(list)
    for r in records:
        per[r["method"]].append(r["seconds"])
    busy = sum(sum(v) for v in per.values())
    print(f"  {len(head['silos'])} silos ({len(head['dropped_silos'])} dropped by "
          f"min_silo_train)")
    print(f"  wall time {wall:.1f} s   {n / wall:.2f} runs/s   "
          f"parallel speed-up {busy / wall:.2f}× on {workers} workers")
    for m, secs in per.items():
        print(f"  {m:<14} {len(secs):5d} runs   {sum(secs) / len(secs):.3f} s per run")

    # projection for the config's full grid (all its methods, full lists)
    fs = full_raw["sweep"]
    per_point = (len(fs["epsilon"]) + bool(fs.get("nonprivate"))) * len(fs["lr"]) * \
        len(fs["seeds"])
    known = {m: sum(v) / len(v) for m, v in per.items()}
    fallback = max(known.values())
    total, proj = 0, 0.0
    for m in fs["methods"]:
        runs = per_point * (len(fs["lam"]) if m in LAMBDA_METHODS else 1)
        # unmeasured methods: the slowest measured per-run time, ×2 for Ditto's two passes
        t = known.get(m, fallback * (2 if m == "ditto" else 1))
        total += runs
        proj += runs * t
    speedup = busy / wall
    print(f"projection for the full grid of {args.config.name}: {total} runs, "
          f"≈ {proj / speedup / 60:.1f} min at the measured {speedup:.2f}× speed-up "
          f"(unmeasured methods estimated: "
          f"{', '.join(m for m in fs['methods'] if m not in known) or 'none'})")


if __name__ == "__main__":
    main()

"""What honest tuning costs, on School and heart (figures printed, not asserted).

A sweep with sweep.tuning = "private": untuned Local and FedAvg (lr fixed), MR-MTL over
the thesis's λ grid (the fixed public λ̄ and the uncounted choice come from it) and MR-MTL
privately tuned (TNB, E[h] = 10, RepeatAndSelect accounting), at ε ∈ {1, 2, 4, 6, 8},
3 seeds, all 139 schools with b = 32 (small schools take full-batch steps, q = 1).
Prints the wall time and the comparison table; writes <results>-tuning.png/.json.

    .venv/bin/python benchmarks/bench_tuning.py                  # School + heart (~15 min)
    .venv/bin/python benchmarks/bench_tuning.py --data heart     # heart only (~1 min)
    .venv/bin/python benchmarks/bench_tuning.py --seeds 1 --rounds 50   # a reduced run
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import warnings
from pathlib import Path

from rich.console import Console

from silofl.experiments.sweep import expand, run_sweep
from silofl.experiments.sweep_config import sweep_config_from_dict
from silofl.experiments.sweep_results import read_results
from silofl.tuning.report import write_comparison

ROOT = Path(__file__).resolve().parents[1] / "examples"
LAMS = [0.0001, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10]  # thesis appendix B.4


def school(rounds: int, seeds: int, eps: list[float]) -> dict:
    return {"data": {"source": "school", "test_fraction": 0.2, "standardize": True, "seed": 0},
            "model": {"name": "linear", "metric": "mse"},
            "training": {"rounds": rounds, "local_epochs": 1, "batch_size": 32, "clip": 1.0,
                         "eval_every": rounds},
            "privacy": {"delta": 1e-3, "accountant": "rdp", "noise": "seeded"},
            "sweep": {"methods": ["local", "fedavg", "mrmtl"], "epsilon": eps,
                      "lam": LAMS, "lr": [0.03], "seeds": list(range(seeds)),
                      "validation_fraction": 0.2, "min_silo_train": 0, "workers": 2,
                      "tuning": "private", "results": "school.jsonl"},
            "tuning": {"method": "mrmtl", "pivot_lam": 0.1, "eta": 1.0, "mean_trials": 10}}


def heart(rounds: int, seeds: int, eps: list[float]) -> dict:
    return {"data": {"source": "heart", "test_fraction": 0.2, "seed": 0},
            "model": {"name": "logistic", "metric": "accuracy"},
            "training": {"rounds": rounds, "batch_size": 8, "clip": 1.0, "eval_every": rounds},
            "privacy": {"delta": 1e-4, "accountant": "rdp", "noise": "seeded"},
            "sweep": {"methods": ["local", "fedavg", "mrmtl"], "epsilon": eps,
                      "lam": LAMS, "lr": [0.1], "seeds": list(range(seeds)),
                      "workers": 2, "tuning": "private", "results": "heart.jsonl"},
            "tuning": {"method": "mrmtl", "pivot_lam": 0.1, "eta": 1.0, "mean_trials": 10}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="school,heart")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=0, help="default: School 200, heart 30")
    ap.add_argument("--epsilon", default="1,2,4,6,8")
    ap.add_argument("--out", default="", help="results directory (default: a temp dir)")
    a = ap.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    con = Console(width=160)
    eps = [float(e) for e in a.epsilon.split(",")]
    out = Path(a.out or tempfile.mkdtemp(prefix="bench-tuning-"))
    for name in a.data.split(","):
        make, rounds = (school, a.rounds or 200) if name == "school" else (heart, a.rounds or 30)
        raw = make(rounds, a.seeds, eps)
        raw["sweep"]["results"] = str(out / raw["sweep"]["results"])
        sc = sweep_config_from_dict(raw, ROOT)
        n = len(expand(sc))
        t0 = time.perf_counter()
        res = run_sweep(sc)
        wall = time.perf_counter() - t0
        head, records = read_results(res.results)
        table, files = write_comparison(head, records, res.results)
        tuned = [r["seconds"] for r in records if r["method"].endswith("_tuned")]
        con.print(f"[bold]{name}[/]: {n} runs, {len(head['silos'])} silos, {rounds} rounds, "
                  f"wall {wall:.1f} s ({wall / 60:.1f} min); tuned runs "
                  f"{sum(tuned) / max(1, len(tuned)):.1f} s each")
        con.print(table)
        con.print("files: " + ", ".join(str(f) for f in files))


if __name__ == "__main__":
    main()

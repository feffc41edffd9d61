"""The peers' methods (FedProx, SCAFFOLD, APFL) against FedAvg and Local under silo-specific
DP on heart (4 hospitals, logistic, accuracy) and School (139 schools, linear, MSE).

Every method meets the same per-silo (ε, δ); σ is calibrated to what each declares (APFL:
two passes per round). Fixed public settings, no tuning: heart batch 8, lr 0.1; School
batch 32, lr 0.03, δ 1e-3; clip 1; seeded noise. Prints mean ± spread over seeds of the
final pooled test metric (figures printed, not asserted).

    .venv/bin/python benchmarks/bench_peers.py                       # heart + School
    .venv/bin/python benchmarks/bench_peers.py --data heart --seeds 1 --rounds 10
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings

import numpy as np

from silofl.algorithms import make_algorithm
from silofl.config import config_from_dict
from silofl.experiments.build import (
    apply_privacy,
    build_model,
    load_federation,
    training_config,
)
from silofl.runtime.simulator import simulate

METHODS = ("local", "fedavg", "fedprox", "scaffold", "apfl")


def setup(data: str, rounds: int, eps: float, seed: int) -> dict:
    if data == "heart":
        return {"data": {"source": "heart", "test_fraction": 0.2, "seed": 0},
                "model": {"name": "logistic", "metric": "accuracy"},
                "training": {"rounds": rounds, "batch_size": 8, "lr": 0.1, "clip": 1.0,
                             "seed": seed, "eval_every": rounds},
                "privacy": {"epsilon": eps, "delta": 1e-4, "accountant": "rdp",
                            "noise": "seeded"}}
    return {"data": {"source": "school", "test_fraction": 0.2, "standardize": True, "seed": 0},
            "model": {"name": "linear", "metric": "mse"},
            "training": {"rounds": rounds, "batch_size": 32, "lr": 0.03, "clip": 1.0,
                         "seed": seed, "eval_every": rounds},
            "privacy": {"epsilon": eps, "delta": 1e-3, "accountant": "rdp", "noise": "seeded"}}


def run(data: str, method: str, rounds: int, eps: float, seed: int, opts: dict) -> float:
    cfg = config_from_dict(setup(data, rounds, eps, seed))
    fed = apply_privacy(load_federation(cfg.data), cfg)
    res = simulate(fed, build_model(cfg, fed), make_algorithm(method, **opts),
                   training_config(cfg))
    return float(res.final_pooled)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="heart,school")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=0, help="default: heart 30, School 50")
    ap.add_argument("--epsilon", default="1,4")
    ap.add_argument("--prox-mu", type=float, default=0.01)
    ap.add_argument("--apfl-alpha", type=float, default=0.5)
    a = ap.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    opts = {"prox_mu": a.prox_mu, "apfl_alpha": a.apfl_alpha}
    for data in a.data.split(","):
        rounds = a.rounds or (30 if data == "heart" else 50)
        metric = "accuracy" if data == "heart" else "MSE"
        print(f"\n{data}: {rounds} rounds, {a.seeds} seeds, test {metric} (mean ± half-range)")
        print(f"{'method':10s}" + "".join(f"{'ε = ' + e:>20s}" for e in a.epsilon.split(",")))
        for m in METHODS:
            t0, cells = time.perf_counter(), []
            for e in a.epsilon.split(","):
                vals = np.array([run(data, m, rounds, float(e), s, opts)
                                 for s in range(a.seeds)])
                cells.append(f"{vals.mean():.4f} ± {np.ptp(vals) / 2:.4f}")
            print(f"{m:10s}" + "".join(f"{c:>20s}" for c in cells)
                  + f"   ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()

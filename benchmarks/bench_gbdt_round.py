"""Seconds for one DP-GBDT boosting round: 4 silos × 100k rows × 50 features (issue 24
target ≤ 1 s). Usage: python benchmarks/bench_gbdt_round.py [depth] [n_bins]"""

from __future__ import annotations

import sys
import time

import numpy as np

import silofl
from silofl.algorithms.dp_gbdt import train_dp_gbdt
from silofl.data.federation import Federation, Silo


def main() -> None:
    depth = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    n_bins = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    rng = np.random.default_rng(0)
    silos = []
    for k in range(4):
        X = rng.uniform(-1, 1, (100_000, 50))
        y = (X[:, 0] * X[:, 1] + 0.3 * X[:, 2] > 0).astype(int)
        silos.append(Silo(f"s{k}", X, y, X[:10], y[:10], silofl.PrivacyTarget(1.0, 1e-6)))
    fed = Federation(silos, [f"x{j}" for j in range(50)], "binary", 2)
    hist = {"depth": depth, "n_bins": n_bins, "splits": "histogram"}  # level rounds
    train_dp_gbdt(fed, trees=1, **hist)  # warm: calibration caches
    took = {}
    for trees in (1, 4):
        t0 = time.perf_counter()
        train_dp_gbdt(fed, trees=trees, **hist)
        took[trees] = time.perf_counter() - t0
    per_round = (took[4] - took[1]) / 3
    print(f"depth={depth} n_bins={n_bins}: one boosting round {per_round:.3f} s; "
          f"setup (binning 4×100k×50, σ calibration) {took[1] - per_round:.3f} s")


if __name__ == "__main__":
    main()

"""Engine benchmark (figures printed, not asserted).

1. The Vehicle-like workload — 23 silos, n_k spread over 872..1933, d = 100, linear SVM,
   b = 64, C = 6, σ = 1, 400 rounds of 1 local epoch, MR-MTL — once with DP and once
   without, in the same process. Targets: DP ≤ 1.3× non-private; a few seconds.
2. Time to calibrate σ for all 139 School silos (own n_k, b = 32, 200 rounds, ε = 1,
   δ = 1e-3). Target ≤ 5 s.

Run: .venv/bin/python benchmarks/bench_engine.py [--rounds 400]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from silofl.algorithms import make_algorithm
from silofl.data import PrivacyTarget, load_school, vehicle_like
from silofl.models import make_model
from silofl.privacy import accounting
from silofl.runtime.plan import TrainingConfig, plan_silos
from silofl.runtime.simulator import simulate

SCHOOL = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "school.mat"


REPEATS = 3


def vehicle(rounds: int) -> None:
    fed = vehicle_like(seed=0)
    # A target loose enough that σ = 1 for 400 rounds fits: the ledgers still check it.
    fed = fed.with_targets(PrivacyTarget(1e4, 1e-5))
    model = make_model("svm", fed.dim)
    alg = make_algorithm("mrmtl", lam=0.1)
    times = {True: [], False: []}
    # interleaved repeats, best of each: single timings on a shared 2-core box vary ±30%
    for rep in range(REPEATS):
        for private in (True, False):
            cfg = TrainingConfig(rounds=rounds, batch_size=64, lr=0.01, clip=6.0,
                                 private=private, noise_multiplier=1.0 if private else None,
                                 eval_every=rounds)
            plans = plan_silos(fed, alg, cfg)
            t0 = time.perf_counter()
            res = simulate(fed, model, alg, cfg, plans=plans)
            times[private].append(time.perf_counter() - t0)
            if rep == 0:
                eps = max(led.epsilon() for led in res.ledgers) if res.ledgers else None
                print(f"  {'DP-SGD ' if private else 'non-DP '} pooled accuracy "
                      f"{res.final_pooled:.4f}"
                      + (f"   max ε (RDP, δ=1e-5) {eps:.1f}" if eps else ""))
    times = {k: min(v) for k, v in times.items()}
    print(f"  best of {REPEATS}: DP-SGD {times[True]:.2f} s, non-DP {times[False]:.2f} s")
    n = [s.n_train for s in fed.silos]
    print(f"Vehicle-like: {fed.num_silos} silos, n_k {min(n)}..{max(n)}, d={fed.dim}, "
          f"{rounds} rounds MR-MTL")
    print(f"  DP / non-DP wall-time ratio: {times[True] / times[False]:.2f}  (target ≤ 1.3)")


def school_calibration() -> None:
    if not SCHOOL.is_file():
        print(f"School calibration: skipped ({SCHOOL} not found)")
        return
    fed = load_school(SCHOOL)
    sizes = [s.n_train for s in fed.silos]
    accounting.calibrate_dpsgd.cache_clear()
    t0 = time.perf_counter()
    sig = []
    for n in sizes:
        q = min(1.0, 32 / n)  # silos smaller than the batch train on full batches
        steps = 200 * accounting.steps_for_epochs(n, min(32, n), 1)
        sig.append(accounting.calibrate_dpsgd(1.0, 1e-3, q, steps))
    dt = time.perf_counter() - t0
    print(f"School calibration: {len(sizes)} silos (n_train {min(sizes)}..{max(sizes)}, "
          f"{sum(n <= 32 for n in sizes)} with q = 1), b=32, 200 rounds, ε=1, δ=1e-3: "
          f"{dt:.2f} s (target ≤ 5 s); σ range {min(sig):.2f}..{max(sig):.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=400)
    a = ap.parse_args()
    vehicle(a.rounds)
    school_calibration()

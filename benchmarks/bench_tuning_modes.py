"""MR-MTL tuned by each honest mode vs FedAvg and Local, on heart and School (quick).

Every figure counts every data-dependent choice. Part of the silos is held out and
treated as a public proxy (heart: Hungary; School: every 7th school), so that every method
trains and is tested on the same remaining silos:

- local, fedavg: untuned (lr fixed, public);
- mrmtl λ̄: MR-MTL at the public λ̄ = 0.1 (no tuning);
- tuned η=1 / η=0: `select = "random"` (pivot + RepeatAndSelect over E[h] = 10, TNB);
- subsample: `select = "subsample"` (γ = 0.1, η = 0, E[h] = 10; score ratio 2, and 4 —
  "subsample s=4" is the default counted tuning);
- sub η=-.5: the same with TNB η = −0.5 (`privacy.tnb_select`), score ratio 2 and 4;
- proxy: λ chosen non-privately on the held-out silos (declared public), one private run;
- proxy sim: the same with the run's DP noise simulated on the proxy (`proxy_noise`).

    .venv/bin/python benchmarks/bench_tuning_modes.py --data heart --seeds 2   # ~2 min
    .venv/bin/python benchmarks/bench_tuning_modes.py --data school --rounds 100 --seeds 1
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
import warnings
from pathlib import Path

import numpy as np

from silofl.algorithms import make_algorithm
from silofl.experiments import build
from silofl.experiments.sweep import prepare
from silofl.experiments.sweep_config import sweep_config_from_dict
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.simulator import simulate
from silofl.tuning import distributions as D
from silofl.tuning.private import TunedPersonalization
from silofl.tuning.proxy import best_lam, grid_on_proxy
from silofl.tuning.setup import DEFAULT_LAMS
from silofl.tuning.subsample import SubsampleTuned

ROOT = Path(__file__).resolve().parents[1] / "examples"


def config(name: str, rounds: int) -> dict:
    if name == "school":
        return {"data": {"source": "school", "test_fraction": 0.2, "standardize": True,
                         "seed": 0},
                "model": {"name": "linear", "metric": "mse"},
                "training": {"rounds": rounds or 100, "batch_size": 32, "clip": 1.0,
                             "eval_every": rounds or 100},
                "privacy": {"delta": 1e-3, "accountant": "rdp", "noise": "seeded"},
                "sweep": {"methods": ["local"], "epsilon": [1.0], "lr": [0.03],
                          "validation_fraction": 0.2, "min_silo_train": 0}}
    return {"data": {"source": "heart", "test_fraction": 0.2, "seed": 0},
            "model": {"name": "logistic", "metric": "accuracy"},
            "training": {"rounds": rounds or 30, "batch_size": 8, "clip": 1.0,
                         "eval_every": rounds or 30},
            "privacy": {"delta": 1e-4, "accountant": "rdp", "noise": "seeded"},
            "sweep": {"methods": ["local"], "epsilon": [1.0], "lr": [0.1]}}


def split(prep, name: str):
    """(private federation, its validation sets, public proxy federation)."""
    K = prep.fed.num_silos
    proxy = [k for k in range(K) if (prep.fed.silos[k].name == "Hungary" if name == "heart"
                                      else k % 7 == 3)]
    rest = [k for k in range(K) if k not in proxy]
    sub = lambda ks: dataclasses.replace(prep.fed, silos=[prep.fed.silos[k] for k in ks])  # noqa: E731
    return sub(rest), [prep.validation[k] for k in rest], sub(proxy)


def methods(val, lam_proxy: float, lam_sim: float) -> dict:
    grid = list(DEFAULT_LAMS)
    return {
        "local": make_algorithm("local"),
        "fedavg": make_algorithm("fedavg"),
        "mrmtl λ̄=0.1": make_algorithm("mrmtl", lam=0.1),
        "tuned η=1": TunedPersonalization(grid, D.tnb(1.0, mean=10), val, pivot_lam=0.1),
        "tuned η=0": TunedPersonalization(grid, D.tnb(0.0, mean=10), val, pivot_lam=0.1),
        "subsample": SubsampleTuned(grid, D.tnb(0.0, mean=10), val, pivot_lam=0.1,
                                    fraction=0.1),
        "subsample s=4": SubsampleTuned(grid, D.tnb(0.0, mean=10), val, pivot_lam=0.1,
                                        fraction=0.1, score_ratio=4.0),
        "sub η=-.5": SubsampleTuned(grid, D.tnb(-0.5, mean=10), val, pivot_lam=0.1,
                                    fraction=0.1),
        "sub η=-.5 s=4": SubsampleTuned(grid, D.tnb(-0.5, mean=10), val, pivot_lam=0.1,
                                        fraction=0.1, score_ratio=4.0),
        "proxy": make_algorithm("mrmtl", lam=lam_proxy),
        "proxy sim": make_algorithm("mrmtl", lam=lam_sim),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="heart")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--epsilon", default="1,4")
    ap.add_argument("--only", default="", help="comma-separated method names to run")
    a = ap.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    sc = sweep_config_from_dict(config(a.data, a.rounds), ROOT)
    prep = prepare(sc)
    fed, val, proxy = split(prep, a.data)
    base = dataclasses.replace(build.training_config(sc.base), lr=sc.sweep.lr[0])
    scores = grid_on_proxy(proxy, prep.model, "mrmtl", list(DEFAULT_LAMS), base, prep.metric)
    lam = best_lam(scores, prep.metric)
    print(f"{a.data}: {fed.num_silos} private silos, proxy {proxy.num_silos} silo(s); "
          f"{base.rounds} rounds; proxy grid " +
          ", ".join(f"λ={s['lam']:g}: {s['score']:.4f}" for s in scores))
    table: dict = {}
    for eps in [float(e) for e in a.epsilon.split(",")]:
        target = PrivacyTarget(eps, sc.base.privacy.delta)
        sim = grid_on_proxy(proxy, prep.model, "mrmtl", list(DEFAULT_LAMS), base, prep.metric,
                            target=target)
        lam_sim = best_lam(sim, prep.metric)
        print(f"ε = {eps:g}: proxy λ = {lam:g}, proxy sim λ = {lam_sim:g} (" +
              ", ".join(f"{s['lam']:g}: {s['score']:.4f}" for s in sim) + ")")
        for seed in range(a.seeds):
            cfg = dataclasses.replace(base, seed=seed, private=True)
            f = fed.with_targets(PrivacyTarget(eps, sc.base.privacy.delta))
            for name, alg in methods(val, lam, lam_sim).items():
                if a.only and name not in a.only.split(","):
                    continue
                t0 = time.perf_counter()
                r = simulate(f, prep.model, alg, cfg, metric=prep.metric)
                sig = float(np.median([p.noise_multiplier for p in r.plans]))
                table.setdefault((name, eps), []).append(
                    (r.final_pooled, sig, time.perf_counter() - t0))
    names = [n for n in methods(val, lam, lam) if not a.only or n in a.only.split(",")]
    for eps in sorted({e for _, e in table}):
        print(f"ε = {eps:g} ({prep.metric}, mean ± std over {a.seeds} seed(s); median σ)")
        for n in names:
            v = np.array([x[0] for x in table[(n, eps)]])
            s = np.median([x[1] for x in table[(n, eps)]])
            t = np.mean([x[2] for x in table[(n, eps)]])
            print(f"  {n:<16} {v.mean():.4f} ± {v.std():.4f}   σ {s:6.3f}   {t:5.1f} s")


if __name__ == "__main__":
    main()

"""FedPer, FedRep and FedBN against FedAvg and Local under silo-specific DP (issue 22, item 3).

Heart (4 hospitals; batch 8, lr 0.1; mlp, mlp_norm for FedBN, logistic) and School (139
schools; linear, batch 32, lr 0.03, δ 1e-3) at ε ∈ {1, 4}, seeded noise, 2 seeds, every
method at the same per-silo target (σ calibrated to what each declares: FedRep pays two
passes per round), and a Rotated & Masked MNIST slice (8 silos × 300, ε = 4, the
LayerNorm MLP on flattened images). Prints one JSON line per cell (the pooled test metric
per seed and its mean); cells run one by one or by index (`--list`; parallel with xargs).

    PYTHONPATH=src python benchmarks/bench_split_methods.py [cell indices]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np

from silofl.algorithms import make_algorithm
from silofl.models import make_model
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig
from silofl.runtime.simulator import simulate

EPSILONS = (1.0, 4.0)
SEEDS = (0, 1)


def cell(fed, model_name, method, eps, delta, seeds=SEEDS, **train) -> dict:
    """The pooled test metric of `method` at ε over `seeds` (seeded noise)."""
    vals, t0 = [], time.perf_counter()
    for seed in seeds:
        opts = {} if model_name in ("linear", "logistic") else {"task": fed.task,
                                                               "seed": seed}
        if "input_shape" in train:
            opts["input_shape"] = train.pop("input_shape")
        model = make_model(model_name, fed.dim, max(fed.num_classes, 2), **opts)
        cfg = TrainingConfig(seed=seed, noise="seeded", **train)
        res = simulate(fed.with_targets(PrivacyTarget(eps, delta)), model,
                       make_algorithm(method), cfg)
        vals.append(res.final_pooled)
    return {"model": model_name, "method": method, "epsilon": eps,
            "mean": float(np.mean(vals)), "runs": [round(v, 4) for v in vals],
            "seconds": round(time.perf_counter() - t0, 1)}


HEART = {"mlp": ("local", "fedavg", "fedper", "fedrep"),
         "mlp_norm": ("fedavg", "fedbn"),
         "logistic": ("local", "fedavg", "fedper", "fedrep")}
SCHOOL = ("local", "fedavg", "fedper", "fedrep")
MNIST = ("local", "fedavg", "fedper", "fedrep", "fedbn")


def cells() -> list[tuple[str, str, str, float]]:
    """Every (data, model, method, ε) cell of the benchmark."""
    out = [("heart", mo, me, e) for e in EPSILONS for mo, ms in HEART.items() for me in ms]
    out += [("school", "linear", me, e) for e in EPSILONS for me in SCHOOL]
    return out + [("mnist", "mlp_norm", me, 4.0) for me in MNIST]


def federation(data: str):
    if data == "heart":
        from silofl.data.heart import load_heart_disease
        return load_heart_disease(seed=0)
    if data == "school":
        from silofl.data.school import load_school
        return load_school(seed=0)
    from silofl.data.federation import Federation, Silo
    from silofl.data.mnist import load_rotated_masked_mnist
    img = load_rotated_masked_mnist(num_silos=8, train_per_silo=300, test_per_silo=100,
                                    seed=0)
    flat = [Silo(s.name, s.X_train.reshape(len(s.y_train), -1), s.y_train,
                 s.X_test.reshape(len(s.y_test), -1), s.y_test) for s in img.silos]
    return Federation(flat, [f"px{i}" for i in range(784)], "multiclass", num_classes=10,
                      name="rmm-flat")


def run_cell(data: str, model: str, method: str, eps: float) -> dict:
    fed = federation(data)
    if data == "heart":
        out = cell(fed, model, method, eps, 1e-4, rounds=20, batch_size=8, lr=0.1, clip=1.0)
    elif data == "school":
        out = cell(fed, model, method, eps, 1e-3, rounds=50, batch_size=32, lr=0.03,
                   clip=1.0)
    else:  # Rotated & Masked MNIST, 8 silos × 300, flattened for the LayerNorm MLP
        out = cell(fed, model, method, eps, 1e-4, seeds=(0,), rounds=20, batch_size=32,
                   lr=0.1, clip=1.0)
    return {"data": data, **out}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--list", action="store_true", help="print the cells' indices")
    ap.add_argument("cells", nargs="*", type=int, help="cell indices (default: all)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    grid = cells()
    if args.list:
        print(" ".join(str(i) for i in range(len(grid))))
    else:
        for i in args.cells or range(len(grid)):
            print(json.dumps(run_cell(*grid[i])), flush=True)

"""clip = "auto" (private adaptive clipping) against hand-set clips, on heart and School.

Each (data, ε, method, clip, seed) is its own `silofl run` job (seeded noise, scratch
store): heart (logistic, batch 8, lr 0.1, δ 1e-4, 30 rounds) and School (all 139 schools,
linear, MSE, batch 32, lr 0.03, δ 1e-3, 100 rounds), ε ∈ {1, 4}, FedAvg and MR-MTL (λ = 1),
clip ∈ {0.1, 0.3, 1, 3, 10, "auto"} at the default clip_* settings, seeds 0 and 1. Prints
the mean over seeds per cell and auto's gap to the best hand-set clip (heart: accuracy
points; School: relative MSE). Figures printed, not asserted.

    .venv/bin/python benchmarks/bench_adaptive_clip.py                 # both (~5 min)
    .venv/bin/python benchmarks/bench_adaptive_clip.py --data heart    # ~20 s
    .venv/bin/python benchmarks/bench_adaptive_clip.py --out runs/clip.jsonl  # keep rows
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

from silofl.config.input import load_config
from silofl.experiments.run import run

DATA = {
    "heart": (30, ['data.source="heart"', "data.test_fraction=0.2", 'model.name="logistic"',
                   'model.metric="accuracy"', "training.batch_size=8", "training.lr=0.1",
                   "privacy.delta=1e-4"]),
    "school": (100, ['data.source="school"', "data.test_fraction=0.2", "data.standardize=true",
                     'model.name="linear"', 'model.metric="mse"', "training.batch_size=32",
                     "training.lr=0.03", "privacy.delta=1e-3"]),
}
CLIPS = ("0.1", "0.3", "1", "3", "10", "auto")
EPSILONS, METHODS, SEEDS = (1, 4), ("fedavg", "mrmtl"), (0, 1)


def one(data: str, eps: float, method: str, clip: str, seed: int) -> tuple[float, list]:
    """(final pooled metric, each silo's final clip or None) of one job."""
    rounds, base = DATA[data]
    clip_value = '"auto"' if clip == "auto" else clip
    cfg = load_config(None, [*base, f"privacy.epsilon={eps}", f'training.methods=["{method}"]',
                             "training.lam=1.0", f"training.rounds={rounds}",
                             f"training.seed={seed}", 'privacy.noise="seeded"',
                             "budget.scratch=true", 'output.dir=""',
                             f"training.clip={clip_value}"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = run(cfg).results[0]
    return r.final_pooled, [p.final_clip for p in r.plans]


def table(data: str, rows: list[dict]) -> None:
    higher = data == "heart"
    cell = defaultdict(list)
    for r in rows:
        cell[(r["eps"], r["method"], r["clip"])].append(r["metric"])
    print(f"{data}: {'accuracy' if higher else 'MSE'}, mean of seeds {list(SEEDS)}")
    print(f"{'ε':>3} {'method':7} " + " ".join(f"{c:>7}" for c in CLIPS) + "  best  auto gap")
    for eps in EPSILONS:
        for m in METHODS:
            v = {c: float(np.mean(cell[(eps, m, c)])) for c in CLIPS}
            hand = {c: x for c, x in v.items() if c != "auto"}
            best = (max if higher else min)(hand, key=hand.__getitem__)
            gap = (f"{100 * (v['auto'] - hand[best]):+.1f} pts" if higher
                   else f"{100 * (v['auto'] / hand[best] - 1):+.1f} %")
            print(f"{eps:>3} {m:7} " + " ".join(f"{v[c]:7.4f}" for c in CLIPS)
                  + f"  {best:>4}  {gap}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", choices=[*DATA, "both"], default="both")
    ap.add_argument("--out", type=Path, default=None, help="append every run as a JSON line")
    a = ap.parse_args()
    for data in DATA if a.data == "both" else [a.data]:
        rows = []
        for eps in EPSILONS:
            for m in METHODS:
                for clip in CLIPS:
                    for seed in SEEDS:
                        metric, clips = one(data, eps, m, clip, seed)
                        rows.append({"data": data, "eps": eps, "method": m, "clip": clip,
                                     "seed": seed, "metric": metric,
                                     "final_clips": clips if clip == "auto" else None})
                        if a.out is not None:
                            with open(a.out, "a") as f:
                                f.write(json.dumps(rows[-1]) + "\n")
        table(data, rows)


if __name__ == "__main__":
    main()

"""clip = "auto" (private adaptive clipping) against hand-set clips, on heart, School and the
Vehicle-like task.

Each (data, ε, method, clip, seed) is its own `silofl run` job (seeded noise, scratch
store): heart (logistic, batch 8, lr 0.1, δ 1e-4, 30 rounds), School (all 139 schools,
linear, MSE, batch 32, lr 0.03, δ 1e-3, 100 rounds) and Vehicle-like (23 silos, d = 100,
logistic, batch 64, lr 0.1, δ 1e-4, 100 rounds; bench_personalization's settings),
ε ∈ {1, 4}, FedAvg, MR-MTL and Ditto (λ = 1), clip ∈ {0.1, 0.3, 1, 3, 10, "auto"} at the
default clip_* settings (or --set ones). Prints the mean over seeds per cell and auto's gap
to the best hand-set clip (accuracy points; School: relative MSE). Figures printed, not
asserted. --out keeps every job as a JSON line and --load tables earlier ones, so a new
auto setting needs only its own jobs (--clips auto) beside the hand-set rows.

    .venv/bin/python benchmarks/bench_adaptive_clip.py                   # heart + School
    .venv/bin/python benchmarks/bench_adaptive_clip.py --data heart,vehicle --seeds 0,1,2 \
        --methods fedavg,mrmtl,ditto --out runs/clip.jsonl
    .venv/bin/python benchmarks/bench_adaptive_clip.py --data school --clips auto \
        --set 'training.clip_quantile="auto"' --load runs/clip.jsonl
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
    # bench_personalization's Vehicle-like settings (23 silos, d = 100)
    "vehicle": (100, ['data.source="synthetic"', 'data.generator="vehicle"',
                      "data.test_fraction=0.2", 'model.name="logistic"',
                      'model.metric="accuracy"', "training.batch_size=64", "training.lr=0.1",
                      "privacy.delta=1e-4"]),
}
CLIPS = ("0.1", "0.3", "1", "3", "10", "auto")
EPSILONS, METHODS, SEEDS = (1, 4), ("fedavg", "mrmtl"), (0, 1)


def one(data: str, eps: float, method: str, clip: str, seed: int,
        extra: tuple = ()) -> tuple[float, list]:
    """(final pooled metric, each silo's final clip or None) of one job; `extra`: more
    --set overrides (e.g. training.clip_quantile=0.5)."""
    rounds, base = DATA[data]
    clip_value = '"auto"' if clip == "auto" else clip
    cfg = load_config(None, [*base, f"privacy.epsilon={eps}", f'training.methods=["{method}"]',
                             "training.lam=1.0", f"training.rounds={rounds}",
                             f"training.seed={seed}", 'privacy.noise="seeded"',
                             "budget.scratch=true", 'output.dir=""',
                             f"training.clip={clip_value}", *extra])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = run(cfg).results[0]
    return r.final_pooled, [p.final_clip for p in r.plans]


def table(data: str, rows: list[dict], eps_list, methods, seeds, clips=CLIPS) -> None:
    """Print the mean over seeds per (ε, method) cell and auto's gap to the best hand-set."""
    higher = data != "school"
    last = {(r["data"], r["eps"], r["method"], r["clip"], r["seed"]): r["metric"]
            for r in rows}  # a rerun replaces an earlier row
    cell = defaultdict(list)
    for (d, eps, m, c, seed), metric in last.items():
        if d == data and seed in seeds:
            cell[(eps, m, c)].append(metric)
    print(f"{data}: {'accuracy' if higher else 'MSE'}, mean of seeds {list(seeds)}")
    print(f"{'ε':>3} {'method':7} " + " ".join(f"{c:>7}" for c in clips) + "  best  auto gap")
    for eps in eps_list:
        for m in methods:
            v = {c: float(np.mean(cell[(eps, m, c)])) if cell[(eps, m, c)] else np.nan
                 for c in clips}
            hand = {c: x for c, x in v.items() if c != "auto" and not np.isnan(x)}
            if not hand:
                continue
            best = (max if higher else min)(hand, key=hand.__getitem__)
            gap = (f"{100 * (v['auto'] - hand[best]):+.1f} pts" if higher
                   else f"{100 * (v['auto'] / hand[best] - 1):+.1f} %")
            print(f"{eps:>3} {m:7} " + " ".join(f"{v[c]:7.4f}" for c in clips)
                  + f"  {best:>4}  {gap}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="heart,school",
                    help=f"comma-separated, of {', '.join(DATA)}")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help="comma-separated (fedavg, mrmtl, ditto, local; λ = 1)")
    ap.add_argument("--eps", default=",".join(map(str, EPSILONS)))
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--clips", default=",".join(CLIPS), help="which clips to run")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config override for every job, e.g. training.clip_quantile=0.5")
    ap.add_argument("--out", type=Path, default=None, help="append every run as a JSON line")
    ap.add_argument("--load", type=Path, action="append", default=[],
                    help="JSON lines of earlier runs to table with these (not rerun)")
    a = ap.parse_args()
    methods, clips = a.methods.split(","), [c for c in a.clips.split(",") if c]
    eps_list = [float(e) if "." in e else int(e) for e in a.eps.split(",")]
    seeds = [int(x) for x in a.seeds.split(",")]
    rows = [json.loads(line) for f in a.load for line in open(f) if line.strip()]
    for data in a.data.split(","):
        for eps in eps_list:
            for m in methods:
                for clip in clips:
                    for seed in seeds:
                        metric, fin = one(data, eps, m, clip, seed, tuple(a.set))
                        rows.append({"data": data, "eps": eps, "method": m, "clip": clip,
                                     "seed": seed, "metric": metric, "set": a.set,
                                     "final_clips": fin if clip == "auto" else None})
                        if a.out is not None:
                            with open(a.out, "a") as f:
                                f.write(json.dumps(rows[-1]) + "\n")
        table(data, rows, eps_list, methods, seeds)


if __name__ == "__main__":
    main()

"""clip = "auto" against hand-set clips on torch models: the heart MLP and a Rotated &
Masked MNIST slice (8 silos × 300 images, convnet, bench_personalization's settings).

Each (data, method, clip, seed) is one `silofl run` job at ε = 4 (seeded noise, scratch
store), clip ∈ {0.3, 1, 3, "auto"} at the default clip_* settings. Prints the final pooled
test accuracy (mean over seeds), auto's gap to the best hand-set clip and the wall time.
Figures printed, not asserted. Needs PyTorch.

    .venv/bin/python benchmarks/bench_adaptive_clip_torch.py              # ~3 min CPU
    .venv/bin/python benchmarks/bench_adaptive_clip_torch.py --data heart
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from silofl.config.input import load_config
from silofl.experiments.run import run

DATA = {
    "heart": ['data.source="heart"', "data.test_fraction=0.2", 'model.name="mlp"',
              'model.metric="accuracy"', "training.batch_size=8", "training.lr=0.1",
              "training.rounds=30", "privacy.delta=1e-4"],
    "mnist": ['data.source="mnist"', "data.num_silos=8", "data.train_per_silo=300",
              "data.test_per_silo=100", "data.mask_prob=0.1", 'model.name="convnet"',
              'model.metric="accuracy"', "training.batch_size=50", "training.lr=0.5",
              "training.rounds=20", "privacy.delta=1e-4"],
}
CLIPS = ("0.3", "1", "3", "auto")


def one(data: str, method: str, clip: str, seed: int, eps: float) -> tuple[float, list]:
    """(final pooled accuracy, each silo's final clip or None) of one job."""
    clip_value = '"auto"' if clip == "auto" else clip
    cfg = load_config(None, [*DATA[data], f"privacy.epsilon={eps}",
                             f'training.methods=["{method}"]', "training.lam=1.0",
                             f"training.seed={seed}", 'privacy.noise="seeded"',
                             "budget.scratch=true", 'output.dir=""',
                             f"training.clip={clip_value}"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = run(cfg).results[0]
    return r.final_pooled, [p.final_clip for p in r.plans]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="heart,mnist")
    ap.add_argument("--methods", default="fedavg,mrmtl")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--eps", type=float, default=4.0)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    for data in a.data.split(","):
        print(f"{data}: accuracy at ε = {a.eps:g}, mean of seeds {seeds}")
        print(f"{'method':7} " + " ".join(f"{c:>7}" for c in CLIPS) + "  best  auto gap  "
              "final C_k (auto, seed 0)  wall s")
        for m in a.methods.split(","):
            t0, v, fin = time.perf_counter(), {}, None
            for c in CLIPS:
                got = [one(data, m, c, s, a.eps) for s in seeds]
                v[c] = float(np.mean([g[0] for g in got]))
                print(f"  ({m}, clip {c}: {v[c]:.4f}, {time.perf_counter() - t0:.0f} s)",
                      flush=True)
                fin = got[0][1] if c == "auto" else fin
            hand = {c: x for c, x in v.items() if c != "auto"}
            best = max(hand, key=hand.__getitem__)
            print(f"{m:7} " + " ".join(f"{v[c]:7.4f}" for c in CLIPS)
                  + f"  {best:>4}  {100 * (v['auto'] - hand[best]):+.1f} pts  "
                  + " ".join(f"{x:.2f}" for x in fin) + f"  {time.perf_counter() - t0:.0f}")


if __name__ == "__main__":
    main()

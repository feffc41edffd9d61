"""Where the pandemic model's AUPRC comes from (figures printed, not asserted).

    .venv/bin/python benchmarks/bench_pandemic_skill.py [--persons 20000] [--regions 4]
        [--outbreak-seed 1] [--train-seeds 0 1 2 3 4] [--workdir /tmp/silofl-skill]

On one synthetic outbreak it prints the pooled AUPRC (the challenge's score) of

* the positive rate (a random score) and the SIR baseline;
* the **untrained equal-weight score**: the summary inputs standardized per region and
  summed (`summary_baseline.equal_weight_scores`; no labels, no training);
* the **best single summary column** (picked with the labels: optimistic);
* the default recipe trained with node-level DP at ε = 5, and without DP, for each
  training seed (the seed sets the training windows; with the default secure noise the
  batches and the noise are fresh OS entropy in every run, with ``--noise seeded`` they
  follow the seed; the outbreak does not change).

``--adjacency node --preprocessing uncharged --noise seeded`` reproduces the recipe as it
was before the defaults became node+edges / declared / secure.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from silofl.pandemic import metrics as PM
from silofl.pandemic import read_dataset, synthesize
from silofl.pandemic.baseline import sir_baseline_scores
from silofl.pandemic.inputs import SUMMARY_FEATURES
from silofl.pandemic.pipeline import PandemicConfig, predict, train
from silofl.pandemic.summary_baseline import summary_columns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--persons", type=int, default=20_000)
    ap.add_argument("--regions", type=int, default=4)
    ap.add_argument("--outbreak-seed", type=int, default=1)
    ap.add_argument("--train-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--epsilon", type=float, default=5.0)
    ap.add_argument("--noise", default="secure", choices=["secure", "seeded"])
    ap.add_argument("--adjacency", default="node+edges", choices=["node+edges", "node"])
    ap.add_argument("--preprocessing", default="declared", choices=["declared", "uncharged"])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/silofl-skill"))
    a = ap.parse_args()
    d = a.workdir / f"p{a.persons}-r{a.regions}-s{a.outbreak_seed}"
    synthesize(d, persons=a.persons, regions=a.regions, seed=a.outbreak_seed)
    data = read_dataset(d, with_target=True)
    y = data.target.astype(np.int64)
    rate = PM.positive_rate(y)
    print(f"outbreak {d.name}: {data.num_persons} persons, {int(y.sum())} positives, "
          f"positive rate {rate:.4f}")

    def row(name: str, scores: np.ndarray) -> float:
        ap_ = PM.average_precision(y, scores)
        print(f"  {name:<44} AUPRC {ap_:.4f}  ({ap_ / rate:5.1f}× positive rate)")
        return ap_

    row("SIR baseline", sir_baseline_scores(data.states))
    base = PandemicConfig(epsilon=a.epsilon, noise=a.noise, adjacency=a.adjacency,
                          preprocessing=a.preprocessing)
    raw, std = summary_columns(data, base)
    row(f"untrained equal-weight summary score ({a.preprocessing})", std.sum(axis=1))
    cols = [PM.average_precision(y, raw[:, j]) for j in range(raw.shape[1])]
    j = int(np.argmax(cols))
    row(f"best single column ({SUMMARY_FEATURES[j]}, oracle pick)", raw[:, j])
    for private in (True, False):
        got = []
        for s in a.train_seeds:
            cfg = replace(base, private=private, seed=s)
            t = time.perf_counter()
            pm = train(data, cfg)
            label = f"{f'DP ε={a.epsilon:g}' if private else 'non-private'}, seed {s}"
            got.append(row(f"{label} ({time.perf_counter() - t:.1f} s)", predict(data, pm)))
            if private:
                assert all(p["epsilon_spent"] <= a.epsilon * (1 + 1e-9) for p in pm.privacy)
        print(f"  {'median over seeds':<44} AUPRC {np.median(got):.4f}  "
              f"({np.median(got) / rate:5.1f}×)")


if __name__ == "__main__":
    main()

"""The trees' membership audit (`silofl.audit.gbdt`): the one-run lower bound per claimed ε
for DP-GBDT as run, with its noise off (the self-test's broken variant) and with its noise
weakened, beside the true ε of each weakened copy (the accountant at the weakened noise).
The figures of docs/guides/audit.md, "DP federated trees"; the verdicts are tested in
tests/test_audit_gbdt.py.

1. Synthetic binary task (3 silos × 1000 rows, 5 features in [−1, 1], an XOR-like label),
   histogram splits, 8 trees of depth 3, 1000 canaries in silo s0; claimed ε = 1, 2, 4, 8
   (δ = 1e-5).
2. The default trees (cyclic splits, T = 2d, automatic bins and depth): the same task
   with 10 features (20 trees, 64 bins, depth 6), 800 canaries in s0; ε = 1, 2, 4, 8.
3. Heart (Cleveland, claim ε = 1, δ = 1e-4): histogram and random splits with 200
   canaries, and the default (cyclic) settings, with schema and with private bins, with
   the default canaries.
Every audit trains on fresh in-memory ledgers (experiments, not releases).

Run:  .venv/bin/python benchmarks/bench_audit_gbdt.py [--seeds 5] [--json gbdt_audit.json]
      [--parts histogram,cyclic,heart]
(about 2 minutes on a 2-core machine with --seeds 3.)
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import silofl
from silofl.audit.gbdt import GbdtMechanism, _audit
from silofl.data.federation import Federation, Silo
from silofl.privacy import accounting
from silofl.training.histograms import ensemble_event

#: histogram splits (the audit's settings before cyclic splits became the default)
TREES = {"trees": 8, "depth": 3, "splits": "histogram", "lam": 1.0}


def synthetic(eps: float, n: int = 1000, k: int = 3, seed: int = 0, d: int = 5) -> Federation:
    """k silos of n rows, d uniform features, label (x0·x1 > 0) XOR (x2 > 0.5)."""
    rng = np.random.default_rng(seed)
    silos = []
    for i in range(k):
        X, Xt = rng.uniform(-1, 1, (n, d)), rng.uniform(-1, 1, (n // 4, d))

        def lab(Z: np.ndarray) -> np.ndarray:
            return ((Z[:, 0] * Z[:, 1] > 0) ^ (Z[:, 2] > 0.5)).astype(int)
        silos.append(Silo(f"s{i}", X, lab(X), Xt, lab(Xt), silofl.PrivacyTarget(eps, 1e-5)))
    return Federation(silos, [f"x{j}" for j in range(d)], "binary", 2)


def bound(fed: Federation, silo: str, m: int | None, seed: int, scale: float, **trees) -> float:
    """The one-run lower bound of `silo` with the released noise × `scale`."""
    rep = _audit(fed, silo=silo, canaries=m, kind="one-run", runs=None, confidence=0.95,
                 seed=seed, bounds=(-1.0, 1.0), noise_scale=scale, trees=trees)
    return rep.rows[0].lower_bound


def true_epsilon(eps: float, scale: float, trees: int, releases: int) -> float:
    """The accountant's ε (δ = 1e-5) of the ensemble at the claim's σ × `scale`."""
    sigma = accounting.calibrate(lambda s: ensemble_event(s, trees, releases, 1.0), eps,
                                 1e-5, "pld")
    return float(accounting.epsilons(ensemble_event(sigma * scale, trees, releases, 1.0),
                                     1e-5)["pld"])


def synthetic_rows(seeds: range, cyclic: bool) -> list[dict]:
    """Part 1 (histogram splits) or 2 (the default, cyclic splits) per claimed ε."""
    d, m, kw = (10, 800, {}) if cyclic else (5, 1000, TREES)
    trees, releases = (2 * d, 1) if cyclic else (TREES["trees"], TREES["depth"] + 1)
    rows = []
    for eps in (1.0, 2.0, 4.0, 8.0):
        fed = synthetic(eps, d=d)
        row = {"splits": "cyclic" if cyclic else "histogram", "claim": eps,
               "as_run": [bound(fed, "s0", m, s, 1.0, **kw) for s in seeds],
               "noise_off": [bound(fed, "s0", m, s, 0.0, **kw) for s in seeds[:2]]}
        for scale in (0.5, 0.25, 0.1) if eps in (1.0, 4.0) else ():
            row[f"noise_x{scale:g}"] = {
                "true_epsilon": true_epsilon(eps, scale, trees, releases),
                "bounds": [bound(fed, "s0", m, s, scale, **kw) for s in seeds]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def heart_rows(seeds: range) -> list[dict]:
    """Part 3: Cleveland, claim ε = 1."""
    heart = silofl.load_heart_disease(seed=0).with_targets(silofl.PrivacyTarget(1.0, 1e-4))
    c = heart.silos[0].name
    rows = []
    for name, m, kw in (("histogram", 200, {"trees": 20, "depth": 1, "n_bins": 4, "lam": 10.0,
                                            "lr": 0.5, "colsample": 0.3,
                                            "splits": "histogram"}),
                        ("random", 200, {"trees": 20, "depth": 3, "n_bins": 8, "lam": 30.0,
                                         "lr": 0.5, "colsample": 0.1, "splits": "random"}),
                        ("cyclic (defaults)", None, {}),
                        ("cyclic, private bins", None, {"bins": "private"})):
        row = {"silo": c, "splits": name, "claim": 1.0,
               "as_run": [bound(heart, c, m, s, 1.0, **kw) for s in seeds],
               "noise_off": [bound(heart, c, m, s, 0.0, **kw) for s in seeds]}
        if m is None:
            mech = GbdtMechanism(heart, np.tile([-1.0, 1.0], (heart.dim, 1)), dict(kw), 0)
            row.update(settings=mech.kwargs, canaries=mech.default_canaries(c))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--parts", default="histogram,cyclic,heart")
    args = ap.parse_args()
    seeds = range(1, args.seeds + 1)
    parts = args.parts.split(",")
    out: dict = {"seeds": list(seeds)}
    t0 = time.perf_counter()
    if "histogram" in parts:
        out["synthetic"] = synthetic_rows(seeds, cyclic=False)
    if "cyclic" in parts:
        out["synthetic_cyclic"] = synthetic_rows(seeds, cyclic=True)
    if "heart" in parts:
        out["heart"] = heart_rows(seeds)
    out["seconds"] = time.perf_counter() - t0
    print(f"{out['seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

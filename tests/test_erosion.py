"""`silofl erosion`: Weight Erosion with every silo as the user, as one job. The reservation
is the K users' runs composed (with FedAvg and Local), in the store before any data is
read; a silo from another distribution loses weight fastest; outputs are written; bad
input exits 2 leaving nothing behind."""

from __future__ import annotations

import json
import logging
from collections import Counter

import dp_accounting as dpa
import numpy as np
import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

from silofl.cli import app
from silofl.config import config_from_dict
from silofl.errors import ConfigError
from silofl.experiments import erosion
from silofl.privacy import events
from silofl.privacy.budget import BudgetStore
from silofl.runtime.plan import plan_job

logging.getLogger("absl").setLevel(logging.ERROR)

SILOS = ("a", "b", "c", "d", "flip")
ROUNDS = 8


def _table(path, n=400, seed=0):
    """Binary labels from one linear rule; silo `flip` has every label flipped."""
    rng = np.random.default_rng(seed)
    w = np.array([1.5, -1.0, 0.5])
    parts = []
    for name in SILOS:
        X = rng.standard_normal((n, 3))
        y = (X @ w + 0.3 * rng.standard_normal(n) > 0).astype(int)
        if name == "flip":
            y = 1 - y
        parts.append(pd.DataFrame({"x1": X[:, 0], "x2": X[:, 1], "x3": X[:, 2], "label": y,
                                   "site": name}))
    pd.concat(parts).to_csv(path, index=False)
    return path


def _cfg(csv, out="", epsilon=4.0):
    return {"data": {"source": "table", "path": str(csv), "silo_column": "site",
                     "label_column": "label", "test_fraction": 0.3, "standardize": "uncharged"},
            "training": {"rounds": ROUNDS, "lr": 0.3, "seed": 0,
                         "we_p_d": 0.05},  # erode visibly within a few rounds
            "privacy": {"epsilon": epsilon, "noise": "seeded"},
            "budget": {"scratch": True}, "output": {"dir": out}}


@pytest.fixture(scope="module")
def csv(tmp_path_factory):
    return _table(tmp_path_factory.mktemp("erosion") / "sites.csv")


@pytest.fixture(scope="module")
def everyone(csv):
    return erosion.erosion_for_users(config_from_dict(_cfg(csv)))


def _by_method(store, name):
    out: dict[str, list] = {}
    for c in store.charges(name):
        out.setdefault(c["method"], []).append((events.from_json(c["event"]), c["status"]))
    return out


def test_reservation_is_the_k_users_runs_composed_before_data_access(csv, monkeypatch):
    users = ["a", "b", "flip"]
    store, seen = BudgetStore(None), []
    real = erosion._preprocess

    def spy(*a, **kw):  # the first read of the training data
        seen.append({n: _by_method(store, n) for n in SILOS})
        return real(*a, **kw)
    monkeypatch.setattr(erosion, "_preprocess", spy)
    r = erosion.erosion_for_users(config_from_dict(_cfg(csv, epsilon=2.0)), users,
                                  store=store)
    assert len(seen) == 1
    we = {erosion.label_for(u) for u in users}
    for name in SILOS:
        charged = seen[0][name]
        assert set(charged) == we | {"fedavg", "local"}
        assert {s for v in charged.values() for _, s in v} == {"reserved"}
        # the K users' runs: one Poisson-sampled Gaussian step per round each, composed
        counts = Counter()
        for m in we:
            for ev, _ in charged[m]:
                counts += events.flatten(ev)
        (step, n), = counts.items()
        assert n == len(users) * ROUNDS
        assert isinstance(step, dpa.PoissonSampledDpEvent)
        assert step.event.noise_multiplier == pytest.approx(r.noise_multiplier[name])
        after = _by_method(store, name)
        assert {s for v in after.values() for _, s in v} == {"charged"}
        assert store.spent(name)["epsilon"] <= 2.0
    assert r.calibrated_for == f"{len(users) + 2} methods composed"
    assert "σ calibrated for 3 users composed" in r.calibration
    assert all(c["within_target"] and c["epsilon"] > 1.9 for c in r.combined_privacy)
    # σ is calibrated for all K users: more noise than for one user's run
    from silofl.experiments.run import _prepare
    cfg1 = config_from_dict(_cfg(csv, epsilon=2.0))
    cfg1.training.methods, cfg1.training.we_user = ["fedavg", "local", "weight_erosion"], "a"
    p1 = _prepare(cfg1)
    sigma1 = plan_job(p1.raw, p1.algorithms, p1.tcfg)[0][0].noise_multiplier
    assert r.noise_multiplier["a"] > sigma1 * 1.02


def test_other_distribution_loses_weight_fastest(everyone):
    r = everyone
    assert r.users == list(SILOS)
    k_flip = r.silos.index("flip")
    for u in r.users:
        alpha = r.curves[u].alpha
        assert alpha.shape == (ROUNDS, len(SILOS))
        k = r.silos.index(u)
        assert np.all(alpha[:, k] == 1.0)  # the user's own weight stays 1
        assert np.all(np.diff(alpha, axis=0) <= 1e-12)  # weights only erode
        if u == "flip":
            continue
        others = [i for i in range(len(SILOS)) if i != k]
        assert min(others, key=lambda i: alpha[-1, i]) == k_flip, u
        assert alpha[-1, k_flip] < min(alpha[-1, i] for i in others if i != k_flip) - 0.2
    # on a normal silo the majority class is far below the trained models
    c = r.curves["a"]
    assert 0.3 < c.baseline < 0.7 and c.baseline_value in (0.0, 1.0)
    assert min(c.erosion[-1], c.local[-1], c.global_[-1]) > c.baseline + 0.2
    assert len(c.rounds) == len(c.erosion) == len(c.local) == len(c.global_) == ROUNDS


def test_majority_baseline():
    score, c = erosion.majority_baseline("binary", "accuracy", "logistic",
                                         np.array([1, 1, 0]), np.array([1, 0, 0, 0]))
    assert (score, c) == (0.25, 1.0)
    score, c = erosion.majority_baseline("regression", "mse", "linear", np.array([1., 3.]),
                                         np.array([2., 4.]))
    assert (score, c) == (2.0, 2.0)


@pytest.mark.slow
def test_cli_writes_png_and_json(csv, tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(tomli_w.dumps(_cfg(csv)))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["erosion", "--config", str(cfg), "--users", "all",
                                   "--out", str(out), "--scratch"])
    assert res.exit_code == 0, res.output
    assert "σ calibrated for 5 users composed" in res.output
    (run_dir,) = out.iterdir()
    data = json.loads((run_dir / "erosion.json").read_text())
    assert data["users"] == list(SILOS) and data["private"] and data["scratch_store"]
    assert any("majority-class" in n and "not privatized" in n for n in data["notes"])
    for u in SILOS:
        d = data["per_user"][u]
        assert set(d["metric"]) == {"global", "weight_erosion", "local", "majority_baseline"}
        assert len(d["metric"]["weight_erosion"]) == len(d["rounds"]) == ROUNDS
        assert d["alpha"]["rounds"] == list(range(1, ROUNDS + 1))
        assert d["alpha"][u] == [1.0] * ROUNDS
    pngs = sorted(run_dir.glob("erosion_*.png"))
    assert len(pngs) == len(SILOS)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert (run_dir / "ledgers").is_dir() and (run_dir / "config.toml").is_file()


@pytest.mark.parametrize("args, msg", [
    (["--user", "nowhere"], "silos are: a, b, c, d, flip"),
    (["--user", "a", "--user", "a"], "more than once"),
    (["--users", "all", "--user", "a"], "not both"),
    (["--users", "some"], "takes 'all'"),
])
def test_bad_input_exits_2_and_writes_nothing(csv, tmp_path, args, msg):
    store = tmp_path / "budget.sqlite"
    cfg = tmp_path / "run.toml"
    d = _cfg(csv)
    d["budget"] = {"scratch": False}  # a real store file: it must not be created
    cfg.write_text(tomli_w.dumps(d))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["erosion", "--config", str(cfg), "--out", str(out),
                                   "--store", str(store), *args])
    assert res.exit_code == 2, res.output
    assert msg in " ".join(res.output.split())
    assert not out.exists() and not store.exists()


def test_python_api_refuses_unknown_user(csv):
    with pytest.raises(ConfigError, match="silos are: a, b, c, d, flip"):
        erosion.erosion_for_users(config_from_dict(_cfg(csv)), ["zz"])

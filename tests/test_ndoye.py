"""The adapted Ndoye factor (`silofl rank`): a silo from another distribution ranks last,
the private CV-loss release is reserved before any data read and has the calibrated noise,
outputs are written, and bad input exits 2 leaving nothing behind."""

from __future__ import annotations

import json
import logging

import dp_accounting as dpa
import numpy as np
import pandas as pd
import pytest
import tomli_w
from scipy import stats
from typer.testing import CliRunner

from silofl.cli import app
from silofl.config import config_from_dict
from silofl.errors import ConfigError
from silofl.experiments import ndoye
from silofl.privacy import accounting, events
from silofl.privacy.budget import BudgetStore

logging.getLogger("absl").setLevel(logging.ERROR)

SILOS = ("a", "b", "c", "d", "flip")


def _table(path, names=SILOS, n=400, flip="flip", seed=0):
    """Binary labels from one linear rule; silo `flip` has every label flipped."""
    rng = np.random.default_rng(seed)
    w = np.array([1.5, -1.0, 0.5])
    parts = []
    for name in names:
        X = rng.standard_normal((n, 3))
        y = (X @ w + 0.3 * rng.standard_normal(n) > 0).astype(int)
        if name == flip:
            y = 1 - y
        parts.append(pd.DataFrame({"x1": X[:, 0], "x2": X[:, 1], "x3": X[:, 2], "label": y,
                                   "site": name}))
    pd.concat(parts).to_csv(path, index=False)
    return path


def _cfg_dict(csv, epsilon=4.0, rounds=10, seed=0, out=""):
    return {"data": {"source": "table", "path": str(csv), "silo_column": "site",
                     "label_column": "label", "test_fraction": 0.3, "standardize": "uncharged"},
            "training": {"rounds": rounds, "lr": 0.3, "seed": seed},
            "privacy": {"epsilon": epsilon, "noise": "seeded"},
            "budget": {"scratch": True}, "output": {"dir": out}}


@pytest.fixture(scope="module")
def csv(tmp_path_factory):
    return _table(tmp_path_factory.mktemp("ndoye") / "sites.csv")


def test_other_distribution_ranks_last_for_every_user(csv):
    r = ndoye.rank_silos(config_from_dict(_cfg_dict(csv)), "a", top=2)
    assert r.order[-1] == "flip"
    assert r.selected == r.order[:2] and "flip" not in r.selected
    m = r.transfer_matrix  # row u: the ranking user u would compute
    for u, name in enumerate(r.silos):
        if name == "flip":
            continue
        others = [i for i in range(len(r.silos)) if i != u]
        assert r.silos[max(others, key=lambda i: m[u, i])] == "flip", name
    # threshold selection: everyone but the flipped silo transfers well to "a"
    r2 = ndoye.rank_silos(config_from_dict(_cfg_dict(csv)), "a", threshold=0.5)
    assert set(r2.selected) == {"b", "c", "d"}


def test_cv_release_reserved_before_any_data_read(csv, monkeypatch):
    store = BudgetStore(None)
    seen = []

    def reserved_gaussians():
        out = {}
        for name in SILOS:
            for c in store.charges(name):
                if c["label"] == ndoye.CV_LABEL:
                    ev = events.from_json(c["event"])
                    out[name] = (ev, c["status"])
        return out

    def spy(fn):
        def wrapped(*a, **kw):
            seen.append((fn.__name__, reserved_gaussians()))
            return fn(*a, **kw)
        return wrapped
    monkeypatch.setattr(ndoye, "simulate", spy(ndoye.simulate))
    monkeypatch.setattr(ndoye, "clipped_losses", spy(ndoye.clipped_losses))
    cfg = config_from_dict(_cfg_dict(csv, epsilon=2.0))
    r = ndoye.rank_silos(cfg, "b", store=store)
    assert seen and seen[0][0] == "simulate"  # training is the first data access
    for _, charged in seen:  # at every data access, every silo's release is reserved
        assert set(charged) == set(SILOS)
        for name, (ev, status) in charged.items():
            assert isinstance(ev, dpa.GaussianDpEvent) and status == "reserved"
            assert ev.noise_multiplier == pytest.approx(r.cv_noise_multiplier[name])
    # z alone costs cv_share·ε; the whole job (DP-SGD + release) stays within ε
    z = r.cv_noise_multiplier["a"]
    eps_z = accounting.epsilon(dpa.GaussianDpEvent(z), 1e-4, "pld")
    assert 0.19 < eps_z <= 0.2
    assert all(c["within_target"] and c["epsilon"] > 1.9 for c in r.combined_privacy)
    # settled: the executed releases stay charged
    after = reserved_gaussians()
    assert set(after) == set(SILOS) and {s for _, s in after.values()} == {"charged"}
    assert all(store.spent(n)["epsilon"] <= 2.0 for n in SILOS)


@pytest.mark.statistical
def test_cv_noise_scale_matches_sigma_b_over_n(tmp_path, monkeypatch):
    names = [f"s{k:03d}" for k in range(150)]
    csv = _table(tmp_path / "many.csv", names=names, n=60, flip="")
    exact = []

    def record(*a, **kw):
        out = real(*a, **kw)
        exact.append(float(out.mean()))
        return out
    real = ndoye.clipped_losses
    monkeypatch.setattr(ndoye, "clipped_losses", record)
    z = []
    for seed in (1, 2):
        exact.clear()
        r = ndoye.rank_silos(config_from_dict(_cfg_dict(csv, epsilon=1.0, rounds=1,
                                                        seed=seed)), "s000", bound=0.5)
        # the first K loss evaluations are the silos' CV releases, in silo order
        noise = r.cv_loss - np.array(exact[:len(names)])
        z += (noise / np.array([r.cv_noise_std(n) for n in names])).tolist()
        assert r.cv_noise_std(names[0]) == pytest.approx(
            r.cv_noise_multiplier[names[0]] * 0.5 / r.cv_sizes[names[0]])
    z = np.array(z)
    assert abs(z.mean()) < 4 / np.sqrt(len(z))
    assert 0.85 < z.std() < 1.15  # a scale off by √2 (e.g. 2B/n) would fail
    assert stats.kstest(z, "norm").pvalue > 1e-3


def test_cli_writes_table_json_and_heatmap(csv, tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(tomli_w.dumps(_cfg_dict(csv)))
    res = CliRunner().invoke(app, ["rank", "--config", str(cfg), "--user", "c", "--top", "2",
                                   "--out", str(tmp_path / "out"), "--scratch"])
    assert res.exit_code == 0, res.output
    assert "private CV loss" in res.output and "not privatized" in " ".join(res.output.split())
    (run_dir,) = (tmp_path / "out").iterdir()
    data = json.loads((run_dir / "ranking.json").read_text())
    assert data["user"] == "c" and data["selection"] == {"top": 2}
    assert [row["rank"] for row in data["ranking"]] == [1, 2, 3, 4]
    assert data["ranking"][-1]["silo"] == "flip"
    assert np.array(data["transfer_matrix"]).shape == (5, 5)
    assert data["scratch_store"] and data["cv_release"]["a"]["noise_std"] > 0
    assert (run_dir / "transfer_heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run_dir / "ledgers" / "local").is_dir()


@pytest.mark.parametrize("args, message", [
    (["--user", "nowhere"], "silos are: a, b, c, d, flip"),
    (["--user", "a", "--top", "5"], "between 1 and 4"),
    (["--user", "a", "--threshold", "-0.1"], "threshold"),
])
def test_cli_bad_input_exits_2_and_writes_nothing(csv, tmp_path, args, message):
    d = _cfg_dict(csv)
    d["budget"] = {}  # a real store: it must not even be created
    cfg = tmp_path / "run.toml"
    cfg.write_text(tomli_w.dumps(d))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["rank", "--config", str(cfg), "--out", str(out), *args])
    assert res.exit_code == 2
    assert message in " ".join(res.output.split())
    assert not out.exists()


def test_check_selection():
    with pytest.raises(ConfigError, match="not both"):
        ndoye.check_selection(["a", "b"], "a", 1, 0.1)
    with pytest.raises(ConfigError, match="at least two"):
        ndoye.check_selection(["a"], "a", None, None)

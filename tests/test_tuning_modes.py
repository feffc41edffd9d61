"""Cheaper honest tuning: `select = "subsample"` (trials at rate γ·q, then one full run)
and `mode = "proxy"` (the grid on declared public data, free for the silos)."""

from __future__ import annotations

import json
import logging
import math
import tomllib
import warnings
from collections import Counter
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest
import tomli_w
from dp_accounting import rdp
from dp_accounting.dp_event import RepeatAndSelectDpEvent
from typer.testing import CliRunner

from silofl.cli import app
from silofl.errors import BudgetExceeded, ConfigError
from silofl.experiments.sweep import carve_validation
from silofl.models.glm import make_model
from silofl.privacy import accounting, events
from silofl.privacy import selection as TA
from silofl.privacy.budget import BudgetStore
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig
from silofl.runtime.simulator import simulate
from silofl.tuning import distributions as D
from silofl.tuning.subsample import SubsampleTuned
from test_tuning import _fed

logging.getLogger("absl").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", category=RuntimeWarning)

GAMMA = 0.2


def _sub(eps: float = 2.0, rounds: int = 3, fraction: float = GAMMA, K: int = 5):
    fed, val = carve_validation(_fed(K), 0.25, 0)
    fed = fed.with_targets(PrivacyTarget(eps, 1e-4))
    alg = SubsampleTuned([0.01, 0.1, 1.0], D.tnb(1.0, mean=4), val, lrs=[0.05, 0.2],
                         pivot_lam=0.1, fraction=fraction)
    cfg = TrainingConfig(rounds=rounds, batch_size=8, lr=0.1, accountant="rdp",
                         noise="seeded", seed=3, private=True)
    return fed, alg, cfg, make_model("logistic", fed.dim)


# --- the bound --------------------------------------------------------------------------

def test_subsample_charge_matches_dp_accounting_alone():
    """Ledger ε of a subsample-tuned run = dp_accounting's RdpAccountant on the events
    built by hand (same orders: tolerance 1e-6 relative), and within the target."""
    fed, alg, cfg, model = _sub()
    res = simulate(fed, model, alg, cfg)
    for led, p in zip(res.ledgers, res.plans):
        sigma, T = p.noise_multiplier, p.steps_per_pass * cfg.rounds
        full = dpa.PoissonSampledDpEvent(p.q, dpa.GaussianDpEvent(sigma))
        thin = dpa.PoissonSampledDpEvent(GAMMA * p.q, dpa.GaussianDpEvent(sigma))
        score = dpa.GaussianDpEvent(2.0 * sigma / (p.q * math.sqrt(T)))
        ras = RepeatAndSelectDpEvent(
            dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(thin, T), score]), 4.0, 1.0)
        acc = rdp.RdpAccountant(list(accounting.RDP_ORDERS))
        acc.compose(dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(thin, T), ras,
                                         dpa.SelfComposedDpEvent(full, T)]))
        rep = led.report()
        assert rep["epsilon"] == pytest.approx(acc.get_epsilon(1e-4), rel=1e-6)
        assert rep["within_target"] and rep["epsilon"] > 0.95 * led.target.epsilon


def test_subsample_is_cheaper_than_full_trials():
    """At one σ the subsample release costs less than the full-rate tuned release and
    more than one run; γ = 1 is the full-rate release plus one more run."""
    rev = accounting.dpsgd_event(0.1, 2.0, 20)
    dist = D.tnb(0.0, mean=10)
    eps = lambda ev: TA.epsilon_of(ev, 1e-5)  # noqa: E731
    one = eps(dpa.SelfComposedDpEvent(rev, 10))
    full = eps(TA.tuned_event(rev, 10, dist, 1.0))
    sub = eps(TA.subsample_tuned_event(rev, 10, dist, 1.0, 0.1))
    assert one < sub < full
    same = TA.subsample_tuned_event(rev, 10, dist, 1.0, 1.0)
    more = dpa.ComposedDpEvent([TA.tuned_event(rev, 10, dist, 1.0),
                                dpa.SelfComposedDpEvent(rev, 10)])
    assert eps(same) == pytest.approx(eps(more), rel=1e-9)


# --- the run ----------------------------------------------------------------------------

def test_subsample_ledger_is_executed_steps():
    fed, alg, cfg, model = _sub()
    res = simulate(fed, model, alg, cfg)
    for led, p in zip(res.ledgers, res.plans):
        labels = [e.label for e in led.entries]
        assert labels[0] == "tuning"  # charged before any pass read a row
        assert labels.count("tuning-pivot") == cfg.rounds  # the tuning phase's pivot
        assert labels.count("dpsgd") == cfg.rounds  # the final run
        sigma = p.noise_multiplier
        thin = events.dpsgd_event(GAMMA * p.q, sigma, p.steps_per_pass)
        full = events.dpsgd_event(p.q, sigma, p.steps_per_pass)
        assert all(events.flatten(e.event) == events.flatten(thin)
                   for e in led.entries if e.label == "tuning-pivot")
        assert all(events.flatten(e.event) == events.flatten(full)
                   for e in led.entries if e.label == "dpsgd")
    # each trial spent exactly its prepaid allowance: its passes and one score
    (subs,) = alg._subs.values()
    for sub, _rows in subs:
        for led in sub.ledgers:
            assert led.spent_counts() == Counter(led.allowance)
    # the final models are the chosen settings trained in full (not the trials)
    assert len(alg.last_release) == fed.num_silos


def test_subsample_trials_run_at_the_thinned_rate():
    fed, alg, cfg, model = _sub(fraction=0.25)
    simulate(fed, model, alg, cfg)
    (subs,) = alg._subs.values()
    for sub, _rows in subs:
        n = sub.data.n
        assert np.allclose(sub.q, 0.25 * np.minimum(1.0, 8 / n))
        assert np.allclose(sub.expected_batch, sub.q * n)


def test_subsample_refused_over_budget_charges_nothing():
    """The charge is checked for every silo before any is charged: a silo whose ledger
    cannot pay stops the run before any row is read, and no ledger holds an entry."""
    from silofl.privacy.ledger import Ledger
    from silofl.training.dpsgd import GradientRule
    from silofl.training.silo_data import SiloArrays
    from silofl.training.trainer import LocalTrainer
    fed, alg, cfg, model = _sub()
    from silofl.runtime.plan import plan_silos
    plans = plan_silos(fed, alg, cfg)
    ledgers = [Ledger(p.name, PrivacyTarget(p.target.epsilon if k else 0.5, 1e-4), "rdp")
               for k, p in enumerate(plans)]
    from silofl.privacy.randomness import Randomness
    tr = LocalTrainer(model, SiloArrays.stack([s.X_train for s in fed.silos],
                                              [s.y_train for s in fed.silos]),
                      GradientRule(1.0, np.array([p.noise_multiplier for p in plans])), 8,
                      np.array([p.steps_per_pass for p in plans]), 0.1, 0.0,
                      Randomness.seeded(1), ledgers)
    silos, server = alg.init(model.init_params(), fed.num_silos, rounds=cfg.rounds)
    with pytest.raises(BudgetExceeded):
        alg.silo_step(silos, server.params, tr, 1)
    assert all(not led.entries for led in ledgers)
    assert tr.steps_done.sum() == 0


# --- config and CLI -----------------------------------------------------------------------

def _toml(tmp: Path, tuning: dict, **extra) -> Path:
    raw = {"data": {"source": "heart"}, "model": {"name": "logistic"},
           "training": {"methods": ["local", "mrmtl"], "rounds": 2, "batch_size": 8},
           "privacy": {"epsilon": 2.0, "delta": 1e-4, "noise": "seeded", "accountant": "rdp"},
           "budget": {"store": str(tmp / "budget.sqlite")},
           "output": {"dir": str(tmp / "runs")}, "tuning": tuning, **extra}
    p = tmp / "run.toml"
    p.write_text(tomli_w.dumps(raw))
    return p


def _spent(tmp: Path, names=("Cleveland", "Hungary")) -> list[float]:
    if not (tmp / "budget.sqlite").exists():
        return [0.0 for _ in names]
    store = BudgetStore(tmp / "budget.sqlite")
    return [store.spent(n)["epsilon"] for n in names]


def test_run_subsample_meets_target(tmp_path):
    p = _toml(tmp_path, {"mode": "private", "select": "subsample", "lam": [0.1, 1.0],
                         "mean_trials": 3, "subsample_fraction": 0.1})
    res = CliRunner().invoke(app, ["run", "-c", str(p)])
    assert res.exit_code == 0, res.output
    run_dir = next((tmp_path / "runs").iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    tuned = summary["methods"][1]
    assert tuned["select"] == "subsample" and tuned["subsample_fraction"] == 0.1
    assert all(e <= 2.0 + 1e-9 for e in _spent(tmp_path))


def test_run_subsample_over_lifetime_budget_spends_nothing(tmp_path):
    p = _toml(tmp_path, {"mode": "private", "select": "subsample", "lam": [0.1, 1.0],
                         "mean_trials": 3})
    d = tomllib.loads(p.read_text())
    d["budget"]["epsilon"] = 1.0  # lifetime below the job's 2.0
    p.write_text(tomli_w.dumps(d))
    res = CliRunner().invoke(app, ["run", "-c", str(p)])
    assert res.exit_code != 0
    assert _spent(tmp_path) == [0.0, 0.0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("tuning, msg", [
    ({"select": "subsample", "subsample_fraction": 0.0}, "subsample_fraction"),
    ({"select": "subsample", "subsample_fraction": 1.5}, "subsample_fraction"),
    ({"select": "subsample", "method": "ditto"}, "tuning.method = 'mrmtl'"),
    ({"select": "pick"}, "tuning.select must be one of"),
    ({"mode": "proxy"}, "proxy_source"),
    ({"mode": "proxy", "proxy_source": "heart"}, "silos' own data"),
    ({"mode": "proxy", "proxy_source": "table"}, "proxy_path"),
    ({"mode": "proxy", "proxy_source": "school"}, "needs the silos' label and feature"),
    ({"mode": "proxy", "proxy_source": "exam", "lr": [0.1]}, "tunes λ only"),
    ({"mode": "proxy", "proxy_source": "exam", "proxy_noise": "loud"}, "proxy_noise"),
])
def test_tuning_mode_config_errors_spend_nothing(tmp_path, tuning, msg):
    p = _toml(tmp_path, {"mode": "private", "lam": [0.1, 1.0], "mean_trials": 3, **tuning})
    res = CliRunner().invoke(app, ["run", "-c", str(p)])
    assert res.exit_code == 2, res.output
    assert msg in " ".join(res.output.split())
    assert _spent(tmp_path) == [0.0, 0.0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


# --- proxy -------------------------------------------------------------------------------

SCHEMA = """source = "test: documented bounds"
silo_column = "site"
[label]
name = "label"
kind = "binary"
classes = [0, 1]
""" + "".join(f"""[[columns]]
name = "{c}"
kind = "numeric"
lower = -6.0
upper = 6.0
nullable = false
""" for c in "abc")


def _tables(tmp: Path) -> None:
    import pandas as pd
    for name, sites, seed in (("silos.csv", ["s1", "s2", "s3"], 1),
                              ("proxy.csv", ["p1", "p2"], 2)):
        r = np.random.default_rng(seed)
        parts = []
        for s in sites:
            w = np.array([1.0, -1.0, 0.5]) + 0.5 * r.normal(size=3)
            X = np.clip(r.normal(size=(120, 3)), -6, 6)
            y = (r.uniform(size=120) < 1 / (1 + np.exp(-X @ w))).astype(int)
            parts.append(pd.DataFrame({"site": s, "a": X[:, 0], "b": X[:, 1], "c": X[:, 2],
                                       "label": y}))
        pd.concat(parts).to_csv(tmp / name, index=False)
    (tmp / "schema.toml").write_text(SCHEMA)


def _proxy_toml(tmp: Path, proxy_path: str, mode: str = "proxy", lam=None) -> Path:
    _tables(tmp)
    data = {"source": "table", "path": str(tmp / "silos.csv"), "silo_column": "site",
            "label_column": "label", "schema": str(tmp / "schema.toml")}
    tuning = {"mode": mode, "proxy_source": "table", "proxy_path": proxy_path,
              "lam": [0.01, 1.0, 10.0]}
    p = _toml(tmp, tuning, data=data)
    if lam is not None:  # the fixed-λ run the proxy run must cost the same as
        d = tomllib.loads(p.read_text())
        d.pop("tuning")
        d["training"]["lam"] = lam
        p.write_text(tomli_w.dumps(d))
    return p


def test_proxy_mode_charges_nothing_for_tuning(tmp_path):
    p = _proxy_toml(tmp_path, str(tmp_path / "proxy.csv"))
    res = CliRunner().invoke(app, ["run", "-c", str(p)])
    assert res.exit_code == 0, res.output
    assert "declared public by this config" in " ".join(res.output.split())
    assert "cost the silos ε = 0" in " ".join(res.output.split())
    run_dir = next((tmp_path / "runs").iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    info = summary["methods"][1]["tuning"]
    assert info["mode"] == "proxy" and info["declared_public"] is True
    assert info["proxy_noise"].startswith("simulated")
    assert info["silo_epsilon_spent_on_tuning"] == 0.0
    assert [g["lam"] for g in info["grid"]] == [0.01, 1.0, 10.0]
    lam = info["chosen_lam"]
    assert summary["methods"][1]["lam"] == lam
    spent = _spent(tmp_path, ("s1", "s2", "s3"))
    # the same job with λ fixed in advance costs the silos exactly as much
    other = tmp_path / "fixed"
    other.mkdir()
    q = _proxy_toml(other, str(other / "proxy.csv"), lam=lam)
    res = CliRunner().invoke(app, ["run", "-c", str(q)])
    assert res.exit_code == 0, res.output
    assert spent == pytest.approx(_spent(other, ("s1", "s2", "s3")), rel=1e-9)
    lines = [json.loads(x) for f in (run_dir / "ledgers" / "mrmtl").glob("*.jsonl")
             for x in f.read_text().splitlines() if x.strip()]
    assert lines and not any("tuning" in json.dumps(x) for x in lines)


def test_proxy_refuses_the_silos_own_table(tmp_path):
    p = _proxy_toml(tmp_path, str(tmp_path / "silos.csv"))
    res = CliRunner().invoke(app, ["run", "-c", str(p)])
    assert res.exit_code == 2
    assert "silos' own data" in " ".join(res.output.split())
    assert _spent(tmp_path, ("s1", "s2", "s3")) == [0.0, 0.0, 0.0]


def test_subsample_fraction_checked_by_the_algorithm():
    fed, val = carve_validation(_fed(3), 0.25, 0)
    with pytest.raises(ConfigError, match="subsample_fraction"):
        SubsampleTuned([0.1], D.tnb(1.0, mean=3), val, fraction=0.0)
    with pytest.raises(ConfigError, match="mrmtl"):
        SubsampleTuned([0.1], D.tnb(1.0, mean=3), val, pivot="ditto")


def test_sweep_with_subsample_tuning(tmp_path):
    """sweep.tuning = "private" with select = "subsample": the tuned run meets ε and
    records its select and fraction (tuning.select is read from [tuning] as in a run)."""
    from silofl.experiments.sweep import run_sweep
    from silofl.experiments.sweep_config import sweep_config_from_dict
    from silofl.experiments.sweep_results import read_results
    from test_tuning import BASE
    raw = json.loads(json.dumps(BASE))
    raw["sweep"]["results"] = str(tmp_path / "r.jsonl")
    raw["tuning"].update({"select": "subsample", "subsample_fraction": 0.2})
    out = run_sweep(sweep_config_from_dict(raw, tmp_path))
    _head, records = read_results(out.results)
    (t,) = [r for r in records if r["method"] == "mrmtl_tuned"]
    assert t["privacy"]["max_epsilon_spent"] <= 2.0 and not t["privacy"]["over_target"]
    assert t["tuning"]["select"] == "subsample" and t["tuning"]["subsample_fraction"] == 0.2
    assert len(t["tuning"]["released"]) == len(_head["silos"])


def _proxy_sweep(tmp: Path, **tuning) -> dict:
    _tables(tmp)
    return {"data": {"source": "table", "path": str(tmp / "silos.csv"),
                     "silo_column": "site", "label_column": "label",
                     "schema": str(tmp / "schema.toml")},
            "model": {"name": "logistic", "metric": "accuracy"},
            "training": {"rounds": 2, "batch_size": 8},
            "privacy": {"delta": 1e-4, "noise": "seeded", "accountant": "rdp"},
            "sweep": {"methods": ["local", "mrmtl"], "epsilon": [2.0],
                      "lam": [0.01, 1.0, 10.0], "lr": [0.1], "seeds": [0], "workers": 1,
                      "tuning": "proxy", "results": str(tmp / "r.jsonl")},
            "tuning": {"proxy_source": "table", "proxy_path": str(tmp / "proxy.csv"),
                       "lam": [0.01, 1.0, 10.0], **tuning}}


def test_sweep_with_proxy_tuning(tmp_path):
    """sweep.tuning = "proxy": one mrmtl_proxy run per (ε, seed) at the λ the proxy picks,
    declared public in its record, costing the silos what the same λ fixed in advance
    costs (the mrmtl grid run at that λ), and the console says it cost 0."""
    from silofl.experiments.sweep import run_sweep
    from silofl.experiments.sweep_config import sweep_config_from_dict
    from silofl.experiments.sweep_results import read_results
    raw = _proxy_sweep(tmp_path)
    out = run_sweep(sweep_config_from_dict(raw, tmp_path))
    _head, records = read_results(out.results)
    (t,) = [r for r in records if r["method"] == "mrmtl_proxy"]
    info = t["tuning"]
    assert info["declared_public"] is True and info["silo_epsilon_spent_on_tuning"] == 0.0
    lam = info["chosen_lam"]
    assert lam in (0.01, 1.0, 10.0) and t["algorithm"]["lam"] == lam
    (fixed,) = [r for r in records if r["method"] == "mrmtl" and r["lam"] == lam]
    assert t["privacy"]["epsilon_spent"] == pytest.approx(fixed["privacy"]["epsilon_spent"],
                                                          rel=1e-9)
    assert not t["privacy"]["over_target"]
    (tmp_path / "sweep.toml").write_text(tomli_w.dumps(raw))  # all recorded: prints only
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "sweep.toml")])
    assert res.exit_code == 0, res.output
    assert "declared public by this config" in " ".join(res.output.split())


def test_sweep_proxy_tuning_needs_a_declared_proxy(tmp_path):
    from silofl.experiments.sweep_config import sweep_config_from_dict
    raw = _proxy_sweep(tmp_path)
    raw["tuning"].pop("proxy_source")
    with pytest.raises(ConfigError, match="proxy_source"):
        sweep_config_from_dict(raw, tmp_path)
    raw = _proxy_sweep(tmp_path, proxy_source="table")
    raw["tuning"]["proxy_path"] = str(tmp_path / "silos.csv")
    with pytest.raises(ConfigError, match="silos' own data"):
        sweep_config_from_dict(raw, tmp_path)

"""Method dp_gbdt in a job: `silofl run` and `silofl.run` on the built-in heart data and on
a user's messy CSV + schema, alone and beside DP-SGD methods (one σ_k per silo for the
job), its charges in the lifetime store, bad [trees] values, the saved trees and
`silofl predict`, and an interrupted run that is resumed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

import silofl
from silofl.cli import app
from silofl.config import config_from_dict
from silofl.errors import ConfigError
from silofl.experiments.resume import resume_run
from silofl.privacy import events
from silofl.privacy.budget import BudgetStore
from silofl.privacy.ledger import read_entries

runner = CliRunner()
DELTA = 1e-4

SCHEMA = """source = "test: public facts"
silo_column = "hospital"
[label]
name = "{label}"
kind = "{kind}"
{label_extra}
[[columns]]
name = "age"
kind = "numeric"
lower = 18
upper = 90
nullable = true
[[columns]]
name = "bp"
kind = "numeric"
lower = 80
upper = 200
mean = 130
scale = 20
[[columns]]
name = "sex"
kind = "categorical"
levels = ["F", "M"]
nullable = true
[[columns]]
name = "smoker"
kind = "binary"
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SILOFL_HOME", str(tmp_path / "home"))


def _messy_csv(path: Path, n: int = 300, seed: int = 0) -> Path:
    """Three hospitals; missing ages and sexes, values beyond the declared bounds, text
    booleans, a date column to drop; a non-linear binary label and a regression label."""
    rng = np.random.default_rng(seed)
    parts = []
    for h in ("north", "south", "east"):
        age = rng.uniform(10, 95, n)
        bp = rng.normal(130, 30, n)
        sex = rng.choice(["F", "M"], n)
        smoker = rng.random(n) < 0.3
        y = ((age > 55) ^ (bp > 140)) | smoker & (rng.random(n) < 0.5)
        age_txt = np.where(rng.random(n) < 0.1, "", age.round(1).astype(str))
        parts.append(pd.DataFrame({
            "hospital": h, "pid": [f"{h}{i % (n // 2)}" for i in range(n)],
            "visit": "2021-01-01", "age": age_txt, "bp": bp.round(0),
            "sex": np.where(rng.random(n) < 0.05, "", sex),
            "smoker": np.where(smoker, "TRUE", "FALSE"), "y": y.astype(int),
            "cost": np.sin(age / 10) + (bp > 150) + rng.normal(0, 0.1, n)}))
    pd.concat(parts, ignore_index=True).to_csv(path, index=False)
    return path


def _table_cfg(tmp: Path, methods: list[str], regression: bool = False, **sections) -> dict:
    csv = _messy_csv(tmp / "visits.csv")
    extra = "lower = -3\nupper = 3" if regression else "classes = [0, 1]"
    schema = SCHEMA.format(label="cost" if regression else "y",
                           kind="regression" if regression else "binary", label_extra=extra)
    (tmp / "schema.toml").write_text(schema)
    cfg = {"data": {"source": "table", "path": str(csv), "silo_column": "hospital",
                    "label_column": "cost" if regression else "y",
                    "schema": str(tmp / "schema.toml"), "drop": ["visit", "pid"] +
                    (["y"] if regression else ["cost"])},
           "training": {"methods": methods, "rounds": 3},
           "privacy": {"epsilon": 1.0, "delta": DELTA, "noise": "seeded"},
           "trees": {"trees": 4, "depth": 2, "splits": "histogram"},
           "budget": {"store": str(tmp / "store.sqlite")}, "output": {"name": "job"}}
    for k, v in sections.items():
        cfg.setdefault(k, {}).update(v)
    return cfg


def _cli(tmp: Path, cfg: dict, *extra: str):
    path = tmp / "job.toml"
    path.write_text(tomli_w.dumps(cfg))
    return runner.invoke(app, ["run", "--config", str(path), "--out", str(tmp / "runs"),
                               "-q", *extra])


def _store_events(store: BudgetStore, silo: str, method: str) -> Counter:
    out: Counter = Counter()
    for c in store.charges(silo):
        if c["method"] == method and c["status"] == "charged":
            ev = c["event"] if isinstance(c["event"], dict) else json.loads(c["event"])
            for e, n in events.flatten(events.from_dict(ev)).items():
                out[e] += n * c["count"]
    return out


def test_cli_heart_tiny_run_writes_trees_report_and_charges_the_store(tmp_path):
    store = tmp_path / "store.sqlite"
    cfg = {"training": {"methods": ["dp_gbdt"]},
           "trees": {"trees": 3, "depth": 2, "splits": "histogram"},
           "privacy": {"epsilon": 1.0, "delta": DELTA},
           "budget": {"store": str(store)}, "output": {"name": "heart"}}
    res = _cli(tmp_path, cfg)
    assert res.exit_code == 0, res.output
    assert "dp_gbdt" in res.output and "baseline" in res.output
    d = tmp_path / "runs" / "heart"
    summary = json.loads((d / "summary.json").read_text())
    m = summary["methods"][0]
    assert m["method"] == "dp_gbdt" and m["metric"] == "accuracy"
    assert set(m["final_metrics"]) == {"accuracy", "roc_auc"}
    assert set(m["per_silo"]) == {"Cleveland", "Hungary", "Switzerland", "VA Long Beach"}
    privacy = json.loads((d / "privacy_report.json").read_text())
    rows = privacy["methods"]["dp_gbdt"]
    assert all(r["trees"] == {"trees": 3, "releases_per_tree": 3} for r in rows)
    assert all(r["epsilon"] <= 1.0 + 1e-6 for r in rows)
    man = json.loads((d / "models" / "dp_gbdt" / "manifest.json").read_text())
    assert man["model"]["name"] == "trees"
    card = json.loads((d / "models" / "dp_gbdt" / man["silos"][0]["card"]).read_text())
    for key in ("n_train", "bins", "preprocessing"):
        assert key in card
    p = card["privacy"]
    assert p["private"] and p["privacy_unit"] == "example" and p["noise_multiplier"] > 0
    assert p["delta"] == DELTA and p["epsilon"] <= 1.0 + 1e-6 and p["assumptions"]
    # the store was charged what the ledgers charged, for the secure (default) noise
    st = BudgetStore(store)
    for silo in m["per_silo"]:
        led = Counter()
        for e in read_entries(d / "ledgers" / "dp_gbdt" / f"{silo_file(silo)}.jsonl"):
            led.update(events.flatten(e.event))
        assert led and _store_events(st, silo, "dp_gbdt") == led
    # secure noise is the CSPRNG stream (gbdt_programs.noise_stream): no PCG64 caveat
    assert "PCG64" not in " ".join(summary["notes"])


def silo_file(name: str) -> str:
    from silofl.privacy.ledger import silo_file_id
    return silo_file_id(name)


def test_cli_messy_csv_with_dp_sgd_methods_one_sigma_per_silo(tmp_path):
    cfg = _table_cfg(tmp_path, ["local", "fedavg", "dp_gbdt"])
    res = _cli(tmp_path, cfg)
    assert res.exit_code == 0, res.output
    d = tmp_path / "runs" / "job"
    privacy = json.loads((d / "privacy_report.json").read_text())
    by = privacy["methods"]
    for k, comb in enumerate(privacy["combined"]):
        sigmas = {by[m][k]["noise_multiplier"] for m in ("local", "fedavg", "dp_gbdt")}
        assert len(sigmas) == 1  # one σ_k for the job's composition
        assert "3 methods composed" in by["dp_gbdt"][k]["calibrated_for"]
        assert comb["epsilon"] <= 1.0 + 1e-6 and comb["epsilon"] > 0.95
    # the bins: declared [lower, upper] mapped as preprocessing maps them
    man = json.loads((d / "models" / "dp_gbdt" / "manifest.json").read_text())
    card = json.loads((d / "models" / "dp_gbdt" / man["silos"][0]["card"]).read_text())
    names = man["feature_names"]
    bounds = dict(zip(names, card["bins"]["bounds"]))
    assert bounds["age"] == [-1.0, 1.0]  # no declared mean/scale: [18, 90] → [-1, 1]
    assert bounds["bp"] == [-2.5, 3.5]   # (80 − 130)/20, (200 − 130)/20
    assert bounds["smoker"] == [0.0, 1.0] and bounds["sex=F"] == [0.0, 1.0]


def test_api_regression_trees_only(tmp_path):
    cfg = config_from_dict(_table_cfg(tmp_path, ["dp_gbdt"], regression=True,
                                      trees={"clip_g": 2.0, "local_trees": 2}))
    rep = silofl.run(cfg, out_dir=tmp_path / "runs")
    r = rep.results[0]
    assert r.metric == "mse" and set(r.final_metrics) == {"mse"}
    assert np.isfinite(r.final_pooled) and len(r.history.rounds) == 6  # 4 shared + 2 local
    assert all(len(e.trees) == 6 for e in r.params)
    assert rep.quality["dp_gbdt"]["baseline"]["name"] == "MSE of predicting the test mean"
    pred = silofl.load_run(rep.run_dir).predictor("north")  # the saved personal model
    rows = pd.read_csv(tmp_path / "visits.csv").head(20)
    np.testing.assert_allclose(pred.predict(rows), r.params[0].predict(pred.transform(rows)),
                               rtol=0, atol=1e-12)
    assert pred.predict_frame(rows).columns.tolist() == ["prediction"]


def test_store_charge_equals_an_independent_dp_accounting_composition(tmp_path):
    cfg = _table_cfg(tmp_path, ["dp_gbdt"], trees={"trees": 5, "depth": 3})
    rep = silofl.run(config_from_dict(cfg), out_dir=tmp_path / "runs")
    st = BudgetStore(tmp_path / "store.sqlite")
    r = rep.results[0]
    for k, silo in enumerate(r.silos):
        sigma = r.plans[k].noise_multiplier
        # independent: 5 trees × (3 levels + leaves) Gaussian releases, PLD accountant
        acc = dpa.pld.PLDAccountant().compose(dpa.GaussianDpEvent(sigma), 5 * 4)
        eps = acc.get_epsilon(DELTA)
        assert _store_events(st, silo, "dp_gbdt") == Counter({dpa.GaussianDpEvent(sigma): 20})
        spent = st.spent(silo)
        assert spent["epsilon_pld"] == pytest.approx(eps, rel=1e-3)
        assert eps <= 1.0 + 1e-4 and eps > 0.98  # calibrated to the target


@pytest.mark.parametrize("trees,other,what", [
    ({"depth": 0}, {}, "[trees] depth"),
    ({"subsample": 0.0}, {}, "[trees] subsample"),
    ({"splits": "best"}, {}, "[trees] splits"),
    ({"clip_h": "big"}, {}, "[trees] clip_h"),
    ({"bins": "private", "bins_share": 1.0}, {}, "bins_share"),
    ({"n_bins": "many"}, {}, "[trees] n_bins"),
    ({"trees": "lots"}, {}, "[trees] trees"),
    ({"bins_share": 0.3}, {}, "bins_share"),
    ({}, {"privacy": {"unit": "person", "epsilon": 1.0},
          "data": {"person_column": "pid", "drop": ["visit", "cost"]}}, "unit = \"example\""),
    ({}, {"data": {"standardize": "uncharged"}}, "standardized per silo"),
    ({}, {"model": {"metric": "mse"}}, "does not fit a binary task"),
])
def test_bad_trees_values_exit_2_and_charge_nothing(tmp_path, trees, other, what):
    cfg = _table_cfg(tmp_path, ["fedavg", "dp_gbdt"], trees=trees, **other)
    res = _cli(tmp_path, cfg)
    assert res.exit_code == 2, res.output
    assert what in " ".join(res.output.split())
    st = tmp_path / "store.sqlite"
    assert not st.exists() or not any(BudgetStore(st).charges(s) for s in BudgetStore(st).silos())
    assert not (tmp_path / "runs" / "job").exists()


def test_multiclass_label_is_refused_with_what_to_do(tmp_path):
    cfg = _table_cfg(tmp_path, ["dp_gbdt"])
    schema = (tmp_path / "schema.toml").read_text().replace(
        'kind = "binary"\nclasses = [0, 1]', 'kind = "multiclass"\nclasses = [0, 1, 2]', 1)
    (tmp_path / "schema.toml").write_text(schema)
    with pytest.raises(ConfigError, match="multiclass.*softmax"):
        silofl.run(config_from_dict(cfg), out_dir=tmp_path / "runs")
    assert not (tmp_path / "store.sqlite").exists()


def test_predict_round_trip_matches_tree_ensemble_and_xgboost(tmp_path):
    import xgboost as xgb
    cfg = _table_cfg(tmp_path, ["dp_gbdt"], trees={"trees": 6, "depth": 3})
    rep = silofl.run(config_from_dict(cfg), out_dir=tmp_path / "runs")
    rows = pd.read_csv(tmp_path / "visits.csv", keep_default_na=False).sample(50, random_state=0)
    rows.to_csv(tmp_path / "new.csv", index=False)
    out = tmp_path / "pred.csv"
    res = runner.invoke(app, ["predict", "--run", str(rep.run_dir), "--silo", "south",
                              "--data", str(tmp_path / "new.csv"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    pred = silofl.load_run(rep.run_dir).predictor("south")
    X = pred.transform(pd.read_csv(tmp_path / "new.csv"))
    ens = rep.results[0].params[1]
    want = ens.predict(X)
    np.testing.assert_allclose(pd.read_csv(out)["score"], want, rtol=0, atol=1e-6)
    d = rep.run_dir / "models" / "dp_gbdt"
    man = json.loads((d / "manifest.json").read_text())
    booster = xgb.Booster()
    booster.load_model(str(d / man["silos"][1]["xgboost"]))
    assert "sex=(missing)" in man["xgboost_feature_names"]  # XGBoost refuses "<"
    got = booster.predict(xgb.DMatrix(X.astype(np.float32),
                                      feature_names=man["xgboost_feature_names"]))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert want.std() > 0  # the trees split: a constant would pass trivially


def test_interrupted_run_settles_what_executed_and_resume_restarts_the_trees(tmp_path,
                                                                          monkeypatch):
    from silofl.training import histograms
    cfg = _table_cfg(tmp_path, ["dp_gbdt"], trees={"trees": 4, "depth": 2},
                     budget={"epsilon": 3.0})
    real, calls = histograms.SiloHistograms.level_histograms, {"n": 0}

    def interrupted(self, level, rng):
        calls["n"] += 1
        if calls["n"] == 3 * 3 + 1:  # tree 1, level 1 of the first silo (3 silos)
            raise KeyboardInterrupt
        return real(self, level, rng)
    monkeypatch.setattr(histograms.SiloHistograms, "level_histograms", interrupted)
    with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match="NEW budget store"):
        silofl.run(config_from_dict(cfg), out_dir=tmp_path / "runs")
    st = BudgetStore(tmp_path / "store.sqlite")
    run_dir = tmp_path / "runs" / "job"
    sigma = None
    before = {"north": 5, "south": 4, "east": 4}  # each silo charges its own release just
    # before it reads: the first silo paid tree 1 level 1, the others never reached it
    for silo in ("north", "south", "east"):
        got = _store_events(st, silo, "dp_gbdt")  # tree 0 (3 releases) + tree 1 level 0 (, 1)
        (sigma, n), = got.items()
        assert n == before[silo]
        assert st.spent(silo)["unfinished_runs"] == 0  # settled, not left reserved
    monkeypatch.setattr(histograms.SiloHistograms, "level_histograms", real)
    rep = resume_run(run_dir)
    assert "dp_gbdt: from its start" in " ".join(rep.notes())
    for silo in ("north", "south", "east"):
        # the killed run's releases stay charged; the resumed run charged all 4 × 3 again
        assert _store_events(st, silo, "dp_gbdt") == Counter({sigma: before[silo] + 12})
    assert len(rep.results[0].ensemble.trees) == 4


KILLER = """
import json, os, sys
from silofl.training import histograms
real, calls = histograms.SiloHistograms.level_histograms, {"n": 0}
def killed(self, level, rng):
    calls["n"] += 1
    if calls["n"] == 10:  # tree 1, level 1 of the first silo: the process dies, unsettled
        os._exit(9)
    return real(self, level, rng)
histograms.SiloHistograms.level_histograms = killed
import silofl
from silofl.config import config_from_dict
silofl.run(config_from_dict(json.loads(open(sys.argv[1]).read())), out_dir=sys.argv[2])
"""


def test_killed_run_is_settled_by_resume_which_restarts_the_trees(tmp_path):
    import os
    import subprocess
    import sys
    cfg = _table_cfg(tmp_path, ["dp_gbdt"], trees={"trees": 4, "depth": 2},
                     budget={"epsilon": 3.0})
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    proc = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path / "cfg.json"),
                           str(tmp_path / "runs")], capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 9, proc.stderr.decode()[-2000:]
    st = BudgetStore(tmp_path / "store.sqlite")
    assert st.spent("north")["unfinished_runs"] == 1  # the whole reservation still counts
    rep = resume_run(tmp_path / "runs" / "job")
    for silo in ("north", "south", "east"):
        # settled to the releases it executed before dying (the first silo had paid tree 1
        # level 1, the others not), then the full ensemble again
        (sigma, _), = _store_events(st, silo, "dp_gbdt").items()
        done = 5 if silo == "north" else 4
        assert _store_events(st, silo, "dp_gbdt") == Counter({sigma: done + 12})
        assert st.spent(silo)["unfinished_runs"] == 0
    assert len(rep.results[0].ensemble.trees) == 4


def test_sweep_refuses_dp_gbdt_with_what_to_use():
    from silofl.config.sweep import SweepSection
    from silofl.experiments.sweep_config import validate_sweep
    with pytest.raises(ConfigError, match="silofl run"):
        validate_sweep(SweepSection(methods=["fedavg", "dp_gbdt"]))


def test_trees_only_job_checks_its_metric_before_any_charge(tmp_path):
    bad = _table_cfg(tmp_path, ["dp_gbdt"], model={"metric": "mse"})
    with pytest.raises(ConfigError, match="does not fit a binary task"):
        silofl.run(config_from_dict(bad), out_dir=tmp_path / "runs")
    assert not (tmp_path / "store.sqlite").exists()
    cfg = _table_cfg(tmp_path, ["dp_gbdt"], model={"metric": "roc_auc"})
    r = silofl.run(config_from_dict(cfg), out_dir=tmp_path / "runs").results[0]
    assert r.metric == "roc_auc" and set(r.final_metrics) == {"roc_auc", "accuracy"}
    assert r.final_per_silo == list(r.final_metrics["roc_auc"].values())


def test_resume_keeps_a_finished_tree_ensemble_and_charges_it_once(tmp_path):
    cfg = _table_cfg(tmp_path, ["dp_gbdt", "local"], budget={"epsilon": 3.0},
                     training={"rounds": 4})

    def stop(label, t, total, pooled):
        if label == "local" and t == 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match="NEW budget"):
        silofl.run(config_from_dict(cfg), out_dir=tmp_path / "runs", on_progress=stop)
    st = BudgetStore(tmp_path / "store.sqlite")
    before = {s: _store_events(st, s, "dp_gbdt") for s in ("north", "south", "east")}
    assert all(sum(c.values()) == 4 * 3 for c in before.values())
    rep = resume_run(tmp_path / "runs" / "job")
    trees = rep.results[0]
    assert trees.method["name"] == "dp_gbdt" and len(trees.ensemble.trees) == 4
    assert {s: _store_events(st, s, "dp_gbdt") for s in before} == before  # not re-run
    pred = silofl.load_run(rep.run_dir).predictor("east", "dp_gbdt")
    rows = pd.read_csv(tmp_path / "visits.csv").head(10)
    np.testing.assert_allclose(pred.predict(rows), trees.params[2].predict(
        pred.transform(rows)), rtol=0, atol=1e-12)


def test_private_bins_and_personal_leaves_in_a_job_charge_the_declared_event(tmp_path):
    # issue 24 items 1-2 through `silofl.run`: the store holds the bins release and the
    # cyclic trees' leaf releases, exactly what the job declared and calibrated
    from silofl.training.private_bins import bins_sigma
    cfg = _table_cfg(tmp_path, ["dp_gbdt"], trees={
        "trees": "auto", "depth": "auto", "n_bins": "auto", "splits": "cyclic",
        "bins": "private", "bins_share": 0.2, "shrink": "auto"})
    rep = silofl.run(config_from_dict(cfg), out_dir=tmp_path / "runs")
    st = BudgetStore(tmp_path / "store.sqlite")
    r = rep.results[0]
    T = 2 * len(r.params[0].feature_names)  # auto: two passes over the features
    for k, silo in enumerate(r.silos):
        sigma = r.plans[k].noise_multiplier
        bins = dpa.GaussianDpEvent(bins_sigma(sigma, 0.2, T))
        assert _store_events(st, silo, "dp_gbdt") == Counter(
            {bins: 1, dpa.GaussianDpEvent(sigma): T})
        acc = dpa.pld.PLDAccountant().compose(bins).compose(dpa.GaussianDpEvent(sigma), T)
        assert 0.97 < acc.get_epsilon(DELTA) <= 1.0 + 1e-4
    d = rep.run_dir / "models" / "dp_gbdt"
    man = json.loads((d / "manifest.json").read_text())
    card = json.loads((d / man["silos"][0]["card"]).read_text())
    assert "private quantiles" in card["bins"]["source"]
    assert "personal leaves" in card["personal"]


def test_trees_section_defaults_are_train_dp_gbdts_defaults():
    """[trees] (config.run.TreesConfig) and train_dp_gbdt state their defaults each; a job
    with an empty [trees] section must train what the library trains by default."""
    from silofl.algorithms.gbdt_method import default_settings
    from silofl.config import Config
    from silofl.experiments.run_trees import trees_kwargs
    got = trees_kwargs(Config())
    assert {k: got[k] for k in default_settings()} == default_settings()

"""Saved models: every run keeps its models with cards; `load_run` / `silofl predict` apply
them with the saved preprocessing and reproduce the run's reported per-silo test metrics."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from silofl import load_run
from silofl.cli import app
from silofl.config import config_from_dict
from silofl.data.encoding import encode_table
from silofl.data.federation import split_indices
from silofl.data.heart import (
    SILO_COLUMN,
    TARGET,
    heart_disease_frame,
    heart_schema,
    load_heart_disease_raw,
)
from silofl.data.schema import schema_from_dict
from silofl.errors import ConfigError, DataError
from silofl.experiments.artifacts import FORMAT_VERSION, NON_PRIVATE, POST_PROCESSING
from silofl.experiments.run import run as run_experiment
from silofl.models.metrics import metric_fn
from silofl.privacy.ledger import silo_file_id
from silofl.runtime.job import fingerprints

logging.getLogger("absl").setLevel(logging.ERROR)
runner = CliRunner()

SCHEMA = {
    "source": "test fixture: documented ranges",
    "silo_column": "site",
    "label": {"name": "y", "kind": "binary", "classes": ["no", "yes"]},
    "columns": [
        {"name": "age", "kind": "numeric", "lower": 0, "upper": 100, "nullable": True},
        {"name": "dose", "kind": "numeric", "lower": -5, "upper": 5},
        {"name": "smoker", "kind": "binary", "nullable": True},
        {"name": "arm", "kind": "categorical", "levels": ["a", "b", "c"]},
    ],
}


def _table(seed=0, n=360) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    site = rng.choice(["north", "south", "east"], n)
    age = rng.uniform(10, 90, n)
    dose = rng.normal(0, 2, n)
    smoker = rng.integers(0, 2, n).astype(float)
    arm = rng.choice(["a", "b", "c"], n)
    z = 0.04 * (age - 50) + 0.8 * dose + smoker - (arm == "c") + rng.normal(0, 1, n)
    df = pd.DataFrame({"site": site, "age": age, "dose": dose, "smoker": smoker,
                       "arm": arm, "y": np.where(z > 0, "yes", "no")})
    df.loc[rng.random(n) < 0.1, "age"] = np.nan
    df.loc[rng.random(n) < 0.1, "smoker"] = np.nan
    return df


def _test_rows(df, silo_column, label, schema, seed=0, test_fraction=0.2) -> dict:
    """Each silo's raw test rows, split exactly as the table loader splits them."""
    enc = encode_table(df, label, silo_column=silo_column, schema=schema)
    codes, order = pd.factorize(pd.Series(enc.silos, dtype=object), sort=False)
    rng = np.random.default_rng(seed)
    out = {}
    for k, name in enumerate(order):
        idx = enc.rows[codes == k]
        _, te = split_indices(len(idx), test_fraction, rng)
        out[str(name)] = df.iloc[idx[te]].reset_index(drop=True)
    return out


def _labels(rows, label, classes) -> np.ndarray:
    index = {c: i for i, c in enumerate(classes)}
    return np.array([index[v] for v in rows[label]])


def _heart_rows() -> dict:
    df = heart_disease_frame()
    df[TARGET] = (df["num"] > 0).astype("int64")
    return _test_rows(df.drop(columns=["id", "num"]), SILO_COLUMN, TARGET, heart_schema())


@pytest.fixture(scope="module")
def heart_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("heart")
    res = runner.invoke(app, ["run", "--scratch", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def _table_cfg(tmp, df, **data):
    path = tmp / "table.csv"
    df.to_csv(path, index=False)
    (tmp / "schema.toml").write_text(schema_from_dict(SCHEMA).to_toml())
    return config_from_dict({
        "data": {"source": "table", "path": str(path), "silo_column": "site",
                 "label_column": "y", "schema": str(tmp / "schema.toml"), **data},
        "model": {"name": "logistic"},
        "training": {"methods": ["local", "fedavg", "mrmtl"], "rounds": 8,
                     "batch_size": 8, "lr": 0.2},
        "privacy": {"epsilon": 2.0, "delta": 1e-4, "noise": "seeded"},
        "budget": {"scratch": True}})


def _check_reproduces(run_dir: Path, rows: dict, label: str, classes, cli_tmp=None):
    summary = json.loads((run_dir / "summary.json").read_text())
    saved = load_run(run_dir)
    assert {m["method"] for m in summary["methods"]} == set(saved.methods)
    for m in summary["methods"]:
        fn = metric_fn(m["metric"], saved.manifest(m["method"])["model"]["name"])
        for silo, want in m["per_silo"].items():
            y = _labels(rows[silo], label, classes)
            pred = saved.predictor(silo, m["method"])
            assert fn(y, pred.predict(rows[silo])) == want  # exactly the reported metric
            if cli_tmp is not None:
                src, dst = cli_tmp / "in.csv", cli_tmp / f"out-{silo_file_id(silo)}.csv"
                rows[silo].to_csv(src, index=False)
                res = runner.invoke(app, ["predict", "--run", str(run_dir), "--silo", silo,
                                          "--method", m["method"], "--data", str(src),
                                          "--out", str(dst)])
                assert res.exit_code == 0, res.output
                assert "no privacy budget" in " ".join(res.output.split())
                got = pd.read_csv(dst)
                assert len(got) == len(rows[silo])
                assert fn(y, got["score"].to_numpy()) == want


def test_heart_models_reproduce_metrics_api_and_cli(heart_run, tmp_path):
    rows = _heart_rows()
    _check_reproduces(heart_run, rows, TARGET, [0, 1], cli_tmp=tmp_path)
    saved = load_run(heart_run)
    assert saved.shared("fedavg").shape == (35,)
    assert saved.shared("local") is None


def test_heart_model_card(heart_run):
    saved = load_run(heart_run)
    label = saved.method("mrmtl")
    card = saved.model_card("Cleveland", label)
    files = sorted(p.name for p in (heart_run / "models" / label).iterdir())
    fid = silo_file_id("Cleveland")
    assert f"card-{fid}.json" in files and f"model-{fid}.npz" in files
    assert card["format_version"] == FORMAT_VERSION and card["silofl_version"]
    assert card["method"]["name"] == "mrmtl" and card["method"]["lam"] == 0.3
    assert card["hyperparameters"]["rounds"] == 30
    pre = card["preprocessing"]
    assert pre["feature_names"] == heart_schema().feature_names
    assert pre["standardize"]["age"] == [59.0, 41.0]  # declared bounds 18..100
    assert pre["schema"]["label"]["name"] == TARGET
    # the card names the run; the hash of the records stays in the silo's store
    summary = json.loads((heart_run / "summary.json").read_text())
    assert card["data_fingerprint"]["run"] == summary["run_id"]
    raw = fingerprints(load_heart_disease_raw())
    assert raw and not any(fp in json.dumps(card) for fp in raw.values())
    priv = card["privacy"]
    assert priv["private"] and "add/remove one record" in priv["adjacency"]
    assert priv["delta"] == 1e-4 and priv["noise"] == "secure"
    assert priv["epsilon"] == min(priv["epsilon_rdp"], priv["epsilon_pld"])
    assert priv["job"]["epsilon"] <= 1.0
    assert any("scratch" in n for n in priv["notes"])
    privacy = json.loads((heart_run / "privacy_report.json").read_text())
    want = [r for r in privacy["methods"][label] if r["silo"] == "Cleveland"][0]
    assert priv["epsilon"] == want["epsilon"]
    with np.load(heart_run / "models" / label / f"model-{fid}.npz") as z:
        assert z["params"].shape == (35,)
        assert json.loads(str(z["spec"]))["name"] == "logistic"


def test_sklearn_export_matches(heart_run):
    pytest.importorskip("sklearn")
    rows = _heart_rows()["Hungary"]
    pred = load_run(heart_run).predictor("Hungary", "mrmtl")
    est = pred.to_sklearn()
    X = pred.transform(rows)
    np.testing.assert_allclose(est.predict_proba(X)[:, 1], pred.predict(rows), rtol=1e-12)
    assert (est.predict(X) == pred.predict_frame(rows)["class"].to_numpy()).all()


def test_schema_table_and_sklearn_glms(tmp_path):
    df = _table()
    schema = schema_from_dict(SCHEMA)
    rows = _test_rows(df, "site", "y", schema)
    rep = run_experiment(_table_cfg(tmp_path, df), tmp_path / "runs")
    _check_reproduces(rep.run_dir, rows, "y", ["no", "yes"], cli_tmp=tmp_path)
    card = load_run(rep.run_dir).model_card("north", "local")
    assert "reproducible noise" in card["privacy"]["statement"]
    assert card["preprocessing"]["fill"]["age"] == 50.0  # midpoint of declared bounds
    # the other GLMs export too
    pytest.importorskip("sklearn")
    for model, methods in (("svm", ["local"]), ("softmax", ["local"])):
        cfg = _table_cfg(tmp_path, df)
        cfg.model.name, cfg.training.methods = model, methods
        rep = run_experiment(cfg, tmp_path / model)
        pred = load_run(rep.run_dir).predictor("south")
        X, est = pred.transform(rows["south"]), pred.to_sklearn()
        s = pred.predict(rows["south"])
        if model == "svm":
            np.testing.assert_allclose(est.decision_function(X), s, rtol=1e-12, atol=1e-12)
        else:
            np.testing.assert_allclose(est.predict_proba(X), s, rtol=1e-10, atol=1e-12)
        assert list(est.predict(X)) == list(pred.predict_frame(rows["south"])["class"])


def test_linear_regression_exports(tmp_path):
    pytest.importorskip("sklearn")
    df = _table()
    df["y"] = df["dose"] * 2.0 + 1.0
    schema = dict(SCHEMA, label={"name": "y", "kind": "regression", "lower": -20, "upper": 20})
    cfg = _table_cfg(tmp_path, df)
    (tmp_path / "schema.toml").write_text(schema_from_dict(schema).to_toml())
    cfg.model.name, cfg.model.metric, cfg.training.methods = "linear", "mse", ["fedavg"]
    rep = run_experiment(cfg, tmp_path / "lin")
    rows = _test_rows(df, "site", "y", schema_from_dict(schema))
    saved = load_run(rep.run_dir)
    for silo, want in rep.summary()["methods"][0]["per_silo"].items():
        pred = saved.predictor(silo)
        s = pred.predict(rows[silo])
        assert metric_fn("mse", "linear")(rows[silo]["y"].to_numpy(), s) == want
        np.testing.assert_allclose(pred.to_sklearn().predict(pred.transform(rows[silo])), s,
                                   rtol=1e-12, atol=1e-12)
        assert list(pred.predict_frame(rows[silo]).columns) == ["prediction"]


def test_private_standardization_constants_saved_and_used(tmp_path):
    df = _table(seed=1)
    rows = _test_rows(df, "site", "y", schema_from_dict(SCHEMA))
    rep = run_experiment(_table_cfg(tmp_path, df, standardize="private", impute="private"),
                         tmp_path / "runs")
    saved = load_run(rep.run_dir)
    for silo in saved.silos("local"):
        pre = saved.model_card(silo, "local")["preprocessing"]
        center, scale = pre["standardize"]["age"]
        assert (center, scale) != (50.0, 50.0)  # noisy, not the declared midpoint/half-range
        assert rep.release["constants"]["silos"][silo]["standardize"]["age"] == [center, scale]
        assert any(s["mode"] == "private" for s in pre["steps"]["steps"])
    _check_reproduces(rep.run_dir, rows, "y", ["no", "yes"])


def test_nonprivate_cards_say_so(tmp_path):
    res = runner.invoke(app, ["run", "--no-privacy", "--out", str(tmp_path), "-q"])
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    saved = load_run(run_dir)
    for m in saved.methods:
        for silo in saved.silos(m):
            priv = saved.model_card(silo, m)["privacy"]
            assert not priv["private"] and priv["statement"] == NON_PRIVATE
            assert "NON-PRIVATE" in " ".join(priv["notes"])
    _check_reproduces(run_dir, _heart_rows(), TARGET, [0, 1])


@pytest.mark.parametrize("case", ["silo", "method", "ambiguous", "columns", "no-models"])
def test_bad_predict_input_exits_2_and_writes_nothing(heart_run, tmp_path, case):
    rows = _heart_rows()["Cleveland"]
    src, out = tmp_path / "in.csv", tmp_path / "preds.csv"
    rows.to_csv(src, index=False)
    args = {"run": str(heart_run), "silo": "Cleveland", "method": "fedavg"}
    if case == "silo":
        args["silo"] = "Clevelandd"
    elif case == "method":
        args["method"] = "ditto"
    elif case == "ambiguous":
        del args["method"]
    elif case == "columns":
        rows.drop(columns=["age", "chol"]).to_csv(src, index=False)
    else:
        (tmp_path / "empty").mkdir()
        args["run"] = str(tmp_path / "empty")
    cmd = ["predict", "--data", str(src), "--out", str(out)]
    for k, v in args.items():
        cmd += [f"--{k}", v]
    res = runner.invoke(app, cmd)
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["in.csv"]
    expect = {"silo": "'VA Long Beach'", "method": "'mrmtl(λ=0.3)'", "ambiguous": "'local'",
              "columns": "'age'", "no-models": "no saved models"}[case]
    assert expect in text


def test_api_errors(heart_run):
    saved = load_run(heart_run)
    with pytest.raises(ConfigError, match="Hungary"):
        saved.predictor("Nowhere", "local")
    with pytest.raises(DataError, match="shape"):
        saved.predictor("Hungary", "local").predict(np.zeros((2, 3)))
    with pytest.raises(ConfigError, match="not found"):
        load_run(heart_run / "nope")
    assert POST_PROCESSING.startswith("Predicting is post-processing")


def test_torch_mlp_saved_and_reproduced(tmp_path):
    pytest.importorskip("torch")
    cfg = config_from_dict({"model": {"name": "mlp", "hidden": [8]},
                            "training": {"methods": ["fedavg"], "rounds": 3},
                            "budget": {"scratch": True}})
    rep = run_experiment(cfg, tmp_path)
    _check_reproduces(rep.run_dir, _heart_rows(), TARGET, [0, 1])
    saved = load_run(rep.run_dir)
    spec = saved.manifest()["model"]
    assert spec["options"]["hidden"] == [8] and spec["architecture"][0] == ["0.weight", [8, 34]]
    assert saved.shared().shape == (spec["num_params"],)
    with pytest.raises(ConfigError, match="no scikit-learn counterpart"):
        saved.predictor("Hungary").to_sklearn()


def test_sklearn_missing_names_the_install(heart_run, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "sklearn", None)  # import sklearn now fails
    with pytest.raises(ConfigError, match="pip install scikit-learn"):
        load_run(heart_run).predictor("Hungary", "local").to_sklearn()


def test_version_option():
    from silofl._version import silofl_version
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and silofl_version() in res.output

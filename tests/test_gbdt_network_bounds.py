"""Networked dp_gbdt bins each feature over its DECLARED range after the declared
preprocessing, the same rule as `silofl run` (`silofl.data.bounds.feature_bounds`): the job
carries the bounds derived from the server's schema, every silo checks them against its own
schema at join (refusing before any charge), the trees equal the simulator's with those
bounds, and the saved models predict as the run path's for the same seed and split."""

from __future__ import annotations

import json
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

pytest.importorskip("flwr")

from silofl.algorithms.dp_gbdt import train_dp_gbdt  # noqa: E402
from silofl.cli import app  # noqa: E402
from silofl.data.federation import Federation  # noqa: E402
from silofl.errors import ConfigError  # noqa: E402
from silofl.experiments.artifacts import load_run  # noqa: E402
from silofl.privacy.ledger import Ledger  # noqa: E402
from silofl.runtime.job import accountant_kind  # noqa: E402
from silofl.runtime.network import consortium, deploy, release  # noqa: E402
from silofl.runtime.network import messages as W  # noqa: E402
from silofl.runtime.network.server import ServerProgram, load_server_config  # noqa: E402
from silofl.runtime.network.silo import SiloProgram, new_nonce  # noqa: E402
from silofl.runtime.network.silo_config import load_silo_config  # noqa: E402
from test_gbdt_network import _charges, _run, _same_trees  # noqa: E402
from test_network import DELTA  # noqa: E402
from test_network_deploy import HOSPITALS, SCHEMA, messy_table  # noqa: E402

runner = CliRunner()
TREES = {"trees": 3, "depth": 2, "n_bins": 8, "splits": "histogram"}
#: chol [0, 600] standardized by a declared mean/scale: (x − 250)/100 ∈ [−2.5, 3.5]
CHOL = "name = \"chol\"\nkind = \"numeric\"\nlower = 0\nupper = 600\n"


def _schema(tmp: Path, chol: str = CHOL + "mean = 250\nscale = 100\n") -> Path:
    text = SCHEMA.read_text()
    assert CHOL in text
    path = tmp / "schema.toml"
    path.write_text(text.replace(CHOL, chol))
    return path


def _tables(tmp: Path) -> list[str]:
    """The three hospitals' messy tables, each row with a person id (so that a silo's
    own split and the run path's are the same keyed hash of (seed, id))."""
    df = messy_table(tmp / "all.csv")
    df["pid"] = [f"p{i:04d}" for i in range(len(df))]
    df.to_csv(tmp / "all.csv", index=False)
    for n in HOSPITALS:
        df[df["dataset"] == n].to_csv(tmp / f"{n}.csv", index=False)
    return [f"{n}={tmp / f'{n}.csv'}" for n in HOSPITALS]


def _consortium(tmp: Path, schema: Path, standardize: str) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = consortium.init(tmp / "c", schema=schema, silos=HOSPITALS, noise="seeded",
                            tables=_tables(tmp), epsilon=1.0, delta=DELTA,
                            job={"method": "dp_gbdt", "trees": TREES,
                                 "standardize": standardize})
    for p in w["silos"].values():
        raw = tomllib.loads(Path(p).read_text())
        raw["silo"]["methods"] = ["dp_gbdt"]
        raw["data"]["person_column"] = "pid"
        Path(p).write_text(deploy._toml(raw))
    return w


def _programs(w: dict):
    srv = ServerProgram(load_server_config(w["server"]))
    return srv, {n: SiloProgram(load_silo_config(p)) for n, p in w["silos"].items()}


def _run_path(tmp: Path, schema: Path, standardize: str, seed: int) -> Path:
    """`silofl run` of dp_gbdt on the same rows, schema, preprocessing and seed."""
    cfg = {"data": {"source": "table", "path": str(tmp / "all.csv"), "silo_column": "dataset",
                    "label_column": "disease", "schema": str(schema), "person_column": "pid",
                    "standardize": standardize},
           "training": {"methods": ["dp_gbdt"], "seed": seed},
           "privacy": {"epsilon": 1.0, "delta": DELTA, "noise": "seeded"},
           "trees": TREES, "budget": {"store": str(tmp / "run-store.sqlite")},
           "output": {"name": "job"}}
    path = tmp / "job.toml"
    path.write_text(tomli_w.dumps(cfg))
    res = runner.invoke(app, ["run", "--config", str(path), "--out", str(tmp / "runs"), "-q"])
    assert res.exit_code == 0, res.output
    return next((tmp / "runs").glob("*/models")).parent


@pytest.mark.parametrize("standardize", ["declared", "none"])
def test_network_bins_the_declared_bounds_like_the_run_path(tmp_path, standardize):
    xgb = pytest.importorskip("xgboost")  # noqa: F841  (the cards' XGBoost files)
    schema = _schema(tmp_path)
    w = _consortium(tmp_path, schema, standardize)
    srv, silos = _programs(w)
    bounds = np.array(json.loads(srv.job["bounds"]))
    names = list(srv.gbdt.feature_names)
    chol, age = names.index("chol"), names.index("age")
    want_chol = [-2.5, 3.5] if standardize == "declared" else [0.0, 600.0]
    want_age = [-1.0, 1.0] if standardize == "declared" else [18.0, 100.0]
    np.testing.assert_allclose(bounds[chol], want_chol, rtol=0, atol=1e-12)
    np.testing.assert_allclose(bounds[age], want_age, rtol=0, atol=1e-12)
    assert (bounds[[j for j, n in enumerate(names) if n.startswith("sex=")]] == [0, 1]).all()
    _run(srv, silos)
    np.testing.assert_array_equal(srv.gbdt.bounds, bounds)
    for s in silos.values():
        np.testing.assert_array_equal(s.gbdt.silo.bounds, bounds)
    # the simulator on the silos' own preprocessed rows with the same bounds
    job, order = srv.job, [silos[n] for n in HOSPITALS]
    fed = Federation([s.silo for s in order], names, job["task"], job["num_classes"])
    leds = [Ledger(s.cfg.name, s.cfg.target, accountant_kind(job["accountant"])) for s in order]
    sim = train_dp_gbdt(fed, **TREES, bounds=bounds, seed=job["seed"], ledgers=leds,
                        noise="seeded")
    _same_trees(srv.gbdt.server.ensemble, sim.ensemble)
    # the run path: the same bounds in its card, the same predictions from its folders
    run_dir = _run_path(tmp_path, schema, standardize, int(job["seed"]))
    server_dir = release.save_server_release(srv)
    rows = pd.read_csv(tmp_path / "all.csv").drop(columns=["disease", "pid"]).head(60)
    for n, s in silos.items():
        assert release.save_silo_release(s) == Path(s.cfg.release_dir)
        run_card = load_run(run_dir).model_card(n)
        card = load_run(s.cfg.release_dir).model_card(n)
        np.testing.assert_allclose(card["bins"]["bounds"], run_card["bins"]["bounds"],
                                   rtol=0, atol=1e-12)
        assert card["bins"]["source"] == run_card["bins"]["source"]
        assert "declared schema" in card["bins"]["bounds_from"]
        report = json.loads(next(Path(s.cfg.release_dir).glob("gbdt-*-privacy.json"))
                            .read_text())
        assert report["bins"]["bounds"] == bounds.tolist()
        want = load_run(run_dir).predictor(n).predict(rows)
        for where, silo in ((s.cfg.release_dir, n), (server_dir, release.SHARED)):
            got = load_run(where).predictor(silo).predict(rows)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert json.loads((server_dir / "gbdt-privacy.json").read_text())["bins"]["bounds"] \
        == bounds.tolist()


def test_a_silo_refuses_other_bounds_before_any_charge(tmp_path):
    w = _consortium(tmp_path, _schema(tmp_path), "declared")
    srv, silos = _programs(w)
    n, s = next(iter(silos.items()))
    bounds = np.array(json.loads(srv.job["bounds"]))
    bounds[0] = [-1.0, 1.0 + 1e-6]  # a server whose schema or rule differs
    job = {**srv.job, "bounds": json.dumps(bounds.tolist())}
    rep = s.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
                  "job": W.canonical(job).decode()})
    assert rep["status"] == "refused"
    assert "bins' bounds" in rep["reason"] and "Nothing was charged" in rep["reason"]
    assert s.gbdt is None and s.job is None and _charges(s.cfg.budget_store, n) == []
    # a silo whose own schema differs: refused at join too, nothing charged
    (tmp_path / "other").mkdir()
    other = _schema(tmp_path / "other", CHOL + "mean = 300\nscale = 100\n")
    p = Path(w["silos"][n])
    raw = tomllib.loads(p.read_text())
    raw["data"]["schema"] = str(other)
    p.write_text(deploy._toml(raw))
    fresh = SiloProgram(load_silo_config(p))
    rep = fresh.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
                      "job": W.canonical(srv.job).decode()})
    assert rep["status"] == "refused" and "schema" in rep["reason"]
    assert _charges(fresh.cfg.budget_store, n) == []


def test_no_declared_bounds_or_per_silo_scaling_are_refused_as_in_the_run_path(tmp_path):
    no_bounds = _schema(tmp_path, "name = \"chol\"\nkind = \"numeric\"\nfill = 200\n")
    with pytest.raises(ConfigError, match="declares no lower/upper"):
        _consortium(tmp_path, no_bounds, "none")
    with pytest.raises(ConfigError, match="private"):  # per-silo (private) standardization
        (tmp_path / "p").mkdir()
        _consortium(tmp_path / "p", _schema(tmp_path), "private")


def test_a_server_config_stating_other_bounds_is_refused(tmp_path):
    w = _consortium(tmp_path, _schema(tmp_path), "declared")
    path = Path(w["server"])
    raw = tomllib.loads(path.read_text())
    bounds = json.loads(raw["job"]["bounds"])
    assert ServerProgram(load_server_config(path)).job["bounds"] == raw["job"]["bounds"]
    bounds[0] = [-1.0, 2.0]
    raw["job"]["bounds"] = bounds  # a TOML array of pairs: read as the job's JSON
    path.write_text(tomli_w.dumps(raw))
    with pytest.raises(ConfigError, match="bounds = .*the schema gives"):
        load_server_config(path)


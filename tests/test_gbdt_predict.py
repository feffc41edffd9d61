"""Predictions and model cards of tree models as for GLMs: a networked dp_gbdt job (the
in-process harness of test_gbdt_network over the silos' own messy tables) saves its trees
in the run-directory format, so `silofl predict` and `load_run(...).predictor(...)` work
on the server's and each silo's folder, on raw rows encoded by the job's schema, with the
same errors as for GLMs; the cards state the same fields as `silofl run`'s. And a
newcomer's first tree job: a messy CSV + schema, `silofl run --config` with dp_gbdt and
fedavg, then `silofl predict` on new rows."""

from __future__ import annotations

import json
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("flwr")
xgb = pytest.importorskip("xgboost")

from silofl.algorithms.dp_gbdt import train_dp_gbdt  # noqa: E402
from silofl.cli import app  # noqa: E402
from silofl.data.heart import load_heart_disease  # noqa: E402
from silofl.experiments.artifacts import load_run  # noqa: E402
from silofl.privacy.ledger import Ledger  # noqa: E402
from silofl.privacy.targets import ADJACENCY, ASSUMPTIONS, PrivacyTarget  # noqa: E402
from silofl.runtime.job import accountant_kind  # noqa: E402
from silofl.runtime.network import consortium, deploy, release  # noqa: E402
from silofl.runtime.network.server import ServerProgram, load_server_config  # noqa: E402
from silofl.runtime.network.silo import SiloProgram  # noqa: E402
from silofl.runtime.network.silo_config import load_silo_config  # noqa: E402
from test_gbdt_network import _run  # noqa: E402
from test_gbdt_run import _table_cfg  # noqa: E402
from test_network import DELTA, edit_toml  # noqa: E402
from test_network import consortium as demo  # noqa: E402
from test_network_deploy import HOSPITALS, SCHEMA, messy_table  # noqa: E402

runner = CliRunner()
#: shrink and a local tree: each silo's own model differs from the shared one
TREES = {"trees": 3, "depth": 2, "n_bins": 8, "splits": "histogram", "shrink": 0.5,
         "local_trees": 1}
#: what every tree card states, on either path (`runtime.tree_release.tree_card`)
CARD = {"format", "format_version", "silofl_version", "kind", "silo", "file_id", "method",
        "hyperparameters", "model", "task", "classes", "n_train", "bins", "personal",
        "preprocessing", "privacy", "files"}
PRIVACY = {"privacy_unit", "adjacency", "epsilon", "sigma", "bins", "personal_leaves",
           "local_trees", "assumptions", "statement", "noise", "private", "notes"}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A finished networked dp_gbdt job over the three hospitals' messy tables."""
    tmp = tmp_path_factory.mktemp("gbdtpred")
    df = messy_table(tmp / "t.csv")
    for n in HOSPITALS:
        df[df["dataset"] == n].to_csv(tmp / f"{n}.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = consortium.init(tmp / "c", schema=SCHEMA, silos=HOSPITALS, noise="seeded",
                            tables=[f"{n}={tmp / f'{n}.csv'}" for n in HOSPITALS],
                            job={"method": "dp_gbdt", "trees": TREES})
    for p in w["silos"].values():
        raw = tomllib.loads(Path(p).read_text())
        raw["silo"]["methods"] = ["dp_gbdt"]
        Path(p).write_text(deploy._toml(raw))
    srv = ServerProgram(load_server_config(w["server"]))
    silos = {n: SiloProgram(load_silo_config(p)) for n, p in w["silos"].items()}
    _run(srv, silos)
    for s in silos.values():  # as `silofl silo` and the ClientApp do after the last round
        assert release.save_silo_release(s) == Path(s.cfg.release_dir)
    return {"tmp": tmp, "server": srv, "silos": silos,
            "server_dir": release.save_server_release(srv)}


def _booster(folder: Path, silo: str):
    saved = load_run(folder)
    entry = next(s for s in saved.manifest()["silos"] if s["name"] == silo)
    names = saved.manifest()["xgboost_feature_names"]
    return xgb.Booster(model_file=str(folder / "models" / "dp_gbdt" / entry["xgboost"])), names


def test_predict_from_server_and_silo_folders_equals_the_trees(job):
    srv, shared = job["server"], job["server"].gbdt.server.ensemble
    for n, s in job["silos"].items():
        raw_test = s.raw.silos[0].X_test  # encoded, before preprocessing (NaN = missing)
        assert np.isnan(raw_test).any()  # the messy table's gaps reach the cards' fills
        X = s.silo.X_test  # what the silo's trees saw
        folder = Path(s.cfg.release_dir)
        assert sorted(load_run(folder).silos()) == sorted([n, release.SHARED])
        for where, silo, ens in ((folder, n, s.gbdt.personal), (folder, release.SHARED, shared),
                                 (job["server_dir"], release.SHARED, shared)):
            pred = load_run(where).predictor(silo)
            np.testing.assert_allclose(pred.transform(raw_test), X, rtol=0, atol=1e-12)
            got = pred.predict(raw_test)
            np.testing.assert_allclose(got, ens.predict(X), rtol=0, atol=1e-6)
            booster, names = _booster(where, silo)
            np.testing.assert_allclose(booster.predict(xgb.DMatrix(
                X.astype(np.float32), feature_names=names)), got, rtol=0, atol=1e-5)
        own = load_run(folder).predictor(n).predict(raw_test)
        assert not np.allclose(own, load_run(folder).predictor("shared").predict(raw_test))
    assert srv.gbdt.server.done


def test_raw_rows_are_encoded_as_the_silo_encoded_its_table(job):
    """A DataFrame of the silo's own CSV (text levels, blanks) becomes exactly the rows
    the silo trained and tested on (as a set: its split order is its own)."""
    n, s = next(iter(job["silos"].items()))
    rows = pd.read_csv(job["tmp"] / f"{n}.csv")
    pred = load_run(s.cfg.release_dir).predictor(n)
    got = pred.transform(rows)
    want = np.vstack([s.silo.X_train, s.silo.X_test])
    np.testing.assert_allclose(got[np.lexsort(got.T)], want[np.lexsort(want.T)],
                               rtol=0, atol=1e-12)


def test_cli_predict_on_a_silo_and_the_server_folder(job, tmp_path):
    n, s = next(iter(job["silos"].items()))
    rows = pd.read_csv(job["tmp"] / f"{n}.csv").head(40)
    src = tmp_path / "new.csv"
    rows.drop(columns=["disease"]).to_csv(src, index=False)
    for where, silo in ((s.cfg.release_dir, n), (job["server_dir"], release.SHARED)):
        out = tmp_path / f"{silo}.csv"
        res = runner.invoke(app, ["predict", "--run", str(where), "--silo", silo,
                                  "--data", str(src), "--out", str(out)])
        assert res.exit_code == 0, res.output
        frame = pd.read_csv(out)
        assert list(frame.columns) == ["score", "class"] and len(frame) == len(rows)
        want = load_run(where).predictor(silo).predict(rows)
        np.testing.assert_allclose(frame["score"], want, rtol=0, atol=1e-9)
        assert "post-processing" in " ".join(res.output.split())


@pytest.mark.parametrize("case", ["column", "level", "nan"])
def test_bad_rows_exit_2_name_the_column_and_write_nothing(job, tmp_path, case):
    n, s = next(iter(job["silos"].items()))
    rows = pd.read_csv(job["tmp"] / f"{n}.csv").head(10)
    if case == "column":
        rows = rows.drop(columns=["age"])
    elif case == "level":
        rows.loc[rows.index[2], "sex"] = "Femme"
    else:
        rows.loc[rows.index[3], "age"] = np.nan  # age is declared not nullable
    src, out = tmp_path / "in.csv", tmp_path / "preds.csv"
    rows.to_csv(src, index=False)
    for where, silo in ((s.cfg.release_dir, n), (job["server_dir"], release.SHARED)):
        res = runner.invoke(app, ["predict", "--run", str(where), "--silo", silo,
                                  "--data", str(src), "--out", str(out)])
        text = " ".join(res.output.split())
        assert res.exit_code == 2, res.output
        assert not out.exists()
        assert "--data" in text and {"column": "'age'", "level": "column 'sex'",
                                     "nan": "'age'"}[case] in text, text


def test_cards_state_the_same_fields_as_a_run_and_the_privacy_report(job):
    srv = job["server"]
    for n, s in job["silos"].items():
        saved = load_run(s.cfg.release_dir)
        card = saved.model_card(n)
        assert CARD <= set(card) and card["networked"] and card["model"] == {"name": "trees"}
        p = card["privacy"]
        assert PRIVACY <= set(p)
        assert p["privacy_unit"] == "example" and p["adjacency"] == ADJACENCY
        assert p["assumptions"] == list(ASSUMPTIONS)
        assert p["sigma"] == s.reported[2] and 0 < p["epsilon"] <= 1.0 + 1e-9
        assert p["bins"] == {"mode": "schema", "charged": False,
                             "source": card["bins"]["source"]}
        assert "declared schema bounds" in p["bins"]["source"]
        assert p["personal_leaves"].startswith("free") and p["local_trees"].startswith("charged")
        assert card["n_train"] == s.n_train and card["method"]["shrink"] == 0.5
        assert card["preprocessing"]["fill"]  # the declared fills new rows get
        assert "NOT a privacy guarantee" in " ".join(p["notes"])  # seeded noise
        shared = saved.model_card(release.SHARED)
        assert shared["privacy"]["personal_leaves"].startswith("not in this model")
    card = load_run(job["server_dir"]).model_card(release.SHARED)
    assert CARD <= set(card) and PRIVACY <= set(card["privacy"])
    p = card["privacy"]
    assert p["epsilon"] is None and "own card" in p["epsilon_note"]
    assert {k: v["sigma"] for k, v in p["silos"].items()} == {
        n: r.sigma for n, r in srv.silos.items()}


def test_newcomer_messy_csv_run_then_predict_trees_and_fedavg(tmp_path, job):
    """A user's CSV (text levels, blanks, values outside the bounds) + schema: `silofl run
    --config` with dp_gbdt and fedavg, then `silofl predict` on new rows of both."""
    import tomli_w
    cfg = _table_cfg(tmp_path, ["dp_gbdt", "fedavg"])
    (tmp_path / "job.toml").write_text(tomli_w.dumps(cfg))
    res = runner.invoke(app, ["run", "--config", str(tmp_path / "job.toml"), "--out",
                              str(tmp_path / "runs"), "-q"])
    assert res.exit_code == 0, res.output
    new = pd.read_csv(tmp_path / "visits.csv", dtype=str, keep_default_na=False)
    new = new[new["hospital"] == "south"].drop(columns=["y", "cost"])
    assert (new["age"] == "").any() and (new["sex"] == "").any()
    src = tmp_path / "new_visits.csv"
    new.to_csv(src, index=False)
    run_dir = tmp_path / "runs" / "job"
    for method in ("dp_gbdt", "fedavg"):
        out = tmp_path / f"{method}.csv"
        res = runner.invoke(app, ["predict", "--run", str(run_dir), "--silo", "south",
                                  "--method", method, "--data", str(src), "--out", str(out)])
        assert res.exit_code == 0, res.output
        frame = pd.read_csv(out)
        assert len(frame) == len(new) and set(frame["class"]) <= {0, 1}
        assert frame["score"].between(0, 1).all()
        want = load_run(run_dir).predictor("south", method).predict(pd.read_csv(src))
        np.testing.assert_allclose(frame["score"], want, rtol=0, atol=1e-9)
    card = load_run(run_dir).model_card("south", "dp_gbdt")
    assert CARD <= set(card) and PRIVACY <= set(card["privacy"])
    # the networked card has the run's fields (one builder): the run's fingerprint entry
    # is the job hash there, as for GLMs
    n, s = next(iter(job["silos"].items()))
    net = load_run(s.cfg.release_dir).model_card(n)
    assert set(card) - {"data_fingerprint"} == set(net) - {"networked", "job_hash"}
    assert set(card["preprocessing"]) <= set(net["preprocessing"])
    report = json.loads((run_dir / "privacy_report.json").read_text())["methods"]["dp_gbdt"]
    assert card["privacy"]["sigma"] == next(e["noise_multiplier"] for e in report
                                            if e["silo"] == "south") > 0


def test_superlink_route_saves_predictable_folders(tmp_path):
    """Flower's SuperLink route (a fresh silo program per message; the ClientApp saves
    after the last round, the ServerApp at the end): `load_run` on each silo's and the
    server's folder gives the simulator's personal and shared trees (pre-encoded .npz
    silos: arrays in feature order)."""
    from flwr.app import Context, RecordDict

    from silofl.runtime.network import flower_app
    trees = {"trees": 2, "depth": 2, "n_bins": 8, "local_trees": 1, "shrink": 0.5}
    w = demo(tmp_path, job={"method": "dp_gbdt", "trees": trees})
    for p in w["silos"].values():
        edit_toml(p, "silo", methods=["dp_gbdt"])
    grid = flower_app.LoopbackGrid({100 + i: {"silo-config": str(p)}
                                    for i, p in enumerate(w["silos"].values())})
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                  run_config={"server-config": str(w["server"])})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        srv = flower_app.run_server_app(grid, ctx)
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(1.0, DELTA))
    leds = [Ledger(s.name, s.target, accountant_kind(srv.job["accountant"]))
            for s in fed.silos]
    sim = train_dp_gbdt(fed, **trees, seed=srv.job["seed"], ledgers=leds, noise="seeded")
    X = np.vstack([s.X_test for s in fed.silos])
    shared = load_run(srv.cfg.release_dir).predictor(release.SHARED).predict(X)
    np.testing.assert_allclose(shared, sim.ensemble.predict(X), rtol=0, atol=1e-6)
    ens = load_run(srv.cfg.release_dir).shared()  # the manifest's shared ensemble
    np.testing.assert_allclose(ens.predict(X), shared, rtol=0, atol=1e-12)
    for k, p in enumerate(w["silos"].values()):
        saved = load_run(load_silo_config(p).release_dir)
        name = fed.silos[k].name
        np.testing.assert_allclose(saved.predictor(name).predict(X),
                                   sim.personal[k].predict(X), rtol=0, atol=1e-6)
        assert saved.model_card(name)["privacy"]["sigma"] == pytest.approx(
            sim.report[k]["sigma"], rel=1e-12)

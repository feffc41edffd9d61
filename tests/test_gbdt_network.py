"""dp_gbdt over the network: the same silo and server programs as `train_dp_gbdt`, driven
through the silo and server programs of the networked runtime in-process (the transport
is tested in test_network.py): the same trees, the same charges, refusals before any
charge, and the saved models."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest

pytest.importorskip("flwr")

from silofl.algorithms.dp_gbdt import train_dp_gbdt  # noqa: E402
from silofl.data.heart import load_heart_disease  # noqa: E402
from silofl.errors import ConfigError  # noqa: E402
from silofl.privacy import events  # noqa: E402
from silofl.privacy.budget import BudgetStore, BudgetStoreError  # noqa: E402
from silofl.privacy.ledger import Ledger, tightest  # noqa: E402
from silofl.privacy.targets import PrivacyTarget  # noqa: E402
from silofl.runtime.job import accountant_kind  # noqa: E402
from silofl.runtime.network import messages as W  # noqa: E402
from silofl.runtime.network import release  # noqa: E402
from silofl.runtime.network.gbdt_host import load_ensemble  # noqa: E402
from silofl.runtime.network.server import ServerProgram, load_server_config  # noqa: E402
from silofl.runtime.network.silo import SiloProgram, new_nonce  # noqa: E402
from silofl.runtime.network.silo_config import load_silo_config  # noqa: E402
from test_network import DELTA, _store_events, consortium, edit_toml  # noqa: E402

#: leaf values: the same float64 sums in the same order on both sides (in one process they
#: agree exactly); stated tolerance, as for any float comparison across runtimes
TOL = 1e-9


def _programs(w: dict, consent: bool = True):
    if consent:
        for p in w["silos"].values():
            edit_toml(p, "silo", methods=["dp_gbdt", "fedavg"])
    srv = ServerProgram(load_server_config(w["server"]))
    silos = {n: SiloProgram(load_silo_config(p)) for n, p in w["silos"].items()}
    return srv, silos


def _join(srv, silos) -> dict:
    out = {}
    for n, s in silos.items():
        rep = s.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
                      "job": W.canonical(srv.job).decode()})
        out[n] = srv.accept_join(rep)
    return out


def _charges(path, name) -> list:
    """The store's charges of `name` ([] when the store never registered it)."""
    with BudgetStore(path) as store:
        try:
            return store.charges(name)
        except BudgetStoreError:
            return []


def _run(srv, silos) -> None:
    """Every round: each silo answers the server's message, then the server's step."""
    _join(srv, silos)
    for t in range(1, srv.rounds + 1):
        ups = {}
        for n in srv.selected(t, list(silos)):
            rep, u = silos[n].round(srv.request(n, t), [srv.message])
            status, u = srv.accept_update(n, t, rep, [] if u is None else [u])
            assert status == "ok", rep["reason"]
            ups[n] = u
        srv.step(t, ups)


def _same_trees(a, b) -> None:
    assert len(a.trees) == len(b.trees)
    for x, y in zip(a.trees, b.trees, strict=True):
        np.testing.assert_array_equal(x.feature, y.feature)  # the same structure
        np.testing.assert_array_equal(x.left, y.left)
        np.testing.assert_array_equal(x.threshold, y.threshold)  # public bin edges
        np.testing.assert_allclose(x.value, y.value, rtol=0, atol=TOL)


@pytest.mark.parametrize("trees", [
    {"trees": 3, "depth": 2, "n_bins": 8, "colsample": 0.6, "splits": "histogram"},
    {"trees": 4, "splits": "cyclic", "shrink": "auto"},  # auto bins and depth
    {"trees": 3, "depth": 2, "n_bins": 8, "splits": "histogram", "bins": "private",
     "bins_share": 0.2, "shrink": 2.0},
    {"bins": "private", "shrink": 0.5, "local_trees": 1},  # the defaults: cyclic, auto
    {"trees": 3, "depth": 3, "splits": "random", "subsample": 0.5, "local_trees": 2},
])
def test_network_run_equals_simulator_charges_and_saved_models(tmp_path, trees):
    xgb = pytest.importorskip("xgboost")
    w = consortium(tmp_path, job={"method": "dp_gbdt", "trees": trees})
    srv, silos = _programs(w)
    _run(srv, silos)
    assert srv.gbdt.server.done and srv.done == srv.rounds
    job = srv.job
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(1.0, DELTA))
    assert [s.name for s in fed.silos] == list(silos)
    leds = [Ledger(s.name, s.target, accountant_kind(job["accountant"])) for s in fed.silos]
    sim = train_dp_gbdt(fed, **trees, seed=job["seed"], ledgers=leds, noise="seeded")
    _same_trees(srv.gbdt.server.ensemble, sim.ensemble)
    for k, (n, s) in enumerate(silos.items()):
        _same_trees(s.gbdt.silo.shared_ensemble, sim.ensemble)  # each silo got the model
        if trees.get("local_trees") or trees.get("shrink"):  # personal leaves, local trees
            _same_trees(s.gbdt.personal, sim.personal[k])
        assert s.reported[2] == pytest.approx(sim.report[k]["sigma"], rel=1e-12)
        want = {repr(e): c for e, c in leds[k].spent_counts().items()}
        got, status = _store_events(s.cfg.budget_store, n)
        # each round reserved before it ran and settled to what ran
        assert got == want and set(status) == {"charged"}
    # the server's release: the ensemble (ours and XGBoost's format) and its report
    folder = release.save_server_release(srv)
    ens = load_ensemble(folder / "gbdt.json")
    _same_trees(ens, srv.gbdt.server.ensemble)
    report = json.loads((folder / "gbdt-privacy.json").read_text())
    assert set(report["silos"]) == set(silos) and report["noise"] == "seeded"
    X = np.vstack([s.X_test for s in fed.silos]).astype(np.float32)  # XGBoost: float32
    booster = xgb.Booster(model_file=str(folder / "gbdt.xgboost.json"))
    np.testing.assert_allclose(booster.predict(xgb.DMatrix(X)), ens.predict(X.astype(float)),
                               atol=1e-5)
    for s in silos.values():  # each silo saved what it received (and its personal model)
        out = Path(s.cfg.release_dir)
        files = json.loads(next(out.glob("gbdt-*-privacy.json")).read_text())
        assert files["epsilon"] <= 1.0 + 1e-9 and files["sigma"] == s.reported[2]
        mine = load_ensemble(out / files["files"]["trees"])
        _same_trees(mine, srv.gbdt.server.ensemble)
        if trees.get("local_trees") or trees.get("shrink"):
            own = xgb.Booster(model_file=str(out / files["files"]["personal"]["xgboost"]))
            # the silo's column names are kept, made XGBoost-safe (cp=<missing> ->
            # cp=(missing)); the files' name map says how
            names = files["files"]["personal"]["xgboost_name_map"]
            assert own.feature_names == list(names.values()) and "cp=<missing>" in names
            np.testing.assert_allclose(own.predict(xgb.DMatrix(X, feature_names=list(
                names.values()))), s.gbdt.personal.predict(X.astype(float)), atol=1e-5)


def test_silo_without_consent_refuses_before_any_charge(tmp_path):
    w = consortium(tmp_path, job={"method": "dp_gbdt", "trees": {"trees": 2, "depth": 2}})
    for p in w["silos"].values():
        edit_toml(p, "silo", methods=["fedavg"])  # not dp_gbdt
    srv, silos = _programs(w, consent=False)
    regs = _join(srv, silos)
    for n, r in regs.items():
        assert r.status == "refused" and "does not run method 'dp_gbdt'" in r.reason
        # asked anyway, a silo that refused the job runs nothing
        rep, u = silos[n].round(srv.request(n, 1), [srv.message])
        assert rep["status"] == "refused" and u is None
        assert _charges(silos[n].cfg.budget_store, n) == []


def test_malformed_or_out_of_order_messages_are_refused_before_any_charge(tmp_path):
    w = consortium(tmp_path, job={"method": "dp_gbdt", "trees": {"trees": 2, "depth": 2}})
    srv, silos = _programs(w)
    _join(srv, silos)
    n, s = next(iter(silos.items()))
    bad = srv.message.copy()
    bad[8] = 99.0  # a feature the data does not have
    rep, u = s.round(srv.request(n, 1), [bad])
    assert rep["status"] == "refused" and "malformed" in rep["reason"] and u is None
    rep, _ = s.round(srv.request(n, 2), [srv.message])  # not its next round
    assert rep["status"] == "refused" and "next dp_gbdt round" in rep["reason"]
    assert _charges(s.cfg.budget_store, n) == []
    rep, u = s.round(srv.request(n, 1), [srv.message])  # the right one runs, charged
    assert rep["status"] == "ok" and u is not None
    assert len(_charges(s.cfg.budget_store, n)) == 1  # round 1's release, reserved


def test_private_bins_messages_are_checked_before_any_charge(tmp_path):
    # bins = "private": round 1 must be a well-formed BINS message; the first tree's
    # message must bring (d, B − 1) increasing float32 edges; else refused, nothing charged
    from silofl.algorithms.gbdt_messages import OP_BINS, OP_LEAVES, Ask
    w = consortium(tmp_path, job={"method": "dp_gbdt", "trees": {"trees": 2,
                                                                 "bins": "private"}})
    srv, silos = _programs(w)
    _join(srv, silos)
    n, s = next(iter(silos.items()))
    ask = Ask.from_array(srv.message)
    assert ask.op == OP_BINS
    for bad in (Ask(OP_BINS, 0, 7), Ask(OP_LEAVES, 0, 1)):  # too few fine bins; not BINS
        rep, u = s.round(srv.request(n, 1), [bad.to_array()])
        assert rep["status"] == "refused" and u is None, rep
    assert _charges(s.cfg.budget_store, n) == []
    rep, u = s.round(srv.request(n, 1), [srv.message])
    assert rep["status"] == "ok" and u.shape == (1, s.gbdt.s.d * ask.level)
    assert len(_charges(s.cfg.budget_store, n)) == 1  # the bins release, reserved
    ups = {n: srv.accept_update(n, 1, rep, [u])[1]}
    for m in silos:  # the others answer BINS too
        if m != n:
            rep, u = silos[m].round(srv.request(m, 1), [srv.message])
            ups[m] = srv.accept_update(m, 1, rep, [u])[1]
    srv.step(1, ups)
    first = Ask.from_array(srv.message)
    d = s.gbdt.s.d
    assert first.edges.size % d == 0 and first.edges.size > 0
    for edges in (first.edges[:-1], first.edges[::-1].copy()):  # wrong size; decreasing
        bad = Ask.from_array(srv.message)
        bad.edges = edges
        rep, u = s.round(srv.request(n, 2), [bad.to_array()])
        assert rep["status"] == "refused" and "edges" in rep["reason"] and u is None, rep
    assert len(_charges(s.cfg.budget_store, n)) == 1  # still only the bins


def test_person_unit_secagg_and_bad_trees_are_refused_specifically(tmp_path):
    with warnings.catch_warnings(), pytest.raises(ConfigError, match="privacy_unit"):
        warnings.simplefilter("ignore")
        consortium(tmp_path / "p", job={"method": "dp_gbdt", "privacy_unit": "person"})
    with pytest.raises(ConfigError, match="trees.depht"):
        consortium(tmp_path / "k", job={"method": "dp_gbdt", "trees": {"depht": 2}})
    with pytest.raises(ConfigError, match="shrink"):  # shrink runs over the network now
        consortium(tmp_path / "s", job={"method": "dp_gbdt", "trees": {"shrink": -1.0}})
    w = consortium(tmp_path / "a", job={"method": "dp_gbdt", "trees": {"trees": 2}})
    edit_toml(w["server"], "server", secagg=True)
    with pytest.raises(ConfigError, match="secagg = true is not available for dp_gbdt"):
        load_server_config(w["server"])
    # a silo's join checks the job itself: a person-level dp_gbdt job is refused there too
    srv, silos = _programs(consortium(tmp_path / "b", job={"method": "dp_gbdt"}))
    job = {**srv.job, "privacy_unit": "person"}
    rep = next(iter(silos.values())).join({"protocol": W.PROTOCOL, "kind": "join",
                                           "nonce": new_nonce(),
                                           "job": W.canonical(job).decode()})
    assert rep["status"] == "refused" and "privacy_unit" in rep["reason"]
    assert Counter(r["status"] for r in [rep]) == {"refused": 1}


def test_flower_loop_with_a_fresh_silo_program_per_message_equals_simulator(tmp_path):
    """Flower's server loop (`SiloflStrategy`) over in-process clients, each message served
    by a fresh `SiloProgram` that resumes from the silo's state on disk (as a SuperNode
    does): the simulator's trees, and every silo saved the final model."""
    from silofl.runtime.network.clientapp import SiloClient
    from silofl.runtime.network.flower import SiloflStrategy, run_in_process
    trees = {"trees": 2, "depth": 2, "n_bins": 8, "subsample": 0.7}
    w = consortium(tmp_path, job={"method": "dp_gbdt", "trees": trees})
    srv, _ = _programs(w)

    def client_fn(path):
        def make(cid):
            program = SiloProgram(load_silo_config(path))
            program.resume()  # the accepted job and the trees' state, from disk
            return SiloClient(program)
        return make

    run_in_process(SiloflStrategy(srv), srv.rounds,
                   {n: client_fn(p) for n, p in w["silos"].items()})
    assert srv.done == srv.rounds and srv.gbdt.server.done
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(1.0, DELTA))
    leds = [Ledger(s.name, s.target, accountant_kind(srv.job["accountant"]))
            for s in fed.silos]
    sim = train_dp_gbdt(fed, **trees, seed=srv.job["seed"], ledgers=leds, noise="seeded")
    _same_trees(srv.gbdt.server.ensemble, sim.ensemble)
    for k, (n, p) in enumerate(w["silos"].items()):
        cfg = load_silo_config(p)
        saved = next(Path(cfg.release_dir).glob("gbdt-*-privacy.json"))
        _same_trees(load_ensemble(saved.parent / json.loads(saved.read_text())["files"]
                                  ["trees"]), sim.ensemble)
        got, _ = _store_events(cfg.budget_store, n)
        assert got == {repr(e): c for e, c in leds[k].spent_counts().items()}


def test_a_silo_whose_store_runs_out_leaves_and_the_others_finish(tmp_path):
    w = consortium(tmp_path, job={"method": "dp_gbdt", "trees": {
        "trees": 3, "depth": 2, "splits": "histogram"}})  # 9 releases: some fit in ε = 0.4
    poor = next(iter(w["silos"]))
    edit_toml(w["silos"][poor], "silo", lifetime_epsilon=0.4)  # < its run's ε = 1
    srv, silos = _programs(w)
    _join(srv, silos)
    statuses = {}
    for t in range(1, srv.rounds + 1):
        ups = {}
        for n in srv.selected(t, list(silos)):
            rep, u = silos[n].round(srv.request(n, t), [srv.message])
            status, u = srv.accept_update(n, t, rep, [] if u is None else [u])
            statuses.setdefault(n, []).append(status)
            if status == "ok":
                ups[n] = u
        srv.step(t, ups)
    assert srv.gbdt.server.done and len(srv.gbdt.server.ensemble.trees) == 3
    ran = statuses[poor].count("ok")
    assert 0 < ran < srv.rounds and statuses[poor][ran:] == ["exhausted"]  # asked no more
    rows = _charges(silos[poor].cfg.budget_store, poor)
    assert len(rows) == ran and {r["status"] for r in rows} == {"charged"}
    spent = dpa.ComposedDpEvent([events.from_json(r["event"]) for r in rows])
    assert tightest(spent, DELTA)[0] <= 0.4  # never past its lifetime target
    assert all(statuses[n] == ["ok"] * srv.rounds for n in silos if n != poor)


@pytest.mark.parametrize("trees,stop", [
    ({"trees": 3, "depth": 2, "splits": "random", "colsample": 0.5}, 1),
    ({"trees": 3, "depth": 2, "colsample": 0.5, "splits": "histogram"}, 5),  # tree 1, level 1
    ({"trees": 3, "depth": 2, "bins": "private", "splits": "histogram"}, 1),  # after BINS
    ({"trees": 5, "bins": "private", "shrink": "auto"}, 3),  # cyclic: per-silo sums kept
])
def test_a_restarted_server_resumes_from_its_checkpoint(tmp_path, trees, stop):
    w = consortium(tmp_path, job={"method": "dp_gbdt", "trees": trees})
    srv, silos = _programs(w)
    _join(srv, silos)

    def rounds(server, ts):
        for t in ts:
            ups = {}
            for n in server.selected(t, list(silos)):
                rep, u = silos[n].round(server.request(n, t), [server.message])
                ups[n] = server.accept_update(n, t, rep, [] if u is None else [u])[1]
            server.step(t, ups)

    rounds(srv, range(1, stop + 1))  # later trees' public draws come after the restart
    again = ServerProgram(load_server_config(w["server"]))  # a new server process
    assert again.done == stop
    np.testing.assert_array_equal(again.message, srv.message)  # the same next question
    rounds(again, range(stop + 1, again.rounds + 1))
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(1.0, DELTA))
    leds = [Ledger(s.name, s.target, accountant_kind(again.job["accountant"]))
            for s in fed.silos]
    sim = train_dp_gbdt(fed, **trees, seed=again.job["seed"], ledgers=leds, noise="seeded")
    _same_trees(again.gbdt.server.ensemble, sim.ensemble)
    if trees.get("shrink"):  # τ² from the per-silo sums the checkpoint kept
        for k, s in enumerate(silos.values()):
            _same_trees(s.gbdt.personal, sim.personal[k])
            assert s.gbdt.silo.mu == pytest.approx(sim.report[k]["shrink_mu"], rel=1e-9)


def test_superlink_route_clientapp_per_message_equals_simulator(tmp_path):
    """Flower's SuperLink route in one process (`flower_app.LoopbackGrid`: the ServerApp's
    DefaultWorkflow, the ClientApp with its mods, a fresh silo program per message): the
    simulator's trees; each silo saved its model after the last round, the server its."""
    from flwr.app import Context, RecordDict

    from silofl.runtime.network import flower_app
    trees = {"trees": 2, "depth": 2, "n_bins": 8, "local_trees": 1, "shrink": 0.5}
    w = consortium(tmp_path, job={"method": "dp_gbdt", "trees": trees})
    for p in w["silos"].values():
        edit_toml(p, "silo", methods=["dp_gbdt"])
    grid = flower_app.LoopbackGrid({100 + i: {"silo-config": str(p)}
                                    for i, p in enumerate(w["silos"].values())})
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                  run_config={"server-config": str(w["server"])})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        srv = flower_app.run_server_app(grid, ctx)
    assert srv.done == srv.rounds
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(1.0, DELTA))
    leds = [Ledger(s.name, s.target, accountant_kind(srv.job["accountant"]))
            for s in fed.silos]
    sim = train_dp_gbdt(fed, **trees, seed=srv.job["seed"], ledgers=leds, noise="seeded")
    _same_trees(load_ensemble(Path(srv.cfg.release_dir) / "gbdt.json"), sim.ensemble)
    for k, p in enumerate(w["silos"].values()):
        folder = Path(load_silo_config(p).release_dir)
        files = json.loads(next(folder.glob("gbdt-*-privacy.json")).read_text())["files"]
        _same_trees(load_ensemble(folder / files["personal"]["trees"]), sim.personal[k])

"""The challenge's federated entry points: a preset over the networked runtime (the
silo program with graph data, the networked server), driven in-process without a network.
The federated run reproduces the in-process `train` bit for bit, every client's lifetime
store holds exactly the rounds it trained, the silo refuses what its plan and store do
not allow, and the test clients write the challenge's prediction files."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("flwr")

from silofl.errors import ConfigError, SiloflError  # noqa: E402
from silofl.pandemic import federated as F  # noqa: E402
from silofl.pandemic import pipeline as P  # noqa: E402
from silofl.pandemic import read_dataset  # noqa: E402
from silofl.pandemic.partition import input_directory, input_paths, partition_by_region  # noqa: E402
from silofl.pandemic.regions import raw_weights
from silofl.privacy.budget import BudgetStore  # noqa: E402
from silofl.privacy.node_level import node_epsilon  # noqa: E402
from silofl.runtime.network import messages as W  # noqa: E402
from silofl.runtime.network.flower import run_in_process  # noqa: E402

CFG = P.PandemicConfig(rounds=2, batch_size=64, epsilon=8.0, seed=3, noise="seeded")


def _fa():
    from silofl.pandemic import flower_app
    return flower_app


def train_clients(parts, work, cfg):
    """Client factories of the challenge (a fresh client per request, as its runtime)."""
    return {cid: (lambda c, f=folder: F.train_client_factory(
        c, *input_paths(f), work / "clients" / c, config=cfg)) for cid, folder in parts.items()}


def silo(parts, work, cid):
    """Client ``cid``'s silo program, re-opened from its client_dir (test-stage settings)."""
    return _fa().open_region_silo(cid, input_paths(parts[cid]), work / "clients" / cid, None)


@pytest.fixture(scope="module")
def data(small_outbreak):
    return read_dataset(small_outbreak, with_target=True)


@pytest.fixture(scope="module")
def parts(small_outbreak, tmp_path_factory):
    return partition_by_region(small_outbreak, tmp_path_factory.mktemp("parts"))


@pytest.fixture(scope="module")
def in_process(data):
    return P.train(data, CFG)


@pytest.fixture(scope="module")
def federated(parts, tmp_path_factory):
    """Two rounds through Flower's server loop over the challenge factories."""
    work = tmp_path_factory.mktemp("fed")
    strategy, rounds = F.train_strategy_factory(work / "server", config=CFG)
    assert rounds == CFG.rounds
    run_in_process(strategy, rounds, train_clients(parts, work, CFG))
    return work


def test_partitions_hold_each_region_and_only_its_contacts(data, parts):
    assert sorted(parts) == [f"region-{int(c)}" for c in data.region_codes]
    pids = []
    for cid, folder in parts.items():
        d = read_dataset(folder, with_target=True)
        assert d.num_regions == 1 and f"region-{int(d.region_codes[0])}" == cid
        members = data.region_members(int(np.searchsorted(data.region_codes,
                                                           d.region_codes[0])))
        assert np.array_equal(d.pids, data.pids[members])
        assert np.array_equal(d.states, data.states[members])
        assert np.array_equal(d.target, data.target[members])
        inside = np.isin(data.pids[data.network.src], d.pids) & np.isin(
            data.pids[data.network.dst], d.pids)
        assert d.num_contacts == int(inside.sum())  # cross-region contacts are cut
        pids.append(d.pids)
    assert np.array_equal(np.sort(np.concatenate(pids)), data.pids)


def test_flower_rounds_reproduce_in_process_training(data, parts, in_process, federated):
    work = federated
    sizes = {cid: int((data.region == k).sum()) for k, cid in enumerate(in_process.regions)}
    updates = []
    for k, cid in enumerate(in_process.regions):
        prog = silo(parts, work, cid)
        assert prog.done == 2 and prog.n_train == sizes[cid]
        # the same silo-side code, the same random streams: identical bits
        assert np.array_equal(raw_weights(prog.final_model(), prog.region),
                              in_process.weights[k])
        updates.append(prog.last["update"][0])  # what it sent in round 2
    # the server step is the size-weighted mean of what the regions sent (exact sums)
    server = _fa().challenge_server(work / "server")
    n = np.array([sizes[c] for c in in_process.regions], float)
    W_ = np.stack(updates)
    assert server.done == 2
    assert np.array_equal(server.server.params, P.server_step(W_[::-1], n[::-1]))
    assert np.allclose(server.server.params, (n[:, None] * W_).sum(0) / n.sum(), atol=1e-12)
    assert all(r.rounds == [1, 2] for r in server.silos.values())


def test_each_client_store_holds_exactly_its_rounds(parts, in_process, federated):
    for entry in in_process.privacy:
        cid = entry["region"]
        prog = silo(parts, federated, cid)
        charges = prog.store.charges(cid)
        # one reservation per round, settled to the node-level steps that ran
        assert [(c["label"], c["count"], c["status"], c["run_status"]) for c in charges] \
            == [("node-dpsgd", 1, "charged", "finished")] * 2
        steps = sum(json.loads(c["event"])["steps"] for c in charges)
        assert steps == entry["steps"] and prog.plan.noise_multiplier == entry["noise_multiplier"]
        spent = prog.store.spent(cid)
        assert spent["target_epsilon"] == CFG.epsilon and spent["unfinished_runs"] == 0
        assert spent["epsilon"] == pytest.approx(entry["epsilon_spent"], rel=1e-9)
        assert spent["epsilon"] == pytest.approx(node_epsilon(
            prog.region.n, CFG.S, CFG.batch_size, entry["noise_multiplier"], steps,
            1.0 / prog.region.n, adjacency=CFG.adjacency), rel=1e-9)
        assert spent["epsilon"] <= CFG.epsilon * (1 + 1e-9)


def test_the_silo_refuses_what_its_plan_or_store_does_not_allow(parts, federated, tmp_path):
    work = federated
    cid = sorted(parts)[0]
    cdir = work / "clients" / cid
    before = {f: f.read_bytes() for f in sorted((cdir / "state").rglob("*"))}
    prog = silo(parts, work, cid)
    charged = prog.store.charges(cid)
    server = _fa().challenge_server(work / "server")
    req = server.request(cid, 3)
    # the job had 2 rounds: a third is refused, and so is a repeat with another message
    rep, up = prog.round(req, [server.message])
    assert rep["status"] == "refused" and "outside the job" in rep["reason"] and up is None
    rep, _ = prog.round({**req, "round": 2}, [server.message + 1.0])
    assert rep["status"] == "refused" and "already ran" in rep["reason"]
    # a server asking for another σ than the silo calibrated is refused
    rep, _ = prog.round({**server.request(cid, 2), "sigma": 1.0}, [server.message])
    assert rep["status"] == "refused" and "sigma" in rep["reason"]
    assert prog.store.charges(cid) == charged  # nothing was charged
    prog.store.close()
    assert {f: f.read_bytes() for f in sorted((cdir / "state").rglob("*"))} == before
    # the same region in a new run with its lifetime store: σ was calibrated to spend its
    # whole target, so the store refuses the first round and the run stops, nothing read
    new = tmp_path / "rerun"
    (new / "clients" / cid).mkdir(parents=True)
    import sqlite3
    with sqlite3.connect(cdir / "budget.sqlite") as a, \
            sqlite3.connect(new / "clients" / cid / "budget.sqlite") as b:
        a.backup(b)  # the store with its write-ahead log (a file copy could miss it)
    again = P.PandemicConfig(**{**CFG.__dict__, "seed": 4})
    strategy, rounds = F.train_strategy_factory(new / "server", config=again)
    with pytest.raises(SiloflError, match="fewer than min_silos"):
        run_in_process(strategy, rounds, train_clients({cid: parts[cid]}, new, again))
    with BudgetStore(new / "clients" / cid / "budget.sqlite") as store:
        assert len(store.charges(cid)) == 2  # the old run's rounds only
    state = json.loads((new / "clients" / cid / "state" / "state.json").read_text())
    assert state["exhausted"] and "lifetime" in state["reason"]
    # a job whose preprocessing reads the region's statistics without a charge is refused
    loose = P.PandemicConfig(**{**CFG.__dict__, "preprocessing": "uncharged"})
    strategy, rounds = F.train_strategy_factory(new / "loose", config=loose)
    with pytest.raises(SiloflError, match="fewer than min_silos"):
        run_in_process(strategy, rounds, train_clients({cid: parts[cid]}, new / "l", loose))
    state = json.loads((new / "l" / "clients" / cid / "state" / "join.json").read_text()) \
        if (new / "l" / "clients" / cid / "state" / "join.json").exists() else None
    assert state is None  # refused at join: no job accepted, nothing read for training
    # a client_dir of another run (another ε) is refused before anything runs
    other = P.PandemicConfig(**{**CFG.__dict__, "epsilon": 4.0})
    with pytest.raises(ConfigError, match="different run"):
        F.train_client_factory(cid, *input_paths(parts[cid]), cdir, config=other)


def test_a_client_claiming_a_pinned_region_with_another_key_is_rejected(parts, tmp_path):
    cid = sorted(parts)[0]
    work = tmp_path
    strategy, _ = F.train_strategy_factory(work / "server", config=CFG)
    run_in_process(strategy, 1, train_clients({cid: parts[cid]}, work, CFG))
    # an impostor: the same region's files, a fresh client_dir (so a fresh key)
    strategy, _ = F.train_strategy_factory(work / "server", config=CFG)
    impostor = {cid: lambda c: F.train_client_factory(
        c, *input_paths(parts[cid]), work / "impostor", config=CFG)}
    with pytest.raises(W.ProtocolError, match="another key"):
        run_in_process(strategy, 1, impostor)


def test_test_stage_writes_challenge_predictions(data, parts, in_process, federated,
                                                  tmp_path):
    work = federated
    strategy, rounds = F.test_strategy_factory(work / "server")
    assert rounds == 1

    def client_fn(cid):
        folder = parts[cid]
        fmt = tmp_path / f"{cid}-format.csv"
        if not fmt.exists():  # the challenge's format file: pid,score with dummy scores
            pid = pd.read_csv(folder / "va_person.csv")["pid"][::-1]
            pd.DataFrame({"pid": pid, "score": 0.0}).to_csv(fmt, index=False)
        return F.test_client_factory(cid, *input_paths(folder), work / "clients" / cid, fmt,
                                     tmp_path / f"{cid}-preds.csv")

    run_in_process(strategy, rounds, {cid: client_fn for cid in parts})
    expected = P.predict(data, in_process)
    for cid in parts:
        got = pd.read_csv(tmp_path / f"{cid}-preds.csv")
        fmt = pd.read_csv(tmp_path / f"{cid}-format.csv")
        assert list(got.columns) == ["pid", "score"]
        assert list(got["pid"]) == list(fmt["pid"])
        assert np.array_equal(got["score"].to_numpy(),
                              expected[data.pid_index.lookup(got["pid"].to_numpy())])
        assert got["score"].between(0, 1).all() and got["score"].std() > 0


def test_test_client_without_training_is_refused(parts, tmp_path):
    cid, folder = next(iter(parts.items()))
    fmt = tmp_path / "f.csv"
    pd.DataFrame({"pid": [1], "score": [0.0]}).to_csv(fmt, index=False)
    client = F.test_client_factory(cid, *input_paths(folder), tmp_path / "empty", fmt,
                                   tmp_path / "p.csv")
    with pytest.raises(ConfigError, match="no trained client state"):
        client.evaluate([], {"round": 1})


def test_challenge_file_names_anywhere_are_linked(small_outbreak, tmp_path):
    odd = []
    for i, p in enumerate(input_paths(small_outbreak)):
        (tmp_path / f"dir{i}").mkdir()
        odd.append(shutil.copy(p, tmp_path / f"dir{i}" / f"client01_table{i}.csv"))
    d = input_directory(odd, tmp_path / "scratch")
    assert d == tmp_path / "scratch"
    a, b = read_dataset(d), read_dataset(small_outbreak)
    assert np.array_equal(a.pids, b.pids) and a.num_contacts == b.num_contacts
    assert input_directory(input_paths(small_outbreak), tmp_path / "unused") == small_outbreak
    with pytest.raises(ConfigError, match="expected 7 input paths"):
        input_directory(odd[:3], tmp_path / "scratch")


def test_missing_flower_is_a_config_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr now raises ImportError
    with pytest.raises(ConfigError, match=r'pip install "silofl\[flower\]"'):
        F.train_strategy_factory(tmp_path)


def test_flower_with_private_preprocessing_reproduces_train(data, parts, tmp_path):
    """The release is reserved with round 1, charged once before it reads a record, kept
    in the silo's state and reused: the seeded federated run equals the in-process one,
    predictions included."""
    cfg = P.PandemicConfig(rounds=2, batch_size=64, epsilon=8.0, seed=3, noise="seeded",
                           preprocessing="private")
    ref = P.train(data, cfg)
    strategy, rounds = F.train_strategy_factory(tmp_path / "server", config=cfg)
    run_in_process(strategy, rounds, train_clients(parts, tmp_path, cfg))
    expected = P.predict(data, ref)
    for k, cid in enumerate(ref.regions):
        prog = silo(parts, tmp_path, cid)
        assert np.array_equal(raw_weights(prog.final_model(), prog.region), ref.weights[k])
        saved = json.loads((tmp_path / "clients" / cid / "state" / "region.json").read_text())
        assert saved["constants"] == ref.constants[cid] and saved["constants"]["source"] == "private"
        assert sorted((c["label"], c["count"]) for c in prog.store.charges(cid)) == [
            ("node-dpsgd", 1), ("node-dpsgd", 1), ("preprocess", 1)]
        assert prog.store.spent(cid)["epsilon"] == pytest.approx(
            ref.privacy[k]["epsilon_spent"], rel=1e-9)
        scores = prog.predict()
        assert np.array_equal(scores, expected[data.pid_index.lookup(prog.data.pids)])


def test_one_in_process_driver_runs_the_networked_silo_and_server_programs(tmp_path):
    """The driver above is the networked runtime's (`runtime.network.flower`): through it
    the tabular silo/server programs join by signed `get_properties` and run signed rounds
    in Flower's `Server` loop. Each request gets a fresh silo program (as SuperNode and the
    challenge do) that re-accepts the job from its own state on disk; the models equal the
    same programs driven by hand, and each silo's store holds one charge per round."""
    import warnings

    from silofl.runtime.network import consortium
    from silofl.runtime.network import messages as W
    from silofl.runtime.network.flower import SiloClient, SiloflStrategy
    from silofl.runtime.network.server import ServerProgram, load_server_config
    from silofl.runtime.network.silo import SiloProgram, new_nonce
    from silofl.runtime.network.silo_config import load_silo_config
    job = {"rounds": 2, "lam": 0.5, "lr": 0.1, "batch_size": 16, "local_epochs": 0.5}
    runs = {}
    for how in ("flower", "by_hand"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            w = consortium.init(tmp_path / how, demo="heart", noise="seeded", job=job)
        srv = ServerProgram(load_server_config(w["server"]))
        joined: dict[str, dict] = {}

        def program(name, w=w, joined=joined):  # a fresh silo, re-joined from its disk
            prog = SiloProgram(load_silo_config(w["silos"][name]))
            if name in joined:
                prog.join(joined[name])
            return prog

        if how == "flower":
            class Client(SiloClient):
                def get_properties(self, config, joined=joined):
                    rep = super().get_properties(config)
                    if rep.get("status") == "ok":
                        joined[self.program.cfg.name] = dict(config)
                    return rep
            run_in_process(SiloflStrategy(srv), job["rounds"],
                           {n: (lambda c: Client(program(c))) for n in w["silos"]})
        else:
            for n in w["silos"]:
                joined[n] = {"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
                             "job": W.canonical(srv.job).decode()}
                srv.accept_join(program(n).join(joined[n]))
            for t in (1, 2):
                ups = {}
                for n in w["silos"]:
                    rep, u = program(n).round(srv.request(n, t), [srv.message])
                    assert srv.accept_update(n, t, rep, [] if u is None else [u])[0] == "ok"
                    ups[n] = u
                srv.step(t, ups)
        silos = {n: program(n) for n in w["silos"]}
        assert srv.done == 2 and all(s.done == 2 for s in silos.values())
        runs[how] = (srv.server.params, {n: s.personal_model() for n, s in silos.items()},
                     {n: len(s.store.charges(n)) for n, s in silos.items()})
    (g1, p1, c1), (g2, p2, c2) = runs["flower"], runs["by_hand"]
    np.testing.assert_array_equal(g1, g2)
    assert p1.keys() == p2.keys() and len(p1) >= 2
    for n in p1:
        np.testing.assert_array_equal(p1[n], p2[n])
    assert c1 == c2 and all(c == 2 for c in c1.values())  # one reservation per round


def test_deploy_regions_checks_settings_before_writing(small_outbreak, tmp_path):
    """`silofl deploy init --regions`: a bad graph setting or an unknown one is refused
    with nothing written; a good one writes one silo config per region and a graph job."""
    import tomllib

    from silofl.runtime.network import consortium
    for bad, match in (({"pooling": "bogus"}, "pooling"), ({"Ss": 3}, "unknown setting"),
                       ({"method": "weight_erosion"}, "we_user")):
        with pytest.raises(ConfigError, match=match):
            consortium.init(tmp_path / "c", regions=small_outbreak, job=bad)
        assert not (tmp_path / "c").exists()
    w = consortium.init(tmp_path / "c", regions=small_outbreak, job={"S": 10, "rounds": 3})
    assert sorted(w["silos"]) == [f"region-{c}" for c in (51001, 51003, 51005, 51007)]
    server = tomllib.loads((tmp_path / "c" / "server.toml").read_text())
    assert server["job"]["data_kind"] == "graph" and server["job"]["graph"]["S"] == 10
    silo = tomllib.loads(Path(w["silos"]["region-51001"]).read_text())["silo"]
    assert silo["data_kind"] == "graph" and (tmp_path / "c" / silo["data"]).is_dir()

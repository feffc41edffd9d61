"""The challenge's federated entry points (Flower), driven in-process without a network:
the federated run reproduces the in-process `train` bit for bit, every client's ledger
holds exactly the rounds it trained, and the test clients write the challenge's
prediction files."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("flwr")

from silofl.errors import BudgetExceeded, ConfigError  # noqa: E402
from silofl.pandemic import federated as F  # noqa: E402
from silofl.pandemic import pipeline as P  # noqa: E402
from silofl.pandemic import read_dataset  # noqa: E402
from silofl.runtime.network.flower import InProcessClientProxy, run_in_process  # noqa: E402
from silofl.pandemic.node_dp import node_epsilon  # noqa: E402
from silofl.pandemic.partition import input_directory, input_paths, partition_by_region  # noqa: E402
from silofl.pandemic.silo import client_state  # noqa: E402

CFG = P.PandemicConfig(rounds=2, batch_size=64, epsilon=8.0, seed=3, noise="seeded")


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
    """Two rounds driven by hand: initialize → (configure_fit → client.fit →
    aggregate_fit) × 2.  Every proxy call builds a fresh client from the factory, as the
    challenge's runtime does.  Returns (work dir, mean model after each round, FitRes
    metrics of the last round)."""
    from flwr.common import parameters_to_ndarrays
    from flwr.server import SimpleClientManager
    work = tmp_path_factory.mktemp("fed")
    strategy, rounds = F.train_strategy_factory(work / "server", config=CFG)
    assert rounds == CFG.rounds
    manager = SimpleClientManager()
    for cid, folder in parts.items():
        manager.register(InProcessClientProxy(cid, lambda c, f=folder: F.train_client_factory(
            c, *input_paths(f), work / "clients" / c, config=CFG)))
    params = strategy.initialize_parameters(manager)
    assert parameters_to_ndarrays(params) == []  # round 1: the common initialization
    means, metrics = [], {}
    for t in range(1, rounds + 1):
        instructions = strategy.configure_fit(t, params, manager)
        assert sorted(p.cid for p, _ in instructions) == sorted(parts)
        assert all(ins.config["round"] == t for _, ins in instructions)
        results = [(proxy, proxy.fit(ins, None, None)) for proxy, ins in instructions]
        results.reverse()  # arrival order must not matter
        params, _ = strategy.aggregate_fit(t, results, [])
        means.append(parameters_to_ndarrays(params)[0])
        metrics = {p.cid: (res.metrics, res.num_examples, parameters_to_ndarrays(res.parameters)[0])
                   for p, res in results}
    return work, means, metrics


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
    work, means, metrics = federated
    sizes = {cid: int((data.region == k).sum()) for k, cid in enumerate(in_process.regions)}
    for k, cid in enumerate(in_process.regions):
        state = np.load(work / "clients" / cid / "state.npz")
        # the same silo-side code, the same random streams: identical bits
        assert np.array_equal(state["w_raw"], in_process.weights[k])
        m, n, w = metrics[cid]
        assert n == sizes[cid] and np.array_equal(w, state["w"])
    # the server step is the size-weighted mean of what the clients sent
    W = np.stack([metrics[c][2] for c in in_process.regions])
    n = np.array([sizes[c] for c in in_process.regions], float)
    assert np.allclose(means[-1], (n[:, None] * W).sum(0) / n.sum(), rtol=0, atol=1e-12)
    assert np.array_equal(means[-1], P.server_step(W[::-1], n[::-1]))
    assert not np.array_equal(means[0], means[1])
    assert np.array_equal(np.load(work / "server" / "mean_latest.npy"), means[-1])
    server = json.loads((work / "server" / "server.json").read_text())
    assert server["round"] == 2 and len(server["clients"]) == len(parts)


def test_each_client_ledger_holds_exactly_its_rounds(in_process, federated):
    work, _, metrics = federated
    for entry in in_process.privacy:
        cid = entry["region"]
        lines = [json.loads(x) for x in
                 (work / "clients" / cid / "ledger.jsonl").read_text().splitlines()]
        assert [x["round"] for x in lines] == [1, 2]
        assert all(x["silo"] == cid and x["label"] == "node-dpsgd" for x in lines)
        steps = sum(x["event"]["steps"] for x in lines)
        state = client_state(work / "clients" / cid)
        assert state["rounds"] == [1, 2]
        p = state["privacy"]
        assert steps == p["steps"] == entry["steps"]
        assert p["noise_multiplier"] == entry["noise_multiplier"]
        assert p["epsilon_spent"] == pytest.approx(entry["epsilon_spent"], rel=1e-12)
        assert p["epsilon_spent"] == pytest.approx(
            node_epsilon(p["n"], p["S"], CFG.batch_size, p["noise_multiplier"], steps,
                         p["delta"], adjacency=CFG.adjacency))
        assert p["epsilon_spent"] <= CFG.epsilon * (1 + 1e-9)
        assert metrics[cid][0]["epsilon_spent"] == pytest.approx(p["epsilon_spent"])


def test_a_round_past_the_budget_or_repeated_is_refused(parts, federated):
    from flwr.common import FitIns, ndarrays_to_parameters
    work, means, _ = federated
    cid, folder = next(iter(parts.items()))
    cdir = work / "clients" / cid
    before = {f: (cdir / f).read_bytes() for f in ("ledger.jsonl", "state.npz", "state.json")}
    client = F.train_client_factory(cid, *input_paths(folder), cdir, config=CFG)
    # σ was calibrated for 2 rounds: the client's lifetime store refuses a third, and
    # nothing runs
    with pytest.raises(BudgetExceeded, match="lifetime"):
        client.fit([means[-1]], {"round": 3})
    with pytest.raises(ConfigError, match="already trained round 2"):
        client.fit([means[-1]], {"round": 2})
    assert {f: (cdir / f).read_bytes() for f in before} == before
    # a client_dir of another run (another config) is refused before anything runs
    other = P.PandemicConfig(rounds=3, batch_size=64, epsilon=8.0, seed=3)
    with pytest.raises(ConfigError, match="different run"):
        client = F.train_client_factory(cid, *input_paths(folder), cdir, config=other)
        client.to_client().fit(FitIns(ndarrays_to_parameters([]), {"round": 3}))
    assert {f: (cdir / f).read_bytes() for f in before} == before


def test_test_stage_writes_challenge_predictions(data, parts, in_process, federated,
                                                  tmp_path):
    work, _, _ = federated
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


def test_each_client_keeps_a_lifetime_store_settled_every_round(parts, federated):
    from silofl.privacy.budget import BudgetStore
    work, _, _ = federated
    for cid in parts:
        cdir = work / "clients" / cid
        state = client_state(cdir)
        with BudgetStore(cdir / "budget.sqlite") as store:
            charges = store.charges(cid)
            assert [(c["label"], c["count"], c["status"], c["run_status"]) for c in charges] \
                == [("node-dpsgd", 1, "charged", "finished")] * 2  # one run per round
            spent = store.spent(cid)
            assert spent["target_epsilon"] == CFG.epsilon and spent["unfinished_runs"] == 0
            assert spent["epsilon"] == pytest.approx(state["privacy"]["epsilon_spent"],
                                                     rel=1e-9)
        assert state["privacy"]["lifetime_epsilon_spent"] == pytest.approx(spent["epsilon"])


def test_flower_with_private_preprocessing_reproduces_train(data, parts, tmp_path):
    """The release is charged once, in round 1, saved in client_dir and reused: the
    seeded federated run equals the in-process one, predictions included."""
    from silofl.pandemic.silo import client_predict
    from silofl.privacy.budget import BudgetStore
    cfg = P.PandemicConfig(rounds=2, batch_size=64, epsilon=8.0, seed=3, noise="seeded",
                           preprocessing="private")
    ref = P.train(data, cfg)
    strategy, rounds = F.train_strategy_factory(tmp_path / "server", config=cfg)
    run_in_process(strategy, rounds, {
        cid: (lambda c, f=folder: F.train_client_factory(c, *input_paths(f),
                                                         tmp_path / "clients" / c, config=cfg))
        for cid, folder in parts.items()})
    expected = P.predict(data, ref)
    for k, cid in enumerate(ref.regions):
        cdir = tmp_path / "clients" / cid
        assert np.array_equal(np.load(cdir / "state.npz")["w_raw"], ref.weights[k])
        saved = json.loads((cdir / "preprocessing.json").read_text())
        assert saved["constants"] == ref.constants[cid] and saved["constants"]["source"] == "private"
        lines = [json.loads(x) for x in (cdir / "ledger.jsonl").read_text().splitlines()]
        assert [(x["round"], x["label"]) for x in lines] == [
            (0, "preprocess"), (1, "node-dpsgd"), (2, "node-dpsgd")]
        with BudgetStore(cdir / "budget.sqlite") as store:
            assert sorted(c["label"] for c in store.charges(cid)) == [
                "node-dpsgd", "node-dpsgd", "preprocess"]
    cid, folder = next(iter(parts.items()))
    fmt = tmp_path / "fmt.csv"
    pd.DataFrame({"pid": pd.read_csv(folder / "va_person.csv")["pid"], "score": 0.0}).to_csv(
        fmt, index=False)
    client_predict(cid, input_paths(folder), tmp_path / "clients" / cid, fmt, tmp_path / "p.csv")
    got = pd.read_csv(tmp_path / "p.csv")
    assert np.array_equal(got["score"].to_numpy(),
                          expected[data.pid_index.lookup(got["pid"].to_numpy())])


def test_one_in_process_driver_runs_the_networked_silo_and_server_programs(tmp_path):
    """The driver above is the networked runtime's (`runtime.network.flower`): through it
    the tabular silo/server programs join by signed `get_properties` and run signed rounds
    in Flower's `Server` loop. Each request gets a fresh silo program (as SuperNode and the
    challenge do) that re-accepts the job from its own state on disk; the models equal the
    same programs driven by hand, and each silo's store holds one charge per round."""
    import warnings
    from silofl.runtime.network import deploy, messages as W
    from silofl.runtime.network.flower import SiloClient, SiloflStrategy
    from silofl.runtime.network.server import ServerProgram, load_server_config
    from silofl.runtime.network.silo import SiloProgram, load_silo_config, new_nonce
    job = {"rounds": 2, "lam": 0.5, "lr": 0.1, "batch_size": 16, "local_epochs": 0.5}
    runs = {}
    for how in ("flower", "by_hand"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            w = deploy.init(tmp_path / how, demo="heart", noise="seeded", job=job)
        srv = ServerProgram(load_server_config(w["server"]))
        joined: dict[str, dict] = {}

        def program(name, w=w, joined=joined):  # a fresh silo, re-joined from its disk
            prog = SiloProgram(load_silo_config(w["silos"][name]))
            if name in joined:
                prog.join(joined[name])
            return prog

        if how == "flower":
            class Client(SiloClient):
                def get_properties(self, config):
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

"""The IFCA family and Weight Erosion on graph data (node-level unit): the selection's
sensitivity by brute force, the mechanisms statistically, and the pipeline's charges
against an independent node-level computation."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from silofl.algorithms import make_algorithm
from silofl.cli import app
from silofl.data.heart import load_heart_disease
from silofl.errors import ConfigError, PrivacyError
from silofl.models import make_model
from silofl.pandemic import pipeline as P
from silofl.pandemic import read_dataset
from silofl.pandemic.engine import GraphSource
from silofl.pandemic.features import build_neighbourhood_features
from silofl.pandemic.regions import raw_weights, region_groups
from silofl.privacy.accounting import RDP_ORDERS_FINE
from silofl.privacy.budget import BudgetStore
from silofl.privacy.ledger import Ledger
from silofl.privacy.node_level import NodeLevelDpEvent, affected_examples, node_epsilon, node_steps
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig
from silofl.runtime.simulator import simulate
from silofl.training import selection
from silofl.training import trainer as TR
from silofl.training.dpsgd import GradientRule
from silofl.training.sampling import NODE_LABEL, NodeUnit
from silofl.training.silo_data import SiloArrays
from silofl.training.trainer import LocalTrainer

T_DAYS = 40


# --- a small graph whose degrees are already bounded (pruning removes nothing) ------------

def _bounded_graph(n: int, S: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Random simple graph with every degree ≤ S − 1 (so `prune_pairs` keeps every edge
    and the appearance bound S holds without any data-dependent pruning)."""
    deg = np.zeros(n, int)
    edges = set()
    for _ in range(4 * n):
        u, v = rng.choice(n, 2, replace=False)
        if deg[u] < S - 1 and deg[v] < S - 1 and (min(u, v), max(u, v)) not in edges:
            edges.add((min(u, v), max(u, v)))
            deg[u] += 1
            deg[v] += 1
    e = np.array(sorted(edges))
    return e[:, 0], e[:, 1]


def _states(rng, n: int) -> np.ndarray:
    st = np.zeros((n, T_DAYS), np.int8)
    onset = rng.integers(5, 60, n)
    for i in range(n):
        if onset[i] < T_DAYS:
            st[i, onset[i]:] = 1
            st[i, min(T_DAYS, onset[i] + rng.integers(3, 9)):] = 2
    return st


def _region(n: int, S: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    src, dst = _bounded_graph(n, S, rng)
    r, L = len(src), 12
    return dict(src=src.astype(np.int32), dst=dst.astype(np.int32), num_nodes=n,
                start_time=rng.integers(0, 86400, r).astype(np.int32),
                duration=rng.integers(60, 20000, r).astype(np.int32),
                lid=rng.integers(0, L, r).astype(np.int32),
                age=rng.integers(0, 95, n), sex=rng.integers(1, 3, n),
                household_size=rng.integers(1, 7, n),
                activities=rng.integers(0, 2, (n, 6)).astype(np.uint8),
                frac_out_of_home=rng.random(n).astype(np.float32), states=_states(rng, n),
                location_ids=np.arange(L),
                location_flags=rng.integers(0, 2, (L, 6)).astype(np.uint8),
                longitude=rng.normal(-78, 1, L).astype(np.float32),
                latitude=rng.normal(38, 1, L).astype(np.float32))


def _replace(raw: dict, v: int, S: int, adjacency: str, rng) -> dict:
    """`raw` with person v replaced: new attributes and states; under "node+edges" also
    new contacts (to persons with spare degree, keeping every degree ≤ S − 1)."""
    out = {k: (a.copy() if isinstance(a, np.ndarray) else a) for k, a in raw.items()}
    n = raw["num_nodes"]
    out["age"][v], out["sex"][v] = rng.integers(0, 95), rng.integers(1, 3)
    out["household_size"][v] = rng.integers(1, 7)
    out["activities"][v] = rng.integers(0, 2, 6)
    out["frac_out_of_home"][v] = rng.random()
    out["states"][v] = _states(rng, 1)[0]
    if adjacency == "node+edges":
        keep = (out["src"] != v) & (out["dst"] != v)
        deg = np.bincount(np.concatenate([out["src"][keep], out["dst"][keep]]), minlength=n)
        spare = [u for u in rng.permutation(n) if u != v and deg[u] < S - 1][:S - 1]
        m = len(spare)
        out["src"] = np.concatenate([out["src"][keep], np.full(m, v)]).astype(np.int32)
        out["dst"] = np.concatenate([out["dst"][keep], spare]).astype(np.int32)
        for k, hi in (("start_time", 86400), ("duration", 20000), ("lid", 12)):
            out[k] = np.concatenate([raw[k][keep], rng.integers(1, hi, m)]).astype(np.int32)
    return out


def _examples(raw: dict, S: int, window_seed: int = 5, round: int = 1):
    F = build_neighbourhood_features(**raw, S=S, t_window=14, constants="declared")
    assert np.array_equal(F.index.degree, F.index.original_degree)  # nothing pruned
    X, y = F.gather(np.arange(F.num_nodes), F.epoch_windows(window_seed, round))
    return F, X, y.astype(float)


@pytest.mark.parametrize("adjacency", ["node", "node+edges"])
def test_node_selection_sensitivity_by_brute_force(adjacency, monkeypatch):
    """Replace each person of a small graph in turn; recompute the examples and the
    selection scores of random candidates: at most A = affected_examples examples change
    and no score moves by more than `node_sensitivity` = A·B/n — which some replacement
    exceeds at the one-example figure B/n (so A is needed)."""
    n, S, G = 40, 4, 48
    rng = np.random.default_rng(11)
    raw = _region(n, S, seed=2)
    F, X0, y0 = _examples(raw, S)
    A = affected_examples(n, S, adjacency)
    clf, reg = make_model("focal", X0.shape[1]), make_model("linear", X0.shape[1])
    cands = rng.normal(0, 3, (G, X0.shape[1] + 1))
    bound = 0.05  # a small loss bound: clipped losses saturate, so changes approach B
    for model, B in ((clf, 1.0), (reg, bound)):
        assert selection.node_sensitivity(model, n, S, adjacency, bound) == pytest.approx(
            A * B / n)
    s0 = {m.name: selection.scores(m, cands, X0, y0, bound) for m in (clf, reg)}
    worst = {m.name: 0.0 for m in (clf, reg)}
    most = 0
    for v in range(n):
        _, X1, y1 = _examples(_replace(raw, v, S, adjacency, rng), S)
        changed = int(np.sum(np.any(X1 != X0, axis=1) | (y1 != y0)))
        assert changed <= A, f"replacing person {v} changed {changed} > {A} examples"
        most = max(most, changed)
        for m in (clf, reg):
            d = np.abs(selection.scores(m, cands, X1, y1, bound) - s0[m.name]).max()
            worst[m.name] = max(worst[m.name], d)
    assert most >= 2  # the graph has persons appearing in other examples
    assert worst["focal"] <= A / n + 1e-12
    assert worst["linear"] <= A * bound / n + 1e-12
    # one example's worth (B/n) is exceeded: the example-level Δ would be wrong here
    assert worst["focal"] > 1.0 / n and worst["linear"] > bound / n

    # the trainer scores a region in chunks exactly as one whole-region mean
    monkeypatch.setattr(TR, "SCORE_CHUNK", 7)
    src = GraphSource([SimpleNamespace(features=F, n=n)], lambda k, X: X, seed=5)
    tr = LocalTrainer(clf, src, GradientRule(1.0, None), 8, np.array([1]), 0.1, 0.0,
                      Randomness.seeded(0), node=NodeUnit(S, adjacency, ("r",), 0))
    np.testing.assert_allclose(tr._node_scores(0, cands, 1, 1.0), s0["focal"], atol=1e-12)


def _node_trainer(X, y, S=3, b=8, sigma=2.0, target=1e3, allowance=None, secure=False):
    n = len(y)
    led = Ledger("r", PrivacyTarget(target, 1e-5), "rdp", allowance=allowance)
    return LocalTrainer(make_model("logistic", X.shape[1]), SiloArrays.stack([X], [y]),
                        GradientRule(1.0, np.array([sigma])), b, np.array([n // b]), 0.1, 0.0,
                        Randomness.os_entropy() if secure else Randomness.seeded(0), [led],
                        node=NodeUnit(S, "node+edges", ("r",), 3), label=NODE_LABEL)


@pytest.mark.statistical
def test_node_selection_follows_the_exponential_mechanism():
    """Each node-level selection is charged ε²/8-zCDP first, and its choices follow
    exp(−ε s/(2Δ)) with Δ = A/n (chi-square), not the example-level Δ = 1/(n − 1)."""
    rng = np.random.default_rng(0)
    n, S, eps, R = 60, 3, 0.3, 500
    X = rng.normal(size=(n, 3))
    y = (X[:, 0] > 0).astype(float)
    cands = np.stack([np.r_[1.0, 0, 0, 0], np.r_[0, 1.0, 0, 0], np.r_[-1.0, 0, 0, 0]])
    tr = _node_trainer(X, y, S=S)
    score = selection.scores(tr.model, cands, X, y)
    delta_s = selection.node_sensitivity(tr.model, n, S, "node+edges")
    assert delta_s == affected_examples(n, S, "node+edges") / n
    picks = np.array([tr.select_cluster(cands, eps, round=t)[0] for t in range(1, R + 1)])
    led = tr.ledgers[0]
    assert len(led.entries) == R == tr.selections_done[0]
    assert {e.label for e in led.entries} == {"select"}
    assert all(e.event == selection.selection_event(eps) for e in led.entries)
    counts = np.bincount(picks, minlength=3)
    p_node = selection.em_probabilities(score, eps, delta_s)
    p_example = selection.em_probabilities(score, eps, selection.sensitivity(tr.model, n))
    assert stats.chisquare(counts, R * p_node).pvalue > 1e-3
    assert stats.chisquare(counts, R * p_example).pvalue < 1e-6


@pytest.mark.statistical
def test_node_gradient_is_one_charged_node_level_step():
    """`gradients` at node level: charged NodeLevelDpEvent(steps=1) before any read; the
    release is the clipped mean of exactly b persons plus N(0, (σC/b)²) per coordinate
    (KS test); a ledger that cannot pay refuses it with nothing read or charged."""
    n, S, b, sigma, R = 50, 3, 8, 2.0, 300
    x = np.array([[3.0, -1.0, 0.5]])
    X, y = np.repeat(x, n, axis=0), np.ones(n)  # identical rows: the clipped mean is fixed
    tr = _node_trainer(X, y, S=S, b=b, sigma=sigma)
    W = np.array([[0.2, -0.1, 0.3, 0.0]])
    g0 = tr.model.clipped_grad_sum(W, X[None, :b], y[None, :b], np.ones((1, b)), 1.0)[0] / b
    z = np.concatenate([(tr.gradients(W, round=t)[0] - g0) * b / sigma
                        for t in range(1, R + 1)])
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.std() - 1) < 0.08
    led = tr.ledgers[0]
    step = NodeLevelDpEvent(n, S, b, sigma, 1, "node+edges")
    assert len(led.entries) == R == tr.steps_done[0]
    assert all(e.event == step and e.label == "node-dpsgd" for e in led.entries)
    assert led.epsilon("rdp") == pytest.approx(node_epsilon(n, S, b, sigma, R, 1e-5,
                                                            adjacency="node+edges"), rel=1e-9)
    # a ledger allowed nothing: refused before the data is read, nothing charged
    poor = _node_trainer(X, y, S=S, b=b, sigma=sigma, allowance={})
    reads = []
    gather = poor.data.gather
    poor.data.gather = lambda *a: reads.append(1) or gather(*a)
    with pytest.raises(PrivacyError):
        poor.gradients(W, round=1)
    with pytest.raises(PrivacyError):
        poor.select_cluster(np.zeros((2, 4)), 0.5, round=1)
    assert not reads and not poor.ledgers[0].entries and poor.steps_done[0] == 0



def test_core_api_plans_and_charges_ifca_and_weight_erosion_at_node_level():
    """`plan_silos`/`simulate` with privacy_unit="node" on tabular data (one row a person,
    S = 1): σ is calibrated for what each method composes (IFCA: the passes and its
    selection; Weight Erosion: one step per round) and the ledgers hold exactly what ran."""
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(3.0, 1e-4))
    cfg = TrainingConfig(rounds=4, batch_size=16, lr=0.1, noise="seeded", seed=2,
                         privacy_unit="node", node_S=1)
    model = make_model("logistic", fed.dim)
    algs = {"ifca": make_algorithm("ifca", clusters=2),
            "weight_erosion": make_algorithm("weight_erosion", we_user=fed.names[1]),
            "fedavg": make_algorithm("fedavg")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = {m: simulate(fed, model, a, cfg) for m, a in algs.items()}
    for m, r in res.items():
        for led, p in zip(r.ledgers, r.plans):
            counts = Counter(e.label for e in led.entries)
            assert counts == ({"node-dpsgd": 4, "select": 1} if m == "ifca" else
                              {"node-dpsgd": 4}), m
            assert 0.98 * 3.0 < led.epsilon("rdp") <= 3.0
            assert p.steps_per_pass == (1 if m == "weight_erosion" else
                                        node_steps(p.n, 16, 1.0))
    for a, b in zip(res["ifca"].plans, res["fedavg"].plans):  # the selection costs noise
        assert a.noise_multiplier > b.noise_multiplier


# --- the pipeline: what is reserved, charged and reported ---------------------------------

def _train(data, store=None, **kw):
    cfg = P.PandemicConfig(rounds=3, batch_size=64, epsilon=2.0, seed=1, noise="seeded", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return P.train(data, cfg, store=store), cfg


@pytest.fixture(scope="module")
def outbreak(small_outbreak):
    return read_dataset(small_outbreak)


def _ledger_counts(store, name):
    out = {}
    for c in store.charges(name):
        assert c["status"] == "charged"
        out[c["label"]] = out.get(c["label"], 0) + c["count"]
    return out


@pytest.mark.parametrize("method", ["ifca", "ifca_mrmtl"])
def test_pipeline_ifca_charges_its_selections_and_calibrates_for_them(outbreak, method):
    store = BudgetStore(None)
    pm, cfg = _train(outbreak, store, method=method, clusters=2)
    ref, _ = _train(outbreak, method="mrmtl")
    sel = 1  # selection_rounds 0.1 of 3 rounds: at least one
    for k, e in enumerate(pm.privacy):
        # one pass per round and one selection, as executed (settled store)
        assert _ledger_counts(store, e["region"]) == {"node-dpsgd": cfg.rounds, "select": sel}
        assert e["selections"]["count"] == sel
        eps_sel = 0.03 * cfg.epsilon
        assert e["selections"]["epsilon"] == pytest.approx(eps_sel)
        # independent: node-level RDP of every step plus sel · ρα, converted at the fine grid
        orders = np.asarray(RDP_ORDERS_FINE)
        want = node_epsilon(e["n"], e["S"], cfg.batch_size, e["noise_multiplier"],
                            e["steps"], e["delta"], adjacency=cfg.adjacency,
                            base_rdp=sel * eps_sel ** 2 / 8 * orders)
        assert e["epsilon_spent"] == pytest.approx(want, rel=1e-9)
        assert e["lifetime_epsilon_spent"] == pytest.approx(want, rel=1e-9)
        assert 0.99 * cfg.epsilon < e["epsilon_spent"] <= cfg.epsilon
        # the selections are paid for with noise: more than the same passes alone
        assert e["noise_multiplier"] > ref.privacy[k]["noise_multiplier"]
        assert e["steps"] == ref.privacy[k]["steps"]


def test_pipeline_weight_erosion_node_level(outbreak):
    names = [r.name for r in region_groups(outbreak, P.PandemicConfig())]
    store = BudgetStore(None)
    pm, cfg = _train(outbreak, store, method="weight_erosion", we_user=names[1])
    assert len({tuple(w) for w in pm.weights}) == 1  # one model, personalized for the user
    for e in pm.privacy:
        assert e["steps"] == cfg.rounds  # one node-level step per round
        charges = store.charges(e["region"])
        assert [(c["label"], c["count"]) for c in charges] == [("node-dpsgd", cfg.rounds)]
        ev = NodeLevelDpEvent.from_dict(json.loads(charges[0]["event"]))
        assert (ev.steps, ev.b, ev.sigma) == (1, cfg.batch_size, e["noise_multiplier"])
        want = node_epsilon(e["n"], e["S"], cfg.batch_size, e["noise_multiplier"],
                            cfg.rounds, e["delta"], adjacency=cfg.adjacency)
        assert e["epsilon_spent"] == pytest.approx(want, rel=1e-9)
        assert 0.99 * cfg.epsilon < want <= cfg.epsilon
    local, _ = _train(outbreak, method="weight_erosion", we_user=names[1],
                      we_update="local_sgd")
    ref, _ = _train(outbreak, method="fedavg")
    assert [e["steps"] for e in local.privacy] == [e["steps"] for e in ref.privacy]
    # refused before anything is reserved: no user, an unknown user
    with pytest.raises(ConfigError, match="we_user"):
        _train(outbreak, store, method="weight_erosion")
    with pytest.raises(ConfigError, match="not a silo"):
        _train(outbreak, store, method="weight_erosion", we_user="region-0")
    assert all(len(store.charges(n)) == 1 for n in names)


def test_cli_trains_ifca_and_weight_erosion_on_graph_data(small_outbreak, tmp_path):
    runner = CliRunner()
    base = ["pandemic", "train", "--data", str(small_outbreak), "--rounds", "2", "--batch",
            "64", "--scratch", "--noise", "seeded"]
    r = runner.invoke(app, base + ["--method", "ifca", "--clusters", "2", "--model",
                                   str(tmp_path / "i")])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "Cluster selections: 1 per region" in out
    saved = json.loads((tmp_path / "i" / "model.json").read_text())
    assert saved["config"]["method"] == "ifca" and saved["config"]["clusters"] == 2
    r = runner.invoke(app, base + ["--method", "weight_erosion", "--model",
                                   str(tmp_path / "w")])
    assert r.exit_code != 0 and "we_user" in " ".join(r.output.split())
    assert not (tmp_path / "w").exists()
    name = region_groups(read_dataset(small_outbreak), P.PandemicConfig())[0].name
    r = runner.invoke(app, base + ["--method", "weight_erosion", "--we-user", name,
                                   "--model", str(tmp_path / "w")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "w" / "model.json").read_text())["config"]["we_user"] == name


def test_graph_jobs_carry_the_method_settings():
    from silofl.pandemic.network import check_job, graph_job, job_algorithm
    names = ["region-1", "region-2", "region-3"]
    job = graph_job(P.PandemicConfig(method="ifca", clusters=3), names, 12)
    assert job_algorithm(job).clusters == 3
    job = graph_job(P.PandemicConfig(method="weight_erosion", we_user="region-2",
                                     we_update="local_sgd"), names, 12)
    alg = job_algorithm(job)
    assert (alg.user_index, alg.update) == (1, "local_sgd")
    with pytest.raises(ConfigError, match="we_participation"):
        check_job(dict(job, we_participation=0.5))
    with pytest.raises(ConfigError, match="clusters"):
        job_algorithm(graph_job(P.PandemicConfig(method="ifca", clusters=4), names, 12))


@pytest.mark.slow
def test_networked_graph_job_runs_ifca_like_pipeline_train(tmp_path):
    """Each region its own `silofl silo` process against `silofl server` (TLS), method
    ifca: every region reserves its selection with round 1 in its own store, and the seeded
    run's models and ε equal `pipeline.train` in one process bit for bit."""
    pytest.importorskip("flwr")
    from silofl.algorithms.ifca import ClusterServer
    from silofl.runtime.network.server import load_server_config
    from silofl.runtime.network.silo import open_program
    from silofl.runtime.network.silo_config import load_silo_config
    from test_network import run_regions  # the process helpers
    w = run_regions(tmp_path, {"rounds": 2, "batch_size": 64, "seed": 2, "method": "ifca",
                               "clusters": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = P.train(read_dataset(tmp_path / "outbreak"), P.PandemicConfig(
            rounds=2, batch_size=64, epsilon=6.0, delta=1e-5, seed=2, noise="seeded",
            method="ifca", clusters=2))
    with np.load(Path(load_server_config(w["server"]).state_dir) / "server.npz") as z:
        clusters = z["clusters"]
    for k, name in enumerate(ref.regions):
        prog = open_program(load_silo_config(w["silos"][name]))
        assert prog.resume() and prog.done == 2
        mine = prog.algorithm.personal_models(prog.state, ClusterServer(clusters))[0]
        np.testing.assert_array_equal(raw_weights(mine, prog.region), ref.weights[k])
        assert [(c["label"], c["count"]) for c in prog.store.charges(name)] == [
            ("select", 1), ("node-dpsgd", 1), ("node-dpsgd", 1)]
        assert prog.store.spent(name)["epsilon"] == pytest.approx(
            ref.privacy[k]["epsilon_spent"], rel=1e-9)

"""Attacks on the issue-24/25 surfaces (DP trees, lazy silos, Ray sweeps, the fused GLM
pass): each finding's test failed before its fix; the rest pin properties that held."""

from __future__ import annotations

import numpy as np
import pytest

from silofl.algorithms.gbdt_messages import OP_BINS, OP_LEAVES, OP_LEVEL, OP_MODEL, Ask
from silofl.algorithms.gbdt_programs import GbdtServer, GbdtSilo
from silofl.algorithms.gbdt_settings import gbdt_settings

D = 4
BOUNDS = np.tile([-1.0, 1.0], (D, 1))


def _data(task: str, n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    X = r.uniform(-1, 1, (n, D))
    y = (X[:, 0] + X[:, 1] > 0).astype(float) if task == "binary" else 3 * X[:, 0] + X[:, 2]
    return X, y


def _silo(s, X, y, sigma=1.0):
    silo = GbdtSilo(s, X, y, sigma, None, np.random.default_rng(5), "a", bounds=BOUNDS)
    silo.noise_scale = 0.0  # the exact statistics: their difference is the sensitivity
    return silo


def _delta(s, ask: Ask) -> float:
    """The L2 sensitivity the noise of a release is scaled to (histograms.py, private_bins.py)."""
    G, H = s.clip_g, s.clip_h
    if ask.op == OP_BINS:
        return float(np.sqrt(s.d))
    if ask.op == OP_LEVEL:
        return float(np.sqrt(ask.features.size * (G ** 2 + H ** 2)))
    return float(np.sqrt(G ** 2 + H ** 2))


EXTREME = {  # one added row: features far outside the bounds, labels far outside the range
    "binary": (np.array([1e300, -1e300, 1e9, -1e9]), 1.0),
    "regression": (np.array([1e300, -1e300, 1e9, -1e9]), 1e12),
}


@pytest.mark.parametrize("task", ["binary", "regression"])
@pytest.mark.parametrize("opts", [
    dict(splits="histogram", depth=3, n_bins=8),
    dict(splits="histogram", depth=2, n_bins=8, colsample=0.5),
    dict(splits="cyclic", depth=None, n_bins=8),
    dict(splits="random", depth=3, n_bins=8),
    dict(splits="cyclic", depth=None, n_bins="auto", bins="private"),
    dict(splits="histogram", depth=2, n_bins=8, clip_g=0.3, clip_h=0.1),
], ids=["hist", "colsample", "cyclic", "random", "private-bins", "small-clips"])
def test_one_extreme_row_moves_each_release_by_at_most_the_charged_delta(task, opts):
    """Held: add/remove one row (extreme features and labels) moves every release of every
    tree, with the same server messages, by ≤ the Δ its noise is scaled to."""
    s = gbdt_settings(task, D, trees=4, **opts)
    X, y = _data(task)
    xe, ye = EXTREME[task]
    Xn, yn = np.vstack([X, xe]), np.append(y, ye)
    server = GbdtServer(s, np.random.default_rng(1), bounds=BOUNDS, sigmas=[1.0],
                        n_rows=len(y))
    a, b = _silo(s, X, y), _silo(s, Xn, yn)
    seen = set()
    while not server.done:
        ask = server.current
        ra, rb = a.answer(ask), b.answer(ask)
        if ask.op != OP_MODEL:
            gap = float(np.linalg.norm(rb - ra))
            assert gap <= _delta(a.s, ask) * (1 + 1e-9), (ask.op, ask.tree, ask.level, gap)
            seen.add(ask.op)
        server.receive([ra])
    assert OP_LEAVES in seen


# --- DP randomness secure by default (library entry point) -------------------------------

def _fed(n: int = 200, k: int = 2):
    import silofl
    from silofl.data.federation import Federation, Silo
    r = np.random.default_rng(0)
    silos = []
    for i in range(k):
        X, Xt = r.uniform(-1, 1, (n, D)), r.uniform(-1, 1, (50, D))
        silos.append(Silo(f"s{i}", X, (X[:, 0] > 0).astype(int), Xt, (Xt[:, 0] > 0).astype(int),
                          silofl.PrivacyTarget(1.0, 1e-5)))
    return Federation(silos, [f"x{j}" for j in range(D)], "binary", 2)


def _leaves(res) -> np.ndarray:
    return np.concatenate([t.value for t in res.ensemble.trees])


def test_train_dp_gbdt_draws_secure_noise_by_default():
    """Finding (high): `train_dp_gbdt` (public API) defaulted to noise = "seeded" with
    seed = 0, so a private run's noise followed from a public seed: anyone could redraw
    it and subtract it from the released leaves. Now the default is the CSPRNG: two runs
    with the same seed release different leaves; "seeded" still reproduces."""
    from silofl.algorithms.dp_gbdt import train_dp_gbdt
    kw = dict(trees=3, splits="cyclic", seed=0)
    a, b = train_dp_gbdt(_fed(), **kw), train_dp_gbdt(_fed(), **kw)
    assert not np.allclose(_leaves(a), _leaves(b))
    c, e = (train_dp_gbdt(_fed(), **kw, noise="seeded") for _ in range(2))
    np.testing.assert_allclose(_leaves(c), _leaves(e), rtol=0, atol=1e-12)
    # the non-private reference stays reproducible (nothing secret is drawn)
    p, q = (train_dp_gbdt(_fed(), **kw, private=False, subsample=0.5) for _ in range(2))
    np.testing.assert_allclose(_leaves(p), _leaves(q), rtol=0, atol=1e-12)


# --- a malicious server: messages that would make a silo release more than charged -------

def _spy_silo(s, ledger=True):
    from silofl.privacy.ledger import Ledger
    from silofl.privacy.targets import PrivacyTarget
    X, y = _data(s.task)
    led = Ledger("a", PrivacyTarget(50.0, 1e-5), "rdp") if ledger else None
    return GbdtSilo(s, X, y, 2.0, led, np.random.default_rng(3), "a", bounds=BOUNDS)


def _charged(silo) -> int:
    return len(silo.ledger.entries)


def _refused(silo, ask: Ask) -> None:
    from silofl.algorithms.gbdt_messages import MessageError
    before = _charged(silo)
    with pytest.raises(MessageError):
        silo.answer(ask)
    assert _charged(silo) == before


def test_malicious_server_replays_and_reorderings_are_refused_uncharged():
    """Held: a BINS request twice, a level repeated, a level skipped, features out of range
    or changed mid-tree, split bins out of range: refused before any charge or read."""
    s = gbdt_settings("binary", D, trees=3, depth=3, n_bins=8, splits="histogram",
                      bins="private")
    server = GbdtServer(s, np.random.default_rng(1), bounds=BOUNDS, sigmas=[2.0], n_rows=300)
    silo = _spy_silo(s)
    bins = server.current
    assert bins.op == OP_BINS
    server.receive([silo.answer(bins)])
    _refused(silo, bins)                                   # a second BINS
    first = server.current
    bad = Ask(OP_LEVEL, 0, 0, np.arange(D) + 1, edges=first.edges)
    _refused(silo, bad)                                    # feature out of range
    server.receive([silo.answer(first)])
    _refused(silo, first)                                  # level 0 again (no edges now)
    again = Ask(first.op, 0, 0, first.features)
    _refused(silo, again)
    nxt = server.current
    skip = Ask(OP_LEVEL, 0, 2, nxt.features, nxt.split_feature, nxt.split_bin)
    _refused(silo, skip)                                   # level skipped
    other = Ask(OP_LEVEL, 0, 1, nxt.features[::-1].copy(), nxt.split_feature, nxt.split_bin)
    _refused(silo, other)                                  # features changed mid-tree
    wide = Ask(OP_LEVEL, 0, 1, nxt.features, nxt.split_feature, nxt.split_bin + 100)
    _refused(silo, wide)                                   # split bin beyond B
    server.receive([silo.answer(nxt)])


def test_non_finite_or_malformed_wire_messages_are_refused():
    """Held: the wire decoder refuses NaN/inf (a NaN leaf value would make a silo's margins
    NaN and its histograms NaN exactly where its rows are: a noise-free occupancy map)."""
    from silofl.algorithms.gbdt_messages import MessageError
    ask = Ask(OP_LEAVES, 1, 2, np.arange(1), np.zeros(3, np.int64), np.ones(3, np.int64),
              np.array([0.1, np.nan, 0.0, 0.0]))
    with pytest.raises(MessageError):
        Ask.from_array(ask.to_array())
    raw = ask.to_array()
    raw[1] = 0.5  # a fractional tree index
    with pytest.raises(MessageError):
        Ask.from_array(raw)


# --- Ray sweeps: a result returned twice, a worker log beyond the reservation ------------

def _reserved_sweep_run(tmp_path):
    pytest.importorskip("ray")
    from silofl.experiments import sweep as S
    from silofl.experiments.sweep_config import load_sweep_config
    from test_sweep_ray import _config
    sc = load_sweep_config(_config(tmp_path, engine="ray"))
    prep = S.prepare(sc)
    S.preflight(sc, prep)
    spec = next(s for s in S.expand(sc) if s.private)
    return S.reserve_run(sc, spec, prep, S.calibrate_all(sc, prep, [spec]), {})


def _spent(store) -> dict:
    return {n: store.spent(n)["epsilon"] for n in store.silos()}


def test_a_ray_result_returned_twice_cannot_resettle_lower(tmp_path):
    """Held: the driver settles a run to its worker's log once; the same result (or a
    smaller log) coming back again is refused by the store, the spend unchanged."""
    import pickle

    from silofl.privacy.budget import BudgetStoreError
    from silofl.runtime.detached import detach, settle_detached
    job = _reserved_sweep_run(tmp_path)
    worker = pickle.loads(pickle.dumps(detach(job)))
    method, ps = next(iter(job.planned.items()))
    worker.ledgers(method)[0].charge(ps[0].declared, label="plan")
    settle_detached(job, worker.log)
    after = _spent(job.store)
    assert after[ps[0].name] > 0
    for log in (worker.log, []):
        job.settled = False  # a driver that lost track of it
        with pytest.raises(BudgetStoreError):
            settle_detached(job, log)
    assert _spent(job.store) == after


def test_a_worker_log_beyond_its_reservation_keeps_the_whole_reservation(tmp_path):
    """Held: a log claiming more than was reserved is refused; the run stays reserved
    (counted in full), never settled to less."""
    from silofl.privacy import events
    from silofl.privacy.budget import BudgetStoreError
    from silofl.runtime.detached import settle_detached
    job = _reserved_sweep_run(tmp_path)
    before = _spent(job.store)
    method, ps = next(iter(job.planned.items()))
    log = [(ps[0].name, method, "plan", events.to_json(ps[0].declared), 2)]
    with pytest.raises(BudgetStoreError):
        settle_detached(job, log)
    assert job.store.run_status(job.run_id) == "reserved"
    assert _spent(job.store) == before


@pytest.mark.parametrize("local_trees", [0, 2])
def test_a_silo_answers_nothing_after_its_final_model_message(local_trees):
    """Finding (low): after its last MODEL message a silo still took the next tree's
    message and released (charged, but beyond the job's declared run: a malicious server
    could drain the silo's lifetime budget with trees nobody asked for). Now refused
    uncharged; over the network the round count bounded it already."""
    from silofl.algorithms.gbdt_programs import drive, grow_local
    s = gbdt_settings("binary", D, trees=2, splits="cyclic", n_bins=8, depth=None,
                      local_trees=local_trees)
    server = GbdtServer(s, np.random.default_rng(1), bounds=BOUNDS, sigmas=[2.0], n_rows=300)
    silo = _spy_silo(s)
    drive(server, [silo])
    if local_trees:
        grow_local(silo, np.random.default_rng(2))
    spent = _charged(silo)
    assert spent == s.trees + s.local_trees
    more = GbdtServer(s, np.random.default_rng(9), edges=silo.edges,
                      first_tree=s.trees + s.local_trees, n_trees=1, send_edges=False)
    _refused(silo, more.current)


# --- a malicious server over the network: replays, other messages, skipped rounds --------

def test_network_silo_replays_and_rewrites_are_answered_without_a_new_release(tmp_path):
    """Held: the same round twice with the same message gets the same release back (no
    fresh noise, nothing charged again); the same round with another message, a skipped
    round and a round beyond the job's are refused; the store holds one charge."""
    pytest.importorskip("flwr")
    from test_gbdt_network import _charges, _join, _programs
    from test_network import consortium
    trees = {"trees": 2, "depth": 2, "n_bins": 8, "splits": "histogram"}
    w = consortium(tmp_path, job={"method": "dp_gbdt", "trees": trees})
    srv, silos = _programs(w)
    _join(srv, silos)
    n, s = next(iter(silos.items()))
    msg = srv.message
    rep, u = s.round(srv.request(n, 1), [msg])
    assert rep["status"] == "ok" and u is not None
    one = _charges(s.cfg.budget_store, n)
    assert len(one) == 1
    rep2, u2 = s.round(srv.request(n, 1), [msg.copy()])
    assert rep2["status"] == "ok"
    np.testing.assert_array_equal(u2, u)  # resent, not redrawn
    other = msg.copy()
    other[-1] = np.float32(other[-1] * 0.5)  # another edge
    for t, m in ((1, other), (3, msg), (srv.rounds + 1, msg)):
        rep3, u3 = s.round(srv.request(n, t), [m])
        assert rep3["status"] == "refused" and u3 is None, (t, rep3["reason"])
    assert _charges(s.cfg.budget_store, n) == one


# --- charge_all: a round's charges all or none -------------------------------------------

def test_charge_all_refused_by_one_silo_charges_no_silo_and_calls_no_hook():
    """Held: one silo over budget → BudgetExceeded before any ledger records the round
    and before the store's batched hook is called (no partial round charged)."""
    import dp_accounting as dpa

    from silofl.errors import BudgetExceeded
    from silofl.privacy.ledger import Ledger, charge_all
    from silofl.privacy.targets import PrivacyTarget
    calls = []

    def hook(*a):
        calls.append(a)
    hook.many = lambda rows: calls.append(rows)  # type: ignore[attr-defined]
    rich = Ledger("rich", PrivacyTarget(10.0, 1e-5), "rdp", on_charge=hook)
    poor = Ledger("poor", PrivacyTarget(0.01, 1e-5), "rdp", on_charge=hook)
    ev = dpa.GaussianDpEvent(1.0)
    with pytest.raises(BudgetExceeded):
        charge_all([rich, poor], [ev, ev], round=0, label="glm")
    assert rich.entries == [] and poor.entries == [] and calls == []
    charge_all([rich], [ev], round=0, label="glm")
    assert len(rich.entries) == 1 and len(calls) == 1  # one batched store call


# --- StackedNet: an architecture it would compute differently is not stacked -------------

def test_stacked_engine_refuses_a_layer_used_twice():
    """Finding (medium, correctness of what executes): a Sequential applying one layer twice
    (shared weights) was 'stacked' with the second application dropped (named_children
    skips repeats), so training ran another network than the model's (and a released model
    predicts with the full one). Now such a module takes the general path (build → None);
    a plain net is still stacked and computes the module's outputs."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from silofl.models.torch_stacked import StackedNet
    shared = nn.Linear(4, 4)
    assert StackedNet.build(nn.Sequential(shared, nn.ReLU(), shared), (4,)) is None
    inner = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    assert StackedNet.build(nn.Sequential(inner, nn.ReLU(), inner, nn.Linear(4, 2)),
                            (4,)) is None
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    net = StackedNet.build(plain, (4,))
    assert net is not None
    X = torch.randn(1, 5, 4)
    params = {n: p.detach().unsqueeze(0) for n, p in plain.named_parameters()}
    out, _ = net.forward(params, X)
    torch.testing.assert_close(out[0], plain(X[0]).detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("task", ["binary", "regression"])
def test_huge_leaf_values_from_a_server_keep_releases_finite_and_within_delta(task):
    """Held: a server sending the largest finite leaf values (margins overflow to ±inf)
    gets finite releases that one row still moves by ≤ Δ (g, h clipped; no NaN cells)."""
    import dataclasses
    import warnings
    s = gbdt_settings(task, D, trees=5, splits="cyclic", n_bins=8, depth=None)
    X, y = _data(task)
    xe, ye = EXTREME[task]
    server = GbdtServer(s, np.random.default_rng(1), bounds=BOUNDS, sigmas=[1.0],
                        n_rows=len(y))
    a, b = _silo(s, X, y), _silo(s, np.vstack([X, xe]), np.append(y, ye))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # exp overflow in the sigmoid
        while not server.done:
            ask = server.current
            if ask.leaves.size:
                big = np.where(np.arange(ask.leaves.size) % 2, 1.7e308, -1.7e308)
                ask = dataclasses.replace(ask, leaves=big)
            ra, rb = a.answer(ask), b.answer(ask)
            if ask.op != OP_MODEL:
                assert np.all(np.isfinite(ra)) and np.all(np.isfinite(rb))
                assert np.linalg.norm(rb - ra) <= _delta(a.s, ask) * (1 + 1e-9)
            server.receive([ra])

"""ULDP-FL weighting (method `uldp`) over the network, only inside Flower's SecAgg+ sum.

Every silo sends its share u_k = Σ_p (1/M)·ḡ_p + N(0, σ²C²/K) masked; the server unmasks
only Σ_k u_k (all K silos: reconstruction threshold K, weight 1 each) and steps
w ← w − lr·(Σ_k u_k / Z + l2·w). Function level: the ServerApp body and the ClientApp (with
Flower's `secaggplus_mod`) talk through `flower_app.LoopbackGrid` (the real protocol code,
in this process).

Tolerance against the simulator (which sums the shares exactly): the only difference is
SecAgg+'s quantization. Per round each silo's stochastic rounding is off by less than one
level 2c/Q per coordinate (c the clipping range, Q = 2^22), so the unmasked sum is off by
less than K·2c/Q (`secagg.sum_error_bound`) and the model step by lr·K·2c/(Q·Z) per
coordinate (√P times that in norm). A round's map is L-Lipschitz, L = 1 + lr·(max‖x̃‖²/4 +
l2) (clipping is a projection; the logistic Hessian is ≤ x̃x̃ᵀ/4), so after R rounds the
models differ by at most that step error times Σ_{j<R} L^j (in norm). The noise is
patched to the same constant in both runs (the simulator draws it jointly, the network per
silo and per round); real draws are exercised by the other tests.
"""

from __future__ import annotations

import importlib
import json
import math
import tomllib
import warnings
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict  # noqa: E402

from silofl.algorithms import uldp as uldp_alg  # noqa: E402
from silofl.algorithms.uldp import ULDP  # noqa: E402
from silofl.data.federation import Federation, Silo  # noqa: E402
from silofl.errors import ConfigError  # noqa: E402
from silofl.privacy import uldp as uacc  # noqa: E402
from silofl.privacy.budget import BudgetStore  # noqa: E402
from silofl.privacy.ledger import tightest  # noqa: E402
from silofl.privacy.targets import PrivacyTarget  # noqa: E402
from silofl.runtime.network import deploy, flower_app, release  # noqa: E402
from silofl.runtime.network import secagg as S  # noqa: E402
from silofl.runtime.network.jobspec import job_config, job_model  # noqa: E402
from silofl.runtime.network.server import load_server_config  # noqa: E402
from silofl.runtime.network.silo import SiloProgram  # noqa: E402
from silofl.runtime.network.silo_config import load_silo_config
from silofl.runtime.simulator import simulate  # noqa: E402
from test_network import _store_events  # noqa: E402  (tests/ is on the import path)

DIM, K, M = 3, 3, 2
DELTA = 1e-5
EPS = {"h0": 4.0, "h1": 2.0, "h2": 4.0}  # h1's stricter target decides the consortium's σ
JOB = {"method": "uldp", "rounds": 3, "lr": 0.5, "clip": 1.0, "batch_size": 8,
       "privacy_unit": "person", "persons_in_silos": M}
NOISE_Z = 0.37  # the patched noise draw (in noise stds)


def federation(persons: int = 70, seed: int = 0) -> Federation:
    """K hospitals; persons with 1–4 visits, a quarter of them treated at two (≤ M)."""
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=DIM)
    rows: dict[int, tuple[list, list, list]] = {k: ([], [], []) for k in range(K)}
    for p in range(persons):
        z = rng.normal(size=DIM)
        where = rng.choice(K, size=2 if rng.random() < 0.25 else 1, replace=False)
        for k in where:
            for _ in range(1 + rng.poisson(1.0)):
                x = z + 0.3 * rng.normal(size=DIM)
                rows[k][0].append(x)
                rows[k][1].append(int(x @ beta > 0))
                rows[k][2].append(f"p{p:04d}")
    silos = []
    for k, (X, y, ids) in rows.items():
        y = np.array(y)
        y[:2] = [0, 1]
        Xt = rng.normal(size=(40, DIM))
        silos.append(Silo(f"h{k}", np.array(X), y, Xt, (Xt @ beta > 0).astype(int),
                          PrivacyTarget(EPS[f"h{k}"], DELTA), person_train=np.array(ids),
                          person_test=np.array([f"t{k}-{i}" for i in range(40)])))
    return Federation(silos, [f"x{i}" for i in range(DIM)], "binary", 2)


def consortium(tmp: Path, fed: Federation, secagg: bool = True, job: dict | None = None,
               server: dict | None = None, lifetime: float = 1.0) -> dict:
    """A consortium folder of `fed` (each silo its `EPS` target, `lifetime` times it as its
    lifetime ε; the stores are the test user's, shared by every deployment of the data)."""
    from silofl.runtime.network import consortium as network_init
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = network_init.init(tmp, federation=fed, noise="seeded", delta=DELTA,
                              address="127.0.0.1:9", job={**JOB, **(job or {})})
    raw = tomllib.loads((tmp / "server.toml").read_text())
    raw["server"].update(secagg=secagg, join_timeout=20.0, **(server or {}))
    (tmp / "server.toml").write_text(deploy._toml(raw))
    for name, path in w["silos"].items():  # each silo its own target
        raw = tomllib.loads(Path(path).read_text())
        raw["silo"]["epsilon"] = EPS[name]
        raw["silo"]["lifetime_epsilon"] = lifetime * EPS[name]
        Path(path).write_text(deploy._toml(raw))
    return w


def run_loopback(tmp: Path, w: dict):
    nodes = {100 + i: {"silo-config": str(w["silos"][n])} for i, n in enumerate(sorted(w["silos"]))}
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                  run_config={"server-config": str(tmp / "server.toml")})
    return flower_app.run_server_app(flower_app.LoopbackGrid(nodes), ctx)


class _ConstNoise:
    def normal(self, shape):
        return np.full(shape, NOISE_Z)


@pytest.fixture
def const_noise(monkeypatch):
    """Both runs' share noise: NOISE_Z stds in every coordinate (see the module doc)."""
    real = uldp_alg.silo_release

    def patched(trainer, *args, **kw):
        rng, trainer.rng = trainer.rng, _ConstNoise()
        try:
            return real(trainer, *args, **kw)
        finally:
            trainer.rng = rng
    monkeypatch.setattr(uldp_alg, "silo_release", patched)


def spy_quantization(monkeypatch) -> dict:
    """What Flower's `secaggplus_mod` really quantized (weight factor, c, Q, max |value|)."""
    mod = importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
    seen: dict[str, list] = {"ratio": [], "c": [], "Q": [], "max_abs": []}
    quantize, multiply = mod.quantize, mod.parameters_multiply

    def spy_multiply(params, factor):
        seen["ratio"].append(float(factor))
        return multiply(params, factor)

    def spy_quantize(params, clipping_range, target_range):
        seen["c"].append(float(clipping_range))
        seen["Q"].append(int(target_range))
        seen["max_abs"].append(max(float(np.abs(a).max()) for a in params))
        return quantize(params, clipping_range, target_range)

    monkeypatch.setattr(mod, "parameters_multiply", spy_multiply)
    monkeypatch.setattr(mod, "quantize", spy_quantize)
    return seen


def resumed(path) -> SiloProgram:
    s = SiloProgram(load_silo_config(path))
    assert s.resume()
    return s


# --- the network's result is the simulator's, within SecAgg+'s quantization ------------------

def test_uldp_over_secagg_equals_the_simulator(tmp_path, monkeypatch, const_noise):
    fed = federation()
    w = consortium(tmp_path / "c", fed)
    seen = spy_quantization(monkeypatch)
    prog = run_loopback(tmp_path / "c", w)
    R = JOB["rounds"]
    assert prog.done == R and all(r.rounds == [1, 2, 3] for r in prog.silos.values())
    # Flower's own settings: weight 1 for every silo, one range c, nothing clipped
    assert len(seen["ratio"]) == K * R and set(seen["ratio"]) == {1.0}
    c, Q = seen["c"][0], seen["Q"][0]
    assert set(seen["c"]) == {c} and max(seen["max_abs"]) <= c
    n = [s.n_persons for s in fed.silos]
    assert [prog.silos[s.name].n_train for s in fed.silos] == n  # join replies count persons

    # the simulator, same job, same seeded data, one σ for the consortium
    cfg = job_config(prog.job)
    alg = ULDP(persons_in_silos=M)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(fed, job_model(prog.job), alg, cfg,
                       store=BudgetStore(tmp_path / "sim.sqlite"))
    sigma = res.plans[0].noise_multiplier
    assert prog.consortium_sigma() == sigma  # the largest σ_k = the strictest target's
    assert sigma == uacc.calibrate_sigma([PrivacyTarget(2.0, DELTA)], R)
    assert c == S.share_range(n, JOB["clip"], sigma, K, M)
    Z = sum(n) / M
    step = JOB["lr"] * S.sum_error_bound(K, c, Q) / Z  # one round's quantization, per coord
    # a round's map w ↦ w − lr(Σ_k u_k(w)/Z + l2·w) is L-Lipschitz: the weights total Z,
    # a clipped logistic row gradient is ‖x̃‖²/4-Lipschitz (x̃ = [x, 1]); errors compound
    x2 = max(float((np.sum(s.X_train ** 2, axis=1) + 1).max()) for s in fed.silos)
    L = 1 + JOB["lr"] * (x2 / 4 + prog.job["l2"])
    allowance = step * math.sqrt(prog.P) * sum(L ** j for j in range(R))  # in norm
    sim = res.shared  # the simulator's server model
    diff = float(np.linalg.norm(prog.server.params - sim))
    assert 0 < diff <= allowance, (diff, allowance)
    moved = np.linalg.norm(prog.server.params - job_model(prog.job).init_params())
    assert moved > 1e3 * allowance  # the check has teeth

    # every silo charged exactly the simulator's events: R rounds of Gaussian(σ*)
    for name, path in w["silos"].items():
        cfg_s = load_silo_config(path)
        got = _store_events(cfg_s.budget_store, name)[0]
        assert got == _store_events(tmp_path / "sim.sqlite", name)[0]
        assert got == {repr(dpa.GaussianDpEvent(sigma)): R}


def test_the_silo_report_states_the_consortium_and_the_share_figures(tmp_path):
    w = consortium(tmp_path / "c", federation())
    prog = run_loopback(tmp_path / "c", w)
    R, sigma = JOB["rounds"], prog.consortium_sigma()
    for name, path in w["silos"].items():
        priv = release.silo_privacy(resumed(path))
        u = priv["uldp"]
        # independent accounting: dp_accounting's PLD and RDP of the same Gaussians
        agg = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(sigma), R)
        share = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(sigma / math.sqrt(K)), R)
        assert u["consortium_epsilon"] == pytest.approx(tightest(agg, DELTA)[0], rel=1e-9)
        assert u["share_epsilon"] == pytest.approx(tightest(share, DELTA)[0], rel=1e-9)
        assert u["share_epsilon"] > 1.5 * u["consortium_epsilon"]
        assert priv["epsilon"] == pytest.approx(u["consortium_epsilon"], rel=1e-9)
        assert priv["epsilon"] <= EPS[name] + 1e-9 and priv["noise_multiplier"] == sigma
        assert f"{u['share_epsilon']:.4g}" in priv["statement"]
        assert "SecAgg+" in priv["statement"] and priv["privacy_unit"] == "person"
        # the saved model card carries the same figures
        cards = list(Path(load_silo_config(path).release_dir).rglob("card-*.json"))
        assert cards, "the silo saved no card after its last round"
        card = json.loads(cards[0].read_text())
        assert card["privacy"]["uldp"]["share_epsilon"] == pytest.approx(u["share_epsilon"])
    # the server's shared-model card names the one σ and the SecAgg+ sum
    server_cards = list((Path(w["server"]).parent / "state/server").rglob("card-*.json"))
    assert server_cards
    shared = json.loads(server_cards[0].read_text())["privacy"]
    assert shared["uldp_sigma"] == sigma and "SecAgg+ sum of all 3" in shared["statement"]


# --- refusals: no SecAgg+, no person unit, not every silo, linked weights, bad σ --------------

def test_uldp_needs_secagg_the_person_unit_and_every_silo(tmp_path):
    fed = federation()
    from silofl.runtime.network import consortium as network_init
    with warnings.catch_warnings():  # deploy init writes what uldp needs
        warnings.simplefilter("ignore")
        network_init.init(tmp_path / "z", federation=fed, noise="seeded", delta=DELTA,
                          address="127.0.0.1:9", job=JOB)
    written = tomllib.loads((tmp_path / "z" / "server.toml").read_text())["server"]
    assert written["secagg"] is True and written["min_silos"] == written["expected_silos"] == K
    load_server_config(tmp_path / "z" / "server.toml")
    consortium(tmp_path / "a", fed, secagg=False)
    with pytest.raises(ConfigError, match="only inside a SecAgg\\+ sum.*secagg = true"):
        load_server_config(tmp_path / "a" / "server.toml")
    consortium(tmp_path / "b", fed, server={"min_silos": K - 1})
    with pytest.raises(ConfigError, match="every one of the 3 silos"):
        load_server_config(tmp_path / "b" / "server.toml")
    consortium(tmp_path / "d", fed, job={"privacy_unit": "example"})
    with pytest.raises(ConfigError, match="privacy_unit = \"person\""):
        load_server_config(tmp_path / "d" / "server.toml")
    for k, (key, value) in enumerate((("uldp_weighting", "linked"),
                                      ("uldp_sample_rate", 0.5))):
        consortium(tmp_path / f"l{k}", fed, job={key: value})
        with pytest.raises(ConfigError, match="linkage protocol.*consortium secret"):
            load_server_config(tmp_path / f"l{k}" / "server.toml")
    # the legacy fast path has no SecAgg+: refused there as for the other secagg jobs
    from silofl.runtime.network.flower import run_server
    consortium(tmp_path / "e", fed)
    with pytest.raises(ConfigError, match="SuperLink"):
        run_server(load_server_config(tmp_path / "e" / "server.toml"))


def _joined(tmp: Path, fed: Federation):
    from silofl.runtime.network import messages as W
    from silofl.runtime.network.server import ServerProgram
    from silofl.runtime.network.silo import new_nonce
    w = consortium(tmp, fed)
    srv = ServerProgram(load_server_config(tmp / "server.toml"))
    silos = {n: SiloProgram(load_silo_config(p)) for n, p in w["silos"].items()}
    for s in silos.values():
        rep = s.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
                      "job": W.canonical(srv.job).decode()})
        assert rep["status"] == "ok", rep["reason"]
        srv.accept_join(rep)
    return w, srv, silos


def test_a_silo_refuses_unmasked_rounds_and_a_smaller_sigma_before_any_charge(tmp_path):
    w, srv, silos = _joined(tmp_path / "c", federation())
    s = silos["h0"]
    rep, u = s.round(srv.request("h0", 1), [srv.message])  # not masked
    assert rep["status"] == "refused" and "SecAgg+" in rep["reason"] and u is None
    s.masked = True
    low = {**srv.request("h0", 1), "sigma": s.reported[2] * 0.99}
    rep, u = s.round(low, [srv.message])
    assert rep["status"] == "refused" and "below this silo's own" in rep["reason"]
    assert all(_store_events(load_silo_config(p).budget_store, n)[0] == {}
               for n, p in w["silos"].items())
    # the consortium's σ (h1's, larger than h0's own) is accepted and charged
    assert srv.consortium_sigma() > s.reported[2]
    rep, u = s.round(srv.request("h0", 1), [srv.message])
    assert rep["status"] == "ok" and u.shape == (1, srv.P)
    got = _store_events(load_silo_config(w["silos"]["h0"]).budget_store, "h0")[0]
    assert got == {repr(dpa.GaussianDpEvent(srv.consortium_sigma())): 1}
    # a later round with another σ is refused (one σ per job)
    other = {**srv.request("h0", 2), "sigma": srv.consortium_sigma() * 1.5}
    rep, _ = s.round(other, [srv.message])
    assert rep["status"] == "refused" and "one σ per job" in rep["reason"]


def test_the_share_is_bounded_and_carries_its_noise_share(tmp_path):
    """The share u_k's mean part is at most n_k·C/M in norm; its noise is σC/√K."""
    w, srv, silos = _joined(tmp_path / "c", federation(persons=200))
    s = silos["h0"]
    s.masked = True
    sigma = srv.consortium_sigma()
    rep, u = s.round(srv.request("h0", 1), [srv.message])
    assert rep["status"] == "ok"
    # the same silo's noiseless share, from the training module directly
    from silofl.training.uldp import weighted_sums
    n0 = s.trainer.data.n[0]
    exact = weighted_sums(s.model, srv.message[None], s.trainer.data,
                          [np.full(n0, 1.0 / M)], JOB["clip"])[0]
    assert np.linalg.norm(exact) <= n0 * JOB["clip"] / M + 1e-9
    noise = u[0] - exact
    std = sigma * JOB["clip"] / math.sqrt(K)
    assert np.all(np.abs(noise) <= S.SHARE_TAIL_Z * std)
    assert np.all(np.abs(u[0]) <= S.share_range([n0], JOB["clip"], sigma, K, M))
    assert np.abs(noise).max() > 1e-3 * std  # noise was really added


def test_linked_weights_and_sampling_are_refused_over_the_network():
    for alg in (ULDP("linked"), ULDP(sample_rate=0.5)):
        alg.bind_silos(["a", "b"])
        with pytest.raises(ConfigError, match="linkage protocol"):
            alg.share_step(None, np.zeros(3), None, 1, 1.0)


def test_a_sum_missing_a_silo_is_never_unmasked(tmp_path):
    """A silo whose lifetime budget covers one of two rounds drops out of round 2's masked
    sum; with threshold K Flower never unmasks the others' shares, and the server keeps its
    round-1 model (checkpointed): no step on a sum that lacks a share of the noise."""
    fed = federation()
    w = consortium(tmp_path / "c", fed, job={"rounds": 2})
    raw = tomllib.loads(Path(w["silos"]["h0"]).read_text())
    raw["silo"]["lifetime_epsilon"] = 0.85 * EPS["h1"]  # one round at σ* costs 1.36, two 2.0
    Path(w["silos"]["h0"]).write_text(deploy._toml(raw))
    prog = run_loopback(tmp_path / "c", w)
    assert prog.done == 1 and all(r.rounds == [1] for r in prog.silos.values())
    summary = json.loads((Path(w["server"]).parent / "state/server/summary.json").read_text())
    assert summary["rounds_done"] == 1
    # round 2: h0 was refused by its store before any charge; h1 and h2 were charged for
    # shares the server never saw (the reservation precedes the masked upload)
    sigma = prog.consortium_sigma()
    for name, path in w["silos"].items():
        got = _store_events(load_silo_config(path).budget_store, name)[0]
        assert got == {repr(dpa.GaussianDpEvent(sigma)): 1 if name == "h0" else 2}


class _DropOnce(flower_app.LoopbackGrid):
    """Loses node `node`'s first masked-vector request (as a SuperNode that went away):
    the others have run the round and sent their masked shares."""

    def __init__(self, configs, node: int):
        super().__init__(configs)
        self.node, self.dropped = node, False

    def _deliver(self, messages):
        from flwr.app import Error, Message
        from flwr.common.secure_aggregation.secaggplus_constants import (
            RECORD_KEY_CONFIGS,
            Key,
            Stage,
        )
        out, keep = [], []
        for m in messages:
            rec = m.content.config_records.get(RECORD_KEY_CONFIGS)
            if not self.dropped and m.metadata.dst_node_id == self.node and rec is not None \
                    and rec.get(Key.STAGE) == Stage.COLLECT_MASKED_VECTORS:
                self.dropped = True
                out.append(Message(Error(code=1, reason="node went away"), reply_to=m))
            else:
                keep.append(m)
        return out + super()._deliver(keep)


def test_a_round_missing_a_share_is_asked_again_and_resent_shares_cost_nothing(
        tmp_path, monkeypatch):
    """h0's masked upload is lost in the first attempt at round 1: with threshold K the
    partial sum is never unmasked (no step); the round is asked again, h1 and h2 resend
    their cached shares (no second charge) and h0 runs it once: every store holds one
    round, and the model is one full sum's step."""
    fed = federation()
    w = consortium(tmp_path / "c", fed, job={"rounds": 2})
    seen = spy_quantization(monkeypatch)
    nodes = {100 + i: {"silo-config": str(w["silos"][n])} for i, n in enumerate(sorted(w["silos"]))}
    grid = _DropOnce(nodes, node=100)  # h0
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                  run_config={"server-config": str(tmp_path / "c" / "server.toml")})
    prog = flower_app.run_server_app(grid, ctx)  # the workflow's 2 rounds: 1 lost, 1 done
    assert grid.dropped and prog.done == 1
    assert all(r.rounds == [1] for r in prog.silos.values())
    sigma = prog.consortium_sigma()
    for name, path in w["silos"].items():  # one charge each, the resend cost nothing
        got = _store_events(load_silo_config(path).budget_store, name)[0]
        assert got == {repr(dpa.GaussianDpEvent(sigma)): 1}
    # two masked uploads by h1 and h2 (first attempt and resend), one by h0
    assert len(seen["ratio"]) == 2 * (K - 1) + 1
    # the same step as a run without the loss: the same job (σ, seeded shares), its
    # ServerApp serving one round only; two quantizations apart
    real = flower_app.FlowerServerConfig
    monkeypatch.setattr(flower_app, "FlowerServerConfig",
                        lambda num_rounds, round_timeout: real(1, round_timeout))
    clean = run_loopback(tmp_path / "d", consortium(tmp_path / "d", fed, job={"rounds": 2}))
    assert clean.done == 1 and clean.consortium_sigma() == sigma
    n = [s.n_persons for s in fed.silos]
    c = S.share_range(n, JOB["clip"], sigma, K, M)
    bound = 2 * JOB["lr"] * S.sum_error_bound(K, c) / (sum(n) / M) * math.sqrt(prog.P)
    diff = float(np.linalg.norm(prog.server.params - clean.server.params))
    assert diff <= bound, (diff, bound)
    assert np.linalg.norm(clean.server.params - job_model(prog.job).init_params()) > 1e3 * bound


# --- real processes: flower-superlink, one SuperNode per hospital, `flwr run` -----------------

@pytest.mark.slow
@pytest.mark.network
def test_uldp_over_tls_processes_with_secagg(tmp_path):
    """Three hospitals as SuperNodes (TLS, registered keys) run two uldp rounds through
    `flwr run` with SecAgg+: every store holds two Gaussian(σ*) rounds, the server's model
    equals the in-process (LoopbackGrid) run of the same job within twice the module's
    quantization allowance (same seeded shares; each run quantizes stochastically)."""
    import os
    import subprocess
    import time

    from test_network_flower import (
        BIN,
        READY_S,
        _free_port,
        _ports_free,
        _wait_online,
        _wait_registered,
    )
    fed = federation()
    port = _free_port()
    while not _ports_free(port, 16):
        port = _free_port()
    out = tmp_path / "c"
    w = consortium(out, fed, job={"rounds": 2}, lifetime=3.0)  # two runs of the data
    raw = tomllib.loads((out / "server.toml").read_text())
    raw["server"].update(address=f"127.0.0.1:{port}", join_timeout=READY_S)
    (out / "server.toml").write_text(deploy._toml(raw))
    for path in w["silos"].values():
        raw = tomllib.loads(Path(path).read_text())
        raw["server"]["address"] = f"127.0.0.1:{port}"
        Path(path).write_text(deploy._toml(raw))
    flower_app.write_app(out, out / "server.toml", f"127.0.0.1:{port}", insecure=False)
    cmds = flower_app.local_commands(out, w["silos"], port, bin_dir=str(BIN))
    env = {**os.environ, **cmds["env"], "FLWR_HOME": str(out / "flower_home"),
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    procs: list = []
    try:
        procs.append(subprocess.Popen(cmds["superlink"], env=env, stdout=open(
            tmp_path / "superlink.log", "w"), stderr=subprocess.STDOUT))
        deadline = time.monotonic() + READY_S
        for cmd in cmds["register"]:
            _wait_registered(cmd, env, deadline)
        for n, argv in cmds["supernodes"].items():
            procs.append(subprocess.Popen(argv, env=env, stdout=open(
                tmp_path / f"node_{deploy.silo_file_id(n)}.log", "w"), stderr=subprocess.STDOUT))
        _wait_online(env, K, time.monotonic() + READY_S)
        r = subprocess.run(cmds["run"], env=env, capture_output=True, text=True,
                           timeout=2 * READY_S)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    summary = out / "state" / "server" / "summary.json"
    assert summary.is_file(), r.stdout[-3000:] + r.stderr[-2000:]
    s = json.loads(summary.read_text())
    assert s["rounds_done"] == 2 and s["secagg"]
    from silofl.runtime.network.server import ServerProgram
    real = ServerProgram(load_server_config(out / "server.toml"))  # its checkpoint
    sigma = real.consortium_sigma()
    for name, path in w["silos"].items():
        got = _store_events(load_silo_config(path).budget_store, name)[0]
        assert got == {repr(dpa.GaussianDpEvent(sigma)): 2}
    # the same job in process (another folder: its own stores and state)
    loop = run_loopback(tmp_path / "d", consortium(tmp_path / "d", fed, job={"rounds": 2},
                                                   lifetime=3.0))
    assert loop.done == 2
    n = [x.n_persons for x in fed.silos]
    c = S.share_range(n, JOB["clip"], sigma, K, M)
    step = JOB["lr"] * S.sum_error_bound(K, c) / (sum(n) / M) * math.sqrt(real.P)
    x2 = max(float((np.sum(x.X_train ** 2, axis=1) + 1).max()) for x in fed.silos)
    L = 1 + JOB["lr"] * (x2 / 4 + real.job["l2"])
    diff = float(np.linalg.norm(real.server.params - loop.server.params))
    assert diff <= 2 * step * (1 + L), (diff, step)


def test_silos_refuse_a_secagg_setup_that_could_unmask_a_partial_sum(tmp_path, monkeypatch):
    """A server that sets a majority threshold (a curious one, outside the honest-but-
    curious assumption) gets no share at all: every silo refuses the setup stage, before
    its round is run or charged."""
    fed = federation()
    w = consortium(tmp_path / "c", fed, job={"rounds": 1})
    monkeypatch.setattr(S, "uldp_threshold", S.reconstruction_threshold)
    prog = run_loopback(tmp_path / "c", w)
    assert prog.done == 0
    for name, path in w["silos"].items():
        assert _store_events(load_silo_config(path).budget_store, name)[0] == {}

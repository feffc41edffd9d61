"""FedProx, SCAFFOLD and APFL under silo-specific DP: each equals a scalar transcription of
its paper's update without noise, its ledger holds exactly the steps it ran, the per-silo
(networked) hosting gives the joint simulator's models, and GLMs and torch models train."""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import pytest

from silofl.algorithms import METHODS, make_algorithm
from silofl.config import config_from_dict
from silofl.data import linear_silos, load_heart_disease
from silofl.errors import ConfigError
from silofl.experiments.build import build_algorithms
from silofl.models import make_model
from silofl.privacy import accounting, events
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime import simulator
from silofl.runtime.network.hosting import NETWORK_METHODS
from silofl.runtime.plan import TrainingConfig
from silofl.runtime.simulator import simulate
from silofl.training.dpsgd import GradientRule
from silofl.training.silo_data import SiloArrays
from silofl.training.trainer import LocalTrainer

PEERS = ("fedprox", "scaffold", "apfl")
LABELS = {"apfl": {"dpsgd-global", "dpsgd-personal"}}
TOL = dict(rtol=1e-6, atol=1e-8)  # the trainer computes gradients in float32 (SiloArrays)


@pytest.fixture
def cached_epsilon(monkeypatch):
    """Memoize ε evaluations (speed only; the values are dp_accounting's)."""
    cached = functools.lru_cache(maxsize=None)(accounting.epsilon)
    monkeypatch.setattr(accounting, "epsilon", cached)


# --- the papers' updates, transcribed with scalars (1-D linear regression: w, b) ---------------

XS = ([0.5, -1.0, 2.0], [1.5, 0.25, -0.5, 1.0])  # two silos' inputs (values exact in float32)
YS = ([1.0, -0.5, 2.5], [-1.0, 0.5, 0.0, -0.75])
STEPS = (3, 2)  # T_k: local steps per pass (full batches)
LR, ROUNDS = 0.2, 4


def _grad(w: float, b: float, k: int) -> tuple[float, float]:
    """∇ of the mean of ½(w·x + b − y)² over silo k's examples."""
    gw = gb = 0.0
    for x, y in zip(XS[k], YS[k]):
        r = w * x + b - y
        gw, gb = gw + r * x, gb + r
    return gw / len(XS[k]), gb / len(XS[k])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _trainer() -> LocalTrainer:
    """Non-private full-batch trainer (q = 1: every step the exact mean gradient)."""
    data = SiloArrays.stack([np.array(x, dtype=float)[:, None] for x in XS],
                            [np.array(y, dtype=float) for y in YS])
    return LocalTrainer(model=make_model("linear", 1), data=data,
                        rule=GradientRule(1.0, None), batch_size=100,
                        steps_per_round=np.array(STEPS), lr=LR, l2=0.0,
                        rng=Randomness.seeded(0))


def _run(alg) -> np.ndarray:
    """The algorithm's own silo and server steps for ROUNDS rounds, uniform weights."""
    trainer = _trainer()
    silos, server = alg.init(np.array([0.3, -0.2]), 2, rounds=ROUNDS)
    for t in range(1, ROUNDS + 1):
        silos, update = alg.silo_step(silos, alg.broadcast(server), trainer, t)
        server = alg.server_step(server, update, np.ones(2))
    return alg.personal_models(silos, server)


def _fedprox_by_hand(mu: float) -> list[tuple[float, float]]:
    W, B = 0.3, -0.2
    for _ in range(ROUNDS):
        dw, db = [], []
        for k in range(2):
            w, b = W, B
            for _ in range(STEPS[k]):
                gw, gb = _grad(w, b, k)
                w, b = w - LR * (gw + mu * (w - W)), b - LR * (gb + mu * (b - B))
            dw.append(w - W)
            db.append(b - B)
        W, B = W + _mean(dw), B + _mean(db)
    return [(W, B)] * 2


def _scaffold_by_hand() -> list[tuple[float, float]]:
    X, c = [0.3, -0.2], [0.0, 0.0]
    ck = [[0.0, 0.0], [0.0, 0.0]]
    for _ in range(ROUNDS):
        dys, dcs = [], []
        for k in range(2):
            y = list(X)
            for _ in range(STEPS[k]):
                g = _grad(y[0], y[1], k)
                y = [y[i] - LR * (g[i] - ck[k][i] + c[i]) for i in range(2)]
            new = [ck[k][i] - c[i] + (X[i] - y[i]) / (STEPS[k] * LR) for i in range(2)]
            dys.append([y[i] - X[i] for i in range(2)])
            dcs.append([new[i] - ck[k][i] for i in range(2)])
            ck[k] = new
        X = [X[i] + _mean([d[i] for d in dys]) for i in range(2)]
        c = [c[i] + _mean([d[i] for d in dcs]) for i in range(2)]
    return [(X[0], X[1])] * 2


def _apfl_by_hand(alpha0: float, a_lr: float) -> list[tuple[float, float]]:
    W = [0.3, -0.2]
    v = [[0.3, -0.2], [0.3, -0.2]]
    alpha = [alpha0, alpha0]
    for _ in range(ROUNDS):
        dws = []
        for k in range(2):
            u = list(W)
            for _ in range(STEPS[k]):  # the global pass
                g = _grad(u[0], u[1], k)
                u = [u[i] - LR * g[i] for i in range(2)]
            dws.append([u[i] - W[i] for i in range(2)])
            for _ in range(STEPS[k]):  # the personal pass on the mixture, w held fixed
                a = alpha[k]
                vbar = [a * v[k][i] + (1 - a) * W[i] for i in range(2)]
                g = _grad(vbar[0], vbar[1], k)
                grad_a = sum((v[k][i] - W[i]) * g[i] for i in range(2))
                v[k] = [v[k][i] - LR * a * g[i] for i in range(2)]
                alpha[k] = min(1.0, max(0.0, a - a_lr * grad_a))
        W = [W[i] + _mean([d[i] for d in dws]) for i in range(2)]
    return [tuple(alpha[k] * v[k][i] + (1 - alpha[k]) * W[i] for i in range(2))
            for k in range(2)]


@pytest.mark.parametrize("method, settings, by_hand", [
    ("fedprox", {"prox_mu": 0.7}, lambda: _fedprox_by_hand(0.7)),
    ("scaffold", {}, _scaffold_by_hand),
    ("apfl", {"apfl_alpha": 0.6, "apfl_alpha_lr": 0.5}, lambda: _apfl_by_hand(0.6, 0.5)),
    ("apfl", {"apfl_alpha": 0.3}, lambda: _apfl_by_hand(0.3, LR)),  # 0: the training lr
])
def test_equals_the_papers_update_without_noise(method, settings, by_hand):
    got = _run(make_algorithm(method, weighted=False, **settings))
    np.testing.assert_allclose(got, np.array(by_hand()), **TOL)
    # the method is not FedAvg in disguise: its own terms change the models
    fedavg = _run(make_algorithm("fedavg", weighted=False))
    assert np.abs(got - fedavg).max() > 1e-3


def test_fedprox_at_mu_zero_is_fedavg_and_scaffold_learns_its_drift():
    np.testing.assert_allclose(_run(make_algorithm("fedprox", prox_mu=0.0, weighted=False)),
                               _run(make_algorithm("fedavg", weighted=False)), **TOL)
    alg = make_algorithm("scaffold", weighted=False)
    trainer = _trainer()
    silos, server = alg.init(np.zeros(2), 2)
    for t in (1, 2, 3):
        silos, update = alg.silo_step(silos, alg.broadcast(server), trainer, t)
        server = alg.server_step(server, update, np.ones(2))
    # c is the mean of the c_k (full participation, uniform weights), and nonzero
    np.testing.assert_allclose(server.control, silos.control.mean(0), **TOL)
    assert np.abs(server.control).max() > 1e-3


# --- privacy: the ledger holds exactly the executed steps, under the declared labels ---------

def _binary_fed(eps=(1.0, 2.0, 4.0), sizes=(60, 90, 120)):
    fed = linear_silos(num_silos=len(sizes), sizes=list(sizes), dim=4, heterogeneity=0.5,
                       task="binary", seed=0)
    return fed.with_targets(None, {s.name: PrivacyTarget(e, 1e-4)
                                   for s, e in zip(fed.silos, eps)})


def _cfg(**kw) -> TrainingConfig:
    return TrainingConfig(**{**dict(rounds=6, batch_size=10, lr=0.2, clip=1.0, seed=3,
                                    noise="seeded"), **kw})


@pytest.mark.parametrize("method", PEERS)
def test_ledger_equals_executed_steps(method, monkeypatch, cached_epsilon):
    made = []

    class Recording(LocalTrainer):
        def __post_init__(self):
            super().__post_init__()
            made.append(self)

    monkeypatch.setattr(simulator, "LocalTrainer", Recording)
    fed, cfg = _binary_fed(), _cfg()
    alg = make_algorithm(method)
    res = simulate(fed, make_model("logistic", fed.dim), alg, cfg)
    trainer = made[-1]
    fedavg = simulate(fed, make_model("logistic", fed.dim), make_algorithm("fedavg"), cfg)
    for k, (led, plan) in enumerate(zip(res.ledgers, res.plans)):
        counts = Counter()
        for event, c in led.spent_counts().items():
            counts[type(event).__name__] += c
        assert counts["PoissonSampledDpEvent"] == trainer.steps_done[k]
        assert trainer.steps_done[k] == alg.passes_per_round * cfg.rounds * plan.steps_per_pass
        assert events.flatten(plan.declared) == led.spent_counts()
        assert {e.label for e in led.entries} == LABELS.get(method, {"dpsgd"})
        per_label = Counter(e.label for e in led.entries)
        assert set(per_label.values()) == {cfg.rounds}  # each pass once per round
        assert 0.97 * plan.target.epsilon <= led.epsilon() <= plan.target.epsilon
        # FedProx and SCAFFOLD cost what FedAvg costs; APFL's second pass needs more noise
        same = plan.noise_multiplier == fedavg.plans[k].noise_multiplier
        assert same == (method != "apfl")


# --- hosting: each silo on its own trainer (as on the network) gives the joint models -------

@pytest.mark.filterwarnings("ignore:batch_size 500")
@pytest.mark.parametrize("method", PEERS)
def test_per_silo_hosting_equals_joint(method):
    fed = _binary_fed()
    model = make_model("logistic", fed.dim)
    cfg = _cfg(private=False, batch_size=500, rounds=4)  # q = 1: no sampling randomness
    joint = simulate(fed, model, make_algorithm(method), cfg)
    per_silo = simulate(fed, model, make_algorithm(method), cfg, hosting="per_silo")
    np.testing.assert_allclose(per_silo.params, joint.params, **TOL)


@pytest.mark.parametrize("method", PEERS)
def test_private_per_silo_run_is_seeded_and_charged(method, cached_epsilon):
    fed, cfg = _binary_fed(), _cfg(rounds=3)
    model = make_model("logistic", fed.dim)
    a = simulate(fed, model, make_algorithm(method), cfg, hosting="per_silo")
    b = simulate(fed, model, make_algorithm(method), cfg, hosting="per_silo")
    np.testing.assert_array_equal(a.params, b.params)  # same process, same seeded streams
    for led, plan in zip(a.ledgers, a.plans):
        assert events.flatten(plan.declared) == led.spent_counts()
    assert method in NETWORK_METHODS


@pytest.mark.filterwarnings("ignore:batch_size")
@pytest.mark.parametrize("method", ("scaffold", "apfl"))
def test_own_step_runs_at_node_level_too(method):
    """The node-level pass (silo by silo) applies the method's own step as the batched
    pass does: full batches of every person equal full example-level batches."""
    fed = linear_silos(num_silos=3, sizes=[50, 50, 50], dim=3, task="binary", seed=0)
    base = dict(rounds=3, batch_size=50, lr=0.2, clip=1.0, seed=0, private=False,
                local_epochs=2)
    model = make_model("logistic", fed.dim)
    node = simulate(fed, model, make_algorithm(method), TrainingConfig(
        **base, privacy_unit="node", node_S=1, adjacency="node"))
    example = simulate(fed, model, make_algorithm(method), TrainingConfig(**base))
    np.testing.assert_allclose(node.params, example.params, **TOL)
    fedavg = simulate(fed, model, make_algorithm("fedavg"), TrainingConfig(**base))
    assert np.abs(node.params - fedavg.params).max() > 1e-5  # ≫ the tolerance above


# --- GLM and torch smoke runs, settings and errors ------------------------------------------

def test_glm_methods_learn_on_heart(cached_epsilon):
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(2.0, 1e-4))
    model = make_model("logistic", fed.dim)
    cfg = TrainingConfig(rounds=12, batch_size=16, lr=0.1, clip=1.0, seed=0, noise="seeded")
    for m in PEERS:
        res = simulate(fed, model, make_algorithm(m), cfg)
        assert res.final_pooled > 0.7, (m, res.final_pooled)


@pytest.mark.parametrize("method", PEERS)
def test_torch_mlp_runs(method, cached_epsilon):
    pytest.importorskip("torch")
    fed = _binary_fed(sizes=(40, 50, 60))
    model = make_model("mlp", fed.dim, 2, task="binary", hidden=[8])
    res = simulate(fed, model, make_algorithm(method), _cfg(rounds=3))
    assert res.params.shape == (3, model.num_params) and np.all(np.isfinite(res.params))
    assert all(led.report()["within_target"] for led in res.ledgers)


@pytest.mark.parametrize("kw, words", [
    (dict(prox_mu=-0.1), "prox_mu"), (dict(prox_mu=float("nan")), "prox_mu"),
    (dict(apfl_alpha=1.5), "apfl_alpha"), (dict(apfl_alpha=-0.1), "apfl_alpha"),
    (dict(apfl_alpha_lr=-1.0), "apfl_alpha_lr"),
])
def test_bad_settings_are_config_errors(kw, words):
    with pytest.raises(ConfigError, match=words):
        make_algorithm("fedavg", **kw)


def test_config_keys_reach_the_algorithms_and_scaffold_needs_a_step_size():
    cfg = config_from_dict({"training": {"methods": list(PEERS), "prox_mu": 0.25,
                                         "apfl_alpha": 0.8, "apfl_alpha_lr": 0.05}})
    prox, scaf, apfl = (a.describe() for a in build_algorithms(cfg))
    assert prox["mu"] == 0.25 and scaf["name"] == "scaffold"
    assert (apfl["alpha"], apfl["alpha_lr"], apfl["passes_per_round"]) == (0.8, 0.05, 2)
    assert set(PEERS) <= set(METHODS)
    fed = _binary_fed()
    with pytest.raises(ConfigError, match="set lr > 0"):
        simulate(fed, make_model("logistic", fed.dim), make_algorithm("scaffold"),
                 _cfg(lr=0.0, private=False))


def test_a_networked_release_states_the_methods_settings():
    pytest.importorskip("flwr")
    from silofl.runtime.network import release
    from silofl.runtime.network.server import JOB_DEFAULTS
    job = {**JOB_DEFAULTS, "method": "fedprox", "prox_mu": 0.2}
    assert release._method(job)["prox_mu"] == 0.2
    apfl = release._method({**job, "method": "apfl", "apfl_alpha": 0.3})
    assert (apfl["apfl_alpha"], apfl["apfl_alpha_lr"]) == (0.3, 0.0)
    assert "prox_mu" not in release._method({**job, "method": "fedavg"})

"""FedPer, FedRep and FedBN (a shared body and personal coordinates) under silo-specific DP:
each equals a hand-written transcription of its paper's update without noise, the ledgers
hold exactly the steps that ran, partial DP-SGD clips on the trained coordinates only, the
per-silo hosting routes the same models as the joint one, and GLMs work or are refused."""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import pytest
import torch

from silofl.algorithms import make_algorithm
from silofl.data import linear_silos
from silofl.errors import ConfigError
from silofl.models import make_model
from silofl.privacy import accounting, events
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime import simulator
from silofl.runtime.plan import TrainingConfig, plan_silos
from silofl.runtime.simulator import simulate
from silofl.training.trainer import LocalTrainer

SPLIT = ("fedper", "fedrep", "fedbn")
pytestmark = pytest.mark.filterwarnings("ignore:batch_size .* full-batch steps")
LABELS = {"fedper": {"dpsgd"}, "fedbn": {"dpsgd"}, "fedrep": {"dpsgd-head", "dpsgd-body"}}


@pytest.fixture
def cached_epsilon(monkeypatch):
    """Memoize ε evaluations (speed only; the values are dp_accounting's)."""
    monkeypatch.setattr(accounting, "epsilon",
                        functools.lru_cache(maxsize=None)(accounting.epsilon))


@pytest.fixture
def trainers(monkeypatch):
    """Capture the LocalTrainer a simulation builds, to read its step counters."""
    made = []

    class Recording(LocalTrainer):
        def __post_init__(self):
            super().__post_init__()
            made.append(self)

    monkeypatch.setattr(simulator, "LocalTrainer", Recording)
    return made


def _fed(sizes=(7, 9), task="regression", dim=2, eps=3.0):
    fed = linear_silos(num_silos=len(sizes), sizes=list(sizes), dim=dim, heterogeneity=1.0,
                       seed=2, task=task)
    return fed.with_targets(PrivacyTarget(eps, 1e-4))


def _model(fed, name):
    opts = {} if name in ("linear", "logistic") else {"task": fed.task, "hidden": [4]}
    return make_model(name, fed.dim, 2, **opts)


# --- the papers' updates, transcribed by hand (non-private, full batches) -------------------

def _glm_by_hand(fed, method, rounds, steps, lr):
    """FedPer / FedRep on linear regression y ≈ w·x + b, head = b, written out in scalars:
    full-batch gradient steps g = (1/n) Σ_i (w·x_i + b − y_i)·(x_i, 1)."""
    d = fed.dim
    body, heads = [0.0] * d, [0.0] * fed.num_silos
    n = [s.n_train for s in fed.silos]
    for _ in range(rounds):
        deltas = []
        for k, s in enumerate(fed.silos):
            X, y = s.X_train.astype(np.float32).astype(float), s.y_train
            w, b = list(body), heads[k]

            def grad(w, b, X=X, y=y, m=n[k]):
                gw, gb = [0.0] * d, 0.0
                for i in range(m):
                    r = sum(w[j] * X[i, j] for j in range(d)) + b - y[i]
                    for j in range(d):
                        gw[j] += r * X[i, j] / m
                    gb += r / m
                return gw, gb

            if method == "fedper":  # one pass on the whole model
                for _ in range(steps):
                    gw, gb = grad(w, b)
                    w, b = [w[j] - lr * gw[j] for j in range(d)], b - lr * gb
            else:  # FedRep: the head with the body frozen, then the body with the head frozen
                for _ in range(steps):
                    b -= lr * grad(w, b)[1]
                for _ in range(steps):
                    gw = grad(w, b)[0]
                    w = [w[j] - lr * gw[j] for j in range(d)]
            heads[k] = b
            deltas.append([w[j] - body[j] for j in range(d)])
        body = [body[j] + sum(n[k] * deltas[k][j] for k in range(len(n))) / sum(n)
                for j in range(d)]
    return np.array([body + [heads[k]] for k in range(fed.num_silos)])


@pytest.mark.parametrize("method", ["fedper", "fedrep"])
def test_glm_fedper_and_fedrep_equal_their_papers_updates(method):
    fed = _fed()
    cfg = TrainingConfig(rounds=3, batch_size=9, local_epochs=2.0, lr=0.2, private=False,
                         seed=0)  # b ≥ every n: full batches
    res = simulate(fed, _model(fed, "linear"), make_algorithm(method), cfg)
    steps = res.plans[0].steps_per_pass
    assert steps == 2 and res.plans[1].steps_per_pass == 2
    want = _glm_by_hand(fed, method, 3, steps, 0.2)
    np.testing.assert_allclose(res.params, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(want[0, -1], want[1, -1])  # the intercepts are personal


def _torch_by_hand(fed, model, rounds, steps, lr, keep):
    """FedBN (Algorithm 1 of Li et al. 2021) on the LayerNorm MLP with autograd: each silo
    starts from the shared parameters and its own normalization parameters, takes steps[k]
    full-batch gradient steps, and the server averages the non-normalization parameters
    weighted by n_k; a silo's model is (shared, its own norm)."""
    net = model.module
    params = [p for _, p in net.named_parameters()]
    shared = torch.tensor(model.init_params())
    own = [shared.clone() for _ in fed.silos]
    keep_t = torch.tensor(keep)
    n = torch.tensor([float(s.n_train) for s in fed.silos])
    for _ in range(rounds):
        deltas = []
        for k, s in enumerate(fed.silos):
            w = torch.where(keep_t, own[k], shared)
            X = torch.tensor(s.X_train, dtype=torch.float32)
            y = torch.tensor(s.y_train, dtype=torch.float32)
            for _ in range(steps[k]):
                torch.nn.utils.vector_to_parameters(w.float(), params)
                z = net(X)[:, 0]
                loss = (torch.nn.functional.softplus(z) - y * z).mean()
                g = torch.autograd.grad(loss, params)
                w = w - lr * torch.cat([gi.flatten() for gi in g]).double()
            own[k] = w.detach()
            deltas.append(torch.where(keep_t, 0.0, w.detach() - shared))
        shared = shared + sum(n[k] * deltas[k] for k in range(len(deltas))) / n.sum()
    return np.stack([torch.where(keep_t, own[k], shared).numpy() for k in range(len(own))])


def test_fedbn_equals_its_papers_update_on_a_layernorm_mlp():
    fed = _fed(sizes=(8, 11), task="binary", dim=3)
    model = _model(fed, "mlp_norm")
    keep = model.param_groups()["norm"]
    assert keep.sum() == 2 * 4  # the LayerNorm's scale and shift of 4 hidden units
    cfg = TrainingConfig(rounds=3, batch_size=11, local_epochs=2.0, lr=0.3, private=False,
                         seed=0)
    res = simulate(fed, model, make_algorithm("fedbn"), cfg)
    want = _torch_by_hand(fed, model, 3, [p.steps_per_pass for p in res.plans], 0.3, keep)
    np.testing.assert_allclose(res.params, want, rtol=1e-4, atol=1e-5)  # float32 compute
    assert not np.allclose(res.params[0][keep], res.params[1][keep])  # personal norms
    np.testing.assert_array_equal(res.params[0][~keep], res.params[1][~keep])  # shared rest


# --- privacy: the ledgers hold exactly what ran ------------------------------------------

@pytest.mark.parametrize("method", SPLIT)
def test_ledger_equals_executed_steps(method, trainers, cached_epsilon):
    fed = _fed(sizes=(40, 60), task="binary", dim=3, eps=2.0)
    cfg = TrainingConfig(rounds=3, batch_size=10, lr=0.1, clip=1.0, seed=1, noise="seeded")
    res = simulate(fed, _model(fed, "mlp_norm"), make_algorithm(method), cfg)
    trainer = trainers[-1]
    passes = 2 if method == "fedrep" else 1
    for k, (led, plan) in enumerate(zip(res.ledgers, res.plans)):
        counts = Counter()
        for event, c in led.spent_counts().items():
            counts[type(event).__name__] += c
        assert counts["PoissonSampledDpEvent"] == trainer.steps_done[k]
        assert trainer.steps_done[k] == passes * cfg.rounds * plan.steps_per_pass
        assert events.flatten(plan.declared) == led.spent_counts()
        assert {e.label for e in led.entries} == LABELS[method]
        assert led.epsilon() <= plan.target.epsilon
        if method == "fedrep":  # as many head steps as body steps
            per = Counter(e.label for e in led.entries)
            assert per["dpsgd-head"] == per["dpsgd-body"] == cfg.rounds


def test_fedrep_pays_two_passes_fedper_and_fedbn_one(cached_epsilon):
    fed = _fed(sizes=(40, 60), task="binary", dim=3, eps=2.0)
    cfg = TrainingConfig(rounds=5, batch_size=10, lr=0.1, clip=1.0)
    sigma = {m: [p.noise_multiplier for p in plan_silos(fed, make_algorithm(m), cfg)]
             for m in ("fedavg", *SPLIT)}
    assert sigma["fedper"] == sigma["fedbn"] == sigma["fedavg"]
    assert all(r > 1.1 * a for r, a in zip(sigma["fedrep"], sigma["fedavg"]))


@pytest.mark.parametrize("name", ["logistic", "softmax", "mlp"])
def test_partial_clipping_bounds_the_trained_coordinates_only(name):
    """coords: each example's gradient restricted to the coordinates is clipped to C (the
    sensitivity the noise is calibrated to) and the sum is 0 elsewhere; the closed forms
    agree with clipping the restricted per-example gradients one by one."""
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(2, 5, 3)) * 10).astype(np.float32)
    y = rng.integers(0, 2, size=(2, 5)).astype(float)
    mask = np.ones((2, 5))
    model = (make_model(name, 3, 3) if name == "softmax" else
             make_model(name, 3, 2, **({"task": "binary", "hidden": [4]} if name == "mlp"
                                       else {})))
    W = rng.normal(size=(2, model.num_params))
    head = model.param_groups()["head"]
    for coords in (head, ~head):
        got = model.clipped_grad_sum(W, X, y, mask, 0.5, coords=coords)
        assert np.all(got[:, ~coords] == 0)
        for k in range(2):
            g = model.per_example_grads(W[k], X[k], y[k]) * coords
            norms = np.maximum(np.linalg.norm(g, axis=1), 1e-12)
            want = (g * np.minimum(1, 0.5 / norms)[:, None]).sum(0)
            np.testing.assert_allclose(got[k], want, rtol=1e-4, atol=1e-5)
        one = model.clipped_grad_sum(W, X[:, :1], y[:, :1], mask[:, :1], 0.5, coords=coords)
        assert np.all(np.linalg.norm(one, axis=1) <= 0.5)


def test_fixed_runs_unchanged_by_the_coordinate_seam():
    """A pass over every coordinate is the ordinary pass: same batches, same noise, same
    charges (private, seeded)."""
    from silofl.privacy.ledger import Ledger
    from silofl.privacy.randomness import Randomness
    from silofl.training.dpsgd import GradientRule
    from silofl.training.silo_data import SiloArrays
    fed = _fed(sizes=(30, 40), task="binary", dim=3)
    model = _model(fed, "logistic")

    def trainer():
        return LocalTrainer(model, SiloArrays.stack([s.X_train for s in fed.silos],
                                                    [s.y_train for s in fed.silos]),
                            GradientRule(1.0, np.array([1.1, 0.9])), 10, np.array([3, 4]),
                            0.1, 0.0, Randomness.seeded(4),
                            ledgers=[Ledger(s.name, PrivacyTarget(50.0, 1e-4))
                                     for s in fed.silos])
    a, b = trainer(), trainer()
    W0 = np.zeros((2, model.num_params))
    np.testing.assert_array_equal(a.run(W0, round=1),
                                  b.run(W0, round=1, coords=np.ones(model.num_params, bool)))
    assert [e.event for e in a.ledgers[0].entries] == [e.event for e in b.ledgers[0].entries]
    with pytest.raises(ValueError, match="non-empty boolean mask"):
        b.run(W0, round=2, coords=np.zeros(model.num_params, bool))
    assert len(b.ledgers[0].entries) == 1  # a refused pass is not charged


# --- hosting, GLMs, torch --------------------------------------------------------------

@pytest.mark.parametrize("method,name", [("fedper", "mlp"), ("fedrep", "mlp"),
                                         ("fedbn", "mlp_norm"), ("fedrep", "logistic")])
def test_per_silo_hosting_routes_the_joint_models(method, name):
    """Full batches, no noise: the per-silo route (each silo its own trainer, its update
    encoded as one row with the head zeroed, merged on the server) gives the joint models."""
    fed = _fed(sizes=(12, 15), task="binary", dim=3)
    cfg = TrainingConfig(rounds=3, batch_size=15, local_epochs=2.0, lr=0.3, private=False,
                         seed=0)
    model = _model(fed, name)
    joint = simulate(fed, model, make_algorithm(method), cfg)
    per = simulate(fed, model, make_algorithm(method), cfg, hosting="per_silo")
    np.testing.assert_allclose(per.params, joint.params, rtol=1e-5, atol=1e-6)
    keep = model.param_groups()["norm" if method == "fedbn" else "head"]
    assert not np.allclose(joint.params[0][keep], joint.params[1][keep])


def test_private_torch_runs_learn_and_fedbn_refuses_models_without_norms(cached_epsilon):
    fed = _fed(sizes=(60, 80), task="binary", dim=3, eps=4.0)
    cfg = TrainingConfig(rounds=4, batch_size=10, lr=0.2, clip=1.0, seed=1, noise="seeded")
    for method in SPLIT:
        res = simulate(fed, _model(fed, "mlp_norm"), make_algorithm(method), cfg)
        assert 0.5 < res.final_pooled <= 1.0, method
    for name in ("logistic", "linear", "mlp"):
        f = fed if name != "linear" else _fed()
        with pytest.raises(ConfigError, match="fedbn needs a torch model with normalization"):
            simulate(f, _model(f, name), make_algorithm("fedbn"), cfg)
    from silofl.models.torch_model import TorchModel
    one_layer = TorchModel(torch.nn.Linear(3, 1), task="binary", input_shape=(3,))
    assert one_layer.param_groups()["head"].all()  # all head: nothing to share
    with pytest.raises(ConfigError, match="nothing is left to share"):
        make_algorithm("fedper").bind_model(one_layer)


def test_server_never_averages_personal_coordinates():
    fed = _fed()
    alg = make_algorithm("fedper")
    model = _model(fed, "linear")
    alg.bind_model(model)
    silos, server = alg.init(np.zeros(model.num_params), 2)
    forged = np.ones((2, model.num_params))  # a silo that uploads its head anyway
    new = alg.server_step(server, forged, np.ones(2))
    assert new.params[-1] == 0.0 and np.all(new.params[:-1] == 1.0)

"""Personalization baselines of thesis chapter 1 (Finetune, Ditto, Mocha, IFCA and its
variants, IFCA-preconditioned MR-MTL) under silo-specific example-level DP: every data touch
is charged, ledgers match what ran, targets hold, private selection is the exponential
mechanism, and each method learns on real (heart disease) and synthetic data."""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter

import dp_accounting as dpa
import numpy as np
import pytest
from scipy import stats

from silofl.algorithms import METHODS, make_algorithm
from silofl.algorithms.base import SiloState
from silofl.algorithms.ifca import IFCA
from silofl.algorithms.mocha import Mocha, mocha_omega
from silofl.config import config_from_dict
from silofl.data import linear_silos, load_heart_disease
from silofl.errors import BudgetExceeded, ConfigError
from silofl.experiments.build import build_algorithms
from silofl.models import make_model
from silofl.models import metrics as M
from silofl.privacy import accounting, events
from silofl.privacy import accounting as A
from silofl.privacy.ledger import Ledger
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime import simulator
from silofl.runtime.plan import TrainingConfig, plan_silos
from silofl.runtime.simulator import simulate
from silofl.training import selection
from silofl.training.dpsgd import GradientRule
from silofl.training.silo_data import SiloArrays
from silofl.training.trainer import LocalTrainer

NEW = ("finetune", "ditto", "mocha", "ifca", "ifca_local", "ifca_finetune", "ifca_mrmtl")
IFCAS = ("ifca", "ifca_local", "ifca_finetune", "ifca_mrmtl")
LABELS = {"ditto": {"dpsgd-global", "dpsgd-personal"}, **{m: {"dpsgd", "select"} for m in IFCAS}}


@pytest.fixture
def cached_epsilon(monkeypatch):
    """Memoize ε evaluations (speed only; the values are dp_accounting's)."""
    orig = accounting.epsilon
    cached = functools.lru_cache(maxsize=None)(orig)

    def epsilon(event, delta, kind=accounting.DEFAULT_ACCOUNTANT):
        try:
            return cached(event, delta, kind)
        except TypeError:  # unhashable (composed events holding lists)
            return orig(event, delta, kind)
    monkeypatch.setattr(accounting, "epsilon", epsilon)


@pytest.fixture(scope="module")
def heart():
    return load_heart_disease(seed=0)


@pytest.fixture
def trainers(monkeypatch):
    """Capture the LocalTrainer a simulation builds, to read its instrumented counters."""
    made = []

    class Recording(LocalTrainer):
        def __post_init__(self):
            super().__post_init__()
            made.append(self)

    monkeypatch.setattr(simulator, "LocalTrainer", Recording)
    return made


def _binary_fed(eps=(1.0, 2.0, 4.0), sizes=(60, 90, 120), seed=0):
    fed = linear_silos(num_silos=len(sizes), sizes=list(sizes), dim=4, heterogeneity=0.5,
                       task="binary", seed=seed)
    return fed.with_targets(None, {s.name: PrivacyTarget(e, 1e-4)
                                   for s, e in zip(fed.silos, eps)})


def _cfg(**kw):
    # seeded noise: these tests compare runs that must draw the same noise
    base = dict(rounds=10, batch_size=10, lr=0.2, clip=1.0, seed=3, noise="seeded")
    base.update(kw)
    return TrainingConfig(**base)


# --- privacy: every data touch is charged, and the targets hold -------------------------------

@pytest.mark.parametrize("method", NEW)
def test_ledger_equals_instrumented_data_touches(method, trainers, cached_epsilon):
    fed, cfg = _binary_fed(), _cfg()
    alg = make_algorithm(method, lam=0.5, selection_rounds=0.2, finetune_fraction=0.5)
    res = simulate(fed, make_model("logistic", fed.dim), alg, cfg)
    trainer = trainers[-1]
    passes = 2 if method == "ditto" else 1
    t_sel = 2 if method in IFCAS else 0  # 20% of 10 rounds
    for k, (led, plan) in enumerate(zip(res.ledgers, res.plans)):
        counts = Counter()
        for event, c in led.spent_counts().items():
            counts[type(event).__name__] += c
        # what the ledger holds is exactly what ran ...
        assert counts["PoissonSampledDpEvent"] == trainer.steps_done[k]
        assert counts["ZCDpEvent"] == trainer.selections_done[k]
        # ... and what ran is the declared schedule
        assert trainer.steps_done[k] == passes * cfg.rounds * plan.steps_per_pass
        assert trainer.selections_done[k] == t_sel
        assert events.flatten(plan.declared) == led.spent_counts()
        assert {e.label for e in led.entries} == LABELS.get(method, {"dpsgd"})
        # the target holds, and σ was calibrated to use (almost all of) it
        target = plan.target.epsilon
        assert led.epsilon() <= target
        # under the accountant σ was calibrated with
        assert led.epsilon(cfg.accountant if method not in IFCAS else "rdp") >= 0.97 * target
        rep = led.report()
        assert rep["within_target"]
        assert (rep["epsilon_pld"] is None) == (method in IFCAS)  # PLD has no zCDP
    if method in IFCAS:  # each selection is fraction·ε_k of that silo's own target
        for led, plan in zip(res.ledgers, res.plans):
            sel = [e for e in led.entries if e.label == "select"]
            assert [e.round for e in sel] == [1, 2]
            eps_sel = 0.03 * plan.target.epsilon
            assert all(e.event == dpa.ZCDpEvent(eps_sel ** 2 / 8) for e in sel)


def test_overheads_raise_noise_at_the_same_epsilon(cached_epsilon):
    fed, cfg = _binary_fed(), _cfg()
    sigma = {m: [p.noise_multiplier for p in plan_silos(fed, make_algorithm(m), cfg)]
             for m in ("fedavg", "finetune", "mocha", "ditto", "ifca")}
    for k in range(fed.num_silos):
        assert sigma["finetune"][k] == sigma["mocha"][k] == sigma["fedavg"][k]
        assert sigma["ditto"][k] > 1.2 * sigma["fedavg"][k]  # twice the steps
        assert sigma["ifca"][k] > sigma["fedavg"][k]         # selections are paid for


def test_selection_is_charged_before_any_data_is_read(monkeypatch):
    data = SiloArrays.stack([np.ones((20, 2))] * 2, [np.arange(20) % 2] * 2)
    reads = []
    orig = SiloArrays.gather
    monkeypatch.setattr(SiloArrays, "gather", lambda self, s, i: reads.append(1) or
                        orig(self, s, i))
    ledgers = [Ledger("a", PrivacyTarget(1.0, 1e-5)), Ledger("b", PrivacyTarget(0.01, 1e-5))]
    trainer = LocalTrainer(make_model("logistic", 2), data, GradientRule(1.0, np.ones(2)), 5,
                           np.array([1, 1]), 0.1, 0.0, Randomness.seeded(0), ledgers)
    cands = np.zeros((2, 3))
    with pytest.raises(BudgetExceeded, match="'b'"):  # ε_sel = 0.2 > silo b's whole budget
        trainer.select_cluster(cands, np.array([0.2, 0.2]), round=1)
    assert reads == [] and all(not led.entries for led in ledgers)
    assert list(trainer.selections_done) == [0, 0]
    trainer.select_cluster(cands, np.array([0.2, 0.001]), round=1)
    assert len(reads) == 2 and list(trainer.selections_done) == [1, 1]
    assert [e.label for led in ledgers for e in led.entries] == ["select", "select"]


# --- the exponential mechanism ---------------------------------------------------------------

@pytest.mark.statistical
def test_private_selection_follows_the_exponential_mechanism(cached_epsilon):
    """Many silos holding the same 21 examples choose among 3 candidates with error rates
    2/21, 6/21 and 10/21: the empirical choice frequencies must match
    exp(−ε·err/(2Δ))/Σ with Δ = 1/(n−1) = 1/20."""
    n, K, eps = 21, 4000, 0.5
    x = np.linspace(-1, 1, n)
    y = (x > 0).astype(float)
    # w = [slope, bias] = 50·[1, −t]: predict 1 iff x > t; thresholds between the points
    cands = np.array([[50.0, -50 * t] for t in (-0.15, -0.55, -0.95)])
    model = make_model("logistic", 1)
    err = selection.scores(model, cands, x[:, None], y)
    assert err * n == pytest.approx([2, 6, 10])  # fixed, distinct error counts
    data = SiloArrays.stack([x[:, None]] * K, [y] * K)
    ledgers = [Ledger(f"s{k}", PrivacyTarget(2.0, 1e-5)) for k in range(K)]
    trainer = LocalTrainer(model, data, GradientRule(1.0, np.ones(K)), 5, np.ones(K, int),
                           0.1, 0.0, Randomness.seeded(7), ledgers)
    choice = trainer.select_cluster(cands, eps, round=1)
    observed = np.bincount(choice, minlength=3)
    p = selection.em_probabilities(err, eps, 1.0 / (n - 1))
    assert p == pytest.approx(np.exp(-eps * err * 10) / np.exp(-eps * err * 10).sum())
    assert stats.chisquare(observed, K * p).pvalue > 1e-3
    # the test has power: a mechanism with half the noise would be rejected
    wrong = selection.em_probabilities(err, 2 * eps, 1.0 / (n - 1))
    assert stats.chisquare(observed, K * wrong).pvalue < 1e-6
    assert ledgers[0].spent_counts() == Counter({dpa.ZCDpEvent(eps ** 2 / 8): 1})


@pytest.mark.statistical
def test_gumbel_draws_are_standard_gumbel_in_both_modes():
    for rng in (Randomness.seeded(0), Randomness.os_entropy()):
        g = rng.gumbel(20000)
        assert np.all(np.isfinite(g))
        assert stats.kstest(g, "gumbel_r").pvalue > 1e-4


def test_selection_scores_and_sensitivity():
    logistic, linear, svm = make_model("logistic", 1), make_model("linear", 1), make_model("svm", 1)
    assert selection.sensitivity(logistic, 101) == pytest.approx(0.01)
    assert selection.sensitivity(linear, 101, loss_bound=2.0) == pytest.approx(0.02)
    X, y = np.array([[0.0], [1.0], [2.0], [3.0]]), np.array([0.0, 1.0, 2.0, 10.0])
    # regression: per-example 0.5·squared error clipped to [0, B] before the mean
    score = selection.scores(linear, np.array([[1.0, 0.0]]), X, y, loss_bound=1.0)
    assert score[0] == pytest.approx((0 + 0 + 0 + 1.0) / 4)
    # SVM margins: positive margin = class 1
    yb = np.array([0.0, 1.0, 1.0, 1.0])
    assert selection.scores(svm, np.array([[1.0, -0.5]]), X, yb)[0] == 0.0


# --- Mocha -----------------------------------------------------------------------------------

def test_mocha_omega_matches_the_formula():
    from scipy.linalg import sqrtm
    W = np.array([[1.0, 2.0, 0.5, -1.0], [0.5, -1.0, 2.0, 0.0], [1.5, 0.0, -0.5, 1.0]])
    root = np.real(sqrtm(W @ W.T))  # full rank: no clamping, Ω = (WWᵀ)^½ / tr (WWᵀ)^½
    np.testing.assert_allclose(mocha_omega(W), root / np.trace(root), atol=1e-10)
    # rank one: the zero eigenvalues are clamped at the floor
    a = np.array([[3.0], [-4.0], [0.0]])  # ‖a‖ = 5
    u = a[:, 0] / 5
    r = np.sqrt(1e-8)
    expect = (5 * np.outer(u, u) + r * (np.eye(3) - np.outer(u, u))) / (5 + 2 * r)
    om = mocha_omega(a)
    np.testing.assert_allclose(om, expect, atol=1e-12)
    assert np.trace(om) == pytest.approx(1.0) and np.all(np.linalg.eigvalsh(om) > 0)


def test_mocha_silo_step_adds_lambda_omega_w():
    """Non-private full-batch step: Mocha's step minus the plain step = lr·λ(ΩW)_k, with the
    other silos' models from the server and the silo's own current model."""
    rng = np.random.default_rng(0)
    Xs = [rng.standard_normal((12, 2)) for _ in range(3)]
    ys = [x @ np.array([1.0, -1.0]) for x in Xs]
    trainer = LocalTrainer(make_model("linear", 2), SiloArrays.stack(Xs, ys),
                           GradientRule(1.0, None), 12, np.array([1, 1, 1]), 0.1, 0.0,
                           Randomness.seeded(0))
    W = rng.standard_normal((3, 3))
    A = rng.standard_normal((3, 3))
    omega = A @ A.T + np.eye(3)
    omega /= np.trace(omega)
    lam = 0.7
    silos, _ = Mocha(lam).silo_step(SiloState(W.copy()), (W, omega), trainer, 1)
    plain = trainer.run(W)
    np.testing.assert_allclose(plain - silos.params, 0.1 * lam * omega @ W, atol=1e-12)


# --- relations between methods ---------------------------------------------------------------

@pytest.mark.parametrize("private", [True, False])
def test_endpoints_are_reproduced_exactly(private, cached_epsilon):
    fed, cfg = _binary_fed(), _cfg(private=private, rounds=6)
    model = make_model("logistic", fed.dim)

    def run(alg):
        return simulate(fed, model, alg, cfg)
    local, fedavg = run(make_algorithm("local")), run(make_algorithm("fedavg"))
    same = [(make_algorithm("finetune", finetune_fraction=1.0), fedavg),
            (make_algorithm("finetune", finetune_fraction=0.0), local),
            (make_algorithm("mocha", lam=0.0), local)]
    if not private:  # one cluster starting at the init, exact selection: IFCA is FedAvg
        same.append((IFCA(clusters=1, init_scale=0.0), fedavg))
    for alg, ref in same:
        res = run(alg)
        np.testing.assert_array_equal(res.params, ref.params)
        assert res.history.to_dict() == ref.history.to_dict()
    # finetune halfway: FedAvg history for 3 rounds, then the models differ per silo
    ft = run(make_algorithm("finetune", finetune_fraction=0.5))
    assert ft.history.per_silo[:3] == fedavg.history.per_silo[:3]
    assert not np.allclose(ft.params[0], ft.params[1])


def _two_groups(seed=0):
    """Six silos sharing one linear rule; the last three have their labels flipped."""
    fed = linear_silos(num_silos=6, sizes=[150] * 6, dim=3, heterogeneity=0.0, task="binary",
                       seed=seed, standardize=True)
    silos = [s if k < 3 else dataclasses.replace(s, y_train=1 - s.y_train, y_test=1 - s.y_test)
             for k, s in enumerate(fed.silos)]
    return dataclasses.replace(fed, silos=silos)


def test_ifca_finds_the_clusters_and_beats_fedavg(trainers, cached_epsilon):
    fed = _two_groups().with_targets(PrivacyTarget(4.0, 1e-4))
    model = make_model("logistic", fed.dim)
    cfg = _cfg(rounds=12, batch_size=15)
    ifca = simulate(fed, model, make_algorithm("ifca", selection_rounds=0.25,
                                               selection_fraction=0.1), cfg)
    fedavg = simulate(fed, model, make_algorithm("fedavg"), cfg)
    assert fedavg.final_pooled < 0.55  # one model cannot serve both groups
    assert ifca.final_pooled > fedavg.final_pooled + 0.15  # (labels are noisy: Bayes ≈ 0.75)
    # silos of a group share a model, the groups have different ones
    P = ifca.params
    assert np.allclose(P[0], P[1]) and np.allclose(P[0], P[2]) and np.allclose(P[3], P[5])
    assert not np.allclose(P[0], P[3])


# --- learning on real data ---------------------------------------------------------------------

def _untrained(model, fed):
    vals = simulator.evaluate(model, np.tile(model.init_params(), (fed.num_silos, 1)), fed,
                              "accuracy")
    return M.pooled(vals, np.array([s.n_test for s in fed.silos]))


def test_every_method_learns_on_heart_disease(heart, cached_epsilon):
    fed = heart.with_targets(PrivacyTarget(2.0, 1e-4))
    model = make_model("logistic", fed.dim)
    base = _untrained(model, fed)
    cfg = TrainingConfig(rounds=15, batch_size=16, lr=0.1, clip=1.0, seed=0, noise="seeded")
    for m in NEW:
        res = simulate(fed, model, make_algorithm(m, lam=0.3), cfg)
        assert res.final_pooled > base + 0.15, (m, res.final_pooled, base)


def test_ifca_mrmtl_on_regression_uses_clipped_loss(trainers, cached_epsilon):
    fed = linear_silos(num_silos=4, sizes=[80, 100, 120, 140], dim=3, seed=1)
    fed = fed.with_targets(PrivacyTarget(3.0, 1e-4))
    model = make_model("linear", fed.dim)
    cfg = _cfg(rounds=10, batch_size=10, lr=0.1)
    res = simulate(fed, model, make_algorithm("ifca_mrmtl", lam=0.3, selection_rounds=0.2), cfg)
    untrained = np.mean([np.mean(s.y_test ** 2) for s in fed.silos])
    assert res.final_pooled < 0.5 * untrained  # MSE
    assert list(trainers[-1].selections_done) == [2] * 4


# --- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, words", [
    (dict(clusters=0), "clusters must be a positive integer"),
    (dict(clusters=1.5), "clusters must be a positive integer"),
    (dict(selection_fraction=0.0), r"selection_fraction .* must be in \(0, 1\)"),
    (dict(selection_fraction=1.0), r"selection_fraction .* must be in \(0, 1\)"),
    (dict(selection_rounds=0.0), r"selection_rounds .* must be in \(0, 1\]"),
    (dict(selection_rounds=1.5), r"selection_rounds .* must be in \(0, 1\]"),
    (dict(finetune_fraction=-0.1), r"finetune_fraction must be in \[0, 1\]"),
    (dict(finetune_fraction=1.1), r"finetune_fraction must be in \[0, 1\]"),
    (dict(lam=-1.0), "lambda"),
])
@pytest.mark.parametrize("method", ["ifca", "ditto", "finetune"])
def test_bad_settings_are_config_errors(method, kw, words):
    with pytest.raises(ConfigError, match=words):
        make_algorithm(method, **kw)


def test_plan_time_errors(cached_epsilon):
    fed = _binary_fed()  # 3 silos
    with pytest.raises(ConfigError, match="clusters = 4 is more than the 3 silos"):
        plan_silos(fed, make_algorithm("ifca_mrmtl", clusters=4), _cfg())
    # PLD has no zCDP: IFCA's selections make the calibration fall back to RDP, which
    # meets the target under RDP
    plans = plan_silos(fed, make_algorithm("ifca"), _cfg(accountant="pld"))
    for p in plans:
        assert A.epsilon(p.declared, p.target.delta, "rdp") <= p.target.epsilon
    plan_silos(fed, make_algorithm("ditto"), _cfg(accountant="pld"))  # fine without zCDP
    with pytest.raises(ConfigError, match="fewer than the 3 selection rounds"):
        plan_silos(fed, make_algorithm("ifca_finetune", finetune_fraction=0.2,
                                       selection_rounds=0.3), _cfg())
    with pytest.raises(ConfigError, match="more than the 3 silos"):  # non-private too
        simulate(fed, make_model("logistic", fed.dim), make_algorithm("ifca", clusters=5),
                 _cfg(private=False))


def test_config_keys_reach_the_algorithms():
    cfg = config_from_dict({"training": {
        "methods": ["finetune", "ifca_finetune", "ifca_mrmtl"], "finetune_fraction": 0.25,
        "clusters": 3, "selection_fraction": 0.05, "selection_rounds": 0.2, "lam": 0.7}})
    ft, iff, im = (a.describe() for a in build_algorithms(cfg))
    assert ft["finetune_fraction"] == 0.25
    assert (iff["clusters"], iff["selection_fraction"], iff["selection_rounds"],
            iff["finetune_fraction"]) == (3, 0.05, 0.2, 0.25)
    assert (im["clusters"], im["lam"]) == (3, 0.7)
    bad = config_from_dict({"training": {"methods": ["ifca"], "clusters": 0}})
    with pytest.raises(ConfigError, match="clusters"):
        build_algorithms(bad)
    with pytest.raises(ConfigError, match="must be of type int"):
        config_from_dict({"training": {"clusters": 2.5}})
    assert set(NEW) | {"local", "fedavg", "mrmtl", "weight_erosion", "privatekt",
                       "fedavg_ldp", "fedprox", "scaffold", "apfl", "fedper", "fedrep",
                       "fedbn", "uldp", "dp_gbdt"} == set(METHODS)

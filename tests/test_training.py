"""Training internals: Poisson batch sampling, the padded silo store, DP-SGD steps and
the trainer's bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from silofl.algorithms import make_algorithm
from silofl.data import linear_silos
from silofl.errors import ConfigError
from silofl.models import make_model
from silofl.privacy import accounting as A
from silofl.privacy import events
from silofl.privacy.ledger import Ledger
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig, plan_silos
from silofl.training.dpsgd import GradientRule, scale
from silofl.training.sampling import poisson_batches
from silofl.training.silo_data import SiloArrays
from silofl.training.trainer import LocalTrainer


def _draw(n, q, reps, rng):
    """`reps` independent batches for each silo (n_k, q_k), drawn in one call as the trainer
    does (silos tiled). Returns idx, mask with shape (reps, K, M)."""
    n, q = np.asarray(n), np.asarray(q, float)
    idx, mask = poisson_batches(np.tile(n, reps), np.tile(q, reps), rng)
    return idx.reshape(reps, len(n), -1), mask.reshape(reps, len(n), -1)


def _check_structure(idx, mask, n):
    for r in range(idx.shape[0]):
        for k in range(idx.shape[1]):
            sel = idx[r, k][mask[r, k]]
            assert np.all(np.diff(sel) > 0)  # sorted and distinct
            assert sel.size == 0 or (sel[0] >= 0 and sel[-1] < n[k])
            # selected entries form a prefix; padding holds 0
            m = mask[r, k]
            assert not np.any(m[1:] & ~m[:-1])
            assert np.all(idx[r, k][~m] == 0)


# --- Poisson sampling ------------------------------------------------------------------------

@pytest.mark.statistical
def test_poisson_batch_sizes_mean_variance_and_inclusion_several_silos():
    n = np.array([200, 50, 1000, 7])
    q = np.array([0.1, 0.5, 0.01, 0.3])
    reps = 4000
    idx, mask = _draw(n, q, reps, Randomness.seeded(0))
    assert idx.dtype == np.int64 and mask.dtype == bool
    _check_structure(idx[:200], mask[:200], n)
    sizes = mask.sum(-1)  # (reps, K)
    for k in range(len(n)):
        mean, var = q[k] * n[k], n[k] * q[k] * (1 - q[k])
        # CLT: the sample mean has sd sqrt(var/reps); the sample variance sd ≈ var·sqrt(2/reps)
        # (plus a kurtosis term, small for these binomials): allow 5 sd
        assert abs(sizes[:, k].mean() - mean) < 5 * np.sqrt(var / reps)
        kurt = (1 - 6 * q[k] * (1 - q[k])) / var  # excess kurtosis of Binomial
        sd_var = var * np.sqrt((2 + kurt) / reps)
        assert abs(sizes[:, k].var(ddof=1) - var) < 5 * sd_var
        # each index joins with probability q_k: chi-square over indices, and max deviation
        counts = np.zeros(n[k])
        for r in range(reps):
            np.add.at(counts, idx[r, k][mask[r, k]], 1)
        expect, sd = reps * q[k], np.sqrt(reps * q[k] * (1 - q[k]))
        chi2 = float(np.sum((counts - expect) ** 2) / sd ** 2)
        assert 1e-5 < stats.chi2.sf(chi2, n[k]) < 1 - 1e-5
        assert np.max(np.abs(counts - expect)) < 5 * sd
    # the batch sizes of different silos are independent (no shared structure)
    assert abs(np.corrcoef(sizes[:, 0], sizes[:, 2])[0, 1]) < 5 / np.sqrt(reps)


def test_poisson_batches_are_independent_between_steps():
    n, q, reps = np.array([100]), np.array([0.2]), 3000
    idx, mask = _draw(n, q, reps, Randomness.seeded(1))
    sel = np.zeros((reps, 100), bool)
    for r in range(reps):
        sel[r, idx[r, 0][mask[r, 0]]] = True
    # consecutive draws: P(i in both) = q²
    both = (sel[1:] & sel[:-1]).mean()
    assert abs(both - 0.04) < 5 * np.sqrt(0.04 * 0.96 / ((reps - 1) * 100))
    # within a draw, neighbouring indices are independent too: P(i, i+1 both) = q²
    adj = (sel[:, 1:] & sel[:, :-1]).mean()
    assert abs(adj - 0.04) < 5 * np.sqrt(0.04 * 0.96 / (reps * 99)) * 2


def test_q_one_selects_everything():
    n = np.array([5, 13, 40])
    idx, mask = poisson_batches(n, np.ones(3), Randomness.seeded(0))
    for k in range(3):
        np.testing.assert_array_equal(idx[k][mask[k]], np.arange(n[k]))
    # mixed with q < 1 silos
    idx, mask = poisson_batches(np.array([30, 30]), np.array([1.0, 0.1]), Randomness.seeded(1))
    np.testing.assert_array_equal(idx[0][mask[0]], np.arange(30))
    assert mask[1].sum() < 30


def test_poisson_tiny_q_can_give_empty_batches():
    idx, mask = _draw(np.array([20]), np.array([0.01]), 500, Randomness.seeded(2))
    sizes = mask.sum(-1)[:, 0]
    assert (sizes == 0).mean() == pytest.approx(0.99 ** 20, abs=5 * np.sqrt(0.82 * 0.18 / 500))
    assert idx.shape[-1] >= 1


class _CountingRng:
    """Wraps a Randomness and counts every uniform drawn."""

    def __init__(self, inner):
        self.inner, self.drawn, self.calls = inner, 0, 0

    def uniform(self, shape):
        self.calls += 1
        u = self.inner.uniform(shape)
        self.drawn += u.size
        return u

    def normal(self, shape):
        return self.inner.normal(shape)


def test_sampling_cost_scales_with_batch_not_silo_size():
    n, q = 10 ** 6, 1e-4  # expected batch 100
    rng = _CountingRng(Randomness.seeded(3))
    sizes = []
    for _ in range(20):
        idx, mask = poisson_batches(np.array([n]), np.array([q]), rng)
        sel = idx[0][mask[0]]
        assert np.all(np.diff(sel) > 0) and sel[-1] < n
        sizes.append(sel.size)
    assert rng.drawn / 20 < 400  # ≈ 4σ above the batch size, far below n = 10⁶
    assert 60 < np.mean(sizes) < 140
    # several silos with different (n, q) at once: still O(largest batch) per silo
    rng = _CountingRng(Randomness.seeded(4))
    poisson_batches(np.array([10 ** 6, 10 ** 5, 500]), np.array([1e-4, 1e-3, 0.02]), rng)
    assert rng.drawn < 3 * 400


def test_poisson_secure_randomness_has_right_mean():
    n, q = np.array([1000, 300]), np.array([0.05, 0.3])
    reps = 1500
    idx, mask = _draw(n, q, reps, Randomness.os_entropy())
    _check_structure(idx[:100], mask[:100], n)
    sizes = mask.sum(-1)
    for k in range(2):
        mean, var = q[k] * n[k], n[k] * q[k] * (1 - q[k])
        assert abs(sizes[:, k].mean() - mean) < 6 * np.sqrt(var / reps)
        assert abs(sizes[:, k].var(ddof=1) / var - 1) < 6 * np.sqrt(2 / reps)


def test_poisson_batches_reproducible_with_seed():
    a = poisson_batches(np.array([500, 80]), np.array([0.1, 0.3]), Randomness.seeded(7))
    b = poisson_batches(np.array([500, 80]), np.array([0.1, 0.3]), Randomness.seeded(7))
    c = poisson_batches(np.array([500, 80]), np.array([0.1, 0.3]), Randomness.seeded(8))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[0].shape != c[0].shape or not np.array_equal(a[0], c[0])


# --- silo store ------------------------------------------------------------------------------

def test_silo_arrays_gather_returns_requested_rows():
    rng = np.random.default_rng(0)
    Xs = [rng.normal(size=(n, 3)) for n in (5, 9, 2)]
    ys = [rng.normal(size=n) for n in (5, 9, 2)]
    data = SiloArrays.stack(Xs, ys)
    assert data.n.tolist() == [5, 9, 2] and data.rows.dtype == np.float32
    silos = np.array([2, 0, 1])
    idx = np.array([[1, 0, 0], [4, 2, 0], [8, 3, 5]])
    X, y, sq = data.gather(silos, idx)
    assert X.shape == (3, 3, 3) and y.shape == (3, 3) and sq.shape == (3, 3)
    for j, k in enumerate(silos):
        np.testing.assert_allclose(X[j], Xs[k][idx[j]], rtol=1e-6)
        np.testing.assert_allclose(y[j], ys[k][idx[j]], rtol=1e-6)
        np.testing.assert_allclose(sq[j], (Xs[k][idx[j]] ** 2).sum(1), rtol=1e-5)


def test_silo_arrays_non_tabular():
    rng = np.random.default_rng(1)
    Xs = [rng.normal(size=(n, 2, 2)) for n in (3, 4)]
    ys = [np.arange(n, dtype=float) for n in (3, 4)]
    data = SiloArrays.stack(Xs, ys)
    X, y, sq = data.gather(np.array([1]), np.array([[3, 0]]))
    assert sq is None and X.shape == (1, 2, 2, 2)
    np.testing.assert_allclose(X[0], Xs[1][[3, 0]], rtol=1e-6)
    np.testing.assert_array_equal(y[0], [3.0, 0.0])


# --- DP-SGD step and trainer -----------------------------------------------------------------

def test_gradient_rule_divides_by_expected_not_realised_batch():
    model = make_model("linear", 2)
    rng = np.random.default_rng(0)
    W = rng.normal(size=(2, 3))
    X = rng.normal(size=(2, 5, 2))
    y = rng.normal(size=(2, 5))
    mask = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    eb = np.array([3.0, 2.0])
    rule = GradientRule(0.5, np.array([1e-12, 1e-12]))  # (virtually) no noise
    g = rule(model, W, X, y, mask, eb, np.array([0, 1]), Randomness.seeded(0))
    ref = model.clipped_grad_sum(W, X, y, mask, 0.5) / eb[:, None]
    np.testing.assert_allclose(g, ref, rtol=1e-9, atol=1e-12)
    nonpriv = GradientRule(0.5, None)
    assert not nonpriv.private and rule.private
    np.testing.assert_allclose(nonpriv(model, W, X, y, mask, eb, np.array([0, 1]), None),
                               model.grad_sum(W, X, y, mask) / eb[:, None], rtol=1e-12)
    np.testing.assert_allclose(scale(np.ones((2, 3)), np.array([2, 4])),
                               [[0.5] * 3, [0.25] * 3])


def _trainer(sizes, b, private=True, steps=None, lr=0.1, l2=0.0, sigma=1.0, seed=0):
    fed = linear_silos(num_silos=len(sizes), sizes=list(sizes), dim=3, seed=seed)
    data = SiloArrays.stack([s.X_train for s in fed.silos], [s.y_train for s in fed.silos])
    steps = np.array(steps if steps is not None else
                     [A.steps_for_epochs(n, b, 1.0) for n in sizes])
    ledgers = ([Ledger(s.name, PrivacyTarget(1e3, 1e-5)) for s in fed.silos]
               if private else None)
    rule = GradientRule(1.0, np.full(len(sizes), sigma) if private else None)
    return fed, LocalTrainer(model=make_model("linear", 3), data=data, rule=rule, batch_size=b,
                             steps_per_round=steps, lr=lr, l2=l2, rng=Randomness.seeded(seed),
                             ledgers=ledgers)


def test_full_batch_non_private_step_is_gradient_descent():
    """q = 1 and no privacy: one local step is exactly w − lr·(mean gradient + l2·w)."""
    fed, tr = _trainer([20, 30], b=1000, private=False, steps=[1, 1], lr=0.3, l2=0.1)
    assert np.all(tr.q == 1.0)
    W0 = np.random.default_rng(0).normal(size=(2, 4))
    W1 = tr.run(W0)
    model = make_model("linear", 3)
    for k, s in enumerate(fed.silos):
        g = model.per_example_grads(W0[k], s.X_train, s.y_train).mean(0)
        np.testing.assert_allclose(W1[k], W0[k] - 0.3 * (g + 0.1 * W0[k]), rtol=1e-5, atol=1e-6)
    # anchor pull λ(w − anchor) is added to the gradient
    anchor = np.ones((2, 4))
    fed, tr = _trainer([20, 30], b=1000, private=False, steps=[1, 1], lr=0.3)
    W1b = tr.run(W0, anchor=anchor, lam=2.0)
    fed, tr = _trainer([20, 30], b=1000, private=False, steps=[1, 1], lr=0.3)
    W1c = tr.run(W0)
    np.testing.assert_allclose(W1b, W1c - 0.3 * 2.0 * (W0 - anchor), rtol=1e-10, atol=1e-12)


def test_trainer_steps_and_charges_per_silo():
    fed, tr = _trainer([40, 100, 64], b=8)
    assert tr.steps_per_round.tolist() == [5, 12, 8]
    W = np.zeros((3, 4))
    for t in (1, 2, 3):
        W = tr.run(W, round=t)
    assert tr.steps_done.tolist() == [15, 36, 24]
    for k, led in enumerate(tr.ledgers):
        assert [e.round for e in led.entries] == [1, 2, 3]
        assert led.spent_counts() == {A.dpsgd_event(8 / fed.silos[k].n_train, 1.0):
                                      3 * tr.steps_per_round[k]}
    assert not np.allclose(W, 0)
    assert tr.round_events(passes=2)[1] == A.dpsgd_event(8 / 100, 1.0, 24)


def test_private_trainer_needs_ledgers():
    fed = linear_silos(num_silos=2, sizes=[20, 20], dim=3, seed=0)
    data = SiloArrays.stack([s.X_train for s in fed.silos], [s.y_train for s in fed.silos])
    with pytest.raises(ValueError, match="ledger"):
        LocalTrainer(model=make_model("linear", 3), data=data,
                     rule=GradientRule(1.0, np.ones(2)), batch_size=4,
                     steps_per_round=np.array([5, 5]), lr=0.1, l2=0.0,
                     rng=Randomness.seeded(0))


def test_non_private_training_reduces_loss():
    fed = linear_silos(num_silos=2, sizes=[200, 300], dim=3, noise=0.05, seed=4)
    fed_, tr = _trainer([200, 300], b=20, private=False, lr=0.1, seed=4)
    model = make_model("linear", 3)
    W = np.zeros((2, 4))
    before = [model.loss(W[k], s.X_train, s.y_train).mean() for k, s in enumerate(fed.silos)]
    for t in range(5):
        W = tr.run(W, round=t + 1)
    after = [model.loss(W[k], s.X_train, s.y_train).mean() for k, s in enumerate(fed.silos)]
    for k in range(2):
        assert after[k] < 0.1 * before[k]
        np.testing.assert_allclose(W[k, :3], fed.meta["weights"][k], atol=0.1)


# --- training configuration / plan -----------------------------------------------------------

@pytest.mark.parametrize("field,value,words", [
    ("rounds", 0, "rounds"), ("local_epochs", 0.0, "local_epochs"), ("batch_size", 0, "batch_size"),
    ("lr", -0.1, "learning rate"), ("clip", 0.0, "clip"), ("clip", float("inf"), "clip"),
    ("l2", -1.0, "l2"), ("accountant", "moments", "accountant"), ("noise", "urandom", "noise"),
    ("eval_every", 0, "eval_every"), ("noise_multiplier", -1.0, "noise_multiplier")])
def test_training_config_validation(field, value, words):
    with pytest.raises(ConfigError, match=words):
        TrainingConfig(**{field: value}).validate()


def test_plan_silos_q_steps_and_fixed_sigma():
    fed = linear_silos(num_silos=3, sizes=[40, 100, 64], dim=3, seed=0).with_targets(
        PrivacyTarget(50.0, 1e-4))
    alg = make_algorithm("local")
    plans = plan_silos(fed, alg, TrainingConfig(rounds=3, batch_size=8, local_epochs=2.0,
                                                noise_multiplier=1.3))
    assert [p.q for p in plans] == [8 / 40, 8 / 100, 8 / 64]
    assert [p.steps_per_pass for p in plans] == [10, 25, 16]
    assert all(p.noise_multiplier == 1.3 for p in plans)
    for p in plans:  # the declared cost of the run: rounds × steps_per_pass DP-SGD steps
        assert events.flatten(p.declared) == {A.dpsgd_event(p.q, 1.3): 3 * p.steps_per_pass}
    led = Ledger("x", PrivacyTarget(50.0, 1e-4))
    led.preflight(plans[1].declared)
    with pytest.warns(UserWarning, match="batch_size 40 .* silo-00 .*q = 1"):
        full = plan_silos(fed, alg, TrainingConfig(batch_size=40, noise_multiplier=1.3))
    assert [p.q for p in full] == [1.0, 40 / 100, 40 / 64]  # full-batch steps, no amplification
    nonpriv = plan_silos(fed, alg, TrainingConfig(batch_size=8, private=False))
    assert all(p.noise_multiplier is None for p in nonpriv)

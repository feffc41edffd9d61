"""Independent privacy review of commit 5340753 (PrivateKT / local DP, private tuning, q = 1,
Weight Erosion schedules, audit): the accounting checked against computations that do not
share silofl's code (exact k-fold randomized response, the analytic Gaussian mechanism,
dp_accounting's own RDP and TNB parametrization), and the problems the review found and
fixed (privacy/ldp.py, privacy/accounting.py, algorithms/privatekt.py):

* randomized response whose keep probability β rounds to 1 (ε/K ≳ 37) uploaded the true
  labels and crashed the accountant with a raw ValueError; it is now a NonPrivateDpEvent
  (ε = ∞), and PrivateKT's planning refuses it with a clear ConfigError before any data
  is read or any budget reserved;
* a client whose local SGD diverged uploaded a NaN/∞ "noisy" update, which reveals the
  divergence outside the mechanism; such a row is now replaced by 0 (a valid input) before
  clipping and noise;
* the PLD of nearly noiseless RR (ε/K ≈ 20–36) took minutes (its grid followed the loss's
  vanishing std): the grid is now never finer than 1/2000 of the loss.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import pld, rdp
from dp_accounting.rdp.rdp_privacy_accountant import _gamma_truncated_negative_binomial
from scipy import stats

from silofl.algorithms import make_algorithm
from silofl.data.mnist import load_dirichlet_mnist
from silofl.errors import ConfigError
from silofl.models import make_model
from silofl.privacy import accounting as acc
from silofl.privacy import events, ldp
from silofl.privacy import selection as TA
from silofl.privacy.budget import BudgetStore
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig
from silofl.runtime.simulator import simulate
from silofl.training.sampling import poisson_batches
from silofl.training.silo_data import SiloArrays
from silofl.tuning import distributions as D
from silofl.tuning.private import score_sigma

DELTA = 1e-5


@pytest.fixture(scope="module")
def tiny_fed():
    """Real MNIST digits: 3 clients × 40 (Dirichlet mixes), 50 public images."""
    return load_dirichlet_mnist(num_silos=3, train_per_silo=40, test_per_silo=10,
                                public_size=50, flatten=True, seed=1)


# --- k-ary randomized response: exact composition, independent of silofl's PLD code ---------

def _exact_rr_delta(p: float, C: int, n: int, eps: float) -> float:
    """δ(ε) of n-fold k-ary RR (keep w.p. 1 − p, else uniform over C) for two inputs that
    differ in every one of the n labels: the loss is (#x − #x′)·log(a/b) with the counts
    multinomial(n; a, b, (C − 2)b), a = 1 − p + p/C, b = p/C."""
    a, b = 1 - p + p / C, p / C
    step = math.log(a / b)
    out = 0.0
    for i in range(n + 1):
        for j in range(n + 1 - i):
            loss = (i - j) * step
            if loss <= eps:
                continue
            k = n - i - j
            if k and C == 2:  # binary RR: every output is x or x′
                continue
            logp = (math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(j + 1)
                    - math.lgamma(k + 1) + i * math.log(a) + j * math.log(b)
                    + (k * math.log((C - 2) * b) if k else 0.0))
            out += math.exp(logp) * -math.expm1(eps - loss)
    return out


def _exact_rr_epsilon(p: float, C: int, n: int, delta: float) -> float:
    lo, hi = 0.0, 2.0 * n * math.log((1 - p + p / C) / (p / C))  # twice the pure bound
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _exact_rr_delta(p, C, n, mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize("eps,K,C,rounds", [(5.0, 2, 10, 10), (1.0, 5, 10, 3),
                                            (3.0, 10, 3, 3), (8.0, 4, 2, 2),
                                            (60.0, 2, 10, 5)])  # ε/K = 30: nearly noiseless
def test_rr_accounting_bounds_the_exact_composition_tightly(eps, K, C, rounds):
    ev = ldp.rr_event(eps, K, C)
    p = ev.noise_parameter
    a, b = 1 - p + p / C, p / C
    # Eq. 6: the ratio is e^{ε/K} (up to β's rounding, which the event carries: p = 1 − β)
    assert math.log(a / b) == pytest.approx(eps / K, abs=1e-4)
    comp = dpa.SelfComposedDpEvent(ldp.rr_round_event(eps, K, C), rounds)
    exact = _exact_rr_epsilon(p, C, K * rounds, DELTA)
    e_pld, e_rdp = acc.epsilon(comp, DELTA, "pld"), acc.epsilon(comp, DELTA, "rdp")
    # both accountants are upper bounds; PLD is within 1% of the exact figure
    assert _exact_rr_delta(p, C, K * rounds, e_pld) <= DELTA
    assert exact <= e_pld <= exact * 1.01 + 0.01
    assert exact <= e_rdp * (1 + 1e-9)
    assert exact <= eps * rounds + 1e-9  # never above pure composition
    # silofl's RDP of RR is dp_accounting's (REPLACE_ONE: two different inputs)
    ref = rdp.RdpAccountant(list(acc.RDP_ORDERS), dpa.NeighboringRelation.REPLACE_ONE)
    ref.compose(comp)
    assert e_rdp == pytest.approx(ref.get_epsilon(DELTA), rel=1e-6)


def test_dp_accounting_pld_ignores_rr_counts_which_silofl_composes():
    """The README's claim about dp_accounting 0.6.0, checked: its PLDAccountant composes a
    self-composed RR event once whatever the count, so silofl must not delegate to it."""
    one = ldp.rr_event(4.0, 2, 10)

    def lib(count):
        a = pld.PLDAccountant(dpa.NeighboringRelation.REPLACE_ONE, 1e-4)
        a.compose(dpa.SelfComposedDpEvent(one, count))
        return a.get_epsilon_for_delta(DELTA) if hasattr(a, "get_epsilon_for_delta") \
            else a.get_epsilon(DELTA)
    assert lib(20) == pytest.approx(lib(1), rel=1e-9)  # the library's count is lost
    assert acc.epsilon(dpa.SelfComposedDpEvent(one, 20), DELTA) > 10 * lib(1)


def test_rr_that_keeps_every_label_is_non_private_not_a_crash():
    """β rounds to 1 from ε/K ≈ 37 on: the mechanism then uploads the true labels. The event
    must say so (ε = ∞) rather than be RR with p = 0, which dp_accounting refuses with a raw
    ValueError mid-planning."""
    for eps, K in ((80.0, 2), (1e4, 3)):
        assert ldp.rr_keep_probability(eps, K, 10) == 1.0
        y = np.arange(500) % 10
        assert np.array_equal(ldp.randomized_response(y, 1.0, 10, Randomness.seeded(0)), y)
        ev = ldp.rr_round_event(eps, K, 10)
        assert acc.epsilon(ev, DELTA, "pld") == math.inf
        assert acc.epsilon(ev, DELTA, "rdp") == math.inf
    # just below the cliff the event is still the executed RR (its p is 1 − β exactly),
    # (its PLD used to take 90 s here, the grid following RR's vanishing loss std; the time
    # is printed by benchmarks/bench_accounting.py)
    beta = ldp.rr_keep_probability(30.0, 1, 10)
    ev = ldp.rr_event(30.0, 1, 10)
    assert 0 < ev.noise_parameter == 1.0 - beta
    assert acc.epsilon(dpa.SelfComposedDpEvent(ev, 7), DELTA, "pld") == \
        pytest.approx(210.0, rel=1e-3)


def test_privatekt_at_a_noiseless_epsilon_is_refused_before_any_read(tiny_fed, monkeypatch):
    """A clear ConfigError at planning, nothing read, nothing reserved."""
    fed = tiny_fed.with_targets(PrivacyTarget(1e6, DELTA), {})
    reads = []
    orig = SiloArrays.gather
    monkeypatch.setattr(SiloArrays, "gather",
                        lambda self, s, i: reads.append(1) or orig(self, s, i))
    store = BudgetStore(None)
    alg = make_algorithm("privatekt", ldp_epsilon=200.0, kt_samples=2)
    with pytest.raises(ConfigError, match="keeps every label"):
        simulate(fed, make_model("softmax", fed.dim, 10), alg,
                 TrainingConfig(rounds=2, batch_size=8, noise="seeded"), store=store)
    assert reads == [] and store.silos() == []  # nothing registered, nothing reserved
    assert alg.privacy_events(None, 2, PrivacyTarget(1e6, DELTA)) == dpa.NoOpDpEvent()


# --- LDP on clipped updates -------------------------------------------------------------------

def _analytic_gaussian_delta(sigma: float, eps: float) -> float:
    """δ(ε) of the Gaussian mechanism, sensitivity 1, std σ (Balle & Wang 2018)."""
    return float(stats.norm.cdf(-eps * sigma + 1 / (2 * sigma))
                 - math.exp(eps) * stats.norm.cdf(-eps * sigma - 1 / (2 * sigma)))


@pytest.mark.parametrize("eps,delta", [(1.0, 1e-5), (5.0, 1e-5), (0.5, 1e-3)])
def test_gaussian_update_event_meets_its_epsilon_delta_exactly(eps, delta):
    sigma = ldp.update_event("gaussian", eps, delta).noise_multiplier
    d = _analytic_gaussian_delta(sigma, eps)
    assert 0.95 * delta <= d <= delta  # valid, and calibrated tightly
    assert ldp.update_event("laplace", eps, None).noise_multiplier == pytest.approx(1 / eps)


def test_update_noise_is_at_sensitivity_two_clip():
    """Two datasets whose updates point in opposite directions (each clipped to C) differ by
    2C: the noise std must be σ·2C (Gaussian) and the Laplace scale 2C/ε, per coordinate."""
    clip, n = 0.5, 40_000
    rng = Randomness.seeded(3)
    g = ldp.update_event("gaussian", 2.0, DELTA)
    up = np.tile([10.0, 0.0], (n, 1))
    out = ldp.noisy_updates(up, g, clip, rng)
    want = g.noise_multiplier * 2 * clip
    assert np.all(np.abs(out.std(0) / want - 1) < 4 / math.sqrt(2 * n))
    assert out[:, 0].mean() == pytest.approx(clip, abs=4 * want / math.sqrt(n) + 1e-3)
    lap = ldp.update_event("laplace", 2.0, None)
    out = ldp.noisy_updates(up, lap, clip, rng)
    b = 2 * clip / 2.0
    centred = out - out.mean(0)
    # E|X| = b for Laplace(b); its s.d. is b
    assert np.all(np.abs(np.abs(centred).mean(0) / b - 1) < 4 / math.sqrt(n))
    assert np.abs(ldp.clip_updates(up, clip, 1)).sum(1).max() <= clip


def test_diverged_update_is_replaced_not_uploaded_as_nan():
    clip, n = 1.0, 20_000
    g = ldp.update_event("gaussian", 3.0, DELTA)
    bad = np.full((n, 3), np.nan)
    bad[::3] = np.inf
    bad[1::3] = [1e308, 1e308, 0.0]  # finite, but its norm overflows
    with np.errstate(all="raise"):  # no floating-point warnings either
        out = ldp.noisy_updates(bad, g, clip, Randomness.seeded(5))
    assert np.all(np.isfinite(out))
    want = g.noise_multiplier * 2 * clip  # noise around the fixed input 0
    assert np.all(np.abs(out.mean(0)) < 4 * want / math.sqrt(n))
    assert np.all(np.abs(out.std(0) / want - 1) < 4 / math.sqrt(2 * n))
    out = ldp.noisy_updates(bad, ldp.update_event("laplace", 3.0, None), clip,
                            Randomness.seeded(6))
    assert np.all(np.isfinite(out))


def test_fedavg_ldp_client_that_diverges_sends_a_finite_upload(tiny_fed):
    fed = tiny_fed.with_targets(PrivacyTarget(50.0, DELTA), {})
    alg = make_algorithm("fedavg_ldp", ldp_epsilon=5.0, client_fraction=1.0)
    # w ← w − lr·(g + l2·w) with lr·l2 = 1e100: local SGD overflows to ∞, then NaN
    with np.errstate(all="ignore"):
        res = simulate(fed, make_model("softmax", fed.dim, 10), alg,
                       TrainingConfig(rounds=2, batch_size=8, lr=1.0, l2=1e100,
                                      noise="seeded"), store=BudgetStore(None))
    assert np.all(np.isfinite(res.params))  # before the fix: NaN everywhere
    assert [len(led.entries) for led in res.ledgers] == [2, 2, 2]


# --- private tuning: the event describes what is drawn ------------------------------------

@pytest.mark.parametrize("eta,mean", [(1.0, 10.0), (0.0, 10.0), (0.5, 3.0), (2.0, 20.0)])
def test_repeat_and_select_event_matches_the_drawn_tnb(eta, mean):
    dist = D.tnb(eta, mean=mean)
    rev = acc.dpsgd_event(0.1, 2.0, 3)
    ev = TA.select_event(rev, 5, dist, 0.7)
    assert (ev.mean, ev.shape) == (pytest.approx(mean, rel=1e-9), eta)
    # dp_accounting turns (shape, mean) back into γ: it must be the γ that is sampled
    assert _gamma_truncated_negative_binomial(eta, ev.mean) == pytest.approx(dist.gamma,
                                                                             rel=1e-6)
    h = dist.draw(Randomness.seeded(11), 100_000)
    assert h.min() >= 1
    assert abs(h.mean() - mean) < 4 * h.std() / math.sqrt(len(h))


def test_poisson_trials_and_the_event_round_trip_through_the_store():
    dist = D.poisson(5.0)
    h = dist.draw(Randomness.seeded(12), 100_000)
    assert abs(h.mean() - 5.0) < 4 * math.sqrt(5.0 / len(h))
    assert abs((h == 0).mean() - math.exp(-5)) < 4 * math.sqrt(math.exp(-5) / len(h))
    rev = acc.dpsgd_event(0.2, 1.5, 2)
    for d in (dist, D.tnb(1.0, mean=4.0)):
        sel = TA.select_event(rev, 6, d, 0.5)
        back = events.from_dict(json.loads(events.to_json(sel)))  # a ledger line, read back
        assert back == sel and hash(back) == hash(sel)
        left = Counter(events.flatten(TA.tuned_event(rev, 6, d, 0.5)))
        left.subtract(events.flatten(back))  # what a resume still has to reserve
        assert +left == Counter(events.flatten(dpa.SelfComposedDpEvent(rev, 6)))


# --- q = 1 (full-batch small silos) ------------------------------------------------------------

@pytest.mark.parametrize("sigma,steps", [(1.0, 1), (2.0, 10), (5.0, 100)])
def test_full_batch_steps_are_accounted_as_the_gaussian_mechanism(sigma, steps):
    mu = math.sqrt(steps) / sigma  # T full-batch steps: one Gaussian with std σ/√T
    lo, hi = 0.0, 100.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _analytic_gaussian_delta(1 / mu, mid) > DELTA else (lo, mid)
    got = acc.epsilon(acc.dpsgd_event(1.0, sigma, steps), DELTA)
    assert hi <= got <= hi * 1.005
    rev = acc.dpsgd_event(1.0, sigma, steps)
    assert math.isfinite(score_sigma(rev, 4, 2.0))


def test_full_batch_sampling_reads_every_row_once():
    n = np.array([5, 7, 200])
    idx, mask = poisson_batches(n, np.array([1.0, 1.0, 0.1]), Randomness.os_entropy())
    for k in (0, 1):
        assert sorted(idx[k][mask[k]].tolist()) == list(range(n[k]))

"""Node-level DP accounting (Theorem 2.4.4)."""

from __future__ import annotations

import json
import math

import dp_accounting as dpa
import numpy as np
import pytest

from silofl.errors import CalibrationError, PrivacyError
from silofl.privacy import accounting, events
from silofl.privacy.node_level import (
    DEFAULT_ORDERS,
    NodeLevelDpEvent,
    affected_examples,
    calibrate_node_sigma,
    node_epsilon,
    node_rdp,
    node_steps,
)


def _logsumexp(xs):
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def direct_gamma(alpha, n, S, b, sigma):
    """γ(α) written out: explicit sum over ρ with exact binomial coefficients."""
    log_total = math.log(math.comb(n, b))
    terms = []
    for k in range(0, min(S, b) + 1):
        ways = math.comb(S, k) * math.comb(n - S, b - k)
        if ways == 0:
            continue
        terms.append(math.log(ways) - log_total + alpha * (alpha - 1) * 2 * k * k / sigma**2)
    return _logsumexp(terms) / (alpha - 1)


def direct_epsilon(n, S, b, sigma, steps, delta):
    """min over α of the improved RDP→(ε, δ) conversion (as dp_accounting documents:
    ε = rdp + log1p(−1/α) − log(δ·α)/(α − 1)), plus the classic bound for reference."""
    improved, classic = [], []
    for a in DEFAULT_ORDERS:
        r = steps * direct_gamma(a, n, S, b, sigma)
        improved.append(r + math.log1p(-1 / a) - math.log(delta * a) / (a - 1))
        classic.append(r + math.log(1 / delta) / (a - 1))
    return max(0.0, min(improved)), min(classic)


@pytest.mark.parametrize("n,S,b,sigma,steps", [
    (1000, 5, 50, 1.2, 100),
    (10_000, 20, 256, 3.0, 40),
    (500, 3, 500, 4.0, 10),      # full batch: ρ = S always
    (2000, 1, 64, 0.9, 300),
])
def test_epsilon_matches_direct_evaluation(n, S, b, sigma, steps):
    delta = 1 / n
    eps = node_epsilon(n, S, b, sigma, steps)
    ref, classic = direct_epsilon(n, S, b, sigma, steps, delta)
    assert eps == pytest.approx(ref, rel=1e-8)
    assert eps <= classic
    gam = node_rdp(DEFAULT_ORDERS, n, S, b, sigma)
    for a, g in zip(DEFAULT_ORDERS, gam):
        assert g == pytest.approx(direct_gamma(a, n, S, b, sigma), rel=1e-9, abs=1e-12)


def test_S1_is_gaussian_with_sensitivity_two_sampled_at_rate_b_over_n():
    n, b, sigma = 1000, 40, 2.0
    q = b / n
    a = np.asarray(DEFAULT_ORDERS)
    # log(1 − q + q·exp(α(α−1)·2/σ²)) / (α − 1), overflow-free
    want = np.logaddexp(np.log1p(-q), np.log(q) + a * (a - 1) * 2 / sigma**2) / (a - 1)
    np.testing.assert_allclose(node_rdp(a, n, 1, b, sigma), want, rtol=1e-10)
    # full batch (no amplification): exactly the Gaussian mechanism with Δ = 2, i.e.
    # noise multiplier σ/2 for a unit-sensitivity query: RDP α·2/σ²
    np.testing.assert_allclose(node_rdp(a, n, 1, n, sigma), 2 * a / sigma**2, rtol=1e-12)
    acc = dpa.rdp.RdpAccountant(list(DEFAULT_ORDERS))
    acc.compose(dpa.GaussianDpEvent(sigma / 2), 25)
    assert node_epsilon(n, 1, n, sigma, 25) == pytest.approx(acc.get_epsilon(1 / n), rel=1e-9)


def test_monotonicity():
    base = dict(n=50_000, S=10, b=256, sigma=1.5, steps=200)

    def eps(**kw):
        return node_epsilon(**{**base, **kw})

    e0 = eps()
    assert eps(steps=400) > e0 > eps(steps=100)
    assert eps(S=20) > e0 > eps(S=5)
    assert eps(b=512) > e0 > eps(b=128)
    assert eps(sigma=1.0) > e0 > eps(sigma=3.0)
    assert node_epsilon(1000, 5, 50, 1.0, 0) == 0.0


@pytest.mark.parametrize("target,n,S,b,steps", [
    (1.0, 100_000, 20, 512, 195),
    (5.0, 20_000, 10, 128, 1000),
    (0.5, 5000, 1, 100, 50),
])
def test_calibration_hits_target_from_below(target, n, S, b, steps):
    sigma = calibrate_node_sigma(target, n, S, b, steps)
    eps = node_epsilon(n, S, b, sigma, steps)
    assert eps <= target
    assert eps >= 0.99 * target
    assert node_epsilon(n, S, b, sigma * 0.99, steps) > target


def test_calibration_unreachable():
    with pytest.raises(CalibrationError, match="raise epsilon"):
        calibrate_node_sigma(1e-6, 1000, 20, 500, 10_000)


def test_node_steps():
    assert node_steps(1000, 100, 1) == 10
    assert node_steps(1001, 100, 1) == 11
    assert node_steps(1000, 100, 2.5) == 25
    assert node_steps(1000, 1000, 3) == 3


@pytest.mark.parametrize("kwargs,match", [
    (dict(S=0), "S"),
    (dict(S=-3), "S"),
    (dict(b=2000), "larger than the region"),
    (dict(b=0), "batch size"),
    (dict(sigma=0.0), "sigma"),
    (dict(sigma=-1.0), "sigma"),
    (dict(sigma=float("nan")), "sigma"),
    (dict(S=1001), "cannot exceed"),
    (dict(steps=-1), "steps"),
    (dict(delta=1.5), "delta"),
])
def test_invalid_inputs(kwargs, match):
    args = {**dict(n=1000, S=5, b=50, sigma=1.0, steps=10), **kwargs}
    with pytest.raises(PrivacyError, match=match):
        node_epsilon(**args)


def test_event_is_data():
    ev = NodeLevelDpEvent(n=10_000, S=20, b=256, sigma=2.0, steps=40)
    d = json.loads(json.dumps(ev.to_dict()))
    assert d["event"] == "node_level_dp" and d["S"] == 20
    assert NodeLevelDpEvent.from_dict(d) == ev
    assert ev.epsilon() == node_epsilon(10_000, 20, 256, 2.0, 40)
    assert ev.epsilon(1e-6) > ev.epsilon()
    np.testing.assert_allclose(ev.rdp(), 40 * node_rdp(DEFAULT_ORDERS, 10_000, 20, 256, 2.0))
    assert "S=20" in str(ev)
    with pytest.raises(PrivacyError):
        NodeLevelDpEvent(n=10, S=0, b=5, sigma=1.0, steps=1)
    with pytest.raises(PrivacyError):
        NodeLevelDpEvent.from_dict({"event": "gaussian"})


@pytest.mark.parametrize("n,S,b,sigma,steps", [
    (1000, 5, 50, 1.2, 100),
    (10_000, 20, 256, 3.0, 40),
    (500, 3, 500, 4.0, 10),
])
def test_node_edges_is_the_hypergeometric_with_2S_minus_1_successes(n, S, b, sigma, steps):
    """Replacing a person with their contacts changes up to 2S − 1 examples: the
    accountant's ρ ~ Hypergeometric(n, 2S − 1, b), each affected example moving by ≤ 2C."""
    delta = 1 / n
    edges = node_epsilon(n, S, b, sigma, steps, adjacency="node+edges")
    node = node_epsilon(n, S, b, sigma, steps, adjacency="node")
    assert edges == pytest.approx(direct_epsilon(n, 2 * S - 1, b, sigma, steps, delta)[0],
                                  rel=1e-8)
    assert node == pytest.approx(direct_epsilon(n, S, b, sigma, steps, delta)[0], rel=1e-8)
    assert edges > node
    ev = NodeLevelDpEvent(n, S, b, sigma, steps, "node+edges")
    assert ev.affected == 2 * S - 1 == affected_examples(n, S, "node+edges")
    assert ev.epsilon() == edges
    # the ledgers' accountant composes the event's own curve: the same figure
    assert accounting.epsilon(ev, delta, "rdp") == pytest.approx(edges, rel=1e-12)
    sig = calibrate_node_sigma(2.0, n, S, b, steps, adjacency="node+edges")
    assert node_epsilon(n, S, b, sig, steps, adjacency="node+edges") <= 2.0
    assert sig > calibrate_node_sigma(2.0, n, S, b, steps, adjacency="node")


def test_affected_examples_never_exceed_n():
    assert affected_examples(30, 20, "node+edges") == 30
    assert affected_examples(30, 20, "node") == 20
    with pytest.raises(PrivacyError, match="adjacency"):
        affected_examples(30, 20, "edge")


def test_event_round_trips_and_old_dicts_load_as_node_adjacency():
    ev = NodeLevelDpEvent(n=10_000, S=20, b=256, sigma=2.0, steps=40, adjacency="node+edges")
    d = json.loads(events.to_json(ev))
    assert d["adjacency"] == "node+edges" and d["affected"] == 39
    assert events.from_dict(d) == ev and NodeLevelDpEvent.from_dict(d) == ev
    old = {"event": "node_level_dp", "n": 10_000, "S": 20, "b": 256, "sigma": 2.0, "steps": 40}
    loaded = events.from_dict(old)  # a ledger line written before the field existed
    assert loaded.adjacency == "node" and loaded.affected == 20
    assert loaded.epsilon() == node_epsilon(10_000, 20, 256, 2.0, 40) < ev.epsilon()
    with pytest.raises(PrivacyError, match="inconsistent"):
        NodeLevelDpEvent.from_dict({**d, "affected": 20})
    assert "39 examples affected" in str(ev)


def test_calibration_composes_with_other_charges():
    base = NodeLevelDpEvent(5000, 10, 5000, 300.0, 1, "node+edges").rdp(DEFAULT_ORDERS)
    alone = calibrate_node_sigma(3.0, 5000, 10, 128, 100, adjacency="node+edges")
    both = calibrate_node_sigma(3.0, 5000, 10, 128, 100, adjacency="node+edges", base_rdp=base)
    assert both > alone
    assert node_epsilon(5000, 10, 128, both, 100, adjacency="node+edges", base_rdp=base) <= 3.0
    with pytest.raises(CalibrationError, match="alone exceed"):
        calibrate_node_sigma(3.0, 5000, 10, 128, 100, base_rdp=100 * base)

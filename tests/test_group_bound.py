"""What example-level DP-SGD guarantees a person with k rows (`privacy.group`), against
independent references."""

from __future__ import annotations

import math

import dp_accounting as dpa
import pytest
from scipy import optimize, stats

from silofl.privacy.group import example_level_person_epsilon, group_bound


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """Analytic Gaussian mechanism (Balle & Wang 2018): ε at δ for sensitivity/σ = μ."""
    def d(eps):
        return (stats.norm.cdf(-eps / mu + mu / 2)
                - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta)
    return optimize.brentq(d, 0.0, 500.0)


def test_group_bound_is_the_textbook_formula():
    assert group_bound(1.0, 1e-5, 1) == (1.0, 1e-5)
    e, d = group_bound(0.5, 1e-6, 4)
    assert e == 2.0 and d == pytest.approx(4 * math.exp(1.5) * 1e-6)
    with pytest.raises(ValueError):
        group_bound(1.0, 1e-5, 0)


def test_one_row_is_the_example_level_epsilon():
    q, sigma, T = 0.02, 1.1, 300
    ref = dpa.pld.PLDAccountant().compose(dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), T)).get_epsilon(1e-5)
    assert example_level_person_epsilon(q, sigma, T, 1, 1e-5) == pytest.approx(ref, rel=0.02)


def test_without_sampling_k_rows_are_one_gaussian_of_sensitivity_k():
    """q = 1: every row every step, so T steps of sensitivity k are one Gaussian with
    μ = k·√T/σ (exact reference, tolerance 2 % for the PLD discretisation)."""
    sigma, T, k = 20.0, 16, 3
    want = _gaussian_epsilon(k * math.sqrt(T) / sigma, 1e-5)
    assert example_level_person_epsilon(1.0, sigma, T, k, 1e-5) == pytest.approx(want, rel=0.02)


def test_more_rows_cost_more_and_can_exceed_the_group_bounds_epsilon():
    q, sigma, T = 0.01, 1.0, 500
    e = [example_level_person_epsilon(q, sigma, T, k, 1e-5) for k in (1, 2, 5)]
    assert e[0] < e[1] < e[2]
    # the group bound's ε is k·ε_1, at a much larger δ; at the same δ the tight figure is
    # larger still: example-level training protects a person far less than per-row ε says
    assert e[2] > 5 * e[0] * 0.9

"""dp_accounting's internals are read in one module, `privacy._dpa_adapter`; these tests pin
what it returns against independent computations (dp_accounting's public API, numpy, the
closed form of a distribution's mean), so a dp_accounting release inside the range that
pyproject.toml allows cannot change a figure silently. The custom events are proper
`DpEvent`s, composed by a `PrivacyAccountant` of ours."""

from __future__ import annotations

import math
import re
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import pld, rdp
from dp_accounting.dp_event import RepeatAndSelectDpEvent
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from silofl.errors import PrivacyError
from silofl.privacy import _dpa_adapter as adapter
from silofl.privacy import accounting, events, selection
from silofl.privacy.curves import CurveRdpAccountant, FixedRdpCurveEvent, RdpCurveDpEvent
from silofl.privacy.node_level import NodeLevelDpEvent
from silofl.privacy.pld_eval import _eps_for_delta
from silofl.tuning.distributions import tnb_mean

SRC = Path(__file__).resolve().parents[1] / "src" / "silofl"


# --- PLD internals -------------------------------------------------------------------------

@pytest.mark.parametrize("sampling_prob", [1.0, 0.05])
def test_dense_pmfs_are_the_pld_dp_accounting_reports(sampling_prob):
    """The arrays read from a PLD are a distribution, and ε computed from them equals
    dp_accounting's public `get_epsilon_for_delta` on the same PLD."""
    d = pld_lib.from_gaussian_mechanism(1.3, value_discretization_interval=1e-3,
                                        sampling_prob=sampling_prob)
    rem, add = adapter.dense_pmfs(d)
    assert (add is rem) == (sampling_prob == 1.0)  # the Gaussian's PLD is symmetric
    for lower, probs, inf_mass, grid in (rem, add):
        assert grid == 1e-3 and isinstance(lower, int)
        assert probs.sum() + inf_mass == pytest.approx(1.0, abs=1e-9)
        assert np.all(probs >= 0)
    for delta in (1e-3, 1e-6):
        ours = max(_eps_for_delta(*rem, delta), _eps_for_delta(*add, delta))
        assert ours == pytest.approx(d.get_epsilon_for_delta(delta), rel=1e-9)


def test_compose_dense_is_a_convolution():
    a = (-3, np.array([0.2, 0.5, 0.3 - 1e-3]), 1e-3, 0.01)
    b = (2, np.array([0.6, 0.4 - 2e-3]), 2e-3, 0.01)
    lower, probs, inf_mass, grid = adapter.compose_dense(a, b, 0.0)
    assert lower == -1 and grid == 0.01
    np.testing.assert_allclose(probs, np.convolve(a[1], b[1]), rtol=1e-9, atol=1e-15)
    assert inf_mass == pytest.approx(1 - (1 - 1e-3) * (1 - 2e-3), rel=1e-9)


def test_pld_of_an_accountant_is_what_it_reports():
    acc = pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dpa.LaplaceDpEvent(0.7))
    assert adapter.pld_of(acc).get_epsilon_for_delta(1e-5) == acc.get_epsilon(1e-5)


# --- RepeatAndSelect on a curve ---------------------------------------------------------------

@pytest.mark.parametrize("mean,shape", [(4.0, 1.0), (5.0, 0.0), (3.0, 0.5), (5.0, math.inf)])
def test_repeat_and_select_on_a_curve_equals_dp_accounting_on_the_event(mean, shape):
    """The formula applied to a curve gives what dp_accounting's public accountant gives
    for its own RepeatAndSelectDpEvent around an event with that curve."""
    orders = [1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0]
    inner = dpa.ComposedDpEvent((accounting.dpsgd_event(0.1, 1.5, 12),
                                 dpa.GaussianDpEvent(4.0)))
    inner_rdp = rdp.RdpAccountant(orders).compose(inner).rdp
    public = rdp.RdpAccountant(orders).compose(RepeatAndSelectDpEvent(inner, mean, shape)).rdp
    ours = adapter.repeat_and_select_rdp(orders, inner_rdp, mean, shape)
    np.testing.assert_allclose(ours, public, rtol=1e-12)
    assert np.all(ours >= inner_rdp)  # selecting among repeats never costs less than one run


@pytest.mark.parametrize("shape,mean", [(1.0, 4.0), (0.5, 10.0), (0.0, 5.0), (2.0, 3.0)])
def test_tnb_gamma_gives_the_requested_mean(shape, mean):
    gamma = adapter.tnb_gamma(shape, mean)
    assert 0 < gamma < 1
    assert tnb_mean(shape, gamma) == pytest.approx(mean, rel=1e-6)


def test_no_private_dp_accounting_use_outside_the_adapter():
    """Every read of a dp_accounting internal sits in `_dpa_adapter` (the check can fail:
    the adapter itself is caught by it)."""
    private = re.compile(r"_compute_rdp|_gamma_truncated|\._pld\b|\._pmf_(remove|add)\b|"
                         r"\._symmetric\b|\._probs\b|\._lower_loss\b|\._infinity_mass\b|"
                         r"\._discretization\b|from dp_accounting[\w.]* import[^\n]*\b_\w")
    hits = {p.name for p in SRC.rglob("*.py") if private.search(p.read_text())}
    assert hits == {"_dpa_adapter.py"}


# --- custom events are DpEvents with their own accountant ------------------------------------

def test_curve_events_are_dp_events_composed_by_our_accountant():
    node = NodeLevelDpEvent(1000, 5, 32, 1.2, 40, "node+edges")
    score = selection.GaussianScoreEvent(3.0)
    ras = selection.NodeRepeatAndSelectEvent(node, 3, 2.0, 4.0, 1.0)
    for e in (node, score, ras, FixedRdpCurveEvent((2.0,), (0.1,))):
        assert isinstance(e, dpa.DpEvent) and isinstance(e, RdpCurveDpEvent)
    ev = dpa.ComposedDpEvent((dpa.SelfComposedDpEvent(node, 3), score, ras,
                              dpa.ZCDpEvent(0.01, 0.0), dpa.NoOpDpEvent()))
    acc = CurveRdpAccountant()
    assert acc.supports(ev)
    acc.compose(ev)
    orders = np.asarray(accounting.RDP_ORDERS_FINE)
    expect = 3 * node.rdp(orders) + score.rdp(orders) + ras.rdp(orders) + 0.01 * orders
    np.testing.assert_allclose(acc.rdp, expect, rtol=1e-12)
    eps = acc.get_epsilon(1e-6)
    assert eps == pytest.approx(accounting.epsilon(ev, 1e-6, "rdp"), rel=1e-12)
    assert acc.get_delta(eps * 1.01) <= 1e-6  # the public conversion agrees in direction
    # a dp_accounting event with no curve is refused, in our accountant and in a ledger
    mixed = dpa.ComposedDpEvent((node, accounting.dpsgd_event(0.1, 1.0, 3)))
    assert not acc.supports(mixed)
    with pytest.raises(dpa.UnsupportedEventError):
        CurveRdpAccountant().compose(mixed)
    with pytest.raises(PrivacyError, match="cannot compose node-level events"):
        accounting.epsilon(mixed, 1e-6, "rdp")


def test_fixed_curve_event_round_trips_and_refuses_other_orders():
    e = FixedRdpCurveEvent((1.5, 2.0), (0.1, 0.2))
    assert events.from_json(events.to_json(e)) == e
    np.testing.assert_array_equal(e.rdp([1.5, 2.0]), [0.1, 0.2])
    with pytest.raises(PrivacyError, match="only at the orders"):
        e.rdp([1.5, 3.0])
    with pytest.raises(PrivacyError, match="one value per order"):
        FixedRdpCurveEvent((1.5, 2.0), (0.1,))

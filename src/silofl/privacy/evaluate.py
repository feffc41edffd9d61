"""ε of a composition: which accountant gives it, memoized by the multiset of base events.

Events PLD has no model for — zCDP (IFCA's private selection) and events that bring their
own RDP curve (`curves.RdpCurveDpEvent`: node-level DP-SGD, repeat-and-select on a curve)
— fall back to RDP: `accountant_for` says which accountant applies, `guarantee` gives ε
with the accountant that produced it.

Neighbouring relation: add/remove one example (dp_accounting's default), which is what
Poisson-subsampled DP-SGD with sensitivity C per example satisfies.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import dp_accounting as dpa
import numpy as np
from dp_accounting import pld, rdp

from silofl.errors import PrivacyError
from silofl.privacy.adaptive_clip import equivalent
from silofl.privacy.curves import CurveRdpAccountant, is_curve_event
from silofl.privacy.events import flatten
from silofl.privacy.pld_eval import PLD_BASE_GRID, _pld_epsilon, _pld_search
from silofl.privacy.rdp_curves import (
    RDP_ORDERS,
    RDP_ORDERS_FINE,
    _is_poisson_gaussian,
    _rdp_epsilon,
    _sorted,
    rdp_to_epsilon,
)

Accountant = Literal["rdp", "pld"]
ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld")
DEFAULT_ACCOUNTANT: Accountant = "pld"


def make_accountant(kind: Accountant = DEFAULT_ACCOUNTANT) -> dpa.PrivacyAccountant:
    """A fresh dp_accounting accountant of `kind`.

    Parameters
    ----------
    kind : {"pld", "rdp"}
        RDP at `RDP_ORDERS`, or PLD at the 1e-5 reference grid (`epsilon` picks a grid
        per composition instead).

    Returns
    -------
    dp_accounting.PrivacyAccountant
    """
    _check_kind(kind)
    if kind == "rdp":
        return rdp.RdpAccountant(list(RDP_ORDERS))
    return pld.PLDAccountant(value_discretization_interval=PLD_BASE_GRID)


def _check_kind(kind: object) -> None:
    if kind not in ACCOUNTANTS:
        raise PrivacyError(f"unknown accountant {kind!r}; choose one of {', '.join(ACCOUNTANTS)}")


def _counts(event: dpa.DpEvent) -> dict:
    return flatten(event)


def _key(event: dpa.DpEvent) -> frozenset:
    """Canonical form of a composition: equal multisets of base events give equal ε, in
    whatever order or nesting they were composed (ledgers and calibration must agree).
    Adaptive-clipping steps count as their equivalent Gaussian (`adaptive_clip.equivalent`)."""
    counts = _counts(event)
    if any(equivalent(e) is not e for e in counts):
        merged: dict = {}
        for e, c in counts.items():
            k = equivalent(e)
            merged[k] = merged.get(k, 0) + c
        counts = merged
    return frozenset((e, c) for e, c in counts.items() if c > 0)


def _own_curve(key: frozenset) -> np.ndarray | None:
    """Composed RDP at RDP_ORDERS_FINE when a base event brings its own curve
    (`curves.RdpCurveDpEvent`), by `curves.CurveRdpAccountant`; None for pure
    dp_accounting compositions. Base events are composed in a fixed order (the float
    sum depends on it)."""
    if not any(is_curve_event(e) for e, _ in key):
        return None
    acc = CurveRdpAccountant(RDP_ORDERS_FINE)
    # zCDP events (private selections) compose with curves exactly; anything else not
    if not all(acc.supports(e) for e, _ in key):
        raise PrivacyError("cannot compose node-level events with dp_accounting events "
                           "other than zCDP in one ledger; keep them in separate ledgers")
    for e, c in _sorted(key):
        acc.compose(e, c)
    return acc.rdp


# --- which accountant --------------------------------------------------------------------

def accountant_for(event: dpa.DpEvent, preferred: Accountant = DEFAULT_ACCOUNTANT) -> Accountant:
    """The accountant that gives `event`'s guarantee.

    Parameters
    ----------
    event : dp_accounting.DpEvent
    preferred : {"pld", "rdp"}

    Returns
    -------
    str
        `preferred` if it supports every base event, else "rdp" (zCDP events and curve
        events such as node-level DP-SGD have no PLD here).
    """
    _check_kind(preferred)
    if preferred == "pld" and not _pld_supports_key(_key(event)):
        return "rdp"
    return preferred


def guarantee(event: dpa.DpEvent, delta: float,
              preferred: Accountant = DEFAULT_ACCOUNTANT) -> tuple[float, str]:
    """ε of `event` with the accountant that produced it.

    Budget checks and reports use this, so a check compares the figure it reports.

    Parameters
    ----------
    event : dp_accounting.DpEvent
    delta : float
        δ in (0, 1).
    preferred : {"pld", "rdp"}

    Returns
    -------
    (float, str)
        ε (nats, an upper bound) under `accountant_for(event, preferred)`, and that
        accountant's name.
    """
    kind = accountant_for(event, preferred)
    return epsilon(event, delta, kind), kind


def _pld_supports_key(key: frozenset) -> bool:
    return all(_pld_supports(e) for e, _ in key)


@lru_cache(maxsize=4096)
def _pld_supports(base: dpa.DpEvent) -> bool:
    if is_curve_event(base):
        return False  # brings its own RDP curve (node-level): RDP only
    if isinstance(base, (dpa.GaussianDpEvent, dpa.NonPrivateDpEvent)) or _is_poisson_gaussian(base):
        return True
    if isinstance(base, dpa.RandomizedResponseDpEvent):  # see `_rr_pmfs` (PrivateKT)
        return True
    return pld.PLDAccountant().supports(base)


# --- ε ---------------------------------------------------------------------------------

def epsilon(event: dpa.DpEvent, delta: float, kind: Accountant = DEFAULT_ACCOUNTANT) -> float:
    """ε of `event` at `delta` under one accountant — an upper bound, never rounded down.

    Memoized by the composition's multiset of base events: calibration, the ledger
    preflight, every check and the report evaluate the same compositions.

    Parameters
    ----------
    event : dp_accounting.DpEvent
        The mechanism, e.g. from `dpsgd_event`, or a composition of events.
    delta : float
        δ in (0, 1).
    kind : {"pld", "rdp"}, default "pld"
        The accountant: privacy loss distributions (tight) or Rényi DP.

    Returns
    -------
    float
        ε (dimensionless, ≥ 0; ``inf`` when no finite ε holds at this δ).

    Raises
    ------
    PrivacyError
        δ outside (0, 1), or `kind` cannot account for the event (see `guarantee` in
        ``silofl.privacy.accounting`` for the fallback).
    """
    _check_kind(kind)
    delta = float(delta)
    if not 0 < delta < 1:
        raise PrivacyError(f"delta must lie strictly between 0 and 1, got {delta}")
    return _epsilon_cached(_key(event), delta, kind)


@lru_cache(maxsize=8192)
def _epsilon_cached(key: frozenset, delta: float, kind: str) -> float:
    if not key:
        return 0.0
    if any(isinstance(e, dpa.NonPrivateDpEvent) for e, _ in key):
        return math.inf
    curve = _own_curve(key)
    if curve is not None:
        if kind != "rdp":
            raise PrivacyError(f"the {kind} accountant does not support node-level events; "
                               "use the rdp accountant")
        return rdp_to_epsilon(RDP_ORDERS_FINE, curve, delta)[0]
    if kind == "rdp":
        return _rdp_epsilon(key, delta)
    if not _pld_supports_key(key):
        bad = next(e for e, _ in key if not _pld_supports(e))
        raise PrivacyError(f"the {kind} accountant cannot account for {type(bad).__name__}")
    return _pld_epsilon(key, delta)


def epsilons(event: dpa.DpEvent, delta: float) -> dict[str, float | None]:
    """ε of `event` under both accountants.

    Parameters
    ----------
    event : dp_accounting.DpEvent
        The mechanism or composition.
    delta : float
        δ in (0, 1).

    Returns
    -------
    dict of str to float or None
        ``{"rdp": ε_RDP, "pld": ε_PLD}``; ``None`` where an accountant does not support
        the event (zCDP or node-level events under PLD).
    """
    key = _key(event)
    return {"rdp": epsilon(event, delta, "rdp"),
            "pld": epsilon(event, delta, "pld") if _pld_supports_key(key) else None}


def pld_grid(event: dpa.DpEvent, delta: float) -> float:
    """The discretization interval of the PLD figure `epsilon(event, delta, "pld")`.

    Parameters
    ----------
    event : dp_accounting.DpEvent
    delta : float

    Returns
    -------
    float
        Interval (nats) to reproduce the figure with dp_accounting's PLDAccountant.
    """
    return PLD_BASE_GRID * 2.0 ** _pld_search(_key(event), float(delta))[1]

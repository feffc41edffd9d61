"""Repeat-and-select with a truncated negative binomial number of runs, for every η > −1.

Papernot & Steinke (2022, "Hyperparameter tuning with Renyi differential privacy",
Theorem 2; thesis Theorem E.1.2): if one run Q is (λ, ε)- and (λ̂, ε̂)-RDP, then running it
K ~ TNB(η, γ) times and releasing only the best is (λ, ε')-RDP with

    ε' = ε + (1 + η)(1 − 1/λ̂) ε̂ + (1 + η) log(1/γ)/λ̂ + log E[K]/(λ − 1),

for any η ∈ (−1, ∞), γ ∈ (0, 1), λ > 1, λ̂ ≥ 1. dp_accounting's `RepeatAndSelectDpEvent`
implements it for η ≥ 0 only (its γ solver refuses η < 0); η ∈ (−1, 0) puts less mass on
many runs and costs less (the (1 + η) factor), which is what makes counted tuning cheap.
`TnbRepeatAndSelectDpEvent` is that mechanism as a `dp_accounting.DpEvent` of silofl's
own (a custom event in `events.CUSTOM_EVENTS`): the RDP accountant (`rdp_curves`)
evaluates it from the base run's RDP curve with `tnb_select_rdp`, which is the theorem
minimised over λ̂ in the accountant's orders (as dp_accounting does), then made
non-decreasing in λ (RDP is monotone in the order). At η ≥ 0 it equals dp_accounting's
figure (tests/test_tnb_select.py: relative 1e-7, γ solved by bisection here).
PLD has no model for it: ledgers holding it report RDP (`evaluate.accountant_for`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import dp_accounting as dpa
import numpy as np
import numpy.typing as npt

from silofl.errors import PrivacyError
from silofl.privacy import events

SELECT_EVENT = "tnb_repeat_and_select"


def tnb_mean(shape: float, gamma: float) -> float:
    """E[K] of TNB(η, γ): η(1−γ)/(γ(1−γ^η)) (η ≠ 0), (1/γ − 1)/log(1/γ) (η = 0).

    Parameters
    ----------
    shape : float
        η > −1.
    gamma : float
        γ in (0, 1).

    Returns
    -------
    float
        The mean number of runs (> 1).
    """
    lg = math.log(gamma)
    if shape == 0:
        return (1.0 / gamma - 1.0) / -lg
    return shape * (1.0 - gamma) / (gamma * -math.expm1(shape * lg))


@lru_cache(maxsize=256)
def tnb_gamma(shape: float, mean: float) -> float:
    """γ of TNB(η = shape) with E[K] = `mean`, by bisection in log γ (E[K] falls from ∞ to
    1 as γ goes from 0 to 1). The lower end of the final bracket is returned: a smaller
    γ only raises the bound (the log(1/γ) term), so the answer is conservative.

    Parameters
    ----------
    shape : float
        η > −1.
    mean : float
        E[K] ≥ 1.

    Returns
    -------
    float
        γ in (0, 1]; 1 when mean = 1.
    """
    if mean <= 1:
        return 1.0
    lo, hi = 1e-300, 1.0 - 1e-15
    if tnb_mean(shape, hi) >= mean:
        return hi
    for _ in range(2000):
        mid = math.sqrt(lo * hi) if hi > 2 * lo else 0.5 * (lo + hi)
        if tnb_mean(shape, mid) >= mean:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return lo


def tnb_select_rdp(orders: npt.ArrayLike, rdp: npt.ArrayLike, mean: float,
                   shape: float) -> np.ndarray:
    """RDP of the best-of-K release, K ~ TNB(η, γ) with E[K] = `mean` (Theorem 2 above).

    Parameters
    ----------
    orders : sequence of float, shape (A,)
        Rényi orders, ascending; the bound is +∞ at orders ≤ 1 (before monotonicity).
    rdp : sequence of float, shape (A,)
        RDP (nats) of one run at `orders`.
    mean : float
        E[K] ≥ 1.
    shape : float
        η in (−1, ∞).

    Returns
    -------
    numpy.ndarray, shape (A,)
        RDP (nats) of the release at `orders`.
    """
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    _check(mean, shape)
    if a.shape != r.shape or a.ndim != 1 or np.any(np.diff(a) < 0):
        raise PrivacyError("repeat-and-select needs ascending orders and one RDP value each")
    gamma = tnb_gamma(float(shape), float(mean))
    with np.errstate(invalid="ignore"):
        c = (1.0 + shape) * np.min(np.where(a > 1, (1 - 1 / a) * r - math.log(gamma) / a,
                                            np.inf))
        out = np.where(a > 1, r + math.log(mean) / np.where(a > 1, a - 1, 1.0) + c, np.inf)
    out = np.where(np.isnan(out), np.inf, out)
    return np.minimum.accumulate(out[::-1])[::-1]  # monotone in the order


def _check(mean: float, shape: float) -> None:
    if not (math.isfinite(shape) and shape > -1):
        raise PrivacyError(f"TNB shape η must be a finite number > −1, got {shape!r}")
    if not (math.isfinite(mean) and mean >= 1):
        raise PrivacyError(f"the mean number of runs must be ≥ 1, got {mean!r}")


@dataclass(frozen=True)
class TnbRepeatAndSelectDpEvent(dpa.DpEvent):
    """Run ``event`` K ~ TNB(η = ``shape``) times with E[K] = ``mean``; release the best.

    ``event`` is stored with its compositions as tuples (a hashable base event of ledgers);
    ``.event`` is what each run's prepaid sub-ledger may spend, as for dp_accounting's
    `RepeatAndSelectDpEvent`.
    """

    event: dpa.DpEvent
    mean: float
    shape: float

    def __post_init__(self) -> None:
        _check(float(self.mean), float(self.shape))
        object.__setattr__(self, "event", events.hashable(self.event))
        object.__setattr__(self, "mean", float(self.mean))
        object.__setattr__(self, "shape", float(self.shape))

    def rdp_from(self, orders: npt.ArrayLike, inner_rdp: npt.ArrayLike) -> np.ndarray:
        """RDP at `orders` given one run's RDP `inner_rdp` there (`tnb_select_rdp`)."""
        return tnb_select_rdp(orders, inner_rdp, self.mean, self.shape)

    def to_dict(self) -> dict:
        return {"event": SELECT_EVENT,
                "mechanism": "best of K ~ truncated negative binomial runs (Papernot & "
                             "Steinke 2022, Theorem 2)",
                "inner": events.to_dict(self.event), "mean": self.mean, "shape": self.shape}

    @classmethod
    def from_dict(cls, d: dict) -> TnbRepeatAndSelectDpEvent:
        if d.get("event") != SELECT_EVENT:
            raise PrivacyError(f"not a {SELECT_EVENT} event: {d.get('event')!r}")
        try:
            return cls(events.from_dict(d["inner"]), float(d["mean"]), float(d["shape"]))
        except (KeyError, TypeError, ValueError) as e:
            raise PrivacyError(f"malformed {SELECT_EVENT} event: {e}") from None


__all__ = ["SELECT_EVENT", "TnbRepeatAndSelectDpEvent", "tnb_gamma", "tnb_mean",
           "tnb_select_rdp"]

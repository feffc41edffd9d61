"""σ calibration: the smallest noise multiplier whose composition meets a target ε.

σ is calibrated against the accountant that reports (PLD by default); closed forms only
guide the search (`rdp_curves._fast_rdp`, `_gdp_sigma`), and every answer is the reporting
accountant's own figure. One calibrator serves every privacy unit: `calibrate` takes the
unit's event factory σ ↦ event; `calibrate_dpsgd` and `node_level.calibrate_node_sigma`
are thin entry points that give it the example- and node-level factories.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import dp_accounting as dpa
import numpy as np
from scipy.special import ndtr

from silofl.errors import CalibrationError, PrivacyError
from silofl.privacy.evaluate import (
    DEFAULT_ACCOUNTANT,
    Accountant,
    _check_kind,
    _counts,
    _epsilon_cached,
    _key,
    accountant_for,
    epsilon,
)
from silofl.privacy.events import _check_q_sigma, dpsgd_event
from silofl.privacy.pld_eval import _pld_eps_at, _start_level
from silofl.privacy.rdp_curves import (
    RDP_ORDERS,
    _fast_epsilon,
    _fast_rdp_of_items,
    rdp_to_epsilon,
)
from silofl.privacy.targets import check_target

SIGMA_MAX = 1e4
# PLD calibration never evaluates σ below this: at σ ≈ 0.1 with a small sampling rate the
# subsampled Gaussian's loss range spans 1e11+ grid points (measured: MemoryError at 6 GiB,
# while σ = 0.15 takes ~1 s); a target met only below it is refused (PrivacyError)
_PLD_SIGMA_FLOOR = 0.15


# --- calibration -----------------------------------------------------------------------

def _smallest_sigma(eps_of: Callable[[float], float], target: float,
                   rel_tol: float = 1e-5) -> float | None:
    """Bisection on log σ ∈ [1e-2, SIGMA_MAX] for the smallest σ with eps_of(σ) ≤ target
    (to `rel_tol`; ε falls in σ); None if even SIGMA_MAX is not enough."""
    lo, hi = 1e-2, SIGMA_MAX
    if eps_of(hi) > target:
        return None
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if eps_of(mid) > target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + rel_tol:
            break
    return hi


def _fast_rdp_of(event: dpa.DpEvent) -> np.ndarray | None:
    """RDP at RDP_ORDERS of a composition of Poisson-subsampled Gaussians, Gaussians and
    zCDP events from the closed forms (a search aid, like `_fast_rdp`); None if any base
    event has no closed form here."""
    return _fast_rdp_of_items(_counts(event).items())


def closed_form_sigma(make_event: Callable[[float], dpa.DpEvent], target: float, delta: float,
                      curve: Callable[[dpa.DpEvent], np.ndarray | None]) -> float | None:
    """`_smallest_sigma` on the closed-form RDP `curve(make_event(σ))` (a search aid; the
    caller has checked that make_event has a closed form and re-checks the σ it gets).

    Parameters
    ----------
    make_event : callable float -> dp_accounting.DpEvent
        The run as a function of σ.
    target, delta : float
        The target (ε, δ).
    curve : callable DpEvent -> numpy.ndarray or None
        RDP at `RDP_ORDERS` from closed forms (None: no closed form).

    Returns
    -------
    float or None
        The smallest σ whose closed-form ε meets `target`; None if even the largest σ
        searched does not.
    """
    def eps(s: float) -> float:
        rdp = curve(make_event(s))
        if rdp is None:  # make_event(σ) has one closed form or none, whatever σ
            raise PrivacyError("make_event(σ) lost its closed-form RDP curve as σ changed")
        return rdp_to_epsilon(RDP_ORDERS, rdp, delta)[0]
    return _smallest_sigma(eps, target)


def _fast_composed_guess(make_event: Callable[[float], dpa.DpEvent], target: float,
                         delta: float) -> float | None:
    """`closed_form_sigma` of make_event's composition; None without a closed form."""
    if _fast_rdp_of(make_event(1.0)) is None:
        return None
    return closed_form_sigma(make_event, target, delta, _fast_rdp_of)


@lru_cache(maxsize=4096)
def calibrate_dpsgd(target_epsilon: float, delta: float, q: float, steps: int,
                    kind: Accountant = DEFAULT_ACCOUNTANT) -> float:
    """The smallest noise multiplier σ that keeps `steps` DP-SGD steps within a target.

    RDP: σ to ~1e-5 relative; PLD: ε within 0.2% below the target.

    Parameters
    ----------
    target_epsilon : float
        ε to reach (> 0).
    delta : float
        δ in (0, 1).
    q : float
        Poisson sampling rate in (0, 1].
    steps : int
        Number of DP-SGD steps.
    kind : {"pld", "rdp"}, default "pld"
        The accountant.

    Returns
    -------
    float
        σ: the noise standard deviation in units of the clipping norm C, with
        ``epsilon(dpsgd_event(q, σ, steps), delta, kind) <= target_epsilon``.

    Raises
    ------
    CalibrationError
        No σ ≤ 1e4 reaches the target.
    """
    _check_q_sigma(q, 1.0)
    check_target(target_epsilon, delta, "calibration target ")  # finite search, bounded grid
    if kind == "pld":  # start from the CLT (Gaussian DP) approximation of the PLD
        guess, minimal = _gdp_sigma(target_epsilon, delta, q, steps), False
    else:  # the closed-form RDP σ is the answer, up to dp_accounting's verification
        guess = _smallest_sigma(lambda s: _fast_epsilon(q, s, steps, delta), target_epsilon)
        minimal = True
    return calibrate(lambda s: dpsgd_event(q, s, steps), target_epsilon, delta, kind,
                     guess=guess, guess_is_minimal=minimal)


def _gdp_sigma(target: float, delta: float, q: float, steps: int) -> float | None:
    """σ from the central-limit approximation of subsampled Gaussian composition
    (μ-GDP with μ = q·√(T(e^{1/σ²} − 1)), Bu et al. 2020; exact for q = 1 with μ = √T/σ),
    solving the Gaussian trade-off δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) for μ. Only
    a starting point for the PLD search."""
    def delta_of(mu: float) -> float:
        return float(ndtr(-target / mu + mu / 2) - math.exp(target) * ndtr(-target / mu - mu / 2))

    lo, hi = 1e-9, 1e3
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if delta_of(mid) <= delta else (lo, mid)
    mu = lo
    if q >= 1:
        return math.sqrt(steps) / mu
    x = math.log1p(mu * mu / (q * q * steps))
    return 1 / math.sqrt(x) if x > 0 else None


# PLD calibration stops once ε(σ) ≥ (1 − this) × target: ≤ 0.2% of the budget unused
_FILL = 2e-3


def calibrate(make_event: Callable[[float], dpa.DpEvent], target_epsilon: float,
              delta: float, kind: Accountant = DEFAULT_ACCOUNTANT,
              guess: float | None = None, guess_is_minimal: bool = False,
              rel_tol: float = 1e-3, *, sigma_max: float | None = None) -> float:
    """Smallest noise multiplier σ whose event meets a target ε — for every privacy unit.

    ε falls in σ. For RDP σ is found to `rel_tol`; for PLD until ε ≥ (1 − 0.2%)·target
    (or σ to `rel_tol`). An event family `kind` cannot account for is calibrated under
    `accountant_for` (PLD → RDP for zCDP or curve events such as node-level DP-SGD), the
    accountant `guarantee` checks it with. Every answer is that accountant's own figure
    (the one reported), whatever the guess was.

    Parameters
    ----------
    make_event : callable float -> dp_accounting.DpEvent
        The unit's event factory: σ ↦ everything the silo releases at noise σ
        (`events.dpsgd_event` for example-level DP-SGD, a `NodeLevelDpEvent` for
        node-level, compositions with selections and preprocessing).
    target_epsilon, delta : float
        The target (ε, δ); ε in (0, 100], δ in (0, 0.5).
    kind : {"pld", "rdp"}
        The preferred accountant.
    guess : float, optional
        A starting σ (from a closed form); without one a closed-form guess is tried.
    guess_is_minimal : bool
        The guess came from the same accountant's formula: returned at once if it meets
        the target.
    rel_tol : float
        Relative tolerance in σ.
    sigma_max : float, optional
        Search RDP by doubling from σ = 1 up to `sigma_max` (no closed-form guess): the
        search node-level calibration always used, for curve events.

    Returns
    -------
    float
        σ (dimensionless: noise std = σ × sensitivity) meeting the target.

    Raises
    ------
    CalibrationError
        When no σ ≤ `SIGMA_MAX` (or `sigma_max`) reaches the target.
    """
    if not target_epsilon > 0:
        raise PrivacyError(f"target epsilon must be positive, got {target_epsilon}")
    check_target(target_epsilon, delta, "calibration target ")  # finite search, bounded grid
    _check_kind(kind)
    kind = accountant_for(make_event(1.0), kind)

    def eps(s: float) -> float:
        return epsilon(make_event(s), delta, kind)

    if kind == "pld":
        if guess is None:
            guess = _fast_composed_guess(make_event, target_epsilon, delta)
        return _calibrate_pld(lambda s: _key(make_event(s)), target_epsilon, delta, guess,
                              rel_tol)
    if sigma_max is not None:
        lo, hi = _doubling_bracket(eps, target_epsilon, delta, sigma_max)
    else:
        if guess is None:
            guess = _fast_composed_guess(make_event, target_epsilon, delta)
            guess_is_minimal = guess is not None
        if guess is not None and guess_is_minimal and eps(guess) <= target_epsilon:
            return guess  # a good guess needs only a couple of library evaluations
        lo, hi = _rdp_bracket(eps, target_epsilon, guess)
        _unreachable(eps, hi, target_epsilon, delta)
    return _bisect(eps, target_epsilon, lo, hi, rel_tol)


def _rdp_bracket(eps: Callable[[float], float], target: float, guess: float | None) -> tuple[float,
                 float]:
    """(lo, hi) around the smallest feasible σ, from `guess` (or from σ = 1 without one);
    hi may stay infeasible past SIGMA_MAX (`_unreachable` then says so)."""
    if guess is not None:
        if eps(guess) <= target:
            lo, hi = guess / 2, guess
            while eps(lo) <= target and lo > 1e-2:
                lo, hi = lo / 2, lo
        else:
            lo, hi = guess, guess * (1 + 1e-4)  # the aid is off by a hair at most, usually
            while eps(hi) > target:
                lo, hi = hi, hi * 1.05 if hi < guess * 1.01 else hi * 2
                if hi > SIGMA_MAX:
                    break
        return lo, hi
    lo, hi = 1e-2, 1.0
    while eps(hi) > target and hi <= SIGMA_MAX:
        lo, hi = hi, hi * 4
    return lo, hi


def _doubling_bracket(eps: Callable[[float], float], target: float, delta: float,
                      sigma_max: float) -> tuple[float, float]:
    """(lo, hi) by doubling σ from 1 up to `sigma_max`, then halving down (to 1e-6): the
    search node-level calibration has always used (kept: its σ are reported figures)."""
    hi = 1.0
    while eps(hi) > target:
        if hi >= sigma_max:
            raise CalibrationError(
                f"no noise multiplier up to {sigma_max:g} reaches ε = {target} at "
                f"δ = {delta:.3g}")
        hi = min(hi * 2.0, sigma_max)
    lo = hi / 2.0
    while eps(lo) <= target:
        hi, lo = lo, lo / 2.0
        if lo < 1e-6:
            return hi, hi  # feasible down to the floor: nothing to bisect
    return lo, hi


def _bisect(eps: Callable[[float], float], target: float, lo: float, hi: float,
            rel_tol: float) -> float:
    """Geometric bisection keeping the feasible end hi (ε(hi) ≤ target)."""
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if eps(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def _unreachable(eps: Callable[[float], float], hi: float, target: float, delta: float) -> None:
    if hi > SIGMA_MAX or eps(hi) > target:
        raise _too_strict(target, delta)


def _too_strict(target: float, delta: float) -> CalibrationError:
    return CalibrationError(
        f"no noise multiplier up to {SIGMA_MAX:g} reaches ε = {target} at δ = {delta}; "
        "the target is too strict for this many steps. Raise epsilon or delta, "
        "train for fewer rounds, or use a smaller batch (lower sampling rate)")


def _calibrate_pld(key_of: Callable[[float], frozenset], target: float, delta: float,
                   guess: float | None,
                   rel_tol: float) -> float:
    """Root of log ε(σ) = log target on log σ by the Illinois method (false position that
    halves a stale end's weight), keeping a feasible upper end.

    The search evaluates PLD at the starting grid of `_pld_search` only: the reported
    figure is the smallest over that grid and others, so it is never larger, and the
    returned σ is checked with it."""
    def eps(s: float) -> float:
        key = key_of(s)
        return _pld_eps_at(key, _start_level(key), delta)

    sigma = _pld_root(eps, target, delta, guess, rel_tol)
    if _epsilon_cached(key_of(sigma), delta, "pld") > target:  # cannot happen (see above)
        raise CalibrationError(f"PLD calibration to ε = {target} did not verify; please "
                               "report this as a bug")
    return sigma


def _pld_root(eps: Callable[[float], float], target: float, delta: float, guess: float | None,
              rel_tol: float) -> float:
    start = min(max(guess, _PLD_SIGMA_FLOOR), SIGMA_MAX) if guess else 1.0
    low, high = _bracket(eps, target, start)
    if low is None:  # met even at the floor: the true σ lies where PLD cannot go
        raise PrivacyError(  # not CalibrationError ("too strict"): this target is too loose
            f"ε = {target:g} at δ = {delta:g} is met with a noise multiplier below "
            f"{_PLD_SIGMA_FLOOR:g}, where the PLD accountant's grid no longer fits in memory "
            "(and such a target protects little); lower epsilon or delta, or set "
            "[privacy] accountant = \"rdp\"")
    if high is None:  # ε(SIGMA_MAX) > target: what _unreachable checks
        raise _too_strict(target, delta)
    (lo, e_lo), (hi, e_hi) = low, high
    f_lo = math.log(e_lo / target) if math.isfinite(e_lo) else math.inf
    f_hi = math.log(e_hi / target) if e_hi > 0 else -math.inf
    last = 0  # +1: the last step moved hi, −1: it moved lo
    for _ in range(60):
        if e_hi >= (1 - _FILL) * target or hi / lo <= 1 + rel_tol:
            break
        x_lo, x_hi = math.log(lo), math.log(hi)
        if math.isfinite(f_lo) and math.isfinite(f_hi):
            x = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
            # stay strictly inside, away from the ends
            x = min(max(x, x_lo + 0.02 * (x_hi - x_lo)), x_hi - 0.02 * (x_hi - x_lo))
        else:  # ε = 0 or ∞ at an end: no slope, bisect
            x = 0.5 * (x_lo + x_hi)
        s = math.exp(x)
        e = eps(s)
        if e <= target:
            hi, e_hi = s, e
            f_hi = math.log(e / target) if e > 0 else -math.inf
            if last == 1:
                f_lo *= 0.5  # Illinois: the same end moved twice, damp the stale one
            last = 1
        else:
            lo, e_lo = s, e
            f_lo = math.log(e / target) if math.isfinite(e) else math.inf
            if last == -1:
                f_hi *= 0.5
            last = -1
    return hi


def _bracket(eps: Callable[[float], float], target: float,
             s: float) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """((lo, ε(lo)), (hi, ε(hi))) with ε(lo) > target ≥ ε(hi), found by stepping along the
    local power law ε ∝ σ^−p (a few evaluations from any start); the lo pair is None when
    even σ = _PLD_SIGMA_FLOOR meets the target, the hi pair when σ = SIGMA_MAX does not."""
    e, p = eps(s), 1.0
    while True:
        if e > target and s >= SIGMA_MAX:
            return (s, e), None
        if e <= target and s <= _PLD_SIGMA_FLOOR:
            return None, (s, e)
        if e > 0 and math.isfinite(e):
            ratio = (e / target) ** (1 / p) * (1.02 if e > target else 0.98)  # overshoot
        else:
            ratio = 10.0 if e > target else 0.1
        s2 = min(max(s * min(max(ratio, 0.1), 10.0), _PLD_SIGMA_FLOOR), SIGMA_MAX)
        e2 = eps(s2)
        if (e2 > target) != (e > target):
            return ((s, e), (s2, e2)) if e > target else ((s2, e2), (s, e))
        if 0 < e2 < math.inf and 0 < e < math.inf and e2 != e:
            p = min(max(math.log(e / e2) / math.log(s2 / s), 0.2), 5.0)
        s, e = s2, e2


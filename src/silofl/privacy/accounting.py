"""DP-SGD as dp_accounting events; ε under RDP and PLD; σ calibration.

Every private operation is described as a `dp_accounting.DpEvent` and handed to an
accountant. The *default* accountant is RDP (fast, conservative); PLD is reported beside
it as the tighter figure. Both come from Google's `dp-accounting` library.

Neighbouring relation: add/remove one example (dp_accounting's default), which is what
Poisson-subsampled DP-SGD with sensitivity C per example satisfies.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable, Literal

import dp_accounting as dpa
import numpy as np
from dp_accounting import pld, rdp
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon as _rdp_to_eps
from scipy.special import gammaln, logsumexp

from silofl.errors import CalibrationError, PrivacyError

Accountant = Literal["rdp", "pld"]
ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld")
DEFAULT_ACCOUNTANT: Accountant = "rdp"

# Integer orders only: fractional orders cost ~15 ms each in dp_accounting and rarely
# matter at the ε we target; omitting orders can only make the reported ε larger (safe).
RDP_ORDERS: tuple[float, ...] = tuple(
    [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 16, 18, 20, 24, 28, 32, 40, 48, 56, 64,
     80, 96, 128, 192, 256, 384, 512])
# PLD grid: 1e-3 agrees with 1e-4 to ~1e-3 in ε at 10× the speed; dp_accounting's PLD
# is pessimistic (an upper bound) at any grid.
PLD_DISCRETIZATION = 1e-3


def dpsgd_event(q: float, noise_multiplier: float, steps: int = 1) -> dpa.DpEvent:
    """`steps` DP-SGD steps with Poisson sampling rate q and noise σ (std = σ·C)."""
    _check_q_sigma(q, noise_multiplier)
    base = dpa.PoissonSampledDpEvent(float(q), dpa.GaussianDpEvent(float(noise_multiplier)))
    return base if steps == 1 else dpa.SelfComposedDpEvent(base, int(steps))


def steps_for_epochs(n: int, batch_size: float, epochs: float) -> int:
    """Number of Poisson-sampled steps that make `epochs` passes in expectation."""
    return max(1, int(round(epochs * n / batch_size)))


def make_accountant(kind: Accountant = DEFAULT_ACCOUNTANT) -> dpa.PrivacyAccountant:
    if kind == "rdp":
        return rdp.RdpAccountant(list(RDP_ORDERS))
    if kind == "pld":
        return pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    raise PrivacyError(f"unknown accountant {kind!r}; choose one of {', '.join(ACCOUNTANTS)}")


# Orders for events that bring their own RDP curve (e.g. node-level DP-SGD).
RDP_ORDERS_FINE: tuple[float, ...] = (
    1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 7.0, 8.0,
    9.0, 10.0, 11.0, 12.0, 14.0, 16.0, 18.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0,
    64.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 224.0, 256.0)


def _own_rdp(event) -> np.ndarray | None:
    """Composed RDP at RDP_ORDERS_FINE when every base event has its own `rdp(orders)`
    (events dp_accounting has no type for); None for pure dp_accounting compositions."""
    from silofl.privacy.events import flatten
    counts = flatten(event)
    own = [isinstance(e, dpa.DpEvent) for e in counts]
    if all(own):
        return None
    if any(own):
        raise PrivacyError("cannot compose node-level events with dp_accounting events in "
                           "one ledger; keep them in separate ledgers")
    return sum(c * np.asarray(e.rdp(RDP_ORDERS_FINE)) for e, c in counts.items())


def epsilon(event, delta: float, kind: Accountant = DEFAULT_ACCOUNTANT) -> float:
    """ε of `event` at `delta` under accountant `kind`. Results are memoized: the same
    event is typically evaluated by calibration, the ledger preflight and the report."""
    try:
        return _epsilon_cached(event, float(delta), kind)
    except TypeError:  # unhashable event (e.g. a ComposedDpEvent holding a list)
        return _epsilon(event, delta, kind)


@lru_cache(maxsize=8192)
def _epsilon_cached(event, delta: float, kind: str) -> float:
    return _epsilon(event, delta, kind)


def _epsilon(event, delta: float, kind: Accountant) -> float:
    if isinstance(event, dpa.NoOpDpEvent):
        return 0.0
    rdp_curve = _own_rdp(event)
    if rdp_curve is not None:
        if kind != "rdp":
            raise PrivacyError(f"the {kind} accountant does not support node-level events; "
                               "use the rdp accountant")
        return float(_rdp_to_eps(RDP_ORDERS_FINE, list(rdp_curve), delta)[0])
    if kind == "rdp":
        # RDP composes linearly, so a composition is Σ count × (dp_accounting's RDP of each
        # base event); caching the base curves makes re-checking a composition (every
        # preflight and report, IFCA's selection + DP-SGD mixes) cost microseconds.
        from silofl.privacy.events import flatten
        curve = sum(c * _base_rdp(e) for e, c in flatten(event).items())
        return float(_rdp_to_eps(RDP_ORDERS, list(curve), delta)[0])
    acc = make_accountant(kind)
    if not acc.supports(event):
        raise PrivacyError(f"the {kind} accountant cannot account for {type(event).__name__}")
    acc.compose(event)
    return float(acc.get_epsilon(delta))


@lru_cache(maxsize=8192)
def _base_rdp(event) -> np.ndarray:
    """dp_accounting's RDP curve (at RDP_ORDERS) of one base event."""
    acc = make_accountant("rdp")
    if not acc.supports(event):
        raise PrivacyError(f"the rdp accountant cannot account for {type(event).__name__}")
    acc.compose(event)
    return np.asarray(acc._rdp, dtype=float)  # the accountant's composed RDP vector


def epsilons(event, delta: float) -> dict[str, float | None]:
    """ε under both accountants: {'rdp': …, 'pld': …} (None where an accountant does not
    support the event)."""
    if _own_rdp(event) is not None:
        return {"rdp": epsilon(event, delta, "rdp"), "pld": None}
    # e.g. zCDP events (private selection) have no PLD in dp_accounting
    return {k: epsilon(event, delta, k) if make_accountant(k).supports(event) else None
            for k in ACCOUNTANTS}


# --- calibration ---------------------------------------------------------------------

def _check_q_sigma(q: float, sigma: float) -> None:
    if not 0 < q <= 1:
        raise PrivacyError(f"sampling rate q = batch/n must be in (0, 1], got {q}; "
                           "use a batch size below the silo's number of training examples")
    if not sigma > 0:
        raise PrivacyError(f"noise multiplier must be positive, got {sigma}")


def _fast_rdp(q: float, sigma: float) -> np.ndarray:
    """Per-step RDP of the Poisson-subsampled Gaussian at RDP_ORDERS (all integers),
    vectorized: log A_α = logsumexp_k [log C(α,k) + k log q + (α−k) log(1−q) + (k²−k)/(2σ²)]
    (Mironov, Talwar, Zhang 2019). Only a search aid: results are re-checked with
    dp_accounting before use."""
    a, k, base = _ORDER_GRID
    log1mq = math.log1p(-q) if q < 1 else -1e300  # q = 1: only the k = α term survives
    terms = base + k * math.log(q) + (a - k) * log1mq + (k * k - k) / (2 * sigma * sigma)
    return logsumexp(terms, axis=1) / (a[:, 0] - 1)


def _order_grid():
    a = np.asarray(RDP_ORDERS, dtype=float)[:, None]
    k = np.arange(int(max(RDP_ORDERS)) + 1, dtype=float)[None, :]
    k = np.minimum(k, a)  # clamp; the clamped entries are masked out by base = -inf
    base = gammaln(a + 1) - gammaln(k + 1) - gammaln(a - k + 1)
    base = np.where(np.arange(k.shape[1])[None, :] <= a, base, -np.inf)
    return a, k, base


_ORDER_GRID = _order_grid()


def _fast_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    return float(_rdp_to_eps(RDP_ORDERS, steps * _fast_rdp(q, sigma), delta)[0])


@lru_cache(maxsize=4096)
def calibrate_dpsgd(target_epsilon: float, delta: float, q: float, steps: int,
                    kind: Accountant = DEFAULT_ACCOUNTANT) -> float:
    """Smallest noise multiplier σ (to ~0.1%) with ε(steps × PoissonGaussian(q, σ)) ≤ target
    under accountant `kind`. Raises CalibrationError when no σ ≤ 10⁴ reaches it."""
    # The fast guess is exact for RDP; for PLD (tighter) it is an upper bracket.
    return calibrate(lambda s: dpsgd_event(q, s, steps), target_epsilon, delta, kind,
                     guess=_fast_guess(target_epsilon, delta, q, steps),
                     guess_is_minimal=(kind == "rdp"))


def _fast_guess(target: float, delta: float, q: float, steps: int) -> float | None:
    return _smallest_sigma(lambda s: _fast_epsilon(q, s, steps, delta), target)


def _smallest_sigma(eps_of: Callable[[float], float], target: float) -> float | None:
    """Bisection on log σ ∈ [1e-2, 1e4] for the smallest σ with eps_of(σ) ≤ target (to a
    relative 1e-5; ε falls in σ); None if even σ = 1e4 is not enough."""
    lo, hi = 1e-2, 1e4
    if eps_of(hi) > target:
        return None
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if eps_of(mid) > target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-5:
            break
    return hi


def _fast_rdp_of(event) -> np.ndarray | None:
    """RDP at RDP_ORDERS of a composition of Poisson-subsampled Gaussians, Gaussians and
    zCDP events from the closed forms (a search aid, like `_fast_rdp`); None if any base
    event has no closed form here."""
    from silofl.privacy.events import flatten
    total = np.zeros(len(RDP_ORDERS))
    orders = np.asarray(RDP_ORDERS, dtype=float)
    for e, c in flatten(event).items():
        if isinstance(e, dpa.PoissonSampledDpEvent) and \
                isinstance(e.event, dpa.GaussianDpEvent):
            total += c * _fast_rdp(e.sampling_probability, e.event.noise_multiplier)
        elif isinstance(e, dpa.GaussianDpEvent):
            total += c * orders / (2 * e.noise_multiplier ** 2)
        elif isinstance(e, dpa.ZCDpEvent):
            total += c * (e.xi + e.rho * orders)
        else:
            return None
    return total


def _fast_composed_guess(make_event, target: float, delta: float) -> float | None:
    """`_smallest_sigma` on the closed-form RDP of make_event(σ); None without one."""
    if _fast_rdp_of(make_event(1.0)) is None:
        return None
    return _smallest_sigma(lambda s: float(
        _rdp_to_eps(RDP_ORDERS, list(_fast_rdp_of(make_event(s))), delta)[0]), target)


def calibrate(make_event: Callable[[float], dpa.DpEvent], target_epsilon: float,
              delta: float, kind: Accountant = DEFAULT_ACCOUNTANT,
              guess: float | None = None, guess_is_minimal: bool = False,
              rel_tol: float = 1e-3) -> float:
    """Smallest σ (to `rel_tol`) with ε(make_event(σ)) ≤ target under `kind` (ε falls in σ).

    `guess`, if given, brackets the search; with `guess_is_minimal` (it came from the same
    accountant's formula) a guess that meets the target is returned at once. Every answer
    is verified with dp_accounting, so the target holds whatever the guess was."""
    if not target_epsilon > 0:
        raise PrivacyError(f"target epsilon must be positive, got {target_epsilon}")

    def eps(s: float) -> float:
        return epsilon(make_event(s), delta, kind)

    if guess is None and kind == "rdp":
        guess = _fast_composed_guess(make_event, target_epsilon, delta)
        guess_is_minimal = guess is not None
    if guess is not None:
        # A good guess needs only a couple of library evaluations.
        if eps(guess) <= target_epsilon:
            if guess_is_minimal:
                return guess
            lo, hi = guess / 2, guess
            while eps(lo) <= target_epsilon and lo > 1e-2:
                lo, hi = lo / 2, lo
        else:
            lo, hi = guess, guess * 1.05
            while eps(hi) > target_epsilon:
                lo, hi = hi, hi * 2
                if hi > 1e4:
                    break
    else:
        lo, hi = 1e-2, 1.0
        while eps(hi) > target_epsilon and hi <= 1e4:
            lo, hi = hi, hi * 4
    if eps(hi) > target_epsilon:
        raise CalibrationError(
            f"no noise multiplier up to 1e4 reaches ε = {target_epsilon} at δ = {delta}; "
            "the target is too strict for this many steps. Raise epsilon or delta, "
            "train for fewer rounds, or use a smaller batch (lower sampling rate)")
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if eps(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi

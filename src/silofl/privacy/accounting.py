"""DP-SGD as dp_accounting events; ε under PLD and RDP; σ calibration.

Every private operation is described as a `dp_accounting.DpEvent` and handed to an
accountant. Two accountants, both built on Google's `dp-accounting` (0.6.0):

* **PLD** (the default): privacy loss distributions, dp_accounting's pessimistic
  connect-the-dots discretization of every base event, composed by FFT exponentiation.
  The discretization interval is chosen per composition (see `pld_grid`), so the figure
  stays within ~0.1% of a 1e-5-grid computation however long the run (≤ 1% is tested),
  at a fraction of its cost. Every figure is an upper bound on ε: any grid is pessimistic.
* **RDP**: Rényi DP at dp_accounting's default orders (1.1…10.9 in steps of 0.1, 11…63,
  128…1024) plus the integer orders this module used before; dp_accounting's values are
  cached per base event and order, so re-checking a composition costs microseconds.

σ is calibrated against the accountant that reports (PLD by default); closed forms only
guide the search (`_fast_rdp`, `_gdp_sigma`), and every answer is the reporting
accountant's own figure.

Events PLD has no model for — zCDP (IFCA's private selection) and events that bring their
own `rdp(orders)` (node-level DP-SGD) — fall back to RDP: `accountant_for` says which
accountant applies, `guarantee` gives ε with the accountant that produced it.

Neighbouring relation: add/remove one example (dp_accounting's default), which is what
Poisson-subsampled DP-SGD with sensitivity C per example satisfies.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from functools import lru_cache
from typing import Callable, Literal

import dp_accounting as dpa
import numpy as np
import scipy.fft as scipy_fft
from dp_accounting import pld, rdp
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as _pld_lib
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS
from scipy.special import gammaln, log_ndtr, ndtr

from silofl.errors import CalibrationError, PrivacyError
from silofl.privacy.targets import check_target
from silofl.privacy.events import flatten

Accountant = Literal["rdp", "pld"]
ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld")
DEFAULT_ACCOUNTANT: Accountant = "pld"

# The integer orders of earlier releases stay in the grid: a superset of orders can only
# lower the reported ε, so no figure got worse with the change to fractional orders.
_V1_ORDERS = (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 16, 18, 20, 24, 28, 32, 40, 48, 56,
              64, 80, 96, 128, 192, 256, 384, 512)
RDP_ORDERS: tuple[float, ...] = tuple(sorted(set(DEFAULT_RDP_ORDERS) | set(_V1_ORDERS)))

# Orders for events that bring their own RDP curve (node-level DP-SGD). Small σ puts the
# optimum close to 1 (σ = 1: α ≈ 1.05–1.2), so the grid is dense there; it contains the
# earlier grid (1.25 … 256), so it never reports more than before.
_V1_FINE = (1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 7.0,
            8.0, 9.0, 10.0, 11.0, 12.0, 14.0, 16.0, 18.0, 20.0, 24.0, 28.0, 32.0, 40.0,
            48.0, 56.0, 64.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 224.0, 256.0)
_NEAR_ONE = (1.001, 1.002, 1.005, 1.0075, 1.01, 1.0125, 1.015, 1.0175, 1.02, 1.025, 1.03,
             1.035, 1.04, 1.045, 1.05, 1.055, 1.06, 1.065, 1.07, 1.075, 1.08, 1.085, 1.09,
             1.095, 1.1, 1.11, 1.12, 1.13, 1.14, 1.15, 1.16, 1.17, 1.18, 1.19, 1.2, 1.21,
             1.22, 1.23, 1.24)
RDP_ORDERS_FINE: tuple[float, ...] = tuple(sorted(
    {float(a) for a in (*_NEAR_ONE, *_V1_FINE, *DEFAULT_RDP_ORDERS)}))

#: PLD grids are 1e-5 · 2^k: nested, so a coarser grid of the family is never tighter
#: than a finer one (connect-the-dots on a subset of the dots lies above).
PLD_BASE_GRID = 1e-5
# interval ≈ this share of the per-step privacy loss's std: the discretization error
# then measured ≈ 0.1·(Δ/std)² of ε, i.e. ~0.1%
_GRID_SHARE = 0.1
# accept a grid when halving it changes ε by at most this share (error ≈ a third of it)
_GRID_TOL = 3e-3
_K_MIN, _K_MAX, _K_DEFAULT, _MAX_REFINE = -14, 24, 3, 3
_TAIL = 1e-15  # PLD tail mass truncated per composition, counted as infinite loss
# ε = 0 is reported only when (0, δ)-DP holds with this much slack in the RDP value, so
# floating-point noise in a near-zero curve can never turn into a zero ε
_ZERO_SLACK = 1e-12
SIGMA_MAX = 1e4
# PLD calibration never evaluates σ below this: at σ ≈ 0.1 with a small sampling rate the
# subsampled Gaussian's loss range spans 1e11+ grid points (measured: MemoryError at 6 GiB,
# while σ = 0.15 takes ~1 s); a target met only below it is refused (PrivacyError)
_PLD_SIGMA_FLOOR = 0.15

PLD_DISCRETIZATION = PLD_BASE_GRID  # the reference grid (kept for callers of 0.x)


# --- events -----------------------------------------------------------------------------

def dpsgd_event(q: float, noise_multiplier: float, steps: int = 1) -> dpa.DpEvent:
    """The privacy event of `steps` DP-SGD steps with Poisson sampling and Gaussian noise.

    Parameters
    ----------
    q : float
        Poisson sampling rate in (0, 1]: each record joins a batch independently with
        probability q (expected batch size / records).
    noise_multiplier : float
        σ > 0: the Gaussian noise's standard deviation is σ·C for clipping norm C.
    steps : int, default 1
        Number of steps composed.

    Returns
    -------
    dp_accounting.DpEvent
        ``PoissonSampled(q, Gaussian(σ))``, self-composed `steps` times when steps > 1.
    """
    _check_q_sigma(q, noise_multiplier)
    base = dpa.PoissonSampledDpEvent(float(q), dpa.GaussianDpEvent(float(noise_multiplier)))
    return base if steps == 1 else dpa.SelfComposedDpEvent(base, int(steps))


def steps_for_epochs(n: int, batch_size: float, epochs: float) -> int:
    """Number of Poisson-sampled steps that make `epochs` passes in expectation."""
    return max(1, int(round(epochs * n / batch_size)))


def make_accountant(kind: Accountant = DEFAULT_ACCOUNTANT) -> dpa.PrivacyAccountant:
    """A fresh dp_accounting accountant of `kind` (RDP at RDP_ORDERS; PLD at the 1e-5
    reference grid — `epsilon` picks a grid per composition instead)."""
    _check_kind(kind)
    if kind == "rdp":
        return rdp.RdpAccountant(list(RDP_ORDERS))
    return pld.PLDAccountant(value_discretization_interval=PLD_BASE_GRID)


def _check_kind(kind) -> None:
    if kind not in ACCOUNTANTS:
        raise PrivacyError(f"unknown accountant {kind!r}; choose one of {', '.join(ACCOUNTANTS)}")


def _counts(event) -> dict:
    return flatten(event)


def _key(event) -> frozenset:
    """Canonical form of a composition: equal multisets of base events give equal ε, in
    whatever order or nesting they were composed (ledgers and calibration must agree)."""
    return frozenset((e, c) for e, c in _counts(event).items() if c > 0)


def _own_rdp(event) -> np.ndarray | None:
    """Composed RDP at RDP_ORDERS_FINE when every base event has its own `rdp(orders)`
    (events dp_accounting has no type for); None for pure dp_accounting compositions."""
    return _own_curve(_key(event))


def _own_curve(key: frozenset) -> np.ndarray | None:
    own = [not isinstance(e, dpa.DpEvent) for e, _ in key]
    if not any(own):
        return None
    # zCDP events (private selections) compose with them exactly: ρ-zCDP (with ξ) is
    # (α, ξ + ρα)-RDP at every order α
    if not all(o or isinstance(e, dpa.ZCDpEvent) for (e, _), o in zip(key, own)):
        raise PrivacyError("cannot compose node-level events with dp_accounting events "
                           "other than zCDP in one ledger; keep them in separate ledgers")
    return sum(c * _curve(e) for e, c in _sorted(key))


def _curve(e) -> np.ndarray:
    """RDP at RDP_ORDERS_FINE of an event with its own curve, or of a zCDP event."""
    if isinstance(e, dpa.ZCDpEvent):
        return e.xi + e.rho * np.asarray(RDP_ORDERS_FINE, dtype=float)
    return np.asarray(e.rdp(RDP_ORDERS_FINE), dtype=float)


# --- which accountant --------------------------------------------------------------------

def accountant_for(event, preferred: str = DEFAULT_ACCOUNTANT) -> str:
    """The accountant that gives `event`'s guarantee: `preferred` if it supports every
    base event, else "rdp" (zCDP events and node-level events have no PLD here)."""
    _check_kind(preferred)
    if preferred == "pld" and not _pld_supports_key(_key(event)):
        return "rdp"
    return preferred


def guarantee(event, delta: float, preferred: str = DEFAULT_ACCOUNTANT) -> tuple[float, str]:
    """(ε, accountant): ε of `event` at `delta` under `accountant_for(event, preferred)`.
    Budget checks and reports use this, so a check compares the figure it reports."""
    kind = accountant_for(event, preferred)
    return epsilon(event, delta, kind), kind


def _pld_supports_key(key: frozenset) -> bool:
    return all(_pld_supports(e) for e, _ in key)


@lru_cache(maxsize=4096)
def _pld_supports(base) -> bool:
    if not isinstance(base, dpa.DpEvent):
        return False  # brings its own RDP curve (node-level)
    if isinstance(base, (dpa.GaussianDpEvent, dpa.NonPrivateDpEvent)) or _is_poisson_gaussian(base):
        return True
    if isinstance(base, dpa.RandomizedResponseDpEvent):  # see `_rr_pmfs` (PrivateKT)
        return True
    return pld.PLDAccountant().supports(base)


def _is_poisson_gaussian(e) -> bool:
    return isinstance(e, dpa.PoissonSampledDpEvent) and isinstance(e.event, dpa.GaussianDpEvent)


# --- ε ---------------------------------------------------------------------------------

def epsilon(event, delta: float, kind: Accountant = DEFAULT_ACCOUNTANT) -> float:
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


def _sorted(key: frozenset) -> list:
    """Deterministic order (floating-point sums depend on it)."""
    return sorted(key, key=lambda ec: (repr(ec[0]), ec[1]))


def _rdp_epsilon(key: frozenset, delta: float) -> float:
    """RDP composes linearly: ε from Σ count × (dp_accounting's RDP of each base event).
    dp_accounting's fractional orders cost up to ~0.2 s per event, so where the closed
    form (`_fast_rdp`, equal to dp_accounting's values to ~1e-6) exists it picks the
    orders worth evaluating: those within 1% of its minimum ε. The minimum over fewer
    orders can only be larger (pessimistic); it is the full grid's whenever the optimum is
    among them, and the full grid is used if any of them fails to evaluate."""
    items = _sorted(key)
    aid = _fast_rdp_of_items(items)
    if aid is not None:
        eps_aid = _eps_per_order(_ORDERS, aid, delta)
        best = float(np.min(eps_aid))
        if math.isfinite(best):
            idx = np.flatnonzero(eps_aid <= best * 1.01 + 1e-9)
            curve = sum(c * _base_rdp(e, tuple(idx)) for e, c in items)
            if np.all(np.isfinite(curve)):
                return rdp_to_epsilon(_ORDERS[idx], curve, delta)[0]
    curve = sum(c * _base_rdp(e) for e, c in items)
    return rdp_to_epsilon(RDP_ORDERS, curve, delta)[0]


_RDP_VALUES: OrderedDict = OrderedDict()  # base event → its RDP at RDP_ORDERS (nan: not yet)


def _base_rdp(event, idx: tuple | None = None) -> np.ndarray:
    """dp_accounting's RDP of one base event at RDP_ORDERS[idx] (all orders when None),
    cached per event and order."""
    if isinstance(event, dpa.RandomizedResponseDpEvent):
        sel = slice(None) if idx is None else np.asarray(idx, dtype=int)
        return rr_rdp(event, _ORDERS[sel])
    vals = _RDP_VALUES.get(event)
    if vals is None:
        if not rdp.RdpAccountant().supports(event):
            raise PrivacyError(f"the rdp accountant cannot account for {type(event).__name__}")
        vals = np.full(_ORDERS.size, np.nan)
        if len(_RDP_VALUES) >= 8192:
            _RDP_VALUES.popitem(last=False)
        _RDP_VALUES[event] = vals
    sel = np.arange(_ORDERS.size) if idx is None else np.asarray(idx, dtype=int)
    todo = sel[np.isnan(vals[sel])]
    if todo.size:
        acc = rdp.RdpAccountant([RDP_ORDERS[i] for i in todo])
        with _quiet_absl():
            acc.compose(event)
        vals[todo] = acc.rdp
    out = vals[sel]
    out.flags.writeable = False
    return out


# --- k-ary randomized response (PrivateKT's uploads, silofl.privacy.ldp) ------------------
# RR is a *local* mechanism: its guarantee is between any two inputs, and its input (a
# model's prediction) can change arbitrarily when one record of the client's data changes.
# So it is accounted for the worst pair of inputs, which
# bounds the loss under add/remove of one record, or of the whole local dataset, alike
# (dp_accounting's REPLACE_ONE for RR: the two inputs differ; REPLACE_SPECIAL would compare
# with a uniform output and under-count).

def rr_rdp(event, orders) -> np.ndarray:
    """Exact Rényi divergence of k-ary RR (keep w.p. 1 − p, else uniform over k) between
    its two most distant inputs, at `orders` (> 1): with a = 1 − p + p/k, b = p/k,
    D_α = log(a^α b^{1−α} + b^α a^{1−α} + (k − 2)·b) / (α − 1)."""
    p, k = float(event.noise_parameter), int(event.num_buckets)
    orders = np.asarray(orders, dtype=float)
    if k <= 1 or p >= 1:
        return np.zeros_like(orders)
    if p <= 0:
        return np.full_like(orders, np.inf)
    la, lb = math.log1p(-p + p / k), math.log(p / k)
    terms = np.stack([orders * la + (1 - orders) * lb, orders * lb + (1 - orders) * la,
                      np.full_like(orders, math.log(k - 2) + lb if k > 2 else -np.inf)])
    return _lse(terms, 0) / (orders - 1)


def _rr_loss(event) -> float:
    """RR's largest privacy loss log(a/b) (nats), a = 1 − p + p/k, b = p/k."""
    p, k = float(event.noise_parameter), int(event.num_buckets)
    return math.log1p(-p + p / k) - math.log(p / k)


def _rr_loss_std(event) -> float:
    """Std (nats) of RR's privacy loss (±log(a/b) w.p. a, b; 0 otherwise): sets the grid."""
    p, k = float(event.noise_parameter), int(event.num_buckets)
    a, b = 1 - p + p / k, p / k
    lr = math.log(a / b)
    return math.sqrt(max(lr * lr * (a + b) - (lr * (a - b)) ** 2, 0.0))


def _rr_pld(event, grid: float):
    return _pld_lib.from_randomized_response(
        event.noise_parameter, event.num_buckets, value_discretization_interval=grid,
        neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)


class _quiet_absl:
    """dp_accounting logs a warning for every order whose series it gives up on (the
    order is then excluded, which is safe); keep those out of users' consoles."""

    def __enter__(self):
        import logging
        self.log = logging.getLogger("absl")
        self.level = self.log.level
        self.log.setLevel(max(self.level, logging.ERROR))

    def __exit__(self, *exc):
        self.log.setLevel(self.level)


def rdp_to_epsilon(orders, rdp_values, delta: float) -> tuple[float, float]:
    """(ε, optimal order) from an RDP curve: min over α of the improved conversion
    ε = r + log(1 − 1/α) − log(δα)/(α − 1) (Canonne–Kamath–Steinke 2020, Prop. 12; as
    dp_accounting's `compute_epsilon`, which it matches). Differences, all pessimistic or
    equal: orders in (1, 1.01] are used (dp_accounting skips them; our node-level curves
    are exact there); negative r (roundoff) counts as 0, not as ε = 0; and ε = 0 through
    the KL bound (TV ≤ √(1 − e^{−r}) ≤ δ, Bretagnolle–Huber) needs 1e-12 slack in r."""
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp_values, dtype=float)
    if a.shape != r.shape or a.ndim != 1 or a.size == 0 or np.any(a <= 1):
        raise PrivacyError("RDP orders must be a non-empty 1-D list of numbers > 1, one "
                           "value per order")
    if not 0 < delta < 1:
        raise PrivacyError(f"delta must lie strictly between 0 and 1, got {delta}")
    eps = _eps_per_order(a, r, delta)
    i = int(np.argmin(eps))
    return max(0.0, float(eps[i])), float(a[i])


def _eps_per_order(a: np.ndarray, r: np.ndarray, delta: float) -> np.ndarray:
    r = np.where(np.isnan(r), np.inf, np.maximum(r, 0.0))
    with np.errstate(over="ignore", invalid="ignore"):
        eps = r + np.log1p(-1.0 / a) - np.log(delta * a) / (a - 1.0)
        zero = delta ** 2 + np.expm1(-(r + _ZERO_SLACK)) > 0
    eps = np.where(zero, 0.0, eps)
    return np.where(np.isfinite(r), eps, np.inf)


def clear_caches() -> None:
    """Forget every memoized curve, PMF, ε and σ (for benchmarks: cold-start timings)."""
    for f in (_epsilon_cached, _pld_search, _base_pmfs, _loss_std, _pld_supports, _fast_rdp,
              calibrate_dpsgd):
        f.cache_clear()
    _COMPOSED.clear()
    _RDP_VALUES.clear()


def epsilons(event, delta: float) -> dict[str, float | None]:
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


# --- PLD -------------------------------------------------------------------------------

def _pld_epsilon(key: frozenset, delta: float) -> float:
    return _pld_search(key, delta)[0]


@lru_cache(maxsize=8192)
def _pld_search(key: frozenset, delta: float) -> tuple[float, int]:
    """(ε, grid level) by PLD on the adaptive nested grid: start near `_GRID_SHARE` × the
    per-step loss std, halve until halving changes ε by ≤ `_GRID_TOL`; report the
    smallest figure (every grid gives an upper bound) and its level."""
    k = _start_level(key)
    coarse, fine = _pld_eps_at(key, k + 1, delta), _pld_eps_at(key, k, delta)
    best = min((coarse, k + 1), (fine, k))
    for _ in range(_MAX_REFINE):
        if abs(coarse - fine) <= _GRID_TOL * fine or k <= _K_MIN or not math.isfinite(fine):
            break
        k -= 1
        coarse, fine = fine, _pld_eps_at(key, k, delta)
        best = min(best, (fine, k))
    return best


def pld_grid(event, delta: float) -> float:
    """The discretization interval (nats) of the PLD figure `epsilon(event, delta, "pld")`
    reports — to reproduce it with dp_accounting's PLDAccountant at that interval."""
    return PLD_BASE_GRID * 2.0 ** _pld_search(_key(event), float(delta))[1]


def _start_level(key: frozenset) -> int:
    """Grid level k (Δ = 1e-5·2^k) from the steps' privacy-loss std (count-weighted RMS;
    Gaussians are merged into one step, see `_pld_composed`)."""
    var = n = 0.0
    prec = 0.0
    for e, c in key:
        if isinstance(e, dpa.GaussianDpEvent):
            prec += c / e.noise_multiplier ** 2
        elif _is_poisson_gaussian(e) and e.sampling_probability > 0:
            var += c * _loss_std(e.sampling_probability, e.event.noise_multiplier) ** 2
            n += c
        elif isinstance(e, dpa.RandomizedResponseDpEvent) and 0 < e.noise_parameter < 1:
            # RR's PMF has 3 atoms: finer grid; but at large ε/K its std → 0 while its
            # loss ±log(a/b) does not, and the PMF (length ∝ loss/grid) exploded (review:
            # 90 s for one label at ε/K = 30): never finer than 1/2000 of the loss
            var += c * max(_rr_loss_std(e) / 8, _rr_loss(e) / 2000) ** 2
            n += c
    if prec > 0:
        var, n = var + prec, n + 1
    if not n or not var > 0:
        return _K_DEFAULT
    k = math.floor(math.log2(_GRID_SHARE * math.sqrt(var / n) / PLD_BASE_GRID))
    return min(max(k, _K_MIN), _K_MAX)


@lru_cache(maxsize=4096)
def _loss_std(q: float, sigma: float) -> float:
    """Std (nats) of one step's privacy loss for the Poisson-subsampled Gaussian, the
    smaller of the remove/add directions, by quadrature. Only sets the PLD grid."""
    x = np.linspace(-12 * sigma, 1 + 12 * sigma, 4001)
    loss = np.logaddexp(math.log1p(-q) if q < 1 else -np.inf,
                        math.log(q) + (2 * x - 1) / (2 * sigma ** 2))
    w_q = np.exp(-0.5 * (x / sigma) ** 2)
    w_p = (1 - q) * w_q + q * np.exp(-0.5 * ((x - 1) / sigma) ** 2)
    out = []
    for w in (w_p, w_q):
        w = w / w.sum()
        m = float(w @ loss)
        out.append(max(float(w @ (loss - m) ** 2), 0.0))
    return math.sqrt(min(out))


def _pld_eps_at(key: frozenset, k: int, delta: float) -> float:
    if any(isinstance(e, dpa.NonPrivateDpEvent) for e, _ in key):
        return math.inf
    composed = _pld_composed(key, k)
    if composed is None:
        return 0.0
    remove, add = composed
    return max(_eps_for_delta(*remove, delta), _eps_for_delta(*add, delta))


class _LRU(OrderedDict):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def put(self, k, v):
        self[k] = v
        self.move_to_end(k)
        while len(self) > self.size:
            self.popitem(last=False)
        return v


_COMPOSED = _LRU(4)  # composed PMFs can be MBs: keep a few (ε at another δ is then O(n))


def _pld_composed(key: frozenset, k: int):
    """((lower, probs, inf, grid) remove, (…) add) of the composition at grid 1e-5·2^k:
    dp_accounting's dense connect-the-dots PMFs, each self-composed by FFT exponentiation
    (`_self_compose`) and composed with pessimistic tail truncation (its `compose`)."""
    hit = _COMPOSED.get((key, k))
    if hit is not None:
        _COMPOSED.move_to_end((key, k))
        return hit
    grid = PLD_BASE_GRID * 2.0 ** k
    parts, prec = [], 0.0
    for e, c in _sorted(key):
        if isinstance(e, dpa.GaussianDpEvent):
            prec += c / e.noise_multiplier ** 2  # Gaussians compose exactly into one
            continue
        if _is_poisson_gaussian(e) and e.sampling_probability == 0:
            continue
        rem, add = _base_pmfs(e, grid)
        rem_c = _self_compose(rem, c)
        parts.append((rem_c, rem_c if add is rem else _self_compose(add, c)))
    if prec > 0:
        parts.append(_base_pmfs(dpa.GaussianDpEvent(1.0 / math.sqrt(prec)), grid))
    if not parts:  # only zero-rate sampling: nothing is released
        return None
    rem, add = parts[0]
    for r2, a2 in parts[1:]:
        sym = rem is add and r2 is a2
        rem = _compose(rem, r2)
        add = rem if sym else _compose(add, a2)
    return _COMPOSED.put((key, k), (rem, add))


@lru_cache(maxsize=64)  # a base PMF can be ~1 MB
def _base_pmfs(e, grid: float):
    """dp_accounting's pessimistic connect-the-dots PMFs (remove, add) of one base event,
    as (lower, probs, inf, grid); `add is remove` when the PLD is symmetric."""
    if isinstance(e, dpa.GaussianDpEvent):
        d = _pld_lib.from_gaussian_mechanism(e.noise_multiplier,
                                             value_discretization_interval=grid)
    elif _is_poisson_gaussian(e):
        d = _pld_lib.from_gaussian_mechanism(e.event.noise_multiplier,
                                             value_discretization_interval=grid,
                                             sampling_prob=e.sampling_probability)
    elif isinstance(e, dpa.RandomizedResponseDpEvent):
        d = _rr_pld(e, grid)
    else:  # any other event dp_accounting's PLD accountant supports
        acc = pld.PLDAccountant(value_discretization_interval=grid)
        acc.compose(e)
        d = acc._pld
    # dp_accounting 0.6.0 internals (pinned): the two PMFs of the PLD
    rem = _arrays(d._pmf_remove.to_dense_pmf())
    add = rem if d._symmetric else _arrays(d._pmf_add.to_dense_pmf())
    return rem, add


def _arrays(pmf) -> tuple[int, np.ndarray, float, float]:
    probs = np.asarray(pmf._probs, dtype=float)
    probs.flags.writeable = False
    return (int(pmf._lower_loss), probs, float(pmf._infinity_mass),
            float(pmf._discretization))


_CHERNOFF_ORDERS = np.concatenate((np.arange(-20, 0), np.arange(1, 21))).astype(float)


def _self_compose(pmf, count: int):
    """`count`-fold composition of a dense PMF: dp_accounting's `DensePLDPmf.self_compose`
    (FFT power over the index range that Chernoff bounds show holds all but `_TAIL` of the
    mass; that tail counts as infinite loss), with the 40 bounds computed in one array
    operation instead of 40 scipy calls (the bottleneck of short calibrations)."""
    if count == 1:
        return pmf
    lower_loss, p, inf_mass, grid = pmf
    n = p.size
    idx = np.arange(n, dtype=float)
    orders = _CHERNOFF_ORDERS / n
    pos = p > 0
    with np.errstate(divide="ignore"):
        logp = np.log(np.where(pos, p, 1.0))
    terms = orders[:, None] * idx[None, pos] + logp[None, pos]
    log_mgf = _lse(terms, axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        bound = (count * log_mgf + math.log(2 / _TAIL)) / orders
    ok = np.isfinite(bound)
    upper, lower = (n - 1) * count, 0
    if np.any(ok & (orders > 0)):
        upper = min(upper, int(np.ceil(bound[ok & (orders > 0)]).min()))
    if np.any(ok & (orders < 0)):
        lower = max(lower, int(np.floor(bound[ok & (orders < 0)]).max()))
    out_len = upper - lower + 1
    fast_len = scipy_fft.next_fast_len(max(out_len, n))
    out = np.real(scipy_fft.ifft(scipy_fft.fft(p, fast_len) ** count))
    out = np.roll(out, -lower)[:out_len]
    out.flags.writeable = False
    inf = _TAIL - math.expm1(count * math.log1p(-inf_mass))
    return lower_loss * count + lower, out, inf, grid


def _compose(a, b):
    """Composition of two dense PMFs: dp_accounting's `DensePLDPmf.compose` (convolution,
    pessimistic truncation of `_TAIL`)."""
    pa = pld_pmf.DensePLDPmf(a[3], a[0], np.array(a[1]), a[2], True)
    pb = pld_pmf.DensePLDPmf(b[3], b[0], np.array(b[1]), b[2], True)
    return _arrays(pa.compose(pb, _TAIL))


def _lse(x: np.ndarray, axis: int) -> np.ndarray:
    """log Σ exp along `axis` (plain numpy: scipy's logsumexp costs ~0.2 ms a call)."""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.sum(np.exp(x - m), axis=axis)) + np.squeeze(m, axis=axis)


def _eps_for_delta(lower: int, probs: np.ndarray, inf_mass: float, grid: float,
                   delta: float) -> float:
    """Smallest ε with hockey-stick divergence ≤ δ: dp_accounting's
    `_get_epsilon_for_delta` (the same scan from the largest loss down, the same
    sequential sums), vectorized."""
    if inf_mass > delta:
        return math.inf
    n = probs.size
    loss = (lower + np.arange(n - 1, -1, -1, dtype=float)) * grid  # descending
    p = probs[::-1]
    upper = np.cumsum(np.concatenate(([inf_mass], p)))  # mass at losses > loss[i]: upper[i]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        lower_mass = np.cumsum(np.concatenate(([0.0], np.exp(-loss) * p)))
        stop = (upper[:-1] > delta) & (lower_mass[:-1] > 0) & (
            np.log((upper[:-1] - delta) / lower_mass[:-1]) >= loss)
    early = (upper[1:] >= delta) & (lower_mass[1:] == 0)  # exp(−loss) underflowed
    i_stop = int(np.argmax(stop)) if stop.any() else n
    i_early = int(np.argmax(early)) if early.any() else n
    if i_early < i_stop:
        return max(0.0, float(loss[i_early]))
    mu, ml = upper[i_stop], lower_mass[i_stop]
    if mu <= ml + delta:
        return 0.0
    return float(math.log((mu - delta) / ml))


# --- calibration -----------------------------------------------------------------------

def _check_q_sigma(q: float, sigma: float) -> None:
    if not 0 < q <= 1:
        raise PrivacyError(f"sampling rate q = batch/n must be in (0, 1], got {q}; "
                           "use a batch size below the silo's number of training examples")
    if not sigma > 0:
        raise PrivacyError(f"noise multiplier must be positive, got {sigma}")


def _int_grid():
    a_int = np.asarray([a for a in RDP_ORDERS if float(a).is_integer()], dtype=float)
    a = a_int[:, None]
    k = np.arange(int(a_int.max()) + 1, dtype=float)[None, :]
    kc = np.minimum(k, a)  # clamp; the clamped entries are masked out by base = -inf
    base = gammaln(a + 1) - gammaln(kc + 1) - gammaln(a - kc + 1)
    base = np.where(k <= a, base, -np.inf)
    return a, kc, base


_ORDERS = np.asarray(RDP_ORDERS, dtype=float)
_IS_INT = np.array([float(a).is_integer() for a in RDP_ORDERS])
_ORDER_GRID = _int_grid()
_FRAC = _ORDERS[~_IS_INT]
_FRAC_MAX_TERMS = 1024  # dp_accounting gives up after 1000 terms (order excluded)


@lru_cache(maxsize=4096)
def _fast_rdp(q: float, sigma: float) -> np.ndarray:
    """Per-step RDP of the Poisson-subsampled Gaussian at RDP_ORDERS, vectorized (a search
    aid only: every answer is re-checked with dp_accounting's curves before use).
    Integer α: log A_α = logsumexp_k [log C(α,k) + k log q + (α−k) log(1−q) + (k²−k)/(2σ²)];
    fractional α: the two-sided series of Mironov, Talwar & Zhang (2019, §3.3), as
    dp_accounting sums it; orders whose series does not settle count as +∞ (excluded)."""
    if q >= 1:
        out = _ORDERS / (2 * sigma * sigma)
    else:
        out = np.empty(_ORDERS.size)
        out[_IS_INT] = _fast_int_rdp(q, sigma)
        out[~_IS_INT] = _fast_log_a_frac(q, sigma, _FRAC) / (_FRAC - 1)
    out.flags.writeable = False
    return out


def _fast_int_rdp(q: float, sigma: float) -> np.ndarray:
    a, k, base = _ORDER_GRID
    terms = base + k * math.log(q) + (a - k) * math.log1p(-q) + (k * k - k) / (2 * sigma * sigma)
    return _lse(terms, axis=1) / (a[:, 0] - 1)


def _fast_log_a_frac(q: float, sigma: float, alpha: np.ndarray) -> np.ndarray:
    z0 = sigma * sigma * math.log(1 / q - 1) + 0.5
    lq, l1q, s2 = math.log(q), math.log1p(-q), 2 * sigma * sigma
    out = np.full(alpha.size, np.inf)
    todo = np.arange(alpha.size)
    n = 64
    while todo.size:
        A = alpha[todo, None]
        i = np.arange(n, dtype=float)[None, :]
        j = A - i
        coef = gammaln(A + 1) - gammaln(i + 1) - gammaln(j + 1)  # log |C(α, i)|
        s0 = coef + i * lq + j * l1q + (i * i - i) / s2 + log_ndtr((z0 - i) / sigma)
        s1 = coef + j * lq + i * l1q + (j * j - j) / s2 + log_ndtr((j - z0) / sigma)
        total = np.logaddexp(_lse(s0, axis=1), _lse(s1, axis=1))
        # dp_accounting's stopping rule: both series decreasing and 30 nats below the sum
        done = ((s0[:, -1] < s0[:, -2]) & (s1[:, -1] < s1[:, -2])
                & (np.maximum(s0[:, -1], s1[:, -1]) < total - 30))
        out[todo[done]] = total[done]
        todo = todo[~done]
        if n >= _FRAC_MAX_TERMS:
            break  # not settled: +∞, excluded (as dp_accounting does)
        n *= 2
    return out


def _fast_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    """Closed-form RDP ε of `steps` steps: integer orders first, then only the fractional
    orders within 1 of the best integer one (the curve in α is unimodal in practice)."""
    a_int = _ORDERS[_IS_INT]
    r_int = steps * (_fast_int_rdp(q, sigma) if q < 1 else a_int / (2 * sigma * sigma))
    e_int = _eps_per_order(a_int, r_int, delta)
    i = int(np.argmin(e_int))
    best = max(0.0, float(e_int[i]))
    near = _FRAC[np.abs(_FRAC - a_int[i]) < 1]
    if near.size:
        r = steps * (_fast_log_a_frac(q, sigma, near) / (near - 1) if q < 1
                     else near / (2 * sigma * sigma))
        best = min(best, max(0.0, float(np.min(_eps_per_order(near, r, delta)))))
    return best


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


def _fast_rdp_of(event) -> np.ndarray | None:
    """RDP at RDP_ORDERS of a composition of Poisson-subsampled Gaussians, Gaussians and
    zCDP events from the closed forms (a search aid, like `_fast_rdp`); None if any base
    event has no closed form here."""
    return _fast_rdp_of_items(_counts(event).items())


def _fast_rdp_of_items(items) -> np.ndarray | None:
    total = np.zeros(_ORDERS.size)
    for e, c in items:
        if _is_poisson_gaussian(e):
            if e.sampling_probability > 0:
                total += c * _fast_rdp(e.sampling_probability, e.event.noise_multiplier)
        elif isinstance(e, dpa.GaussianDpEvent):
            total += c * _ORDERS / (2 * e.noise_multiplier ** 2)
        elif isinstance(e, dpa.ZCDpEvent):
            total += c * (e.xi + e.rho * _ORDERS)
        else:
            return None
    return total


def _fast_composed_guess(make_event, target: float, delta: float) -> float | None:
    """`_smallest_sigma` on the closed-form RDP of make_event(σ); None without one."""
    if _fast_rdp_of(make_event(1.0)) is None:
        return None
    return _smallest_sigma(
        lambda s: rdp_to_epsilon(RDP_ORDERS, _fast_rdp_of(make_event(s)), delta)[0], target)


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
              rel_tol: float = 1e-3) -> float:
    """The smallest σ with ε(make_event(σ)) ≤ target, for any family of events.

    ε must fall as σ grows. For RDP σ is found to `rel_tol`; for PLD until
    ε ≥ (1 − 0.2%)·target (or σ to `rel_tol`). An event family `kind` cannot account for
    is calibrated under the accountant that reports it (PLD → RDP for zCDP or node-level
    events). Every answer is checked with the accountant's own figure (the one
    reported), whatever the guess was.

    Parameters
    ----------
    make_event : callable float -> dp_accounting.DpEvent
        The mechanism as a function of the noise multiplier σ.
    target_epsilon : float
        ε to reach (> 0).
    delta : float
        δ in (0, 1).
    kind : {"pld", "rdp"}, default "pld"
        The preferred accountant.
    guess : float, optional
        A σ that brackets the search.
    guess_is_minimal : bool, default False
        The guess came from the same accountant's formula: return it at once if it
        meets the target.
    rel_tol : float, default 1e-3
        Relative precision of σ.

    Returns
    -------
    float
        σ (in units of the clipping norm) with ε(make_event(σ)) ≤ target_epsilon.

    Raises
    ------
    PrivacyError
        A non-positive target or a δ outside (0, 1).
    CalibrationError
        No σ ≤ 1e4 reaches the target.
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

    if guess is None:
        guess = _fast_composed_guess(make_event, target_epsilon, delta)
        guess_is_minimal = guess is not None
    if guess is not None:
        # a good guess needs only a couple of library evaluations
        if eps(guess) <= target_epsilon:
            if guess_is_minimal:
                return guess
            lo, hi = guess / 2, guess
            while eps(lo) <= target_epsilon and lo > 1e-2:
                lo, hi = lo / 2, lo
        else:
            lo, hi = guess, guess * (1 + 1e-4)  # the aid is off by a hair at most, usually
            while eps(hi) > target_epsilon:
                lo, hi = hi, hi * 1.05 if hi < guess * 1.01 else hi * 2
                if hi > SIGMA_MAX:
                    break
    else:
        lo, hi = 1e-2, 1.0
        while eps(hi) > target_epsilon and hi <= SIGMA_MAX:
            lo, hi = hi, hi * 4
    _unreachable(eps, hi, target_epsilon, delta)
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if eps(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi


def _unreachable(eps, hi: float, target: float, delta: float) -> None:
    if hi > SIGMA_MAX or eps(hi) > target:
        raise CalibrationError(
            f"no noise multiplier up to {SIGMA_MAX:g} reaches ε = {target} at δ = {delta}; "
            "the target is too strict for this many steps. Raise epsilon or delta, "
            "train for fewer rounds, or use a smaller batch (lower sampling rate)")


def _calibrate_pld(key_of, target: float, delta: float, guess: float | None,
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


def _pld_root(eps, target: float, delta: float, guess: float | None,
              rel_tol: float) -> float:
    start = min(max(guess, _PLD_SIGMA_FLOOR), SIGMA_MAX) if guess else 1.0
    lo, e_lo, hi, e_hi = _bracket(eps, target, start)
    if lo is None:  # met even at the floor: the true σ lies where PLD cannot go
        raise PrivacyError(  # not CalibrationError ("too strict"): this target is too loose
            f"ε = {target:g} at δ = {delta:g} is met with a noise multiplier below "
            f"{_PLD_SIGMA_FLOOR:g}, where the PLD accountant's grid no longer fits in memory "
            "(and such a target protects little); lower epsilon or delta, or set "
            "[privacy] accountant = \"rdp\"")
    if hi is None:
        _unreachable(eps, SIGMA_MAX, target, delta)
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


def _bracket(eps, target: float, s: float):
    """(lo, ε(lo), hi, ε(hi)) with ε(lo) > target ≥ ε(hi), found by stepping along the
    local power law ε ∝ σ^−p (a few evaluations from any start); lo is None when even
    σ = _PLD_SIGMA_FLOOR meets the target, hi is None when σ = SIGMA_MAX does not."""
    e, p = eps(s), 1.0
    while True:
        if e > target and s >= SIGMA_MAX:
            return s, e, None, None
        if e <= target and s <= _PLD_SIGMA_FLOOR:
            return None, None, s, e
        if e > 0 and math.isfinite(e):
            ratio = (e / target) ** (1 / p) * (1.02 if e > target else 0.98)  # overshoot
        else:
            ratio = 10.0 if e > target else 0.1
        s2 = min(max(s * min(max(ratio, 0.1), 10.0), _PLD_SIGMA_FLOOR), SIGMA_MAX)
        e2 = eps(s2)
        if (e2 > target) != (e > target):
            return (s, e, s2, e2) if e > target else (s2, e2, s, e)
        if 0 < e2 < math.inf and 0 < e < math.inf and e2 != e:
            p = min(max(math.log(e / e2) / math.log(s2 / s), 0.2), 5.0)
        s, e = s2, e2

"""RDP accounting: the order grids, RDP → (ε, δ) conversion, dp_accounting's RDP of each
base event (cached per event and order), and closed forms that guide the searches.

RDP is evaluated at dp_accounting's default orders (1.1…10.9 in steps of 0.1, 11…63,
128…1024) plus the integer orders earlier releases used (`RDP_ORDERS`); events that bring
their own curve (node-level DP-SGD) use the denser `RDP_ORDERS_FINE`. dp_accounting's
values are cached per base event and order, so re-checking a composition costs
microseconds. The closed forms (`_fast_rdp`, …) only pick orders and starting points:
every reported figure is dp_accounting's (or the event's own curve's).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from functools import lru_cache

import dp_accounting as dpa
import numpy as np
import numpy.typing as npt
from dp_accounting import rdp
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS
from scipy.special import gammaln, log_ndtr

from silofl.errors import PrivacyError
from silofl.privacy.events import flatten
from silofl.privacy.tnb_select import TnbRepeatAndSelectDpEvent

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
# ε = 0 is reported only when (0, δ)-DP holds with this much slack in the RDP value, so
# floating-point noise in a near-zero curve can never turn into a zero ε
_ZERO_SLACK = 1e-12

def _is_poisson_gaussian(e: dpa.DpEvent) -> bool:
    return isinstance(e, dpa.PoissonSampledDpEvent) and isinstance(e.event, dpa.GaussianDpEvent)


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


def _base_rdp(event: dpa.DpEvent, idx: tuple | None = None) -> np.ndarray:
    """dp_accounting's RDP of one base event at RDP_ORDERS[idx] (all orders when None),
    cached per event and order."""
    if isinstance(event, dpa.RandomizedResponseDpEvent):
        sel = slice(None) if idx is None else np.asarray(idx, dtype=int)
        return rr_rdp(event, _ORDERS[sel])
    vals = _RDP_VALUES.get(event)
    if vals is None and isinstance(event, TnbRepeatAndSelectDpEvent):
        vals = _tnb_rdp(event)
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


def _tnb_rdp(event: TnbRepeatAndSelectDpEvent) -> np.ndarray:
    """RDP of repeat-and-select with TNB η > −1 at every RDP_ORDERS (Theorem 2 needs the
    run's whole curve: its λ̂ ranges over the orders), from the run's base events' RDP."""
    inner = np.zeros(_ORDERS.size)
    for e, c in _sorted(frozenset(flatten(event.event).items())):
        inner = inner + c * _base_rdp(e)
    vals = event.rdp_from(_ORDERS, inner)
    if len(_RDP_VALUES) >= 8192:
        _RDP_VALUES.popitem(last=False)
    _RDP_VALUES[event] = vals
    return vals


# --- k-ary randomized response (PrivateKT's uploads, silofl.privacy.ldp) ------------------
# RR is a *local* mechanism: its guarantee is between any two inputs, and its input (a
# model's prediction) can change arbitrarily when one record of the client's data changes.
# So it is accounted for the worst pair of inputs, which
# bounds the loss under add/remove of one record, or of the whole local dataset, alike
# (dp_accounting's REPLACE_ONE for RR: the two inputs differ; REPLACE_SPECIAL would compare
# with a uniform output and under-count).

def rr_rdp(event: dpa.DpEvent, orders: npt.ArrayLike) -> np.ndarray:
    """Exact Rényi divergence of k-ary randomized response between its two most distant
    inputs: with a = 1 − p + p/k, b = p/k,
    D_α = log(a^α b^{1−α} + b^α a^{1−α} + (k − 2)·b) / (α − 1).

    Parameters
    ----------
    event : dp_accounting.RandomizedResponseDpEvent
        Keep the input w.p. 1 − p (``noise_parameter`` p), else uniform over k buckets.
    orders : sequence of float, shape (A,)
        Rényi orders, each > 1.

    Returns
    -------
    numpy.ndarray, shape (A,)
        RDP (nats) at `orders`.
    """
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



class _quiet_absl:
    """dp_accounting logs a warning for every order whose series it gives up on (the
    order is then excluded, which is safe); keep those out of users' consoles."""

    def __enter__(self) -> None:
        import logging
        self.log = logging.getLogger("absl")
        self.level = self.log.level
        self.log.setLevel(max(self.level, logging.ERROR))

    def __exit__(self, *exc: object) -> None:
        self.log.setLevel(self.level)


def rdp_to_epsilon(orders: npt.ArrayLike, rdp_values: npt.ArrayLike, delta: float) -> tuple[float,
                   float]:
    """(ε, optimal order) from an RDP curve.

    Min over α of the improved conversion ε = r + log(1 − 1/α) − log(δα)/(α − 1)
    (Canonne–Kamath–Steinke 2020, Prop. 12; as dp_accounting's `compute_epsilon`, which
    it matches). Differences, all pessimistic or equal: orders in (1, 1.01] are used
    (dp_accounting skips them; node-level curves are exact there); negative r (roundoff)
    counts as 0, not as ε = 0; and ε = 0 through the KL bound (TV ≤ √(1 − e^{−r}) ≤ δ,
    Bretagnolle–Huber) needs 1e-12 slack in r.

    Parameters
    ----------
    orders : sequence of float, shape (A,)
        Rényi orders, each > 1.
    rdp_values : sequence of float, shape (A,)
        RDP (nats) at `orders`.
    delta : float
        δ in (0, 1).

    Returns
    -------
    (float, float)
        ε ≥ 0 and the order that attains it.
    """
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


def _lse(x: np.ndarray, axis: int) -> np.ndarray:
    """log Σ exp along `axis` (plain numpy: scipy's logsumexp costs ~0.2 ms a call)."""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.sum(np.exp(x - m), axis=axis)) + np.squeeze(m, axis=axis)



def _int_grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def _fast_rdp_of_items(items: Iterable[tuple[dpa.DpEvent, int]]) -> np.ndarray | None:
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



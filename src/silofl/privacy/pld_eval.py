"""PLD accounting: dp_accounting's pessimistic connect-the-dots PMFs of each base event,
composed by FFT exponentiation on an adaptive nested grid.

The discretization interval is chosen per composition (`pld_grid`), so the figure stays
within ~0.1% of a 1e-5-grid computation however long the run (≤ 1% is tested), at a
fraction of its cost. Every figure is an upper bound on ε: any grid is pessimistic. The
PMF arrays come from dp_accounting through `silofl.privacy._dpa_adapter` (the one module
that reads its internals).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from functools import lru_cache
from typing import Any

import dp_accounting as dpa
import numpy as np
import scipy.fft as scipy_fft
from dp_accounting import pld
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from silofl.privacy import _dpa_adapter as adapter
from silofl.privacy._dpa_adapter import DensePmf
from silofl.privacy.rdp_curves import _is_poisson_gaussian, _lse, _sorted

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

PLD_DISCRETIZATION = PLD_BASE_GRID  # the reference grid (kept for callers of 0.x)


def _rr_loss(event: dpa.DpEvent) -> float:
    """RR's largest privacy loss log(a/b) (nats), a = 1 − p + p/k, b = p/k."""
    p, k = float(event.noise_parameter), int(event.num_buckets)
    return math.log1p(-p + p / k) - math.log(p / k)


def _rr_loss_std(event: dpa.DpEvent) -> float:
    """Std (nats) of RR's privacy loss (±log(a/b) w.p. a, b; 0 otherwise): sets the grid."""
    p, k = float(event.noise_parameter), int(event.num_buckets)
    a, b = 1 - p + p / k, p / k
    lr = math.log(a / b)
    return math.sqrt(max(lr * lr * (a + b) - (lr * (a - b)) ** 2, 0.0))


def _rr_pld(event: dpa.DpEvent, grid: float) -> Any:
    return pld_lib.from_randomized_response(
        event.noise_parameter, event.num_buckets, value_discretization_interval=grid,
        neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)


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
    (lo_r, p_r, inf_r, g_r), (lo_a, p_a, inf_a, g_a) = composed
    return max(_eps_for_delta(lo_r, p_r, inf_r, g_r, delta),
               _eps_for_delta(lo_a, p_a, inf_a, g_a, delta))


class _LRU(OrderedDict):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def put(self, k: Hashable, v: Any) -> Any:
        self[k] = v
        self.move_to_end(k)
        while len(self) > self.size:
            self.popitem(last=False)
        return v


_COMPOSED = _LRU(4)  # composed PMFs can be MBs: keep a few (ε at another δ is then O(n))


def _pld_composed(key: frozenset, k: int) -> tuple[DensePmf, DensePmf] | None:
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
def _base_pmfs(e: dpa.DpEvent, grid: float) -> tuple[DensePmf, DensePmf]:
    """dp_accounting's pessimistic connect-the-dots PMFs (remove, add) of one base event,
    as (lower, probs, inf, grid); `add is remove` when the PLD is symmetric."""
    if isinstance(e, dpa.GaussianDpEvent):
        d = pld_lib.from_gaussian_mechanism(e.noise_multiplier,
                                             value_discretization_interval=grid)
    elif _is_poisson_gaussian(e):
        d = pld_lib.from_gaussian_mechanism(e.event.noise_multiplier,
                                             value_discretization_interval=grid,
                                             sampling_prob=e.sampling_probability)
    elif isinstance(e, dpa.RandomizedResponseDpEvent):
        d = _rr_pld(e, grid)
    else:  # any other event dp_accounting's PLD accountant supports
        acc = pld.PLDAccountant(value_discretization_interval=grid)
        acc.compose(e)
        d = adapter.pld_of(acc)
    return adapter.dense_pmfs(d)


_CHERNOFF_ORDERS = np.concatenate((np.arange(-20, 0), np.arange(1, 21))).astype(float)


def _self_compose(pmf: DensePmf, count: int) -> DensePmf:
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


def _compose(a: DensePmf, b: DensePmf) -> DensePmf:
    """Composition of two dense PMFs: dp_accounting's `DensePLDPmf.compose` (convolution,
    pessimistic truncation of `_TAIL`)."""
    return adapter.compose_dense(a, b, _TAIL)


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



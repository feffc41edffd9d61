"""Node-level (person-level) DP accounting for neighbourhood examples (thesis §2.4).

Setting.  A region's pruned contact graph has ``n`` persons and therefore ``n`` examples
(one neighbourhood vector per person, `silofl.pandemic.features`).  Pruning guarantees
every person appears in at most ``S`` examples — its own plus at most ``S − 1`` other
people's neighbourhoods (`graph.NeighbourIndex.appearance_bound`; ``S = 1 + max_degree``
for ℓ = 1).  DP-SGD runs ``T`` steps; each step draws a batch of exactly ``b`` examples
uniformly *without replacement* (independently across steps), clips every per-example
gradient to L2 norm ``C``, sums, and adds N(0, σ²C²) noise.

Theorem 2.4.4 (Daigavane et al. 2021, as adapted in the seed).  Training is
``(α, T·γ(α))``-node-level RDP with

    γ(α) = 1/(α − 1) · ln E_ρ[ exp(α(α − 1) · 2ρ² / σ²) ],   ρ ~ Hypergeometric(n, S, b),

where ρ is the number of examples in a batch that contain a given person (population
``n`` examples, ``S`` of them contain the person, ``b`` drawn).

Why ``2ρ²/σ²``.  We use *replacement* adjacency: the graph size ``n`` enters the
accounting, so neighbouring graphs have the same number of persons and one person is
replaced (with all of its edges).  That changes the person's own example and the
neighbourhood vectors of up to ``S − 1`` others; each of the ρ affected examples in a
batch can move anywhere in the clipping ball, i.e. by up to ``2C`` in L2, so the summed
gradient has sensitivity ``Δ = 2ρC``.  The Gaussian mechanism's RDP is
``α Δ² / (2σ²C²) = 2αρ²/σ²``, which is the exponent above (times α − 1).  The challenge's
published code used ``ρ²/(2σ²)`` — sensitivity ρC, the add/remove figure for one
example — which is four times smaller in the exponent and *not* safe for this
replacement-adjacency, node-level argument (it amounts to reporting the ε of half the
noise that was actually needed).

Conversion to (ε, δ) uses dp_accounting's public
`dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon` (the improved conversion of
Canonne-Kamath-Steinke / Asoodeh et al.), minimized over `DEFAULT_ORDERS`; δ defaults to
``1/n`` as in the seed (a weak δ: consider ``δ ≪ 1/n`` for reporting).

Steps per epoch.  Batches are drawn independently, so an "epoch" is a number of steps,
not a pass over a permutation: `node_steps` uses ``epochs · ceil(n / b)`` (rounded up for
fractional epochs), i.e. at least ``n`` examples drawn per epoch.

Caveats shared with the seed: the pruning and normalization constants are data-dependent
and not charged here (see `graph` and `features`), and graph features such as degree or
PageRank invalidate the ``S`` bound (`features.NeighbourhoodFeatures.node_dp_S`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
from scipy import stats
from scipy.special import logsumexp

from silofl.errors import CalibrationError, PrivacyError

DEFAULT_ORDERS: tuple[float, ...] = (
    1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 7.0, 8.0,
    9.0, 10.0, 11.0, 12.0, 14.0, 16.0, 18.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0,
    64.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 224.0, 256.0)

EVENT_NAME = "node_level_dp"


# --- validation -----------------------------------------------------------------------

def _int(name: str, value, lo: int, hint: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PrivacyError(f"{name} must be an integer, got {value!r}{hint}")
    if value < lo:
        raise PrivacyError(f"{name} must be at least {lo}, got {value}{hint}")
    return int(value)


def _check(n, S, b, sigma) -> tuple[int, int, int, float]:
    n = _int("n (persons in the region)", n, 1)
    S = _int("S (max examples a person appears in)", S, 1,
             "; S = 1 + max neighbours per person (ℓ = 1)")
    b = _int("batch size b", b, 1)
    if S > n:
        raise PrivacyError(f"S = {S} cannot exceed the number of persons n = {n}")
    if b > n:
        raise PrivacyError(f"batch size b = {b} is larger than the region (n = {n}); "
                           "batches are drawn without replacement, use b ≤ n")
    try:
        sigma = float(sigma)
    except (TypeError, ValueError):
        raise PrivacyError(f"noise multiplier sigma must be a number, got {sigma!r}") from None
    if not (math.isfinite(sigma) and sigma > 0):
        raise PrivacyError(f"noise multiplier sigma must be a positive finite number, "
                           f"got {sigma}")
    return n, S, b, sigma


def _delta(delta, n: int) -> float:
    if delta is None:
        return 1.0 / n
    delta = float(delta)
    if not 0 < delta < 1:
        raise PrivacyError(f"delta must lie strictly between 0 and 1, got {delta}")
    return delta


def _orders(orders) -> np.ndarray:
    a = np.asarray(orders, dtype=np.float64)
    if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 1):
        raise PrivacyError("RDP orders must be a non-empty 1-D list of finite numbers > 1")
    return a


# --- accounting -----------------------------------------------------------------------

def hypergeom_log_pmf(n: int, S: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Support ρ and log P(ρ) of Hypergeometric(population n, S successes, b draws)."""
    rho = np.arange(max(0, b - (n - S)), min(S, b) + 1)
    logp = stats.hypergeom.logpmf(rho, n, S, b)
    return rho, logp - logsumexp(logp)  # renormalize away rounding


def node_rdp(orders, n: int, S: int, b: int, sigma: float) -> np.ndarray:
    """Per-step RDP γ(α) of Theorem 2.4.4 at every order α (array, shape of orders)."""
    n, S, b, sigma = _check(n, S, b, sigma)
    a = _orders(orders)
    rho, logp = hypergeom_log_pmf(n, S, b)
    expo = (a * (a - 1.0))[:, None] * (2.0 * rho.astype(np.float64) ** 2 / sigma ** 2)[None, :]
    return np.maximum(logsumexp(logp[None, :] + expo, axis=1) / (a - 1.0), 0.0)


def node_epsilon_and_order(n: int, S: int, b: int, sigma: float, steps: int,
                           delta: float | None = None,
                           orders: Sequence[float] = DEFAULT_ORDERS) -> tuple[float, float]:
    """(ε, optimal α) after ``steps`` steps; δ defaults to 1/n."""
    n, S, b, sigma = _check(n, S, b, sigma)
    steps = _int("steps", steps, 0)
    delta = _delta(delta, n)
    if steps == 0:
        return 0.0, float("nan")
    a = _orders(orders)
    rdp = steps * node_rdp(a, n, S, b, sigma)
    eps, order = compute_epsilon(list(a), list(rdp), delta)
    return float(eps), float(order)


def node_epsilon(n: int, S: int, b: int, sigma: float, steps: int,
                 delta: float | None = None,
                 orders: Sequence[float] = DEFAULT_ORDERS) -> float:
    """Node-level ε of ``steps`` DP-SGD steps (Theorem 2.4.4); δ defaults to 1/n."""
    return node_epsilon_and_order(n, S, b, sigma, steps, delta, orders)[0]


def node_steps(n: int, b: int, epochs: float) -> int:
    """Steps for ``epochs`` epochs of independently drawn size-``b`` batches:
    ``ceil(epochs · ceil(n / b))`` (so every epoch draws at least n examples)."""
    n = _int("n", n, 1)
    b = _int("batch size b", b, 1)
    if b > n:
        raise PrivacyError(f"batch size b = {b} is larger than the region (n = {n})")
    epochs = float(epochs)
    if not (math.isfinite(epochs) and epochs > 0):
        raise PrivacyError(f"epochs must be a positive number, got {epochs}")
    return int(math.ceil(epochs * math.ceil(n / b) - 1e-9))


def calibrate_node_sigma(target_epsilon: float, n: int, S: int, b: int, steps: int,
                         delta: float | None = None, *, rel_tol: float = 1e-4,
                         sigma_max: float = 1e4,
                         orders: Sequence[float] = DEFAULT_ORDERS) -> float:
    """Smallest noise multiplier σ (to ``rel_tol``) whose node-level ε is ≤ target.

    The returned σ always satisfies the target (bisection keeps the feasible end).
    Raises CalibrationError when even ``sigma_max`` does not reach it."""
    try:
        target = float(target_epsilon)
    except (TypeError, ValueError):
        raise PrivacyError(f"target epsilon must be a number, got {target_epsilon!r}") from None
    if not (math.isfinite(target) and target > 0):
        raise PrivacyError(f"target epsilon must be a positive finite number, got {target}")
    n, S, b, _ = _check(n, S, b, 1.0)
    steps = _int("steps", steps, 1, "; calibration needs at least one training step")
    delta = _delta(delta, n)

    def eps(sigma: float) -> float:
        return node_epsilon(n, S, b, sigma, steps, delta, orders)

    hi = 1.0
    while eps(hi) > target:
        if hi >= sigma_max:
            raise CalibrationError(
                f"no noise multiplier up to {sigma_max:g} reaches node-level ε = {target} "
                f"at δ = {delta:.3g} (n = {n}, S = {S}, b = {b}, {steps} steps; ε at "
                f"σ = {sigma_max:g} is {eps(sigma_max):.4g}); raise epsilon, train for "
                "fewer steps, use a smaller batch, or prune to a smaller S")
        hi = min(hi * 2.0, sigma_max)
    lo = hi / 2.0
    while eps(lo) <= target:
        hi, lo = lo, lo / 2.0
        if lo < 1e-6:
            return hi
    while hi / lo > 1.0 + rel_tol:
        mid = math.sqrt(lo * hi)
        if eps(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


# --- the charge as data ---------------------------------------------------------------

@dataclass(frozen=True)
class NodeLevelDpEvent:
    """One node-level DP-SGD charge: ``steps`` steps on a region of ``n`` persons, each
    appearing in ≤ ``S`` examples, batches of ``b`` drawn without replacement, noise
    multiplier ``sigma``.  dp_accounting has no such event type; this one is plain data
    (`to_dict`/`from_dict` for JSON ledgers) and knows its own ε."""

    n: int
    S: int
    b: int
    sigma: float
    steps: int

    def __post_init__(self):
        n, S, b, sigma = _check(self.n, self.S, self.b, self.sigma)
        steps = _int("steps", self.steps, 0)
        for k, v in (("n", n), ("S", S), ("b", b), ("sigma", sigma), ("steps", steps)):
            object.__setattr__(self, k, v)

    @property
    def default_delta(self) -> float:
        return 1.0 / self.n

    def rdp(self, orders: Sequence[float] = DEFAULT_ORDERS) -> np.ndarray:
        """Composed RDP ``steps · γ(α)`` at ``orders``."""
        return self.steps * node_rdp(orders, self.n, self.S, self.b, self.sigma)

    def epsilon(self, delta: float | None = None,
                orders: Sequence[float] = DEFAULT_ORDERS) -> float:
        return node_epsilon(self.n, self.S, self.b, self.sigma, self.steps, delta, orders)

    def to_dict(self) -> dict:
        return {"event": EVENT_NAME,
                "mechanism": "hypergeometric-sampled Gaussian, replacement adjacency, "
                             "sensitivity 2*rho*C (Theorem 2.4.4)",
                **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "NodeLevelDpEvent":
        if d.get("event") != EVENT_NAME:
            raise PrivacyError(f"not a {EVENT_NAME} event: {d.get('event')!r}")
        return cls(n=d["n"], S=d["S"], b=d["b"], sigma=d["sigma"], steps=d["steps"])

    def __str__(self) -> str:
        return (f"node-level DP-SGD: n={self.n}, S={self.S}, b={self.b}, "
                f"sigma={self.sigma:g}, steps={self.steps}")

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
replaced.  Each of the ρ affected examples in a batch can move anywhere in the clipping
ball, i.e. by up to ``2C`` in L2, so the summed gradient has sensitivity ``Δ = 2ρC``.
The Gaussian mechanism's RDP is ``α Δ² / (2σ²C²) = 2αρ²/σ²``, which is the exponent above
(times α − 1).  The challenge's published code used ``ρ²/(2σ²)`` — sensitivity ρC, the
add/remove figure for one example — which is four times smaller in the exponent and *not*
safe for this replacement-adjacency, node-level argument (it amounts to reporting the ε
of half the noise that was actually needed).

Which examples a replacement affects (``ADJACENCIES``; the hypergeometric's "successes"
``K`` above are these, not always ``S``):

* ``"node"`` — the contact graph is fixed and public; replacing a person changes their
  own attributes and states.  Affected: their own example and the ≤ ``S − 1`` examples
  they appear in as a neighbour: ``K = S``.  (Theorem 2.4.4 as stated.)
* ``"node+edges"`` — replacing a person may also change *who they met* (the contact
  graph is private, the challenge's threat model).  Affected: their own example, their
  old neighbours' (≤ ``S − 1``) and their new neighbours' (≤ ``S − 1``):
  ``K = 2S − 1`` (at most ``n``).

Both rest on one assumption that is *not* charged: the degree-bounding pruning
(`graph.prune_pairs`) is data-dependent, and a replaced person's edges can change which
edges of *other* people are kept (freed or used capacity), hence those people's examples
too.  The bound above counts only the examples that contain the replaced person.

Conversion to (ε, δ) uses `silofl.privacy.accounting.rdp_to_epsilon`: the improved
conversion of Canonne-Kamath-Steinke / Asoodeh et al. that dp_accounting's
`compute_epsilon` implements, minimized over `DEFAULT_ORDERS`, but also at orders in
(1, 1.01], which dp_accounting skips.  Small σ puts the optimal order close to 1 (σ = 1:
α ≈ 1.05–1.2), so the grid is dense there; a grid starting at 1.25 reported ε ≈ 1.6·10⁶
where these orders give ≈ 140 (n = 250 000, S = 20, b = 64, 5000 steps, δ = 1e-5).
δ defaults to ``1/n`` as in the seed (a weak δ: consider ``δ ≪ 1/n`` for reporting).

Steps per epoch.  Batches are drawn independently, so an "epoch" is a number of steps,
not a pass over a permutation: `node_steps` uses ``epochs · ceil(n / b)`` (rounded up for
fractional epochs), i.e. at least ``n`` examples drawn per epoch.

The same event also charges private preprocessing statistics (`pipeline`): a Gaussian
sum over a batch of ``b`` examples of per-example vectors whose replacement changes by at
most ``2C`` is one "step" of this mechanism.

Caveats: the pruning is data-dependent and not charged (above), and graph features such
as degree or PageRank invalidate the ``S`` bound
(`features.NeighbourhoodFeatures.node_dp_S`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import dp_accounting as dpa
import numpy as np
import numpy.typing as npt
from scipy import stats
from scipy.special import logsumexp

from silofl.errors import CalibrationError, PrivacyError
from silofl.privacy.calibration import calibrate
from silofl.privacy.curves import FixedRdpCurveEvent, RdpCurveDpEvent
from silofl.privacy.rdp_curves import RDP_ORDERS_FINE, rdp_to_epsilon
from silofl.privacy.targets import check_epsilon

# The ledger's grid for node-level events (`accounting.RDP_ORDERS_FINE`): calibration and
# the ledger check must agree. 1.001 … 1.24, then dp_accounting's default orders and the
# earlier grid 1.25 … 256 (a superset of it: never a larger ε than before).
DEFAULT_ORDERS: tuple[float, ...] = RDP_ORDERS_FINE

EVENT_NAME = "node_level_dp"

#: "node+edges": a replaced person's contacts may change too (2S − 1 examples affected);
#: "node": the graph is public and fixed (S examples affected)
ADJACENCIES: tuple[str, ...] = ("node+edges", "node")
ADJACENCY_TEXT = {
    "node+edges": ("node-level, replacement of one person together with their contacts "
                   "(the contact graph is private): up to 2S - 1 examples change (the "
                   "person's own, their old and their new neighbours'), each by <= 2C"),
    "node": ("node-level, replacement of one person's attributes and states on a fixed, "
             "public contact graph: up to S examples change (the person's own and their "
             "<= S - 1 neighbours'), each by <= 2C"),
}
#: what every node-level guarantee here assumes and does not charge
PRUNING_ASSUMPTION = (
    "uncharged assumption: the degree-bounding pruning is data-dependent; the bound counts "
    "only the examples that contain the replaced person, not other people's examples whose "
    "kept edges change because the replacement freed or used pruning capacity")


# --- validation -----------------------------------------------------------------------

def _int(name: str, value: Any, lo: int, hint: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PrivacyError(f"{name} must be an integer, got {value!r}{hint}")
    if value < lo:
        raise PrivacyError(f"{name} must be at least {lo}, got {value}{hint}")
    return int(value)


def check_adjacency(adjacency: object) -> str:
    if adjacency not in ADJACENCIES:
        raise PrivacyError(f"adjacency must be one of {', '.join(map(repr, ADJACENCIES))}, "
                           f"got {adjacency!r}")
    return adjacency


def affected_examples(n: int, S: int, adjacency: str = "node") -> int:
    """How many of the ``n`` examples one replaced person can change.

    Parameters
    ----------
    n, S : int
        Persons and the appearance bound.
    adjacency : {"node", "node+edges"}

    Returns
    -------
    int
        ``S`` under "node", ``2S − 1`` under "node+edges", never more than ``n``.
    """
    check_adjacency(adjacency)
    return min(S if adjacency == "node" else 2 * S - 1, n)


def _check(n: Any, S: Any, b: Any, sigma: Any) -> tuple[int, int, int, float]:
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


def _delta(delta: Any, n: int) -> float:
    if delta is None:
        return 1.0 / n
    delta = float(delta)
    if not 0 < delta < 1:
        raise PrivacyError(f"delta must lie strictly between 0 and 1, got {delta}")
    return delta


def _orders(orders: npt.ArrayLike) -> np.ndarray:
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


def node_rdp(orders: npt.ArrayLike, n: int, S: int, b: int, sigma: float) -> np.ndarray:
    """Per-step RDP γ(α) of Theorem 2.4.4 at every order α.

    Parameters
    ----------
    orders : sequence of float, shape (A,)
        Rényi orders, each > 1.
    n : int
        Examples (persons) in the region.
    S : int
        Examples one replacement affects (`affected_examples`: S or 2S − 1), each moving
        by ≤ 2C; the hypergeometric's successes.
    b : int
        Batch size (drawn without replacement).
    sigma : float
        Noise multiplier.

    Returns
    -------
    numpy.ndarray, shape (A,)
        RDP (nats) of one step, ρ ~ Hypergeometric(n, S, b).
    """
    n, S, b, sigma = _check(n, S, b, sigma)
    a = _orders(orders)
    rho, logp = hypergeom_log_pmf(n, S, b)
    expo = (a * (a - 1.0))[:, None] * (2.0 * rho.astype(np.float64) ** 2 / sigma ** 2)[None, :]
    return np.maximum(logsumexp(logp[None, :] + expo, axis=1) / (a - 1.0), 0.0)


def node_epsilon_and_order(n: int, S: int, b: int, sigma: float, steps: int,
                           delta: float | None = None,
                           orders: Sequence[float] = DEFAULT_ORDERS, *,
                           adjacency: str = "node",
                           base_rdp: np.ndarray | None = None) -> tuple[float, float]:
    """(ε, optimal α) of ``steps`` node-level DP-SGD steps.

    Parameters
    ----------
    n, S, b : int
        Persons, appearance bound (`adjacency` turns it into the affected examples),
        batch size.
    sigma : float
        Noise multiplier.
    steps : int
        DP-SGD steps (≥ 0).
    delta : float, optional
        δ; defaults to 1/n.
    orders : sequence of float
        Rényi orders (default `DEFAULT_ORDERS`, the ledger's grid).
    adjacency : {"node", "node+edges"}
    base_rdp : numpy.ndarray, shape (len(orders),), optional
        RDP at `orders` of what the silo spends besides, composed in.

    Returns
    -------
    (float, float)
        ε and the order that attains it (nan when nothing is spent).
    """
    n, S, b, sigma = _check(n, S, b, sigma)
    steps = _int("steps", steps, 0)
    delta = _delta(delta, n)
    a = _orders(orders)
    base = np.zeros(a.size) if base_rdp is None else np.asarray(base_rdp, dtype=np.float64)
    if steps == 0 and base_rdp is None:
        return 0.0, float("nan")
    rdp = base + steps * node_rdp(a, n, affected_examples(n, S, adjacency), b, sigma)
    return rdp_to_epsilon(a, rdp, delta)


def node_epsilon(n: int, S: int, b: int, sigma: float, steps: int,
                 delta: float | None = None,
                 orders: Sequence[float] = DEFAULT_ORDERS, *,
                 adjacency: str = "node", base_rdp: np.ndarray | None = None) -> float:
    """Node-level ε of ``steps`` DP-SGD steps (Theorem 2.4.4); δ defaults to 1/n.

    Parameters and defaults as in `node_epsilon_and_order`.

    Returns
    -------
    float
        ε ≥ 0.
    """
    return node_epsilon_and_order(n, S, b, sigma, steps, delta, orders,
                                  adjacency=adjacency, base_rdp=base_rdp)[0]


def node_steps(n: int, b: int, epochs: float) -> int:
    """Steps for ``epochs`` epochs of independently drawn size-``b`` batches.

    Parameters
    ----------
    n, b : int
        Persons and batch size (b ≤ n).
    epochs : float
        Epochs (> 0).

    Returns
    -------
    int
        ``ceil(epochs · ceil(n / b))``: every epoch draws at least n examples.
    """
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
                         sigma_max: float = 1e4, adjacency: str = "node",
                         base_rdp: np.ndarray | None = None) -> float:
    """Smallest node-level noise multiplier σ meeting a target ε: the one calibrator
    (`calibration.calibrate`) with the node-level event factory.

    Parameters
    ----------
    target_epsilon : float
        Target ε, in (0, 100].
    n, S, b, steps : int
        Persons in the region, appearance bound, batch size, DP-SGD steps (≥ 1).
    delta : float, optional
        δ; defaults to 1/n.
    rel_tol : float
        Relative tolerance in σ (the returned σ always meets the target).
    sigma_max : float
        Largest σ tried.
    adjacency : {"node", "node+edges"}
        Which examples a replaced person changes (`ADJACENCIES`).
    base_rdp : numpy.ndarray, shape (len(DEFAULT_ORDERS),), optional
        RDP at `DEFAULT_ORDERS` of what else the silo spends (e.g. private
        preprocessing), composed in.

    Returns
    -------
    float
        σ (noise std = σ·C).

    Raises
    ------
    CalibrationError
        When even `sigma_max` does not reach the target, or `base_rdp` alone exceeds it.
    """
    try:
        target = float(target_epsilon)
    except (TypeError, ValueError):
        raise PrivacyError(f"target epsilon must be a number, got {target_epsilon!r}") from None
    if not (math.isfinite(target) and target > 0):
        raise PrivacyError(f"target epsilon must be a positive finite number, got {target}")
    check_epsilon(target, "target ")  # ≤ 100, as every calibration (privacy.targets)
    n, S, b, _ = _check(n, S, b, 1.0)
    steps = _int("steps", steps, 1, "; calibration needs at least one training step")
    delta = _delta(delta, n)
    check_adjacency(adjacency)
    if base_rdp is not None and node_epsilon(n, S, b, 1.0, 0, delta,
                                             base_rdp=base_rdp) > target:
        raise CalibrationError(
            f"the silo's other charges (e.g. private preprocessing) alone exceed "
            f"node-level ε = {target} at δ = {delta:.3g}; give them a smaller share")
    base = None if base_rdp is None else FixedRdpCurveEvent(DEFAULT_ORDERS, tuple(base_rdp))

    def make_event(sigma: float) -> dpa.DpEvent:
        ev = NodeLevelDpEvent(n, S, b, sigma, steps, adjacency)
        return ev if base is None else dpa.ComposedDpEvent((ev, base))

    try:
        return calibrate(make_event, target, delta, "rdp", rel_tol=rel_tol,
                         sigma_max=sigma_max)
    except CalibrationError:
        eps_max = node_epsilon(n, S, b, sigma_max, steps, delta, adjacency=adjacency,
                               base_rdp=base_rdp)
        raise CalibrationError(
            f"no noise multiplier up to {sigma_max:g} reaches node-level ε = {target} "
            f"at δ = {delta:.3g} (n = {n}, S = {S}, b = {b}, {steps} steps; ε at "
            f"σ = {sigma_max:g} is {eps_max:.4g}, adjacency {adjacency}); raise "
            "epsilon, train for fewer steps, use a smaller batch, or prune to a smaller S"
        ) from None


# --- the charge as data ---------------------------------------------------------------

@dataclass(frozen=True)
class NodeLevelDpEvent(RdpCurveDpEvent):
    """One node-level DP-SGD charge: ``steps`` steps on a region of ``n`` persons, each
    appearing in ≤ ``S`` examples, batches of ``b`` drawn without replacement, noise
    multiplier ``sigma``, under ``adjacency`` (`ADJACENCIES`: the hypergeometric's
    successes are `affected` = S or 2S − 1).  dp_accounting has no such event type: this
    `DpEvent` brings its own RDP curve (`curves.RdpCurveDpEvent`, composed by
    `curves.CurveRdpAccountant`), is plain data (`to_dict`/`from_dict` for JSON ledgers)
    and knows its own ε."""

    n: int
    S: int
    b: int
    sigma: float
    steps: int
    adjacency: str = "node"

    def __post_init__(self) -> None:
        n, S, b, sigma = _check(self.n, self.S, self.b, self.sigma)
        steps = _int("steps", self.steps, 0)
        check_adjacency(self.adjacency)
        for k, v in (("n", n), ("S", S), ("b", b), ("sigma", sigma), ("steps", steps)):
            object.__setattr__(self, k, v)

    @property
    def affected(self) -> int:
        """Examples one replaced person can change (the hypergeometric's successes)."""
        return affected_examples(self.n, self.S, self.adjacency)

    @property
    def default_delta(self) -> float:
        return 1.0 / self.n

    def rdp(self, orders: npt.ArrayLike = DEFAULT_ORDERS) -> np.ndarray:
        """Composed RDP ``steps · γ(α)`` at ``orders``."""
        return self.steps * node_rdp(orders, self.n, self.affected, self.b, self.sigma)

    def epsilon(self, delta: float | None = None,
                orders: Sequence[float] = DEFAULT_ORDERS) -> float:
        return node_epsilon(self.n, self.S, self.b, self.sigma, self.steps, delta, orders,
                            adjacency=self.adjacency)

    def to_dict(self) -> dict:
        return {"event": EVENT_NAME,
                "mechanism": "hypergeometric-sampled Gaussian, replacement adjacency, "
                             "sensitivity 2*rho*C (Theorem 2.4.4), rho ~ "
                             "Hypergeometric(n, affected, b)",
                **asdict(self), "affected": self.affected}

    @classmethod
    def from_dict(cls, d: dict) -> NodeLevelDpEvent:
        """Dicts written before the adjacency field existed load as "node" (S affected
        examples), which is what they were charged as."""
        if d.get("event") != EVENT_NAME:
            raise PrivacyError(f"not a {EVENT_NAME} event: {d.get('event')!r}")
        ev = cls(n=d["n"], S=d["S"], b=d["b"], sigma=d["sigma"], steps=d["steps"],
                 adjacency=d.get("adjacency", "node"))
        if "affected" in d and d["affected"] != ev.affected:
            raise PrivacyError(f"inconsistent {EVENT_NAME} event: affected = "
                               f"{d['affected']} but S = {ev.S} under {ev.adjacency!r} "
                               f"gives {ev.affected}")
        return ev

    def __str__(self) -> str:
        return (f"node-level DP-SGD: n={self.n}, S={self.S}, b={self.b}, "
                f"sigma={self.sigma:g}, steps={self.steps}, adjacency={self.adjacency} "
                f"({self.affected} examples affected)")

"""Byzantine-robust aggregation of silo updates, and an attack harness to test it.

Updates are flat parameter vectors: a round's updates are a (K, P) array (or K arrays of
shape (P,) when they arrive one by one), the aggregate is (P,). Every rule first screens
the updates: a row that is not finite or not of shape (P,) is dropped from the aggregate
and counted (`Aggregator.rejected`), whatever the rule, the plain mean included.

Rules (f = assumed attackers, K = updates):
    mean               weighted mean (size weights); tolerates no attacker
    median             coordinate-wise median; needs 2f < K
    trimmed_mean       per coordinate, drop the ⌊βK⌋ largest and smallest, average the rest;
                       needs f ≤ ⌊βK⌋ (β = trim_fraction < 1/2)
    krum / multi_krum  the update(s) with the smallest sum of squared distances to their
                       K − f − 2 nearest neighbours (Blanchard et al. 2017); multi-Krum
                       averages the K − f best; needs K > 2f + 2
    centered_clipping  v ← v + mean_i clip_τ(x_i − v), a few iterations from the previous
                       aggregate (Karimireddy et al. 2021); needs 2f < K
The robust rules ignore size weights: a weight is something an attacker could inflate.

Privacy: aggregation only reads the (already noised) DP updates, so it is post-processing
and costs no privacy whatever the rule.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.errors import ConfigError

if TYPE_CHECKING:
    from silofl.algorithms.base import Algorithm
    from silofl.data.federation import Federation
    from silofl.training.trainer import LocalTrainer

RULES = ("mean", "median", "trimmed_mean", "krum", "multi_krum", "centered_clipping")
#: algorithms whose server step takes an `aggregation` rule
ROBUST_METHODS = ("fedavg", "mrmtl", "weight_erosion")
ATTACKS = ("sign_flip", "scaled", "gaussian", "nan", "little")


def screen(updates: np.ndarray | Sequence[np.ndarray],
           dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Screen K updates (a (K, P') array or K arrays) against dimension `dim` = P.
    Returns (keep (K,) bool, rows (K, P) float with rejected rows zeroed)."""
    rows = list(updates) if not isinstance(updates, np.ndarray) or updates.ndim == 2 \
        else [updates]
    keep = np.zeros(len(rows), bool)
    out = np.zeros((len(rows), dim))
    for k, r in enumerate(rows):
        try:
            a = np.asarray(r, dtype=float)
        except (TypeError, ValueError):
            continue
        if a.shape == (dim,) and np.isfinite(a).all():
            keep[k], out[k] = True, a
    return keep, out


def coordinate_median(U: np.ndarray) -> np.ndarray:
    """(K, P) → (P,) coordinate-wise median."""
    return np.median(U, axis=0)


def trimmed_mean(U: np.ndarray, beta: float) -> np.ndarray:
    """(K, P) → (P,): per coordinate, drop the ⌊βK⌋ smallest and largest values, average
    the rest (β in [0, 1/2))."""
    K = U.shape[0]
    b = int(np.floor(beta * K))
    return np.sort(U, axis=0)[b:K - b].mean(0)


def krum_scores(U: np.ndarray, f: int) -> np.ndarray:
    """(K,) Krum score: sum of squared distances to the K − f − 2 nearest other updates."""
    K = U.shape[0]
    sq = (U * U).sum(1)
    d = np.maximum(sq[:, None] + sq[None, :] - 2 * U @ U.T, 0.0)
    np.fill_diagonal(d, np.inf)
    n = max(K - f - 2, 1)  # with fewer updates than the rule needs, still use the closest one
    return np.sort(d, axis=1)[:, :n].sum(1)


def krum(U: np.ndarray, f: int) -> np.ndarray:
    """(K, P) → (P,): the update with the smallest Krum score (ties: the first)."""
    if U.shape[0] == 1:
        return U[0].copy()
    return U[int(np.argmin(krum_scores(U, f)))].copy()


def multi_krum(U: np.ndarray, f: int, m: int | None = None) -> np.ndarray:
    """(K, P) → (P,): the mean of the m updates with the smallest Krum scores (m = K − f)."""
    K = U.shape[0]
    m = max(1, min(K, K - f if m is None else m))
    if K == 1:
        return U[0].copy()
    return U[np.argsort(krum_scores(U, f), kind="stable")[:m]].mean(0)


def centered_clipping(U: np.ndarray, center: np.ndarray, tau: float,
                      iters: int = 3) -> np.ndarray:
    """(K, P), (P,) → (P,): v ← v + (1/K) Σ_i (x_i − v)·min(1, τ/‖x_i − v‖), `iters` times
    from v = center. Each update moves v by at most τ/K per iteration."""
    v = np.array(center, dtype=float)
    for _ in range(iters):
        diff = U - v
        norm = np.linalg.norm(diff, axis=1)
        scale = np.minimum(1.0, tau / np.maximum(norm, 1e-300))
        v = v + (diff * scale[:, None]).mean(0)
    return v


def max_attackers(rule: str, num_silos: int, trim_fraction: float) -> tuple[int, str]:
    """The most attackers `rule` tolerates among `num_silos` updates, and why."""
    K = num_silos
    if rule == "mean":
        return 0, "the mean tolerates no attacker (one update can move it anywhere)"
    if rule in ("median", "centered_clipping"):
        return (K - 1) // 2, f"{rule} needs attackers < K/2 (K = {K})"
    if rule == "trimmed_mean":
        b = int(np.floor(trim_fraction * K))
        return b, (f"trimmed_mean drops ⌊trim_fraction·K⌋ = {b} updates from each end "
                   f"(K = {K}), so it tolerates at most {b} attackers; raise trim_fraction")
    return max(-1, (K - 3) // 2), f"{rule} needs K > 2·attackers + 2 (K = {K})"


@dataclass
class Aggregator:
    """A server's aggregation rule with its settings (see the module docstring)."""
    rule: str = "mean"
    attackers: int = 0
    trim_fraction: float = 0.1
    clip_radius: float = 1.0
    clip_iters: int = 3
    #: updates dropped so far (non-finite or wrong shape), in this process
    rejected: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            near = difflib.get_close_matches(str(self.rule), RULES, n=1)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"unknown aggregation {self.rule!r}; choose one of "
                              f"{', '.join(RULES)}.{hint}")
        if isinstance(self.attackers, bool) or not isinstance(self.attackers, (int, np.integer)) \
                or self.attackers < 0:
            raise ConfigError(f"attackers must be an integer >= 0, got {self.attackers!r}")
        self.attackers = int(self.attackers)
        tf = float(self.trim_fraction)
        if not (np.isfinite(tf) and 0 <= tf < 0.5):
            raise ConfigError(f"trim_fraction must be in [0, 0.5), got {self.trim_fraction}")
        self.trim_fraction = tf
        cr = float(self.clip_radius)
        if not (np.isfinite(cr) and cr > 0):
            raise ConfigError(f"clip_radius must be a positive number, got {self.clip_radius}")
        self.clip_radius = cr
        if self.attackers:  # a rule that tolerates none cannot be asked to
            self.check(None)

    def check(self, num_silos: int | None) -> None:
        """ConfigError if the rule cannot tolerate `attackers` among `num_silos` updates
        (None: only the limits that do not depend on K)."""
        if num_silos is None:
            if self.rule == "mean" and self.attackers:
                raise ConfigError(f"attackers = {self.attackers}, but "
                                  f"{max_attackers('mean', 1, 0)[1]}; choose a robust "
                                  f"aggregation ({', '.join(RULES[1:])})")
            return
        most, why = max_attackers(self.rule, num_silos, self.trim_fraction)
        if self.attackers > most:
            limit = f"at most {most} attackers" if most >= 0 else "more silos"
            raise ConfigError(f"aggregation {self.rule!r} cannot tolerate attackers = "
                              f"{self.attackers}: {why}, so these silos allow {limit}")

    def combine(self, U: np.ndarray, weights: np.ndarray | None = None,
                center: np.ndarray | None = None) -> np.ndarray:
        """(k, P) screened updates → (P,) by the rule; `weights` only for the mean,
        `center` (the previous aggregate) only for centered clipping."""
        if self.rule == "mean":
            w = np.ones(len(U)) if weights is None else np.asarray(weights, float)
            return (w[:, None] * U).sum(0) / w.sum()
        if self.rule == "median":
            return coordinate_median(U)
        if self.rule == "trimmed_mean":
            return trimmed_mean(U, self.trim_fraction)
        if self.rule == "krum":
            return krum(U, self.attackers)
        if self.rule == "multi_krum":
            return multi_krum(U, self.attackers)
        c = np.zeros(U.shape[1]) if center is None else center
        return centered_clipping(U, c, self.clip_radius, self.clip_iters)

    def aggregate(self, updates: np.ndarray | Sequence[np.ndarray], weights: np.ndarray, dim: int,
                  center: np.ndarray | None = None) -> np.ndarray:
        """Screen then combine K updates into a (P,) step; zeros if none survive."""
        keep, U = screen(updates, dim)
        w = np.asarray(weights, float)
        if len(keep) != len(w):  # not one row per silo: nothing can be matched to a silo
            keep = np.zeros(len(w), bool)
        self.rejected += int((~keep).sum())
        if not keep.any():
            return np.zeros(dim)
        return self.combine(U[keep], w[keep], center)

    def describe_if_used(self) -> dict:
        """{"aggregation": ...} for an algorithm's describe(), empty for the plain mean with
        nothing rejected (so such results read as before robust rules existed)."""
        if self.rule == "mean" and not self.rejected:
            return {}
        return {"aggregation": self.describe()}

    def describe(self) -> dict:
        d = {"rule": self.rule, "rejected": self.rejected}
        if self.rule in ("krum", "multi_krum") or self.attackers:
            d["attackers"] = self.attackers
        if self.rule == "trimmed_mean":
            d["trim_fraction"] = self.trim_fraction
        if self.rule == "centered_clipping":
            d["clip_radius"] = self.clip_radius
        return d


# ---- attack harness (tests and experiments; never used by a configured run) ----

@dataclass
class Attack:
    """Replace the updates of attacking silos. `kind`: sign_flip (−u), scaled (−scale·u),
    gaussian (N(0, scale²) per coordinate), nan, little ("a little is enough": the honest
    updates' coordinate mean − z·std). `silos`: attacker indices, or `count` chosen by `seed`."""
    kind: str
    count: int = 0
    silos: tuple = ()
    scale: float = 10.0
    z: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ATTACKS:
            raise ValueError(f"unknown attack {self.kind!r}; choose one of {', '.join(ATTACKS)}")

    def attackers(self, num_silos: int) -> np.ndarray:
        if self.silos:
            return np.array(sorted(self.silos), int)
        rng = np.random.default_rng(self.seed)
        return np.sort(rng.choice(num_silos, size=self.count, replace=False))

    def apply(self, U: np.ndarray, round: int = 0) -> np.ndarray:
        """(K, P) honest updates → (K, P) with the attackers' rows replaced."""
        U = np.array(U, dtype=float)
        bad = self.attackers(U.shape[0])
        if not len(bad):
            return U
        honest = np.setdiff1d(np.arange(U.shape[0]), bad)
        if self.kind == "sign_flip":
            U[bad] = -U[bad]
        elif self.kind == "scaled":
            U[bad] = -self.scale * U[bad]
        elif self.kind == "gaussian":
            rng = np.random.default_rng([self.seed, round])
            U[bad] = self.scale * rng.standard_normal((len(bad), U.shape[1]))
        elif self.kind == "nan":
            U[bad] = np.nan
        else:
            H = U[honest]
            U[bad] = H.mean(0) - self.z * H.std(0)
        return U


def flip_labels(fed: Federation, silos: Sequence[int] | np.ndarray,
                bounds: tuple[float, float] = (0.0, 1.0)) -> Federation:
    """Label-flipping data poisoning: a copy of federation `fed` in which the silos with
    indices `silos` train on flipped labels and otherwise run the honest algorithm (their
    updates are genuine DP-SGD on poisoned rows, so no rule can screen them by shape).
    Classification: y → C − 1 − y (binary: 1 − y); regression: y → lo + hi − y, mirrored
    within the target's public `bounds` (School's scaled score: [0, 1]). Test rows are kept,
    so score only the honest silos."""
    from dataclasses import replace
    out = list(fed.silos)
    for k in sorted({int(k) for k in silos}):
        s = out[k]
        if fed.task == "regression":
            y = bounds[0] + bounds[1] - s.y_train
        else:
            y = (max(fed.num_classes, 2) - 1 - s.y_train).astype(s.y_train.dtype)
        out[k] = replace(s, y_train=y)
    return replace(fed, silos=out)


class Attacked:
    """An algorithm whose silo step output is tampered with by `attack` (simulator only):
    everything else is the wrapped algorithm's."""

    def __init__(self, algorithm: Algorithm, attack: Attack) -> None:
        self.inner, self.attack = algorithm, attack

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not yet set (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def silo_step(self, silos: Any, message: Any, trainer: LocalTrainer,
                  round: int) -> tuple[Any, Any]:
        silos, update = self.inner.silo_step(silos, message, trainer, round)
        if isinstance(update, np.ndarray):
            return silos, self.attack.apply(update, round)
        if hasattr(update, "grads"):  # Weight Erosion sends gradients
            from dataclasses import replace
            return silos, replace(update, grads=self.attack.apply(update.grads, round))
        raise TypeError(f"cannot attack {self.inner.name}'s update of type "
                        f"{type(update).__name__}")

    def describe(self) -> dict[str, Any]:
        return dict(self.inner.describe(), attack={
            "kind": self.attack.kind, "scale": self.attack.scale, "z": self.attack.z,
            "silos": self.attack.silos or None, "count": self.attack.count})

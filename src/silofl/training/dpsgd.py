"""DP-SGD as a chain of small steps on a batch of silos: clip → sum → noise → scale.

All arrays carry a leading silo axis K. Clipping and summing are fused in
`Model.clipped_grad_sum` (closed form for GLMs). Noise N(0, σ_k² C² I) is added to each
silo's clipped sum, and the result is divided by the *expected* batch size q_k·n_k, as
DP-SGD with Poisson sampling prescribes (dividing by the realised size would leak it).

With ``clip = "auto"`` (`QuantileClip`) the rule also tracks each silo's clip privately
(Andrew et al. 2021): every step it counts the batch's examples with ‖g_i‖ ≤ C_k, releases
the centred count with N(0, σ_b²) noise, and moves C_k geometrically towards the target
quantile; the gradient noise is σ_Δ·C_k (`privacy.adaptive_clip`).

Anything that depends only on already-private quantities — the MR-MTL pull λ(w_k − w̄)
towards the (private) average and the L2 term — is added after this step: it is
post-processing and costs no privacy, and clipping it together with the data gradient
would only distort it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from silofl.errors import ConfigError
from silofl.models.base import Model
from silofl.privacy.adaptive_clip import auto_quantile
from silofl.privacy.clipping import clip_bound
from silofl.privacy.randomness import Randomness


def clip_and_sum(model: Model, W: np.ndarray, X: np.ndarray, y: np.ndarray, mask: np.ndarray,
                 clip: float, **aux: Any) -> np.ndarray:
    """Σ_i clip_C(g_i) per silo → (K, P)."""
    return model.clipped_grad_sum(W, X, y, mask, clip, **aux)


def add_noise(grad_sum: np.ndarray, std: np.ndarray, rng: Randomness,
              standard_normal: np.ndarray | None = None) -> np.ndarray:
    """grad_sum + N(0, std_k² I) per silo row; std = σ_k · C. `standard_normal` may hold
    pre-drawn N(0, 1) values of grad_sum's shape (drawing a round's noise at once is faster)."""
    z = rng.normal(grad_sum.shape) if standard_normal is None else standard_normal
    return grad_sum + z * np.asarray(std)[:, None]


def round_noise(rng: Randomness, steps: np.ndarray, std: np.ndarray,
                num_params: int) -> tuple[np.ndarray, np.ndarray]:
    """One round's noise for K silos taking steps[k] DP-SGD steps each, N(0, std_k² I) per
    row (std = σ_k·C, (K,)). Returns z (R, P), R = Σ_k steps[k], and offsets (S + 1,),
    S = max steps: step s's rows z[offsets[s]:offsets[s+1]] belong to the silos still
    stepping (steps > s), in index order.

    A secure stream draws just these R rows (ahead, see `Randomness.normal_prefetched`);
    any other draws the full (S, K, P) block and keeps the rows used, so seeded runs keep
    the noise (and numbers) they always had."""
    steps = np.asarray(steps)
    S, K = (int(steps.max()) if steps.size else 0), len(steps)
    active = np.arange(S)[:, None] < steps[None, :]  # (S, K): silo k steps at step s
    step_of, silo_of = np.nonzero(active)            # step-major, silos in index order
    offsets = np.concatenate([[0], np.cumsum(active.sum(1))])
    if rng.secure:
        z = rng.normal_prefetched((len(silo_of), num_params))
    else:
        z = rng.normal_prefetched((S, K, num_params))[step_of, silo_of]
    z *= np.asarray(std, dtype=float)[silo_of, None]
    return z, offsets


def scale(grad: np.ndarray, expected_batch: np.ndarray) -> np.ndarray:
    """Each silo's row divided by its expected batch size q_k·n_k."""
    return grad / np.asarray(expected_batch, dtype=float)[:, None]


class StepProbe(Protocol):
    """An auditor's instrument at the DP-SGD step (`silofl.audit.whitebox`): it adds known
    canary gradients to the clipped sums — clipped by the rule, `GradientRule.clipped_norm`
    — before the noise, and observes the noisy sums after it. Only audits attach one."""

    def add(self, rule: GradientRule, silos: np.ndarray, clipped: np.ndarray) -> None:
        """Add the canaries' clipped gradients to `clipped` (k, P) of silos `silos` (k,)."""

    def observe(self, silos: np.ndarray, noisy: np.ndarray) -> None:
        """See the noisy sums (k, P) of silos `silos` (what the step releases)."""


@dataclass
class QuantileClip:
    """Each silo's private clip: the quantile estimator of Andrew et al. (2021).

    After every step silo k releases the count of its batch's examples with ‖g_i‖ ≤ C_k,
    centred (Σ_i (1[‖g_i‖ ≤ C_k] − ½), sensitivity ½) plus N(0, σ_b,k²), estimates the
    fraction b̃_k = noisy / m_k + ½ (m_k = q_k·n_k, the expected batch) and updates
    C_k ← C_k · exp(−η_k (b̃_k − γ_k)). Everything here is public or a function of the
    noisy releases; the state is the silo's (checkpointed with it).

    Attributes
    ----------
    clip : numpy.ndarray, shape (K,)
        The current clips C_k (start: clip_init).
    quantile : float or "auto"
        γ in (0, 1), the target fraction of unclipped examples; "auto": each silo's γ_k
        from its noise level (`privacy.adaptive_clip.auto_quantile`, public).
    lr : numpy.ndarray, shape (K,) (or a float for all)
        η_k > 0, each silo's geometric step (`privacy.adaptive_clip.clip_step`).
    count_noise : numpy.ndarray, shape (K,)
        σ_b,k, the count's noise std (examples).
    gradient_noise : numpy.ndarray, shape (K,)
        σ_Δ,k, the gradient sum's noise multiplier (std σ_Δ,k·C_k).
    expected_batch : numpy.ndarray, shape (K,)
        m_k = q_k·n_k.
    target : numpy.ndarray, shape (K,)
        The γ_k of each silo's last update (NaN before its first; for the reports).
    ceiling : float
        A public upper bound on every C_k (`[training] clip_max`): stops a runaway clip.
    """

    clip: np.ndarray
    quantile: float | str
    lr: np.ndarray | float
    count_noise: np.ndarray
    gradient_noise: np.ndarray
    expected_batch: np.ndarray
    target: np.ndarray = field(default_factory=lambda: np.full(0, np.nan))
    ceiling: float = np.inf

    def __post_init__(self) -> None:
        if len(self.target) != len(self.clip):
            self.target = np.full(len(self.clip), np.nan)

    def targets(self, silos: np.ndarray, num_params: int) -> np.ndarray | float:
        """γ of the silos `silos` (k,): the set quantile, or for "auto" each silo's γ_k
        for noise on `num_params` coordinates."""
        if self.quantile == "auto":
            return auto_quantile(self.gradient_noise[silos], num_params,
                                 self.expected_batch[silos])
        return float(self.quantile)

    def update(self, silos: np.ndarray, count: np.ndarray, batch: np.ndarray,
               z: np.ndarray, num_params: int = 1) -> None:
        """One step's release and clip update for the silos `silos` (k,).

        Parameters
        ----------
        silos : numpy.ndarray, shape (k,)
            Indices into `clip`.
        count : numpy.ndarray, shape (k,)
            Examples of each batch with gradient norm ≤ its clip.
        batch : numpy.ndarray, shape (k,)
            Realised batch sizes (private: only the noised centred count leaves).
        z : numpy.ndarray, shape (k,)
            N(0, 1) draws for the count noise.
        num_params : int, default 1
            Coordinates the gradient noise lies on (quantile = "auto" only).
        """
        noisy = count - 0.5 * batch + z * self.count_noise[silos]
        frac = noisy / self.expected_batch[silos] + 0.5
        lr = self._lr(silos)
        gamma = self.targets(silos, num_params)
        self.target[silos] = gamma
        self.clip[silos] = np.minimum(self.clip[silos] * np.exp(-lr * (frac - gamma)),
                                      self.ceiling)

    def _lr(self, rows: np.ndarray) -> np.ndarray | float:
        """η of the silos `rows` (one float shared by all, or each silo's)."""
        return self.lr if np.ndim(self.lr) == 0 else np.asarray(self.lr)[rows]

    def subset(self, rows: np.ndarray) -> QuantileClip:
        """A tracker for the silos `rows` (a copy: pseudo-silos of private tuning)."""
        return QuantileClip(self.clip[rows].copy(), self.quantile, self._lr(rows),
                            self.count_noise[rows], self.gradient_noise[rows],
                            self.expected_batch[rows], ceiling=self.ceiling)


@dataclass(frozen=True)
class GradientRule:
    """How a silo turns a sampled batch into a gradient estimate.

    `noise_multiplier` is None for the non-private mode (no clipping, no noise). `probe`
    (audits only) sees every step: see `StepProbe`. `adaptive` (clip = "auto"): each silo's
    clip is tracked privately (`QuantileClip`); `clip` is then the starting C₀."""

    clip: float
    noise_multiplier: np.ndarray | None  # (K,)
    probe: StepProbe | None = None
    adaptive: QuantileClip | None = None

    def __post_init__(self) -> None:
        if self.adaptive is not None and self.probe is not None:
            raise ConfigError("clip = \"auto\" cannot be audited: the white-box audit assumes "
                              "a fixed clip C; set [training] clip to a number for an audit")

    @property
    def private(self) -> bool:
        """Whether the rule clips and adds noise (False: the non-private mode)."""
        return self.noise_multiplier is not None

    @property
    def sigmas(self) -> np.ndarray:
        """(K,) the noise multipliers σ_k of a private rule."""
        if self.noise_multiplier is None:
            raise ValueError("the non-private gradient rule has no noise multipliers")
        return self.noise_multiplier

    def __call__(self, model: Model, W: np.ndarray, X: np.ndarray, y: np.ndarray,
                 mask: np.ndarray, expected_batch: np.ndarray, silos: np.ndarray | slice,
                 rng: Randomness, standard_normal: np.ndarray | None = None,
                 noise: np.ndarray | None = None, count_noise: np.ndarray | None = None,
                 coords: np.ndarray | None = None,
                 **aux: Any) -> np.ndarray:
        """The (k, P) gradient estimate for the k silos `silos` (indices into
        noise_multiplier) from their batch W (k, P), X (k, B, ...), y, mask (k, B).
        Noise comes from `noise` (k, P), draws already scaled to N(0, σ_k²C²) (a training
        loop draws a round's at once: `round_noise`), else from `standard_normal` (k, P)
        N(0, 1) draws, else from `rng`. clip = "auto": `noise` holds draws at std σ_Δ,k
        (`draw_std`) and `count_noise` (k,) N(0, 1) draws for the count (else from `rng`).
        `coords` (P,) bool: a partial update (FedRep's head or body pass): each example's
        gradient restricted to these coordinates is clipped to C and the noise kept only on
        them — the same Gaussian mechanism on fewer coordinates — and the estimate is 0
        elsewhere."""
        if coords is not None:
            aux["coords"] = coords
        if not self.private:
            g = model.grad_sum(W, X, y, mask)
            return scale(g if coords is None else g * coords, expected_batch)
        if self.adaptive is not None:
            return self._adaptive_step(model, W, X, y, mask, expected_batch, silos, rng,
                                       standard_normal, noise, count_noise, aux)
        clipped = self.clipped_sum(model, W, X, y, mask, **aux)
        if coords is not None:  # a backend that ignores coords clipped the full norm
            clipped *= coords
        if self.probe is not None:
            self.probe.add(self, np.asarray(silos), clipped)
        if noise is not None:
            clipped += noise
            noisy = clipped
        else:
            noisy = add_noise(clipped, self.noise_std()[silos], rng, standard_normal)
        if coords is not None:
            noisy *= coords
        if self.probe is not None:
            self.probe.observe(np.asarray(silos), noisy)
        return scale(noisy, expected_batch)

    def _adaptive_step(self, model: Model, W: np.ndarray, X: np.ndarray, y: np.ndarray,
                       mask: np.ndarray, expected_batch: np.ndarray, silos: np.ndarray | slice,
                       rng: Randomness, standard_normal: np.ndarray | None,
                       noise: np.ndarray | None, count_noise: np.ndarray | None,
                       aux: dict) -> np.ndarray:
        """`__call__` with private adaptive clipping: clip at each silo's C_k, add noise
        σ_Δ,k·C_k (`noise`: draws at std σ_Δ,k, see `draw_std`), release the noisy count
        (`count_noise`: (k,) N(0, 1) draws, else from `rng`) and update C_k."""
        tracker = self.adaptive
        assert tracker is not None
        ids = np.arange(len(tracker.clip))[silos]
        C = tracker.clip[ids]
        clipped, count = model.clipped_grad_sum_count(W, X, y, mask, C, **aux)
        if noise is None:
            noise = rng.normal(clipped.shape) if standard_normal is None else standard_normal
            noise = noise * tracker.gradient_noise[ids][:, None]
        clipped += noise * C[:, None]
        if "coords" in aux:  # a partial pass: the sum and its noise live on the coordinates
            clipped *= aux["coords"]
        z = rng.normal(len(ids)) if count_noise is None else count_noise
        P = int(np.count_nonzero(aux["coords"])) if "coords" in aux else int(np.shape(W)[-1])
        tracker.update(ids, count, np.asarray(mask).sum(1), z, num_params=P)
        return scale(clipped, expected_batch)

    def subset(self, rows: np.ndarray) -> GradientRule:
        """A plain rule for the silos `rows` (K',) alone (private tuning's pseudo-silos:
        each starts its own clip tracker at the current clips; no probe)."""
        if self.noise_multiplier is None:
            return GradientRule(self.clip, None)
        return GradientRule(self.clip, self.noise_multiplier[rows],
                            adaptive=None if self.adaptive is None else self.adaptive.subset(rows))

    def draw_std(self) -> np.ndarray:
        """(K,) the std of the noise a training loop draws ahead (`round_noise`): σ_k·C for
        a fixed clip; σ_Δ,k for clip = "auto", scaled by the step's C_k when it is added."""
        if self.adaptive is not None:
            return self.adaptive.gradient_noise
        return self.noise_std()

    def clipped_sum(self, model: Model, W: np.ndarray, X: np.ndarray, y: np.ndarray,
                    mask: np.ndarray, **aux: Any) -> np.ndarray:
        """Σ_i clip_C(g_i) per silo → (K, P) (`clip_and_sum` at this rule's C)."""
        return clip_and_sum(model, W, X, y, mask, self.clip, **aux)

    def clipped_norm(self, norm: np.ndarray | float) -> np.ndarray:
        """The norm a per-example gradient of norm `norm` has after this rule's clipping."""
        return np.minimum(np.asarray(norm, dtype=float), clip_bound(self.clip))

    def noise_std(self) -> np.ndarray:
        """(K,) σ_k·C: the std of each silo's noise on its clipped sum (clip = "auto":
        σ_Δ,k·C_k at the current clips)."""
        if self.adaptive is not None:
            return self.adaptive.gradient_noise * self.adaptive.clip
        return np.asarray(self.noise_multiplier, dtype=float) * self.clip

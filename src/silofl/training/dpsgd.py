"""DP-SGD as a chain of small steps on a batch of silos: clip → sum → noise → scale.

All arrays carry a leading silo axis K. Clipping and summing are fused in
`Model.clipped_grad_sum` (closed form for GLMs). Noise N(0, σ_k² C² I) is added to each
silo's clipped sum, and the result is divided by the *expected* batch size q_k·n_k, as
DP-SGD with Poisson sampling prescribes (dividing by the realised size would leak it).

Anything that depends only on already-private quantities — the MR-MTL pull λ(w_k − w̄)
towards the (private) average and the L2 term — is added after this step: it is
post-processing and costs no privacy, and clipping it together with the data gradient
would only distort it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from silofl.models.base import Model
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


@dataclass(frozen=True)
class GradientRule:
    """How a silo turns a sampled batch into a gradient estimate.

    `noise_multiplier` is None for the non-private mode (no clipping, no noise). `probe`
    (audits only) sees every step: see `StepProbe`."""

    clip: float
    noise_multiplier: np.ndarray | None  # (K,)
    probe: StepProbe | None = None

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
                 noise: np.ndarray | None = None, coords: np.ndarray | None = None,
                 **aux: Any) -> np.ndarray:
        """The (k, P) gradient estimate for the k silos `silos` (indices into
        noise_multiplier) from their batch W (k, P), X (k, B, ...), y, mask (k, B).
        Noise comes from `noise` (k, P), draws already scaled to N(0, σ_k²C²) (a training
        loop draws a round's at once: `round_noise`), else from `standard_normal` (k, P)
        N(0, 1) draws, else from `rng`. `coords` (P,) bool: a partial update (FedRep's head
        or body pass): each example's gradient restricted to these coordinates is clipped to
        C and the noise kept only on them — the same Gaussian mechanism on fewer
        coordinates — and the estimate is 0 elsewhere."""
        if coords is not None:
            aux["coords"] = coords
        if not self.private:
            g = model.grad_sum(W, X, y, mask)
            return scale(g if coords is None else g * coords, expected_batch)
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

    def clipped_sum(self, model: Model, W: np.ndarray, X: np.ndarray, y: np.ndarray,
                    mask: np.ndarray, **aux: Any) -> np.ndarray:
        """Σ_i clip_C(g_i) per silo → (K, P) (`clip_and_sum` at this rule's C)."""
        return clip_and_sum(model, W, X, y, mask, self.clip, **aux)

    def clipped_norm(self, norm: np.ndarray | float) -> np.ndarray:
        """The norm a per-example gradient of norm `norm` has after this rule's clipping."""
        return np.minimum(np.asarray(norm, dtype=float), clip_bound(self.clip))

    def noise_std(self) -> np.ndarray:
        """(K,) σ_k·C: the std of each silo's noise on its clipped sum."""
        return np.asarray(self.noise_multiplier, dtype=float) * self.clip

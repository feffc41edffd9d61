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

import numpy as np

from silofl.models.base import Model
from silofl.privacy.randomness import Randomness


def clip_and_sum(model: Model, W, X, y, mask, clip: float, **aux) -> np.ndarray:
    """Σ_i clip_C(g_i) per silo → (K, P)."""
    return model.clipped_grad_sum(W, X, y, mask, clip, **aux)


def add_noise(grad_sum: np.ndarray, std: np.ndarray, rng: Randomness,
              standard_normal: np.ndarray | None = None) -> np.ndarray:
    """grad_sum + N(0, std_k² I) per silo row; std = σ_k · C. `standard_normal` may hold
    pre-drawn N(0, 1) values of grad_sum's shape (drawing a round's noise at once is faster)."""
    z = rng.normal(grad_sum.shape) if standard_normal is None else standard_normal
    return grad_sum + z * np.asarray(std)[:, None]


def scale(grad: np.ndarray, expected_batch: np.ndarray) -> np.ndarray:
    return grad / np.asarray(expected_batch, dtype=float)[:, None]


@dataclass(frozen=True)
class GradientRule:
    """How a silo turns a sampled batch into a gradient estimate.

    `noise_multiplier` is None for the non-private mode (no clipping, no noise)."""

    clip: float
    noise_multiplier: np.ndarray | None  # (K,)

    @property
    def private(self) -> bool:
        return self.noise_multiplier is not None

    def __call__(self, model, W, X, y, mask, expected_batch, silos, rng,
                 standard_normal=None, **aux) -> np.ndarray:
        if not self.private:
            return scale(model.grad_sum(W, X, y, mask), expected_batch)
        clipped = clip_and_sum(model, W, X, y, mask, self.clip, **aux)
        noisy = add_noise(clipped, self.noise_multiplier[silos] * self.clip, rng,
                          standard_normal)
        return scale(noisy, expected_batch)

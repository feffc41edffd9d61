"""Generalized linear models with closed-form per-example gradients.

For a GLM the gradient of example i is g_i = r_i ⊗ [x_i, 1], where r_i = ∂loss/∂logit
(a scalar, or a C-vector for softmax). Its norm is ‖r_i‖·√(‖x_i‖² + 1), so clipping and
summing need only one (K,B)→(K,d) contraction: no per-example gradient tensor is built.
Parameter layout: [weights (d), bias] per output; softmax stacks C such blocks.
Binary labels are {0, 1}; hinge and focal map them to ±1 internally.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import expit, log_expit, logsumexp, softmax

from silofl.errors import ConfigError
from silofl.models.base import NAMED_MODELS, Model
from silofl.privacy.clipping import CLIP_MARGIN, clip_bound


class GLM(Model):
    outputs = 1

    def __init__(self, dim: int) -> None:
        self.dim = int(dim)
        self.num_params = self.outputs * (self.dim + 1)

    def param_groups(self) -> dict[str, np.ndarray]:
        """{"head": the intercepts}: a GLM has no deep body, so FedPer / FedRep share the
        weights and keep a personal intercept per silo (per class for softmax) — the GLM
        analogue of a personal head. No "norm" group (FedBN refuses GLMs)."""
        head = np.zeros((self.outputs, self.dim + 1), dtype=bool)
        head[:, self.dim] = True
        return {"head": head.ravel()}

    def _coords_norm(self, coords: np.ndarray, X: np.ndarray,
                     x_sqnorm: np.ndarray) -> np.ndarray:
        """‖[x, 1] restricted to coords‖ per row (K, B), float64, for a (P,) mask that
        selects the same weights and intercept in every output block."""
        blocks = np.asarray(coords, dtype=bool).reshape(self.outputs, self.dim + 1)
        if np.any(blocks != blocks[0]) or not blocks.any():
            raise ValueError("a GLM trains a coordinate subset only when it is non-empty and "
                             "the same in every output block (weights and/or intercepts)")
        cw, cb = blocks[0, :self.dim], float(blocks[0, self.dim])
        if cw.all():
            sq = np.asarray(x_sqnorm, dtype=np.float64)
        elif not cw.any():
            sq = np.zeros(X.shape[:2])
        else:
            sq = np.einsum("kbd,kbd,d->kb", X, X, cw.astype(X.dtype), dtype=np.float64)
        return np.fmax(np.sqrt(sq + cb), 1e-300)

    # logits: (..., B) for one output, (..., B, C) for several
    def logits(self, W: np.ndarray, X: np.ndarray) -> np.ndarray:
        d = self.dim
        if self.outputs == 1:
            if W.ndim == 2 and X.ndim == 3:  # (K, P) × (K, B, d): the training hot path
                return np.matmul(X, W[:, :d, None].astype(X.dtype))[..., 0] + W[:, d, None]
            return np.matmul(X, W[..., :d, None])[..., 0] + W[..., d, None]
        Wm = W.reshape(W.shape[:-1] + (self.outputs, d + 1))
        return np.matmul(X, np.swapaxes(Wm[..., :d], -1, -2)) + Wm[..., None, :, d]

    def residual(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        """∂loss/∂logit, same shape as z."""
        raise NotImplementedError

    def loss_from_logits(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def loss(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        return self.loss_from_logits(self.logits(w, X), y)

    def per_example_grads(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        r = self.residual(self.logits(w, X), y)
        Xb = np.concatenate([X, np.ones((X.shape[0], 1))], axis=1)
        if self.outputs == 1:
            return r[:, None] * Xb
        return (r[:, :, None] * Xb[:, None, :]).reshape(X.shape[0], -1)

    def _weighted_sum(self, coef: np.ndarray, X: np.ndarray) -> np.ndarray:
        """Σ_b coef[k,b] ⊗ [X[k,b], 1] → (K, P)."""
        if self.outputs == 1:
            return np.concatenate([np.matmul(coef[:, None, :].astype(X.dtype), X)[:, 0],
                                   coef.sum(1)[:, None]], 1)
        gw = np.matmul(np.swapaxes(coef, 1, 2), X)  # (K, C, d)
        return np.concatenate([gw, coef.sum(1)[:, :, None]], 2).reshape(coef.shape[0], -1)

    def clipped_grad_sum(self, W: np.ndarray, X: np.ndarray, y: np.ndarray, mask: np.ndarray,
                         clip: float, x_sqnorm: np.ndarray | None = None,
                         *, coords: np.ndarray | None = None, **aux: Any) -> np.ndarray:
        """Σ_b clip(g_kb) over unmasked rows → (K, P) float64, every per-example gradient
        g = r ⊗ [x, 1] clipped to norm ≤ clip_bound(clip) < clip (see models.base).

        W (K, P); X (K, B, d) float32 or float64; y, mask (K, B): bool (padding) or float
        row weights w ∈ [0, 1] (the sum is then Σ_b w_b·clip(g_b)). x_sqnorm (K, B): ‖x‖² per
        row, accurate to X's precision (the trainer stores it in float32, computed from the
        float64 data); computed here in float64 when not given. Never inf or NaN from one
        row: a row whose ‖x‖² overflows X's precision contributes 0, a non-finite residual
        is clipped like a huge one (scalar outputs; softmax: its non-finite parts count 0).
        coords (P,) bool: each g restricted to these coordinates (weights and/or intercepts,
        the same in every block) is clipped, and the sum is 0 elsewhere."""
        return self._clipped(W, X, y, mask, clip_bound(clip), x_sqnorm, coords)[0]

    def clipped_grad_sum_count(self, W: np.ndarray, X: np.ndarray, y: np.ndarray,
                               mask: np.ndarray, clip: np.ndarray,
                               x_sqnorm: np.ndarray | None = None, *,
                               coords: np.ndarray | None = None,
                               **aux: Any) -> tuple[np.ndarray, np.ndarray]:
        """`clipped_grad_sum` at clip[k] (K,) for silo k, and per silo the number of
        unmasked rows with ‖g‖ = ‖r‖·‖[x, 1]‖ ≤ clip[k] (K,) (see `Model`); with `coords`,
        ‖g‖ is the norm of g restricted to them."""
        clip = np.asarray(clip, dtype=np.float64)[:, None]
        out, rnorm, xnorm = self._clipped(W, X, y, mask, clip / (1.0 + CLIP_MARGIN), x_sqnorm,
                                          coords)
        # weighted: a person's rows count Σ w_i ≤ 1 in all (person level)
        within = (rnorm * xnorm <= clip) * np.asarray(mask, dtype=np.float64)
        return out, within.sum(1)

    def _clipped(self, W: np.ndarray, X: np.ndarray, y: np.ndarray, mask: np.ndarray,
                 bound0: float | np.ndarray, x_sqnorm: np.ndarray | None,
                 coords: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The clipped sum (K, P) at clip bound `bound0` (scalar or (K, 1)), and ‖r‖ and
        ‖[x, 1]‖ (restricted to `coords`) per row (K, B)."""
        r = self.residual(self.logits(W, X), y)
        if x_sqnorm is None:  # float64 sums, rounded like the trainer's packed ‖x‖²
            x_sqnorm = np.einsum("kbd,kbd->kb", X, X, dtype=np.float64).astype(X.dtype,
                                                                               copy=False)
        xnorm = (np.sqrt(np.add(x_sqnorm, 1.0, dtype=np.float64)) if coords is None  # ‖[x, 1]‖
                 else self._coords_norm(coords, X, x_sqnorm))
        # largest ‖r‖ whose gradient stays inside the ball; 0 on padded rows. A float mask
        # holds row weights (person level: 1/r_p): clip first, then weigh (Σ w_i·clip(g_i))
        weights = None if np.asarray(mask).dtype == bool else np.asarray(mask, dtype=np.float64)
        bound = np.multiply(mask if weights is None else weights > 0, bound0)
        bound /= xnorm
        if self.outputs == 1:
            # clip r to ±bound: min(1, c/‖g‖)·r in two passes; fmax/fmin map NaN r to a bound
            coef = np.fmax(r, -bound)
            np.fmin(coef, bound, out=coef)
            rnorm = np.abs(r)
        else:
            r = np.where(np.isfinite(r), r, 0.0)
            rnorm = np.sqrt(np.einsum("kbc,kbc->kb", r, r))
            den = np.fmax(rnorm, bound)  # factor bound/max(‖r‖, bound) = min(1, bound/‖r‖),
            np.fmax(den, 1e-300, out=den)  # and 0 (not 0/0) for a zero residual on a padded row
            coef = r * (bound / den)[..., None]
        if weights is not None:
            coef = coef * (weights if self.outputs == 1 else weights[..., None])
        out = self._weighted_sum(coef, X)
        return (out if coords is None else out * coords), rnorm, xnorm

    # -- the trainer's fused step (`training.fused`): scalar outputs only --------------
    def step_targets(self, y: np.ndarray) -> np.ndarray:
        """The labels `y` (any shape) as `residual_step` takes them: a whole round's
        batches are prepared at once, so label transforms leave the step loop.

        Parameters
        ----------
        y : numpy.ndarray
            Labels, any shape, float32 in the trainer.

        Returns
        -------
        numpy.ndarray
            Same shape: whatever `residual_step` expects (here `y` itself).
        """
        return y

    def residual_step(self, z: np.ndarray, t: np.ndarray) -> np.ndarray:
        """∂loss/∂logit from logits `z` and prepared labels `t` (`step_targets`), same
        shape as z; float32 in, float32 out where the loss allows."""
        return self.residual(z, t)

    def grad_sum(self, W: np.ndarray, X: np.ndarray, y: np.ndarray, mask: np.ndarray) -> np.ndarray:
        r = self.residual(self.logits(W, X), y)
        return self._weighted_sum(r * (mask if self.outputs == 1 else mask[..., None]), X)


class LinearRegression(GLM):
    """0.5 · squared error."""
    name, tasks = "linear", ("regression",)

    def residual(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        return z - y

    def loss_from_logits(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        return 0.5 * (z - y) ** 2

    def predict(self, w: np.ndarray, X: np.ndarray) -> np.ndarray:
        return self.logits(w, X)


class LogisticRegression(GLM):
    """Binary cross-entropy on logits; labels in {0, 1}."""
    name, tasks = "logistic", ("binary",)

    def residual(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        return expit(z) - y

    def loss_from_logits(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        return -(y * log_expit(z) + (1 - y) * log_expit(-z))

    def predict(self, w: np.ndarray, X: np.ndarray) -> np.ndarray:
        return expit(self.logits(w, X))


class FocalLoss(LogisticRegression):
    """Focal loss −α_t (1−p_t)^γ log p_t (Lin et al. 2017) for imbalanced binary data."""
    name = "focal"

    def __init__(self, dim: int, gamma: float = 2.0, alpha: float = 0.25) -> None:
        super().__init__(dim)
        if gamma < 0 or not 0 < alpha < 1:
            raise ConfigError(f"focal loss needs gamma ≥ 0 and 0 < alpha < 1, got "
                              f"gamma={gamma}, alpha={alpha}")
        self.gamma, self.alpha = float(gamma), float(alpha)

    def _parts(self, z: np.ndarray, y: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        s = 2 * y - 1
        log_pt = log_expit(s * z)
        pt = np.exp(log_pt)
        at = np.where(y > 0.5, self.alpha, 1 - self.alpha)
        return s, log_pt, pt, at

    def residual(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        s, log_pt, pt, at = self._parts(z, y)
        return s * at * (1 - pt) ** self.gamma * (self.gamma * pt * log_pt - (1 - pt))

    def loss_from_logits(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        _, log_pt, pt, at = self._parts(z, y)
        return -at * (1 - pt) ** self.gamma * log_pt


class LinearSVM(GLM):
    """Hinge loss max(0, 1 − s·z) with s = 2y − 1; predict returns the margin z."""
    name, tasks = "svm", ("binary",)

    def residual(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        s = 2 * y - 1
        return np.where(s * z < 1, -s, 0.0)

    def step_targets(self, y: np.ndarray) -> np.ndarray:
        """The negated signs −s = 1 − 2y (∓1), once per round."""
        return 1 - 2 * y

    def residual_step(self, z: np.ndarray, t: np.ndarray) -> np.ndarray:
        """−s where the margin s·z < 1, else 0 (t = −s, `step_targets`; a NaN z gives 0,
        as in `residual`): three in-place passes."""
        m = t * z
        np.greater(m, -1, out=m)  # −s·z > −1 ⟺ s·z < 1, written as 1.0 / 0.0
        m *= t
        return m

    def loss_from_logits(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.maximum(0.0, 1 - (2 * y - 1) * z)

    def predict(self, w: np.ndarray, X: np.ndarray) -> np.ndarray:
        return self.logits(w, X)


class SoftmaxRegression(GLM):
    """Multinomial logistic regression (softmax cross-entropy); labels 0..C−1."""
    name, tasks = "softmax", ("binary", "multiclass")

    def __init__(self, dim: int, num_classes: int) -> None:
        if num_classes < 2:
            raise ConfigError(f"softmax needs at least 2 classes, got {num_classes}")
        self.outputs = int(num_classes)
        super().__init__(dim)

    def _onehot(self, y: np.ndarray) -> np.ndarray:
        return np.eye(self.outputs)[np.asarray(y, dtype=np.int64)]

    def residual(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        return softmax(z, axis=-1) - self._onehot(y)

    def loss_from_logits(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        return logsumexp(z, axis=-1) - np.take_along_axis(
            z, np.asarray(y, dtype=np.int64)[..., None], axis=-1)[..., 0]

    def predict(self, w: np.ndarray, X: np.ndarray) -> np.ndarray:
        return softmax(self.logits(w, X), axis=-1)


MODELS: dict[str, type[GLM]] = {m.name: m for m in
                                (LinearRegression, LogisticRegression, FocalLoss,
                                 LinearSVM, SoftmaxRegression)}
NAMED_MODELS.update(MODELS)


def make_model(name: str, dim: int, num_classes: int = 2, **options: Any) -> Model:
    """Build a model by name ('linear', 'logistic', 'focal', 'svm', 'softmax')."""
    if name not in MODELS:
        import difflib
        near = difflib.get_close_matches(name, list(MODELS), n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}.{hint}")
    cls = MODELS[name]
    if cls is SoftmaxRegression:
        return cls(dim, num_classes)
    try:
        return cls(dim, **options)
    except TypeError as e:
        raise ConfigError(f"invalid options {options} for model {name!r}: {e}") from None

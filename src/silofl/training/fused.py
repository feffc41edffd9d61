"""The GLM local pass as a few array operations per step, for all silos at once.

`LocalTrainer.run` draws a whole round first — every step's Poisson batch (one index draw
per silo per round, each step's batch an independent Poisson(q_k) sample) and every
step's noise (`dpsgd.round_noise`). For a GLM with one output on packed tabular rows
(`SiloArrays`) this module then runs the pass with the per-step work cut to the part that
depends on the parameters:

- once per round, from the labels and norms of every sampled row (a small gather):
  the model's prepared labels (`GLM.step_targets`) and each row's clip bound on the
  residual, b_i = mask_i · clip_bound(C) / ‖[x_i, 1]‖ (0 on padding and on rows whose
  ‖x‖² overflows), or the 0/1 mask in the non-private mode;
- per step, for the silos still stepping: gather the rows [x, 1] (one `take`; a round's
  rows together would not stay in cache), logits z = [x, 1]·w (one batched matmul),
  residual r, clipped coefficient clip(r, ±b) — the per-example gradient r·[x, 1]
  clipped to norm ≤ C without being built — the clipped sum Σ coef·[x, 1] (one batched
  matmul, bias included), plus the pre-drawn noise, divided by q_k·n_k.

The mechanism is `GradientRule`'s: the same sampling, clip, noise and scale (float32
logits and sums, as the unfused path's sums; `privacy.clipping.CLIP_MARGIN` covers the
rounding). Everything else takes the general path: other models, image-like data, person
level (weighted rows), node level, partial passes (`coords`), clip = "auto", audit probes,
and instrumented sources (a subclass or a patched `SiloArrays.gather`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from silofl.privacy.clipping import clip_bound
from silofl.training import dpsgd
from silofl.training.dpsgd import GradientRule

#: the general path's steps as shipped: where one is replaced (a test's spy, an audit's
#: injected bug) the pass takes the general path, so the replacement is what runs
_PLAIN_STEPS = (GradientRule.__call__, dpsgd.clip_and_sum, dpsgd.scale)
#: a `training.trainer.LocalTrainer` (not imported: the trainer imports this module)
LocalTrainer = Any
#: `training.trainer.StepRule`: (silos (k,), W (k, P), noised g (k, P)) → new W (k, P)
StepRule = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def applies(trainer: LocalTrainer, plain_gather: object, coords: np.ndarray | None) -> bool:
    """Whether `trainer`'s next example-level pass can run fused (see the module doc).

    Parameters
    ----------
    trainer : LocalTrainer
        The trainer about to run a pass.
    plain_gather : object
        The unpatched `SiloArrays.gather`: a patched or overridden reader (or rule) is
        honoured by the general path.
    coords : numpy.ndarray or None
        The pass's coordinate mask (partial passes are not fused).

    Returns
    -------
    bool
    """
    rule, model, data = trainer.rule, trainer.model, trainer.data
    return (coords is None and type(rule) is GradientRule and rule.adaptive is None
            and (GradientRule.__call__, dpsgd.clip_and_sum, dpsgd.scale) == _PLAIN_STEPS
            and rule.probe is None and getattr(model, "outputs", 0) == 1
            and hasattr(model, "residual_step") and getattr(data, "rows", None) is not None
            and getattr(type(data), "gather", None) is plain_gather
            and not hasattr(data, "expand"))


def prepare(trainer: LocalTrainer, ids: np.ndarray, idx: np.ndarray,
            mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A round's parameter-free parts, from the labels and norms of its sampled rows.

    Parameters
    ----------
    trainer : LocalTrainer
        Its data is `SiloArrays` with packed rows (K, n_max, d + 3).
    ids : numpy.ndarray
        Shape (k,), the hosted silos taking the pass.
    idx, mask : numpy.ndarray
        Shape (S, k, M): the round's sampled indices and their validity.

    Returns
    -------
    flat : numpy.ndarray
        Shape (S, k, M) int64, positions into the flattened packed rows.
    targets : numpy.ndarray
        Shape (S, k, M) float32, `GLM.step_targets` of the labels.
    bound : numpy.ndarray
        Shape (S, k, M) float32: private, each row's bound on |r| (0 on padding);
        non-private, the mask as 0/1.
    """
    rows = trainer.data.rows
    flat = ids[None, :, None] * rows.shape[1] + idx
    aux = trainer.data.gather_rows(flat, -2)  # ‖x‖², y
    targets = trainer.model.step_targets(aux[..., 1])
    if not trainer.rule.private:
        return flat, targets, mask.astype(np.float32)
    # float32 throughout: ‖[x, 1]‖ (an overflowing ‖x‖² gives inf → bound 0) and the
    # bound, a few roundings of 2⁻²⁴ each, well inside clip_bound's margin of 2⁻²⁰
    xnorm = np.sqrt(aux[..., 0] + np.float32(1.0))
    bound = np.multiply(mask, np.float32(clip_bound(trainer.rule.clip)), dtype=np.float32)
    bound /= xnorm
    return flat, targets, bound


def clipped_coef(r: np.ndarray, bound: np.ndarray, private: bool,
                 lower: np.ndarray | None = None) -> np.ndarray:
    """Each row's coefficient on [x, 1]: r clipped to ±bound (private; a NaN residual
    takes a bound, like a huge one), or r·mask (non-private, `bound` the 0/1 mask).

    Parameters
    ----------
    r, bound : numpy.ndarray
        Shape (k, M): residuals and bounds (`prepare`).
    private : bool
        Whether to clip.
    lower : numpy.ndarray, optional
        Shape (k, M), −bound if the caller has it (a pass negates a round's bounds once).

    Returns
    -------
    numpy.ndarray
        Shape (k, M) float32; |coef|·‖[x, 1]‖ ≤ clip_bound(C) per row when private.
    """
    if not private:
        return np.multiply(r, bound, dtype=np.float32)
    coef = np.fmax(r, -bound if lower is None else lower, dtype=np.float32)
    return np.fmin(coef, bound, out=coef)


def run_pass(trainer: LocalTrainer, W: np.ndarray, ids: np.ndarray, steps: np.ndarray,
             draws: tuple[np.ndarray, np.ndarray],
             noise: tuple[np.ndarray, np.ndarray] | None,
             pull: tuple[np.ndarray, np.ndarray | float] | None,
             step: StepRule | None) -> np.ndarray:
    """One local pass of the silos `ids`, fused (already charged and drawn).

    Parameters
    ----------
    trainer : LocalTrainer
        `applies` holds for it.
    W : numpy.ndarray
        Shape (K, P), float64: updated in place for the silos `ids` and returned.
    ids : numpy.ndarray
        Shape (k,), hosted silo indices, ascending.
    steps : numpy.ndarray
        Shape (k,), DP-SGD steps of each.
    draws : (idx, mask)
        Shape (S, k, M) each: the round's Poisson batches.
    noise : (z, offsets) or None
        `dpsgd.round_noise` (private), None in the non-private mode.
    pull : (anchor (K, P), λ (K, 1) or a float) or None
        The MR-MTL pull λ(w − anchor), post-processing.
    step : StepRule or None
        The algorithm's own step in place of w ← w − lr·g.

    Returns
    -------
    numpy.ndarray
        W, shape (K, P).
    """
    private = trainer.rule.private
    flat, targets, bound = prepare(trainer, ids, *draws)
    lower = np.negative(bound) if private else bound  # −bound of the whole round, once
    lr = trainer.lr if step is None else 1.0  # folded into the scale: w − lr·ĝ in one op
    scale = lr / trainer.expected_batch[ids]
    keep, shift = _plain_update(trainer, len(W), pull)
    gather, model = trainer.data.gather_rows, trainer.model
    P, everyone, all_step = W.shape[1], len(ids) == len(W), int(steps.min())
    # a batch's rows come first in its row of idx: each step reads its widest batch only
    widths = draws[1].sum(axis=2).max(axis=1).tolist()
    for s in range(flat.shape[0]):
        pos = slice(None) if s < all_step else np.flatnonzero(steps > s)
        active = ids if isinstance(pos, slice) else ids[pos]
        sel = slice(None) if everyone and isinstance(pos, slice) else active
        cols = slice(0, widths[s])
        Xb = gather(flat[s, pos, cols])[..., :P]  # (k, M_s, d + 1): [x, 1]
        Ws = W[sel]
        z = np.matmul(Xb, Ws.astype(np.float32)[:, :, None])[..., 0]
        coef = clipped_coef(model.residual_step(z, targets[s, pos, cols]),
                            bound[s, pos, cols], private, lower[s, pos, cols])
        g32 = np.matmul(coef[:, None, :], Xb)[:, 0]  # (k, P) the clipped sum
        if noise is not None:
            z_all, off = noise
            g = np.add(g32, z_all[off[s]:off[s + 1]])
            g *= scale[pos, None]
        else:
            g = g32 * scale[pos, None]
        if step is None:  # keep·w + lr·λ·anchor − lr·ĝ = w − lr·(ĝ + l2·w + λ(w − anchor))
            new = Ws * keep[sel] if keep is not None else Ws.copy()
            if shift is not None:
                new += shift[sel]
            new -= g
            W[sel] = new
        else:  # the algorithm's step sees ĝ + l2·w + λ(w − anchor), as on the general path
            if trainer.l2:
                g += trainer.l2 * Ws
            if pull is not None:
                anchor, lam = pull
                g += (lam if isinstance(lam, float) else lam[sel]) * (Ws - anchor[sel])
            W[sel] = step(active, Ws, g)
    trainer.steps_done[ids] += steps
    return W


def _plain_update(trainer: LocalTrainer, K: int,
                  pull: tuple[np.ndarray, np.ndarray | float] | None
                  ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The gradient step's parameter-free parts: keep = 1 − lr·(l2 + λ) (K, 1) and
    shift = lr·λ·anchor (K, P); None where they do nothing (no l2, no pull)."""
    lam = 0.0 if pull is None else pull[1]
    if not trainer.l2 and pull is None:
        return None, None
    keep = np.broadcast_to(1.0 - trainer.lr * (trainer.l2 + np.asarray(lam, dtype=float)),
                           (K, 1))
    return keep, None if pull is None else trainer.lr * np.asarray(lam) * pull[0]


def gradients(trainer: LocalTrainer, W: np.ndarray, ids: np.ndarray, idx: np.ndarray,
              mask: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
    """`LocalTrainer.gradients` fused (already charged and drawn): one step's estimate
    ĝ + l2·w per silo of `ids`, the same arithmetic as a pass's step.

    Parameters
    ----------
    trainer : LocalTrainer
        `applies` holds for it.
    W : numpy.ndarray
        Shape (K, P), not changed.
    ids : numpy.ndarray
        Shape (k,), the silos taking part, ascending.
    idx, mask : numpy.ndarray
        Shape (k, M): their Poisson batches.
    noise : numpy.ndarray or None
        Shape (k, P), their noise at std σ·C (None: non-private).

    Returns
    -------
    numpy.ndarray
        Shape (K, P); the rows of silos not in `ids` are NaN.
    """
    out = np.full(W.shape, np.nan)

    def keep(active: np.ndarray, Ws: np.ndarray, g: np.ndarray) -> np.ndarray:
        out[active] = g
        return Ws

    z = None if noise is None else (noise, np.array([0, len(ids)]))
    run_pass(trainer, np.array(W, dtype=float), ids, np.ones(len(ids), dtype=np.int64),
             (idx[None], mask[None]), z, None, keep)
    return out

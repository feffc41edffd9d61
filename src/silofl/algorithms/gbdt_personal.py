"""Personal leaves for DP federated trees: MR-MTL shrinkage (``[trees] shrink``).

For every shared tree each silo has already released its own noisy per-leaf sums
(G_k, H_k) — they are what the server summed into the shared leaves. A personal leaf value
is post-processing of those releases (free: the ledger does not change). Silo k's leaf v
minimises its second-order loss plus a pull of strength μ towards the shared leaf v_s:

    G_k·v + ½(H_k + λ)·v² + ½μ·(v − v_s)²   ⇒   v_k = (μ·v_s − G_k) / (H_k + λ + μ)

(set the derivative G_k + (H_k + λ)v + μ(v − v_s) to 0). μ = 0 gives the silo's local
Newton leaf −G_k/(H_k + λ); μ → ∞ gives v_s. As in the shared leaves, the noisy H_k may be
negative, so the denominator is at least λ + μ, and v_k is clamped to ±max_leaf.

How the personal leaves enter the model. Silo k's sums of tree t were taken at the SHARED
margin of round t, and so was the pooled step v_s: v_k − v_s is silo k's own gap to the
pooled fit (f_k* − f_pool*, to first order the same at every round) seen through tree t's
partition. Replacing every shared leaf η·v_s by η·v_k would add that same gap once per
tree, T·η times in all (it is never fitted away: the shared margins ignore it) — on CPS1988
this took the per-silo AUC from 0.80 to 0.70. So the personal leaf is

    η·v_s + (v_k − v_s)/T

— the shared model plus the AVERAGE of the T trees' estimates of the gap (an ensemble of
T partitions of the same function). μ = ∞ (or v_k = v_s) leaves the shared model unchanged.

``shrink = "auto"`` (binary tasks): μ = 1/τ², with τ² the between-silo variance of the
leaves, estimated by the DerSimonian–Laird moment estimator from the released sums only.
In the quadratic model above H_k + λ plays the precision of the silo's leaf estimate
(for the logistic loss Var(g) = E h, so Var(G_k) ≈ H_k), and μ the precision of a prior
v ~ N(v_s, τ²): the posterior mode is exactly v_k. Per leaf, the local estimate
v̂_k = −G_k/(H_k + λ) has variance s_k² ≈ (H_k + σ_k²(G² + H²)) / (H_k + λ)² (sampling
plus the silo's DP noise on G_k; σ_k and the clip bounds are public); DerSimonian–Laird's
Q = Σ w_k(v̂_k − v̄)², w_k = 1/s_k², pooled over all leaves of all shared trees gives
τ² = max(0, Σ(Q − (K − 1)) / Σ(Σw − Σw²/Σw)); τ² = 0 means μ = ∞ (personal = shared).
Regression has Var(g) = the unknown residual variance, so "auto" is refused there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from silofl.errors import ConfigError
from silofl.models.trees import Tree


def check_shrink(shrink: Any, task: str) -> float | str | None:
    """Normalise ``shrink``: None/"off" → None, "auto" (binary only), or μ ≥ 0 (inf ok)."""
    if shrink is None or shrink == "off":
        return None
    if shrink == "auto":
        if task != "binary":
            raise ConfigError("shrink = \"auto\" is derived for binary tasks only (it needs "
                              "Var(g) = E h); give a number μ ≥ 0 for regression")
        return "auto"
    try:
        mu = float(shrink)
    except (TypeError, ValueError):
        raise ConfigError(f"shrink must be \"off\", \"auto\" or a number μ ≥ 0, got "
                          f"{shrink!r}") from None
    if not mu >= 0.0:
        raise ConfigError(f"shrink μ must be ≥ 0 (0: local leaves, inf: shared), got {mu}")
    return mu


def shrunk_leaf(v_shared: np.ndarray, G: np.ndarray, H: np.ndarray, lam: float, mu: float,
                max_leaf: float) -> np.ndarray:
    """v_k = clip((μ·v_s − G_k) / max(H_k + λ + μ, λ + μ), ±max_leaf) (before η).

    Parameters
    ----------
    v_shared, G, H : numpy.ndarray
        (L,) shared leaf values before η, and the silo's noisy Σg, Σh per leaf.
    lam, mu, max_leaf : float
        λ, μ (inf: the shared values) and the clamp.

    Returns
    -------
    numpy.ndarray
        (L,) personal leaf values before η.
    """
    if np.isinf(mu):
        return np.asarray(v_shared, dtype=np.float64).copy()
    v = (mu * v_shared - G) / np.maximum(H + lam + mu, lam + mu)
    return np.clip(v, -max_leaf, max_leaf)


def auto_tau2(per_tree: list[list[tuple[float, np.ndarray, np.ndarray]]], trees: list[Tree],
              lam: float, clip_g: float, clip_h: float) -> float:
    """τ², the between-silo variance of the leaves, by DerSimonian–Laird over all leaves of
    the shared trees (module docstring); μ = 1/τ² (τ² = 0: μ = ∞, personal = shared).
    The server computes it from the releases it received (post-processing) and sends it
    with the MODEL message.

    Parameters
    ----------
    per_tree : list (trees) of list (silos that answered) of (σ_k, Σg, Σh)
        Each answering silo's σ_k (public) and its released noisy leaf sums, (2^D,) each.
    trees : list of Tree
        The shared trees (their leaves' `slot` index the sums).
    lam, clip_g, clip_h : float
        λ and the clip bounds G, H.

    Returns
    -------
    float
        τ² ≥ 0.
    """
    num = den = 0.0
    d2 = clip_g ** 2 + clip_h ** 2
    for rel, tree in zip(per_tree, trees, strict=True):
        K = len(rel)
        if K < 2:
            continue
        slots = _leaf_slots(tree)
        sig2 = np.square([r[0] for r in rel])[:, None]
        G = np.stack([r[1][slots] for r in rel])  # (K, L)
        H = np.maximum(np.stack([r[2][slots] for r in rel]), 0.0)
        v = -G / (H + lam)
        w = 1.0 / ((H + sig2 * d2) / (H + lam) ** 2)
        vbar = (w * v).sum(0) / w.sum(0)
        num += float((w * (v - vbar) ** 2).sum(0).sum() - (K - 1) * v.shape[1])
        den += float((w.sum(0) - (w ** 2).sum(0) / w.sum(0)).sum())
    return max(0.0, num / den) if den > 0 else 0.0


def mu_from_tau2(tau2: float) -> float:
    """μ = 1/τ² (∞ when τ² = 0)."""
    return np.inf if tau2 <= 0.0 else 1.0 / tau2


def _leaf_slots(tree: Tree) -> np.ndarray:
    if tree.slot is None:
        raise ConfigError("personal leaves need trees built by Tree.from_complete (leaf slots)")
    return tree.slot[tree.feature < 0]


def personal_trees(shared: list[Tree], own: np.ndarray, mu: float, *, lr: float, lam: float,
                   max_leaf: float, shared_sums: np.ndarray | None = None) -> list[Tree]:
    """One silo's personal leaves: the shared trees with each leaf moved by one T-th of
    its shrunk gap (module docstring); post-processing of the silo's own releases.

    Parameters
    ----------
    shared : list of Tree
        The T shared trees.
    own : numpy.ndarray
        (≥ T, 2, 2^D) the silo's own released noisy (Σg, Σh) per tree; the first T
        belong to the shared trees.
    mu : float
        μ ≥ 0 (inf: the shared leaves).
    lr, lam, max_leaf : float
        η, λ and the leaf clamp of the shared leaves.
    shared_sums : numpy.ndarray, optional
        (T, 2, 2^D) the summed noisy (Σg, Σh) the MODEL message carries: the shared leaf
        v_s = clip(−G/max(H + λ, λ)) is taken from them (else from the trees' values / η).

    Returns
    -------
    list of Tree
        T trees.
    """
    out = []
    T = len(shared)
    for t, tree in enumerate(shared):
        is_leaf = tree.feature < 0
        value = tree.value.copy()
        if not np.isinf(mu):  # μ = ∞: exactly the shared leaves
            slots = _leaf_slots(tree)
            if shared_sums is None:
                v_s = tree.value[is_leaf] / lr
            else:  # the server's leaf rule on the sums it sent (gbdt_programs.GbdtServer)
                G, H = shared_sums[t][0][slots], shared_sums[t][1][slots]
                v_s = np.clip(-G / np.maximum(H + lam, lam), -max_leaf, max_leaf)
            v_k = shrunk_leaf(v_s, own[t][0][slots], own[t][1][slots], lam, mu, max_leaf)
            value[is_leaf] += (v_k - v_s) / T  # one T-th of this tree's view of the gap
        out.append(Tree(tree.feature, tree.threshold, tree.left, tree.right, value,
                        tree.slot))
    return out

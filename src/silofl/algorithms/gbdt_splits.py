"""Splits the server chooses from public randomness or a public rule (no release needed):
only each tree's leaf sums are released.

* ``random`` (as in DP-EBM's random splits): every node's feature (among the tree's
  released features) and split bin drawn uniformly.
* ``cyclic`` (DP-EBM's cyclic boosting, Nori et al. 2021): tree t uses the single feature
  t mod d and splits its bin range in halves at every level, so with n_bins = 2^depth its
  leaves are the feature's bins — each tree is one feature's whole shape function,
  learned from one leaf release (an example falls in one leaf: Δ² = G² + H²).

And the server's rule for ``histogram`` splits: the best split of every node from the
summed noisy level histograms (`best_splits`).
"""

from __future__ import annotations

import math

import numpy as np

#: auto bins: pooled rows per bin ≥ ROWS_PER_NOISE × the std of the summed leaf noise
ROWS_PER_NOISE = 3.0
MAX_AUTO_BINS = 64


def auto_bins(n_rows: int, sigmas: list[float], clip_g: float, clip_h: float) -> int:
    """Bins for cyclic splits (leaves = bins) from public quantities only.

    A leaf's summed Σg carries noise of std s = √(Σ_k σ_k²)·√(G² + H²) (every silo's
    leaf release); a bin holding n/B of the pooled rows has a signal that grows with
    n/B. B is the power of two nearest to n / (ROWS_PER_NOISE·s), within [2, 64]: finer
    bins where rows are many or the noise small. ROWS_PER_NOISE = 3 reproduces the bins
    chosen on the development set (Titanic: 4 bins at ε = 0.3, 16 at ε = 1).

    Parameters
    ----------
    n_rows : int
        Σ_k n_k, the silos' training rows (public by the project's assumption).
    sigmas : list of float
        Each silo's noise multiplier σ_k (0: non-private).
    clip_g, clip_h : float
        G and H.

    Returns
    -------
    int
        B, a power of two in [2, MAX_AUTO_BINS].
    """
    s = math.sqrt(sum(x * x for x in sigmas) * (clip_g ** 2 + clip_h ** 2))
    if s == 0.0:
        return MAX_AUTO_BINS
    ratio = n_rows / (ROWS_PER_NOISE * s)
    return int(min(MAX_AUTO_BINS, max(2, 2 ** round(math.log2(max(ratio, 1.0))))))


def cyclic_depth(n_bins: int) -> int:
    """The depth whose complete tree has a leaf per bin: ⌈log2 B⌉."""
    return max(1, math.ceil(math.log2(n_bins)))


def public_features(splits: str, t: int, d: int, m: int,
                    rng: np.random.Generator) -> np.ndarray:
    """The (sorted) features tree `t` may use: feature t mod d for ``cyclic``; else m of
    the d drawn from the server's public `rng` (all when m = d).

    Returns
    -------
    numpy.ndarray
        (m,) or (1,) int column indices.
    """
    if splits == "cyclic":
        return np.array([t % d])
    return np.sort(rng.choice(d, m, replace=False)) if m < d else np.arange(d)


class PublicSplits:
    """The server's split rule for ``random`` or ``cyclic`` splits (module docstring).

    Parameters
    ----------
    kind : {"random", "cyclic"}
    rng : numpy.random.Generator
        Public randomness (random splits).
    """

    def __init__(self, kind: str, rng: np.random.Generator) -> None:
        self.kind = kind
        self.rng = rng

    def choose(self, level: int, n_features: int, B: int) -> tuple[np.ndarray, np.ndarray]:
        """Per node of `level` (2^level of them): the index into the tree's features and
        the split bin k in 1..B − 1 (a row goes left when its bin < k).

        Returns
        -------
        (numpy.ndarray, numpy.ndarray)
            (2^level,) int each.
        """
        slots = 2 ** level
        if self.kind == "random":
            return (self.rng.integers(0, n_features, slots),
                    self.rng.integers(1, B, slots))
        # cyclic: node r of the level covers bins [r·B/2^L, (r+1)·B/2^L): split in halves
        r = np.arange(slots)
        k = np.floor((2 * r + 1) * B / 2 ** (level + 1)).astype(np.int64)
        return np.zeros(slots, dtype=np.int64), np.clip(k, 1, B - 1)


def best_splits(hg: np.ndarray, hh: np.ndarray, lam: float,
                min_child_hessian: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The best split of every node from its (summed, noisy) histograms.

    Parameters
    ----------
    hg, hh : numpy.ndarray
        (slots, m, B) gradient and hessian sums per node, released feature and bin.
    lam : float
        L2 leaf regularisation λ.
    min_child_hessian : float
        Smallest Σh allowed in either child.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray, numpy.ndarray)
        Per slot: the index into the released features (int), the split bin k in 1..B−1
        (a row goes left when its bin < k; B when the node does not split) and the gain
        (−inf when it does not split).
    """
    GL = np.cumsum(hg, axis=2)[:, :, :-1]  # (slots, m, B−1): bins < k for k = 1..B−1
    HL = np.cumsum(hh, axis=2)[:, :, :-1]
    G = hg.sum(axis=2, keepdims=True)
    H = hh.sum(axis=2, keepdims=True)
    GR, HR = G - GL, H - HL
    ok = (HL >= min_child_hessian) & (HR >= min_child_hessian) & (H + lam > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = GL ** 2 / (HL + lam) + GR ** 2 / (HR + lam) - G ** 2 / (H + lam)
    gain = np.where(ok, gain, -np.inf)
    slots, m, K = gain.shape
    flat = gain.reshape(slots, m * K)
    best = np.argmax(flat, axis=1)
    top = flat[np.arange(slots), best]
    j, k = best // K, best % K + 1
    split = top > 0
    B = K + 1
    return j, np.where(split, k, B), np.where(split, top, -np.inf)

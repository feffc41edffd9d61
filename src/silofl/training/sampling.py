"""Poisson subsampling for many silos at once, at O(batch) cost.

Each example of silo k joins a step's batch independently with probability q_k — the
sampling that the Poisson-subsampled Gaussian accountant assumes. Instead of flipping n_k
coins we draw the gaps between selected indices, which are Geometric(q_k): the positions
are cumulative sums of gaps, so the work is proportional to the batch, not the silo.
"""

from __future__ import annotations

import numpy as np

from silofl.privacy.randomness import Randomness


def poisson_batches(n: np.ndarray, q: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
    """Draw one Poisson batch per silo.

    n: (K,) silo sizes; q: (K,) sampling rates in (0, 1].
    Returns idx (K, M) int64 and mask (K, M) bool: row k's selected indices are
    idx[k, mask[k]] (sorted, distinct, < n[k]); padded entries hold 0.
    """
    n = np.asarray(n, dtype=np.int64)
    q = np.asarray(q, dtype=np.float64)
    mean = q * n
    # width covering the batch size with high probability; longer rows are extended below
    m = int(np.max(np.minimum(n, np.ceil(mean + 4 * np.sqrt(mean * (1 - q)) + 4)))) + 1
    # 1/log(1−q); 0 when q = 1 so that every gap is 0 (all examples selected)
    inv = np.zeros_like(q)
    inv[q < 1] = 1.0 / np.log1p(-q[q < 1])
    inv = inv[:, None]
    pos = _positions(rng.uniform((len(n), m)), inv)
    # Rare: a row whose m draws did not run past n needs more gaps.
    while np.any(short := pos[:, -1] < n - 1):
        more = _positions(rng.uniform((len(n), m)), inv) + pos[:, -1:] + 1
        more[~short] = np.iinfo(np.int64).max
        pos = np.concatenate([pos, more], axis=1)
    mask = pos < n[:, None]
    width = max(int(mask.sum(axis=1).max()), 1)
    idx = np.where(mask, pos, 0)[:, :width]
    return idx, mask[:, :width]


def _positions(u: np.ndarray, inv_log1mq: np.ndarray) -> np.ndarray:
    gaps = np.floor(np.log(u) * inv_log1mq).astype(np.int64)  # Geometric(q) − 1 ≥ 0
    return np.cumsum(gaps + 1, axis=1) - 1

"""Poisson subsampling for many silos at once, at O(batch) cost.

Each example of silo k joins a step's batch independently with probability q_k — the
sampling that the Poisson-subsampled Gaussian accountant assumes. Instead of flipping n_k
coins we draw the gaps between selected indices, which are Geometric(q_k): the positions
are cumulative sums of gaps, so the work is proportional to the batch, not the silo.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from silofl.privacy.randomness import Randomness


def poisson_batches(n: np.ndarray, q: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
    """Draw one Poisson batch per silo.

    n: (K,) silo sizes; q: (K,) sampling rates in (0, 1].
    Returns idx (K, M) int64 and mask (K, M) bool: row k's selected indices are
    idx[k, mask[k]] (sorted, distinct, < n[k]), the first mask[k].sum() entries of the
    row; padded entries (after them) hold 0.
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


# --- node-level privacy unit --------------------------------------------------------------
# Batches of exactly b of a silo's n units, drawn uniformly *without replacement*, one
# draw per step — the sampling the node-level (hypergeometric) accountant assumes
# (`silofl.privacy.node_level`). The samplers live in `silofl.training.node_sampling` (numba,
# exact rejection sampling from the secure stream); imported lazily: numba is optional.

#: the ledger label of a node-level local pass
NODE_LABEL = "node-dpsgd"


@dataclass(frozen=True)
class NodeUnit:
    """The node-level privacy unit of a `LocalTrainer`: a person (node) appears in at most
    `S` of a silo's examples; `adjacency` ("node+edges" or "node", see
    `privacy.node_level.ADJACENCIES`) says how many examples one replaced person changes.
    `names` (K,) key each silo's seeded streams together with `seed` (reproducible mode
    only); a secure trainer draws every batch and its noise from a fresh CSPRNG."""

    S: int = 1
    adjacency: str = "node+edges"
    names: tuple[str, ...] = ()
    seed: int = 0


def secure_randomness() -> Randomness:
    """A CSPRNG keyed from OS entropy (`Randomness.secure` where it exists, else
    `Randomness.os_entropy`): one per silo and local pass of a secure node-level run."""
    factory = getattr(Randomness, "secure", None)
    return factory() if callable(factory) else Randomness.os_entropy()


def seeded_streams(seed: int, name: str, round: int,
                   pass_index: int = 0) -> tuple[np.random.Generator, Randomness]:
    """The *seeded* (batch generator, noise source) of silo `name` in `round`, derived
    from (seed, name, round) only — so a silo trained alone (a networked client) draws
    exactly what it draws in the simulator; a second pass in the same round (Ditto)
    appends its index to the key. Reproducible: not a privacy guarantee."""
    key = [int(seed), zlib.crc32(name.encode()), int(round)]
    if pass_index:
        key.append(1000 + int(pass_index))
    return np.random.default_rng([*key, 1]), Randomness.seeded([*key, 7])


class BatchSampler(Protocol):
    """Draws one node-level batch: b distinct unit indices of a silo."""

    def draw(self, b: int) -> np.ndarray:
        """(b,) int64 indices, without replacement."""
        ...


def node_streams(unit: NodeUnit, silo: int, round: int, n: int, secure: bool,
                 pass_index: int = 0) -> tuple[BatchSampler, Randomness]:
    """(sampler with ``.draw(b)``, noise `Randomness`) of silo `silo` for one local pass
    in `round`. Secure: one fresh OS-entropy CSPRNG for both, batches by exact partial
    Fisher–Yates (`UniformBatches`); seeded: `seeded_streams` (``rng.choice`` batches)."""
    from silofl.training.node_sampling import SeededBatches, UniformBatches
    if secure:
        rand = secure_randomness()
        return UniformBatches(n, rand), rand
    rng, noise = seeded_streams(unit.seed, unit.names[silo], round, pass_index)
    return SeededBatches(n, rng), noise

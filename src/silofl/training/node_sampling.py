"""Batches of ``b`` of ``n`` persons drawn uniformly without replacement — the sampling
the node-level accountant assumes — from a `silofl.privacy.randomness.Randomness`.

`UniformBatches` is used with a secure (OS-entropy) stream: every draw is exact.  Each
uniform of a `Randomness` is ``(k + 1)·2⁻⁵³`` for a uniform integer ``k < 2⁵³``, so ``k``
is recovered exactly and turned into a uniform integer below ``m`` by rejection
(``k < 2⁵³ − (2⁵³ mod m)``, then ``k mod m``): no floating-point rounding bias, which
would add to δ (``floor(u·m)`` is off by up to ``m·2⁻⁵⁴`` in total variation per draw).
The batch is a partial Fisher–Yates shuffle of a permutation kept between steps:
whatever the starting permutation, the first ``b`` entries after the ``b`` swaps are a
uniformly random ordered ``b``-subset, so consecutive batches are independent.

`SeededBatches` wraps NumPy's seeded ``Generator.choice`` (the reproducible mode).
"""

from __future__ import annotations

import numpy as np

from silofl.errors import ConfigError
from silofl.privacy.randomness import Randomness

try:
    import numba as nb
except ImportError as exc:  # numba is in the optional "pandemic" extra
    raise ConfigError("batch sampling needs numba: install it with "
                      "`pip install -e '.[pandemic]'`") from exc

_TWO53 = 1 << 53


@nb.njit(cache=True)
def _partial_shuffle(perm: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Swap perm[i] with perm[i + offsets[i]] for i = 0..b−1; return perm[:b] (a copy)."""
    b = offsets.shape[0]
    out = np.empty(b, np.int64)
    for i in range(b):
        j = i + offsets[i]
        t = perm[i]
        perm[i] = perm[j]
        perm[j] = t
        out[i] = perm[i]
    return out


def uniform_integers(rand: Randomness, m: np.ndarray) -> np.ndarray:
    """(len(m),) int64: entry i uniform on 0..m[i]−1 (m[i] ≥ 1, < 2⁵³), exactly."""
    m = np.asarray(m, dtype=np.int64)
    out = np.empty(m.size, np.int64)
    todo = np.arange(m.size)
    while todo.size:
        u = rand.uniform(todo.size)
        k = (u * float(_TWO53)).astype(np.int64) - 1  # exact: u = (k + 1)·2⁻⁵³
        mm = m[todo]
        ok = k < _TWO53 - (_TWO53 % mm)
        out[todo[ok]] = k[ok] % mm[ok]
        todo = todo[~ok]  # rejected (probability < m·2⁻⁵³): draw again
    return out


class UniformBatches:
    """Batches of ``b`` of ``n`` indices, uniformly without replacement, from ``rand``."""

    def __init__(self, n: int, rand: Randomness):
        self.n = int(n)
        self.rand = rand
        self.perm = np.arange(self.n, dtype=np.int64)

    def draw(self, b: int) -> np.ndarray:
        b = int(b)
        if not 0 < b <= self.n:
            raise ConfigError(f"batch size {b} must lie in 1..{self.n}")
        offsets = uniform_integers(self.rand, self.n - np.arange(b, dtype=np.int64))
        return _partial_shuffle(self.perm, offsets)


class SeededBatches:
    """The reproducible mode's batches: ``rng.choice(n, b, replace=False)``."""

    def __init__(self, n: int, rng: np.random.Generator):
        self.n = int(n)
        self.rng = rng

    def draw(self, b: int) -> np.ndarray:
        return self.rng.choice(self.n, size=int(b), replace=False)

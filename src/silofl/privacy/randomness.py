"""Sources of randomness for sampling and noise.

- `Randomness.seeded(seed)`: NumPy PCG64, reproducible — for experiments.
- `Randomness.secure()`: every uniform and Gaussian drawn from the operating system's
  entropy pool (`os.urandom`), so no seed can be recovered from released models — for
  deployments. (Like most DP libraries we use floating-point Gaussians; see Mironov 2012
  on the theoretical floating-point caveat.)

Both expose the same draws the engine needs; batch sampling and the Gumbel noise of private
selection are built on `uniform` so that both modes sample exactly the same distribution.
"""

from __future__ import annotations

import os

import numpy as np


class Randomness:
    secure: bool = False

    @staticmethod
    def seeded(seed: int) -> "Randomness":
        return _Seeded(seed)

    @staticmethod
    def os_entropy() -> "Randomness":
        return _Secure()

    def uniform(self, shape) -> np.ndarray:  # in (0, 1]
        raise NotImplementedError

    def normal(self, shape) -> np.ndarray:
        raise NotImplementedError

    def gumbel(self, shape) -> np.ndarray:
        """Standard Gumbel(0, 1) draws, −log(−log U) with U uniform in (0, 1): the noise of
        report-noisy-max, which samples the exponential mechanism exactly."""
        u = np.asarray(self.uniform(shape), dtype=float)
        while np.any(top := u >= 1.0):  # U = 1 (probability 2^-53) would give +∞: redraw
            u[top] = self.uniform(int(top.sum()))
        return -np.log(-np.log(u))

    def spawn(self) -> "Randomness":
        """An independent stream (for an independent component, e.g. evaluation)."""
        raise NotImplementedError


class _Seeded(Randomness):
    def __init__(self, seed):
        self.gen = np.random.Generator(np.random.PCG64(seed))

    def uniform(self, shape):
        return 1.0 - self.gen.random(shape)  # [0,1) → (0,1]

    def normal(self, shape):
        return self.gen.standard_normal(shape)

    def spawn(self):
        return _Seeded(self.gen.integers(2**63))


class _Secure(Randomness):
    secure = True

    def uniform(self, shape):
        size = int(np.prod(shape))
        bits = np.frombuffer(os.urandom(8 * size), dtype=np.uint64) >> np.uint64(11)
        return ((bits.astype(np.float64) + 1.0) * 2.0**-53).reshape(shape)

    def normal(self, shape):
        size = int(np.prod(shape))
        half = (size + 1) // 2
        u1, u2 = self.uniform(half), self.uniform(half)
        r = np.sqrt(-2.0 * np.log(u1))  # Box–Muller
        z = np.concatenate([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)])
        return z[:size].reshape(shape)

    def spawn(self):
        return _Secure()

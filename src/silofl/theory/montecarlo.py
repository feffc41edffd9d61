"""Monte-Carlo simulation of the mean-estimation model, with the library's own mechanism.

Each repetition draws the silo centres w_k = θ + N(0, τ²), n_k points per silo, clips
them to [−c, c] (Assumption D.3.2 made real: nothing is assumed away), sums them, adds
the Gaussian noise N(0, (z_k c)²) with `silofl.training.dpsgd.add_noise` (the mechanism
DP-SGD uses) from a `Randomness` stream, divides by the public n_k, and scores Local,
FedAvg and MR-MTL(λ) for every λ asked, all on the same draws (common random numbers,
so differences between estimators are measured precisely).

The stream is `Randomness.seeded(seed)` by default: a simulation, not a release — nothing
private is involved. Errors are squared distances to the true w_k (squared data units).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from silofl.errors import ConfigError
from silofl.privacy.randomness import Randomness
from silofl.theory.model import MeanEstimation, alpha
from silofl.training.dpsgd import add_noise

#: 99.9% two-sided normal quantile: the default CI of `Simulation.ci`
Z999 = 3.2905267314918945
_CHUNK_DRAWS = 1 << 22  # data points per chunk (32 MiB of float64)


@dataclass(frozen=True)
class Simulation:
    """errors[r, l, k]: squared error of silo k's estimate number l in repetition r;
    estimates: names ("local", "fedavg", then "mrmtl(λ)" per λ), lambdas: (L, K) λ per
    estimate and silo (0: local, inf: fedavg)."""

    errors: np.ndarray
    estimates: tuple[str, ...]
    lambdas: np.ndarray

    @property
    def reps(self) -> int:
        return self.errors.shape[0]

    def pooled(self) -> np.ndarray:
        """(R, L): each repetition's error averaged over silos (iid over repetitions)."""
        return self.errors.mean(axis=2)

    def mean(self, per_silo: bool = False) -> np.ndarray:
        """(L,) pooled mean error, or (L, K) per silo."""
        return self.errors.mean(axis=0) if per_silo else self.pooled().mean(axis=0)

    def ci(self, per_silo: bool = False, z: float = Z999) -> np.ndarray:
        """Half-width of the normal CI of `mean` (repetitions are independent)."""
        x = self.errors if per_silo else self.pooled()
        return z * x.std(axis=0, ddof=1) / np.sqrt(self.reps)

    def diff(self, i: int, j: int, per_silo: bool = False, z: float = Z999):
        """(mean, CI half-width) of error[i] − error[j], paired over repetitions."""
        x = self.errors if per_silo else self.pooled()
        d = x[:, i] - x[:, j]
        return d.mean(axis=0), z * d.std(axis=0, ddof=1) / np.sqrt(self.reps)


def simulate(m: MeanEstimation, lambdas=(), reps: int = 2000,
             rng: Randomness | None = None, seed: int = 0) -> Simulation:
    """Simulate `reps` independent repetitions of model `m`.

    lambdas: MR-MTL strengths to score, (L,) shared by all silos or (L, K) per silo (e.g.
    each silo's λ_k*); inf means FedAvg. Returns a `Simulation` whose estimates are
    local, fedavg, then one per row of lambdas."""
    if isinstance(reps, bool) or not isinstance(reps, (int, np.integer)) or reps < 2:
        raise ConfigError(f"reps must be an integer ≥ 2 (the CI needs a spread), got {reps!r}")
    K = m.K
    lam = np.asarray(lambdas, dtype=float)
    lam = lam.reshape(-1, 1) * np.ones((1, K)) if lam.ndim <= 1 else lam
    if lam.ndim != 2 or lam.shape[1] != K:
        raise ConfigError(f"lambdas must be (L,) or (L, K={K}), got shape {lam.shape}")
    lam = np.vstack([np.zeros((1, K)), np.full((1, K), np.inf), lam])
    a = alpha(lam, K)  # (L, K); validates λ ≥ 0
    rng = rng if rng is not None else Randomness.seeded(seed)
    n = np.asarray(m.n)
    n_max = int(n.max())
    mask = np.arange(n_max)[None, :] < n[:, None]          # (K, n_max)
    sd = np.sqrt(np.asarray(m.sigma2, dtype=float))[None, :, None]  # (1, K, 1)
    std = m.sigma_dp                                        # (K,)
    out = np.empty((reps, lam.shape[0], K))
    chunk = max(1, _CHUNK_DRAWS // (K * n_max))
    for start in range(0, reps, chunk):
        R = min(chunk, reps - start)
        w = m.theta + np.sqrt(m.tau2) * rng.normal((R, K))            # (R, K)
        x = w[:, :, None] + sd * rng.normal((R, K, n_max))
        sums = (np.clip(x, -m.clip, m.clip) * mask[None]).sum(axis=2)  # (R, K)
        if m.private:
            sums = add_noise(sums.T, std, rng).T  # the library's Gaussian mechanism
        w_hat = sums / n[None, :]
        w_out = (w_hat.sum(axis=1, keepdims=True) - w_hat) / (K - 1)  # ŵ_\k
        est = a[None] * w_hat[:, None, :] + (1 - a[None]) * w_out[:, None, :]
        out[start:start + R] = (est - w[:, None, :]) ** 2
    names = ("local", "fedavg") + tuple(
        f"mrmtl({_fmt(row)})" for row in lam[2:])
    return Simulation(errors=out, estimates=names, lambdas=lam)


def _fmt(row: np.ndarray) -> str:
    return f"{row[0]:g}" if np.all(row == row[0]) else "per-silo λ"

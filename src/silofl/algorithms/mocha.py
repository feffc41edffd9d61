"""Mocha (Smith et al. 2017) in primal form trained with DP-SGD (appendix B.3).

W (K, P) stacks the silos' personal models; the objective adds ½λ·tr(Wᵀ Ω W) with a
task-relationship matrix Ω (K, K), so silo k's penalty gradient is
    λ(ΩW)_k = λ(Ω_kk w_k + Σ_{j≠k} Ω_kj w_j),
with the other silos' w_j from the previous round (held by the server). Ω starts at I/K and
after every round the server sets, from the Gram matrix W Wᵀ = V diag(d) Vᵀ,
    Ω = V diag(√d / Σ√d) Vᵀ,  d clamped below at a small positive floor,
as the thesis's reference implementation does. (Zhang & Yeung's closed form — which the
original Mocha code applies to the *covariance* and then inverts — would use Ω⁻¹ in the
penalty; we follow the thesis's code.)

Privacy: the penalty depends only on already-released (noised) models and on the silo's
own private iterate, so it is added after the noise and costs nothing: Mocha takes the same
DP-SGD steps as Local, FedAvg and MR-MTL and spends exactly the same privacy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.base import Algorithm, SiloState, check_nonnegative

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer

#: floor for the Gram eigenvalues (keeps Ω positive definite, so every Ω_kk > 0)
EIG_FLOOR = 1e-8


def mocha_omega(W: np.ndarray, floor: float = EIG_FLOOR) -> np.ndarray:
    """Ω (K, K) = V diag(√d/Σ√d) Vᵀ from W Wᵀ = V diag(d) Vᵀ, W (K, P), d ≥ floor."""
    d, V = np.linalg.eigh(W @ W.T)
    r = np.sqrt(np.maximum(d, floor))
    return (V * (r / r.sum())) @ V.T


@dataclass
class MochaServer:
    params: np.ndarray  # (K, P) the personal models released last round
    omega: np.ndarray   # (K, K) task-relationship matrix


class Mocha(Algorithm[SiloState, MochaServer]):
    name = "mocha"

    def __init__(self, lam: float) -> None:
        self.lam = check_nonnegative("lambda (lam)", lam)

    def init(self, params0: np.ndarray, num_silos: int,
             rounds: int | None = None) -> tuple[SiloState, MochaServer]:
        W = np.tile(params0, (num_silos, 1))
        return SiloState(W.copy()), MochaServer(W, np.eye(num_silos) / num_silos)

    def broadcast(self, server: MochaServer) -> tuple[Any, ...]:
        """(W (K, P), Ω (K, K)); a networked silo k also gets its index: (W, Ω, [k])."""
        return server.params, server.omega

    def silo_step(self, silos: SiloState, message: tuple[Any, ...],
                  trainer: LocalTrainer, round: int) -> tuple[SiloState, np.ndarray]:
        W_prev, omega, *hosted = message
        # the rows of the silos this process hosts: all (simulator) or its own (network)
        rows = hosted[0] if hosted else slice(None)
        diag = np.diag(omega)[rows]
        cross = omega[rows] @ W_prev - diag[:, None] * W_prev[rows]  # Σ_{j≠k} Ω_kj w_j
        # λ(Ω_kk w_k + cross_k) written as the trainer's pull λ_k (w_k − anchor_k)
        new = trainer.run(silos.params, anchor=-cross / diag[:, None], lam=self.lam * diag,
                          round=round)
        return SiloState(new), new - silos.params

    def server_step(self, server: MochaServer, update: np.ndarray,
                    weights: np.ndarray) -> MochaServer:
        W = server.params + update
        return MochaServer(W, mocha_omega(W))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "lam": self.lam}

"""APFL (Deng et al. 2020): adaptive personalized federated learning.

Each silo keeps a personal model v_k and a mixing weight α_k ∈ [0, 1]; its model is the
mixture v̄_k = α_k v_k + (1 − α_k) w of v_k and the global model w. Each round silo k makes
two DP-SGD passes over its data:
  1. on the global model, from the broadcast w (its change is averaged on the server, as in
     FedAvg);
  2. on its mixture, with w the broadcast model held fixed: each step, at ĝ = ĝ(v̄_k),
        v_k ← v_k − lr·α_k·ĝ,
        α_k ← clip_[0,1](α_k − lr_α·⟨v_k − w, ĝ⟩)
     (both from the values before the step; ∇_v ℓ(v̄) = α_k ∇ℓ(v̄) and
     ∂ℓ(v̄)/∂α = ⟨v_k − w, ∇ℓ(v̄)⟩, the paper's eq. 10 and its α-update), then
     v̄_k = α_k v_k + (1 − α_k) w.
The paper interleaves the two updates step by step on one minibatch; under DP each pass is
its own sequence of Poisson-sampled Gaussian releases, so they run one after the other.

Privacy: two touches of the data per round, so `passes_per_round = 2`: σ is calibrated for
twice the steps of FedAvg at the same ε (as Ditto), and the passes are charged separately
as "dpsgd-global" and "dpsgd-personal". α_k's gradient is computed from the personal
pass's *noised* gradient ĝ, v_k and the released w: post-processing, free. The silo's
model is v̄_k with the server's current w (v_k and α_k never leave the silo).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.base import (
    Algorithm,
    ServerState,
    SiloState,
    apply_mean_update,
    check_fraction,
    check_nonnegative,
)

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer


@dataclass
class ApflSilos(SiloState):
    alpha: np.ndarray | None = None  # (K,) each silo's mixing weight α_k


class APFL(Algorithm[ApflSilos, ServerState]):
    """APFL with mixing weights learned at the silos from their noised gradients."""

    name = "apfl"
    passes_per_round = 2

    def __init__(self, alpha: float = 0.5, alpha_lr: float = 0.0,
                 weighted: bool = True) -> None:
        self.alpha = check_fraction("APFL's initial mixing weight apfl_alpha", alpha,
                                    low_open=False, high_open=False)
        # 0: the training lr (as the paper, one step size for v, w and α)
        self.alpha_lr = check_nonnegative("APFL's mixing-weight step apfl_alpha_lr", alpha_lr)
        self.weighted = bool(weighted)

    def init(self, params0: np.ndarray, num_silos: int,
             rounds: int | None = None) -> tuple[ApflSilos, ServerState]:
        return (ApflSilos(np.tile(params0, (num_silos, 1)), np.full(num_silos, self.alpha)),
                ServerState(params0.copy()))

    def silo_step(self, silos: ApflSilos, message: np.ndarray, trainer: LocalTrainer,
                  round: int) -> tuple[ApflSilos, np.ndarray]:
        K = silos.params.shape[0]
        w = np.tile(message, (K, 1))
        glob = trainer.run(w, round=round, label="dpsgd-global")
        v = silos.params.copy()
        alpha = self._alphas(silos).copy()
        lr, a_lr = trainer.lr, self.alpha_lr or trainer.lr

        def step(active: np.ndarray, vbar: np.ndarray, g: np.ndarray) -> np.ndarray:
            # g: the noised gradient at the mixture (post-processing from here on)
            a, v_a, w_a = alpha[active], v[active], w[active]
            grad_a = np.einsum("kp,kp->k", v_a - w_a, g)
            v[active] = v_a - lr * a[:, None] * g
            alpha[active] = a = np.clip(a - a_lr * grad_a, 0.0, 1.0)
            return a[:, None] * v[active] + (1 - a[:, None]) * w_a

        vbar0 = alpha[:, None] * v + (1 - alpha[:, None]) * w
        trainer.run(vbar0, round=round, label="dpsgd-personal", step=step)
        return ApflSilos(v, alpha), glob - w

    def server_step(self, server: ServerState, update: np.ndarray | None,
                    weights: np.ndarray) -> ServerState:
        if update is None:
            return server
        return apply_mean_update(server, update, weights)

    def personal_models(self, silos: ApflSilos, server: ServerState) -> np.ndarray:
        a = self._alphas(silos)[:, None]
        return a * silos.params + (1 - a) * server.params[None, :]

    def _alphas(self, silos: ApflSilos) -> np.ndarray:
        """(K,) each silo's mixing weight α_k (the starting α before any is stored)."""
        if silos.alpha is None:
            return np.full(silos.params.shape[0], self.alpha)
        return np.asarray(silos.alpha, dtype=float)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "alpha": self.alpha, "alpha_lr": self.alpha_lr,
                "weighted": self.weighted, "passes_per_round": self.passes_per_round}

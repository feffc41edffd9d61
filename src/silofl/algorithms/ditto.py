"""Ditto (Li et al. 2021; appendix B.3) with a FedAvg global solver.

Each round every silo makes two DP-SGD passes over its data: one on the global model
(whose change is averaged on the server, as in FedAvg) and one on its personal model v_k with
the proximal pull λ(v_k − w), w the global model broadcast this round:
    v_k ← v_k − lr·(ĝ(v_k) + λ(v_k − w)).
The pull uses only released quantities and is added after the noise (free, as in MR-MTL),
but the second pass is a second touch of the data: `passes_per_round = 2`, so σ is
calibrated for twice the steps of Local/FedAvg/MR-MTL at the same ε — Ditto's privacy
overhead (thesis Fig. 1.4). The passes are charged separately as "dpsgd-global" and
"dpsgd-personal".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.base import (
    Algorithm,
    ServerState,
    SiloState,
    apply_mean_update,
    check_nonnegative,
)

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer


class Ditto(Algorithm[SiloState, ServerState]):
    name = "ditto"
    passes_per_round = 2

    def __init__(self, lam: float, weighted: bool = True) -> None:
        self.lam = check_nonnegative("lambda (lam)", lam)
        self.weighted = bool(weighted)

    def silo_step(self, silos: SiloState, message: np.ndarray, trainer: LocalTrainer,
                  round: int) -> tuple[SiloState, np.ndarray]:
        start = np.tile(message, (silos.params.shape[0], 1))
        glob = trainer.run(start, round=round, label="dpsgd-global")
        personal = trainer.run(silos.params, anchor=start, lam=self.lam, round=round,
                               label="dpsgd-personal")
        return SiloState(personal), glob - start

    def server_step(self, server: ServerState, update: np.ndarray,
                    weights: np.ndarray) -> ServerState:
        return apply_mean_update(server, update, weights)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "lam": self.lam, "weighted": self.weighted,
                "passes_per_round": self.passes_per_round}

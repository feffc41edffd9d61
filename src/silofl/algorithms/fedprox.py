"""FedProx (Li et al. 2020): FedAvg whose local steps are pulled towards the global model.

Each round every silo starts from the broadcast global model w_t and takes its local DP-SGD
steps on
    ℓ(w) + μ/2 ‖w − w_t‖²,
i.e. w ← w − lr·(ĝ(w) + μ(w − w_t)), ĝ the DP-SGD estimate; the server averages the
changes as FedAvg does. μ = 0 is FedAvg.

Privacy: the proximal gradient μ(w − w_t) depends only on the silo's own private iterate
and the released global model, so it is added after the noise (as MR-MTL's pull): FedProx
takes exactly the DP-SGD steps of FedAvg — one pass per round, the same σ at the same ε,
charged as "dpsgd". It is a global method: every silo's model is the global model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.base import SiloT, check_nonnegative
from silofl.algorithms.fedavg import FedAvg

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer


class FedProx(FedAvg[SiloT]):
    """FedAvg with the proximal term μ/2‖w − w_t‖² in every local step (μ = `mu` ≥ 0)."""

    name = "fedprox"

    def __init__(self, mu: float, weighted: bool = True) -> None:
        super().__init__(weighted)
        self.mu = check_nonnegative("FedProx's proximal strength mu (prox_mu)", mu)

    def silo_step(self, silos: SiloT, message: np.ndarray, trainer: LocalTrainer,
                  round: int) -> tuple[SiloT, np.ndarray | None]:
        start = np.tile(message, (silos.params.shape[0], 1))
        new = trainer.run(start, anchor=start, lam=self.mu, round=round)
        return replace(silos, params=new), new - start

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "mu": self.mu, "weighted": self.weighted}

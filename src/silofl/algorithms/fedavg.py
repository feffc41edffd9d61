"""FedAvg: every silo starts each round from the global model (the fully shared end).

Weighted averaging uses training counts, which is private under replace-one DP but can
leak counts under add/remove DP (appendix C.1); `weighted=False` averages uniformly.
`aggregation` (a `robust.Aggregator`) replaces the mean by a Byzantine-robust rule.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.base import Algorithm, ServerState, SiloT, apply_mean_update
from silofl.algorithms.robust import Aggregator

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer


class FedAvg(Algorithm[SiloT, ServerState]):
    """FedAvg over any silo state (Finetune adds its phase to it)."""

    name = "fedavg"

    def __init__(self, weighted: bool = True, aggregation: Aggregator | None = None) -> None:
        self.weighted = bool(weighted)
        self.aggregation = aggregation or Aggregator()

    def check_plan(self, num_silos: int, rounds: int, accountant: str | None) -> None:
        self.aggregation.check(num_silos)

    def silo_step(self, silos: SiloT, message: np.ndarray, trainer: LocalTrainer,
                  round: int) -> tuple[SiloT, np.ndarray | None]:
        start = np.tile(message, (silos.params.shape[0], 1))
        new = trainer.run(start, round=round)
        return replace(silos, params=new), new - start

    def server_step(self, server: ServerState, update: np.ndarray | None,
                    weights: np.ndarray) -> ServerState:
        if update is None:  # a round without uploads (Finetune's local phase)
            return server
        return apply_mean_update(server, update, weights, self.aggregation)

    def personal_models(self, silos: SiloT, server: ServerState) -> np.ndarray:
        return np.tile(server.params, (silos.params.shape[0], 1))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "weighted": self.weighted,
                **self.aggregation.describe_if_used()}

"""Local finetuning (appendix B.3): FedAvg for the first `finetune_fraction` of the rounds,
then every silo trains alone, starting from the last FedAvg model.

One local pass per round throughout, so Finetune takes exactly the DP-SGD steps of FedAvg
and Local and spends exactly the same privacy (the default `privacy_events`). Under DP the
finetuning phase loses FedAvg's averaging of the silos' noise (thesis Fig. 1.2).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.base import (
    ServerState,
    SiloState,
    check_fraction,
    need_rounds,
    phase_rounds,
)
from silofl.algorithms.fedavg import FedAvg

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer


@dataclass
class PhasedSilos(SiloState):
    switch: int = 0  # rounds 1..switch are federated (FedAvg), later rounds local
    done: int = 0    # rounds completed


class Finetune(FedAvg[PhasedSilos]):
    name = "finetune"

    def __init__(self, finetune_fraction: float = 0.5, weighted: bool = True) -> None:
        super().__init__(weighted)
        self.finetune_fraction = check_fraction("finetune_fraction", finetune_fraction,
                                                low_open=False, high_open=False)

    def init(self, params0: np.ndarray, num_silos: int,
             rounds: int | None = None) -> tuple[PhasedSilos, ServerState]:
        silos, server = super().init(params0, num_silos)
        switch = phase_rounds(self.finetune_fraction, need_rounds(self.name, rounds))
        return PhasedSilos(silos.params, switch=switch), server

    def silo_step(self, silos: PhasedSilos, message: np.ndarray, trainer: LocalTrainer,
                  round: int) -> tuple[PhasedSilos, np.ndarray | None]:
        if round <= silos.switch:  # FedAvg's step
            state, update = super().silo_step(silos, message, trainer, round)
            return replace(silos, params=state.params, done=round), update
        # first local round starts from the final FedAvg model, later ones continue
        start = (np.tile(message, (silos.params.shape[0], 1)) if silos.done == silos.switch
                 else silos.params)
        return replace(silos, params=trainer.run(start, round=round), done=round), None

    def server_step(self, server: ServerState, update: np.ndarray | None,
                    weights: np.ndarray) -> ServerState:
        return server if update is None else super().server_step(server, update, weights)

    def personal_models(self, silos: PhasedSilos, server: ServerState) -> np.ndarray:
        if silos.done > silos.switch:
            return silos.params
        return super().personal_models(silos, server)

    def describe(self) -> dict[str, Any]:
        return dict(super().describe(), finetune_fraction=self.finetune_fraction)

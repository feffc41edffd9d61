"""Local training: every silo trains alone (the fully personalized end of the spectrum)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from silofl.algorithms.base import Algorithm, ServerState, SiloState

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer


class Local(Algorithm[SiloState, ServerState]):
    name = "local"

    def silo_step(self, silos: SiloState, message: Any, trainer: LocalTrainer,
                  round: int) -> tuple[SiloState, None]:
        return SiloState(trainer.run(silos.params, round=round)), None

"""Local training: every silo trains alone (the fully personalized end of the spectrum)."""

from silofl.algorithms.base import Algorithm, SiloState


class Local(Algorithm):
    name = "local"

    def silo_step(self, silos, message, trainer, round):
        return SiloState(trainer.run(silos.params, round=round)), None

"""FedAvg: every silo starts each round from the global model (the fully shared end).

Weighted averaging uses training counts, which is private under replace-one DP but can
leak counts under add/remove DP (appendix C.1); `weighted=False` averages uniformly.
"""

import numpy as np

from silofl.algorithms.base import Algorithm, SiloState, apply_mean_update


class FedAvg(Algorithm):
    name = "fedavg"

    def __init__(self, weighted: bool = True):
        self.weighted = bool(weighted)

    def silo_step(self, silos, message, trainer, round):
        start = np.tile(message, (silos.params.shape[0], 1))
        new = trainer.run(start, round=round)
        return SiloState(new), new - start

    def server_step(self, server, update, weights):
        return apply_mean_update(server, update, weights)

    def personal_models(self, silos, server):
        return np.tile(server.params, (silos.params.shape[0], 1))

    def describe(self):
        return {"name": self.name, "weighted": self.weighted}

"""FedAvg: every silo starts each round from the global model (the fully shared end).

Weighted averaging uses training counts, which is private under replace-one DP but can
leak counts under add/remove DP (appendix C.1); `weighted=False` averages uniformly.
`aggregation` (a `robust.Aggregator`) replaces the mean by a Byzantine-robust rule.
"""

import numpy as np

from silofl.algorithms.base import Algorithm, SiloState, apply_mean_update
from silofl.algorithms.robust import Aggregator


class FedAvg(Algorithm):
    name = "fedavg"

    def __init__(self, weighted: bool = True, aggregation: Aggregator | None = None):
        self.weighted = bool(weighted)
        self.aggregation = aggregation or Aggregator()

    def check_plan(self, num_silos, rounds, accountant):
        self.aggregation.check(num_silos)

    def silo_step(self, silos, message, trainer, round):
        start = np.tile(message, (silos.params.shape[0], 1))
        new = trainer.run(start, round=round)
        return SiloState(new), new - start

    def server_step(self, server, update, weights):
        return apply_mean_update(server, update, weights, self.aggregation)

    def personal_models(self, silos, server):
        return np.tile(server.params, (silos.params.shape[0], 1))

    def describe(self):
        return {"name": self.name, "weighted": self.weighted,
                **self.aggregation.describe_if_used()}

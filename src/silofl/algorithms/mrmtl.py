"""Mean-regularized multi-task learning (Algorithm 1, appendix C.1 of the thesis).

Each silo keeps a personal model w_k and takes DP-SGD steps on
    ℓ(w_k) + λ/2 ‖w_k − w̄‖²,
where w̄ is the server's mean of the personal models from the previous round. The pull
λ(w_k − w̄) depends only on private quantities, so it is added after noising and costs no
privacy: MR-MTL spends exactly what Local and FedAvg spend. λ = 0 is Local training;
larger λ federates more. `aggregation` (a `robust.Aggregator`) replaces the server's mean
update by a Byzantine-robust rule.
"""

from silofl.algorithms.base import (Algorithm, SiloState, apply_mean_update,
                                    check_nonnegative)
from silofl.algorithms.robust import Aggregator


class MRMTL(Algorithm):
    name = "mrmtl"

    def __init__(self, lam: float, weighted: bool = True, aggregation: Aggregator | None = None):
        self.lam = check_nonnegative("lambda (lam)", lam)
        self.weighted = bool(weighted)
        self.aggregation = aggregation or Aggregator()

    def check_plan(self, num_silos, rounds, accountant):
        self.aggregation.check(num_silos)

    def silo_step(self, silos, message, trainer, round):
        anchor = message[None, :].repeat(silos.params.shape[0], 0)
        new = trainer.run(silos.params, anchor=anchor, lam=self.lam, round=round)
        return SiloState(new), new - silos.params

    def server_step(self, server, update, weights):
        return apply_mean_update(server, update, weights, self.aggregation)

    def describe(self):
        return {"name": self.name, "lam": self.lam, "weighted": self.weighted,
                **self.aggregation.describe_if_used()}

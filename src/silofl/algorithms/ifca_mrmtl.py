"""IFCA-preconditioned MR-MTL (Algorithm 2, appendix C.2 of the thesis).

The first `selection_rounds` share of the rounds (at least one) run IFCA with private
cluster selection (see `ifca`); then each silo keeps its last cluster choice and runs MR-MTL
within its cluster: starting from its own model of the last round, it takes DP-SGD steps on
    ℓ(w_k) + λ/2 ‖w_k − w̄_g‖²,
where w̄_g is its cluster's model, which the server keeps equal to the (weighted) mean of
the cluster members' personal models by adding their mean change (eq. C.2). The pull uses
only released models, so after the selection rounds it costs nothing extra: the privacy
cost is IFCA's (DP-SGD passes + the selections).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.base import check_nonnegative
from silofl.algorithms.ifca import IFCA, ClusterSilos, ClusterUpdate

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer


class IFCAMRMTL(IFCA):
    name = "ifca_mrmtl"

    def __init__(self, lam: float, clusters: int = 2, selection_fraction: float = 0.03,
                 selection_rounds: float = 0.1, weighted: bool = True, **kw: Any) -> None:
        super().__init__(clusters, selection_fraction, selection_rounds, weighted, **kw)
        self.lam = check_nonnegative("lambda (lam)", lam)

    def _federate_until(self, rounds: int, select_until: int) -> int:
        return select_until

    def _personal_step(self, silos: ClusterSilos, message: np.ndarray, trainer: LocalTrainer,
                       round: int) -> tuple[ClusterSilos, ClusterUpdate | None]:
        new = trainer.run(silos.params, anchor=message[silos.choice], lam=self.lam, round=round)
        return (replace(silos, params=new, done=round),
                ClusterUpdate(new - silos.params, silos.choice))

    def describe(self) -> dict[str, Any]:
        return dict(super().describe(), lam=self.lam)

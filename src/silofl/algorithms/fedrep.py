"""FedRep (Collins et al. 2021) under silo-specific DP: learn the head, then the body.

The model splits as in FedPer (`Model.param_groups()["head"]`; a GLM's head is its
intercepts). Each round silo k starts from the broadcast body b̄ and its own head h_k and
makes two DP-SGD passes over its data:

    h_k ← head pass from (b̄, h_k), the body frozen       (ledger label "dpsgd-head")
    b   ← body pass from (b̄, h_k), the new head frozen    (ledger label "dpsgd-body")

and uploads the body's change b − b̄ (head coordinates zero); the server averages bodies.
A pass over a coordinate subset is DP-SGD on those coordinates: each example's gradient
restricted to them is clipped to C and Gaussian noise N(0, σ²C²) is added on them only
(`LocalTrainer.run(coords=...)`) — the same mechanism as a full pass, so each pass costs
what a FedAvg pass costs and FedRep spends two per round (`passes_per_round = 2`, like
Ditto): σ is calibrated for twice the steps at the same ε.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.base import SiloState
from silofl.algorithms.fedper import FedPer

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer


class FedRep(FedPer):
    """FedRep: a head pass with the body frozen, then a body pass with the head frozen."""

    name = "fedrep"
    passes_per_round = 2

    def silo_step(self, silos: SiloState, message: np.ndarray, trainer: LocalTrainer,
                  round: int) -> tuple[SiloState, np.ndarray]:
        head = self._keep(trainer)
        start = self.start(silos, message, head)
        mid = trainer.run(start, round=round, label="dpsgd-head", coords=head)
        new = trainer.run(mid, round=round, label="dpsgd-body", coords=~head)
        return SiloState(new), np.where(head, 0.0, new - start)

    def describe(self) -> dict[str, Any]:
        return dict(super().describe(), passes_per_round=self.passes_per_round)


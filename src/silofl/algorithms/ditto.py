"""Ditto (Li et al. 2021; appendix B.3) with a FedAvg global solver.

Each round every silo makes two DP-SGD passes over its data: one on the global model
(whose change is averaged on the server, as in FedAvg) and one on its personal model v_k with
the proximal pull λ(v_k − w), w the global model broadcast this round:
    v_k ← v_k − lr·(ĝ(v_k) + λ(v_k − w)).
The pull uses only released quantities and is added after the noise (free, as in MR-MTL),
but the second pass is a second touch of the data: `passes_per_round = 2`, so σ is
calibrated for twice the steps of Local/FedAvg/MR-MTL at the same ε — Ditto's privacy
overhead (thesis Fig. 1.4). The passes are charged separately as "dpsgd-global" and
"dpsgd-personal". ``lam = "auto"`` (`AutoDitto`, built by `ditto(...)`) sets each silo's
λ_k every round from the released global-pass changes at no privacy cost
(`silofl.algorithms.auto_lambda`); where λ_k = ∞ the personal model is the global one (the
personal pass still runs and is charged, so the ledger is that of a fixed λ).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.auto_lambda import (
    AUTO,
    AutoLambda,
    AutoMessage,
    AutoServer,
    AutoUpdate,
    check_lam,
    finite_pull,
    noise_header,
    start_points,
)
from silofl.algorithms.base import (
    Algorithm,
    ServerState,
    SiloState,
    apply_mean_update,
    check_nonnegative,
)

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer


class Ditto(Algorithm[SiloState, ServerState]):
    name = "ditto"
    passes_per_round = 2

    def __init__(self, lam: float, weighted: bool = True) -> None:
        self.lam = check_nonnegative("lambda (lam)", lam)
        self.weighted = bool(weighted)

    def silo_step(self, silos: SiloState, message: np.ndarray, trainer: LocalTrainer,
                  round: int) -> tuple[SiloState, np.ndarray]:
        start = np.tile(message, (silos.params.shape[0], 1))
        glob = trainer.run(start, round=round, label="dpsgd-global")
        personal = trainer.run(silos.params, anchor=start, lam=self.lam, round=round,
                               label="dpsgd-personal")
        return SiloState(personal), glob - start

    def server_step(self, server: ServerState, update: np.ndarray,
                    weights: np.ndarray) -> ServerState:
        return apply_mean_update(server, update, weights)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "lam": self.lam, "weighted": self.weighted,
                "passes_per_round": self.passes_per_round}


class AutoDitto(AutoLambda, Ditto):
    """Ditto with each silo's λ_k set every round by `auto_lambda`.

    The released passes are the global ones: they all start at the broadcast model without
    pull, which is what the estimator reads. The personal pass of silo k pulls with λ_k;
    where λ_k = ∞ it starts from the broadcast model without pull and the personal model is
    the shared one.
    """

    tracks_models = False

    def __init__(self, weighted: bool = True) -> None:
        super().__init__(0.0, weighted)
        self.lam = AUTO  # type: ignore[assignment]

    def init(self, params0: np.ndarray, num_silos: int,
             rounds: int | None = None) -> tuple[SiloState, AutoServer]:
        return SiloState(np.tile(params0, (num_silos, 1))), \
            self.auto_init(params0, num_silos, rounds)

    def pass_starts(self, server: AutoServer) -> np.ndarray:
        return np.tile(server.params, (len(server.lam), 1))

    def released_pull(self, server: AutoServer) -> np.ndarray:
        return np.zeros(len(server.lam))

    def silo_step(self, silos: SiloState, message: AutoMessage,  # type: ignore[override]
                  trainer: LocalTrainer, round: int) -> tuple[SiloState, AutoUpdate]:
        K = silos.params.shape[0]
        lam = np.broadcast_to(np.asarray(message.lam, float), (K,))
        start = np.tile(message.params, (K, 1))
        glob = trainer.run(start, round=round, label="dpsgd-global")
        personal = trainer.run(start_points(silos.params, message.params, lam), anchor=start,
                               lam=finite_pull(lam), round=round, label="dpsgd-personal")
        return SiloState(personal), AutoUpdate(glob - start, noise_header(trainer))

    def personal_models(self, silos: SiloState, server: AutoServer) -> np.ndarray:  # type: ignore[override]
        return self.auto_personal(silos.params, server)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "weighted": self.weighted,
                "passes_per_round": self.passes_per_round, **self.describe_auto()}


def ditto(lam: float | str, weighted: bool = True) -> Ditto:
    """Ditto at a fixed λ ≥ 0, or `AutoDitto` for ``lam = "auto"``.

    Parameters
    ----------
    lam : float or "auto"
        The personal pass's pull (0: Local-like), or "auto" (λ_k from released updates).
    weighted : bool, default True
        Average by training counts.
    """
    value = check_lam(lam)
    return AutoDitto(weighted) if value == AUTO else Ditto(float(value), weighted)

"""Mean-regularized multi-task learning (Algorithm 1, appendix C.1 of the thesis).

Each silo keeps a personal model w_k and takes DP-SGD steps on
    ℓ(w_k) + λ/2 ‖w_k − w̄‖²,
where w̄ is the server's mean of the personal models from the previous round. The pull
λ(w_k − w̄) depends only on private quantities, so it is added after noising and costs no
privacy: MR-MTL spends exactly what Local and FedAvg spend. λ = 0 is Local training;
larger λ federates more. `aggregation` (a `robust.Aggregator`) replaces the server's mean
update by a Byzantine-robust rule. ``lam = "auto"`` (`AutoMRMTL`, built by
`mrmtl(...)`) sets each silo's λ_k every round from the released updates at no privacy
cost (`silofl.algorithms.auto_lambda`).
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
from silofl.algorithms.robust import Aggregator
from silofl.errors import ConfigError

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer


class MRMTL(Algorithm[SiloState, ServerState]):
    name = "mrmtl"

    def __init__(self, lam: float, weighted: bool = True,
                 aggregation: Aggregator | None = None) -> None:
        self.lam = check_nonnegative("lambda (lam)", lam)
        self.weighted = bool(weighted)
        self.aggregation = aggregation or Aggregator()

    def check_plan(self, num_silos: int, rounds: int, accountant: str | None) -> None:
        self.aggregation.check(num_silos)

    def silo_step(self, silos: SiloState, message: np.ndarray, trainer: LocalTrainer,
                  round: int) -> tuple[SiloState, np.ndarray]:
        anchor = message[None, :].repeat(silos.params.shape[0], 0)
        new = trainer.run(silos.params, anchor=anchor, lam=self.lam, round=round)
        return SiloState(new), new - silos.params

    def server_step(self, server: ServerState, update: np.ndarray,
                    weights: np.ndarray) -> ServerState:
        return apply_mean_update(server, update, weights, self.aggregation)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "lam": self.lam, "weighted": self.weighted,
                **self.aggregation.describe_if_used()}


class AutoMRMTL(AutoLambda, MRMTL):
    """MR-MTL with each silo's λ_k set every round by `auto_lambda` (plain mean only).

    Silo k starts its pass from its personal model with pull λ_k, or, where λ_k = ∞, from
    the broadcast model without pull (a FedAvg pass; its personal model is then the shared
    one). The server follows every personal model from the releases (W_k ← start + Δ_k)
    and moves the shared model by the weighted mean change, as MR-MTL and FedAvg do.
    """

    def __init__(self, weighted: bool = True, aggregation: Aggregator | None = None) -> None:
        agg = aggregation or Aggregator()
        if agg.rule != "mean" or agg.attackers:
            raise ConfigError("mrmtl with lam = \"auto\" estimates λ from every silo's own "
                              f"update and runs with the plain mean; aggregation "
                              f"{agg.rule!r} (attackers {agg.attackers}) is not supported: set "
                              "aggregation = 'mean' and attackers = 0, or a numeric lam")
        super().__init__(0.0, weighted, agg)
        self.lam = AUTO  # type: ignore[assignment]

    def init(self, params0: np.ndarray, num_silos: int,
             rounds: int | None = None) -> tuple[SiloState, AutoServer]:
        return SiloState(np.tile(params0, (num_silos, 1))), \
            self.auto_init(params0, num_silos, rounds)

    def silo_step(self, silos: SiloState, message: AutoMessage,  # type: ignore[override]
                  trainer: LocalTrainer, round: int) -> tuple[SiloState, AutoUpdate]:
        K = silos.params.shape[0]
        lam = np.broadcast_to(np.asarray(message.lam, float), (K,))
        start = start_points(silos.params, message.params, lam)
        anchor = np.tile(message.params, (K, 1))
        new = trainer.run(start, anchor=anchor, lam=finite_pull(lam), round=round)
        return SiloState(new), AutoUpdate(new - start, noise_header(trainer))

    def personal_models(self, silos: SiloState, server: AutoServer) -> np.ndarray:  # type: ignore[override]
        return self.auto_personal(silos.params, server)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "weighted": self.weighted, **self.describe_auto()}


def mrmtl(lam: float | str, weighted: bool = True,
          aggregation: Aggregator | None = None) -> MRMTL:
    """MR-MTL at a fixed λ ≥ 0, or `AutoMRMTL` for ``lam = "auto"``.

    Parameters
    ----------
    lam : float or "auto"
        The regularization strength (0: Local), or "auto" (λ_k from released updates).
    weighted : bool, default True
        Average by training counts.
    aggregation : Aggregator, optional
        The server's rule (auto: the plain mean only).
    """
    value = check_lam(lam)
    if value == AUTO:
        return AutoMRMTL(weighted, aggregation)
    return MRMTL(float(value), weighted, aggregation)

"""SCAFFOLD (Karimireddy et al. 2020) with control variates built from released quantities.

The server holds the global model x and a control variate c; silo k holds its own c_k.
Each round silo k starts from y = x and takes its T_k local DP-SGD steps
    y ← y − lr·(ĝ(y) − c_k + c),
ĝ the DP-SGD estimate, then updates its control variate by the paper's option II
    c_k⁺ = c_k − c + (x − y_k)/(T_k·lr)
and sends (Δy_k, Δc_k) = (y_k − x, c_k⁺ − c_k). The server moves
    x ← x + Σ_k w_k Δy_k,   c ← c + Σ_k w_k Δc_k
with the aggregation weights w_k (training counts, or uniform with `weighted = False`,
which is the paper's full-participation update with global step 1). Over the network, a
round some silos miss moves x and c by the means over the silos that answered (the paper
scales c's step by |S|/N; here every silo is expected every round).

Privacy: c and x are broadcast (released), c_k is a function of the silo's earlier
released updates, and c_k⁺ one of this round's released update y_k − x and of public T_k,
lr: post-processing. The correction c − c_k is added after the noise, so the silo takes
exactly the DP-SGD steps of FedAvg — one pass per round, charged as "dpsgd", the same σ
at the same ε. The broadcast is (x, c): 2P floats; an update (Δy_k, Δc_k): 2P floats.
A global method: every silo's model is the global model x.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.base import Algorithm, SiloState, weighted_mean
from silofl.errors import ConfigError

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer


def check_step_size(lr: float) -> float:
    """`lr` if > 0: SCAFFOLD's control variates divide by T_k·lr (ConfigError otherwise;
    the job builders call it before a budget store is opened).

    Parameters
    ----------
    lr : float
        The training step size.

    Returns
    -------
    float
    """
    if not lr > 0:
        raise ConfigError(f"scaffold's control variates divide by T_k·lr: set lr > 0 "
                          f"(got training.lr = {lr!r})")
    return float(lr)


@dataclass
class ScaffoldSilos(SiloState):
    control: np.ndarray | None = None  # (K, P) each silo's control variate c_k


@dataclass
class ScaffoldServer:
    params: np.ndarray   # (P,) the global model x
    control: np.ndarray  # (P,) the server's control variate c


class Scaffold(Algorithm[ScaffoldSilos, ScaffoldServer]):
    """SCAFFOLD (option II control variates) on DP-SGD local steps."""

    name = "scaffold"

    def __init__(self, weighted: bool = True) -> None:
        self.weighted = bool(weighted)

    def init(self, params0: np.ndarray, num_silos: int,
             rounds: int | None = None) -> tuple[ScaffoldSilos, ScaffoldServer]:
        zeros = np.zeros((num_silos, params0.shape[0]))
        return (ScaffoldSilos(np.tile(params0, (num_silos, 1)), zeros),
                ScaffoldServer(params0.copy(), np.zeros_like(params0, dtype=float)))

    def broadcast(self, server: ScaffoldServer) -> tuple[np.ndarray, np.ndarray]:
        """(x (P,), c (P,))."""
        return server.params, server.control

    def silo_step(self, silos: ScaffoldSilos, message: tuple[np.ndarray, np.ndarray],
                  trainer: LocalTrainer, round: int) -> tuple[ScaffoldSilos, np.ndarray]:
        x, c = message[0], message[1]
        K = silos.params.shape[0]
        ck = np.zeros((K, x.shape[0])) if silos.control is None else silos.control
        drift = c[None, :] - ck  # (K, P): the correction, fixed during the pass
        lr = check_step_size(trainer.lr)  # before anything is charged or read

        def step(active: np.ndarray, W: np.ndarray, g: np.ndarray) -> np.ndarray:
            return W - lr * (g + drift[active])  # on the noised g: free

        start = np.tile(x, (K, 1))
        y = trainer.run(start, round=round, step=step)
        steps = np.asarray(trainer.steps_per_round, dtype=float)[:, None]  # T_k, public
        dy = y - start
        new_c = ck - c[None, :] - dy / (steps * lr)  # option II: c_k − c + (x − y_k)/(T_k·lr)
        return ScaffoldSilos(y, new_c), np.concatenate([dy, new_c - ck], axis=1)

    def server_step(self, server: ScaffoldServer, update: np.ndarray | None,
                    weights: np.ndarray) -> ScaffoldServer:
        if update is None:  # no silo answered
            return server
        P = server.params.shape[0]
        step = weighted_mean(update, weights)  # (2P,): [Δx, Δc]
        return ScaffoldServer(server.params + step[:P], server.control + step[P:])

    def personal_models(self, silos: ScaffoldSilos, server: ScaffoldServer) -> np.ndarray:
        return np.tile(server.params, (silos.params.shape[0], 1))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "weighted": self.weighted}

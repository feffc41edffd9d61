"""The shape of a federated algorithm: a silo step and a server step over explicit state.

    message            = alg.broadcast(server)                 # server → silos
    silos, update      = alg.silo_step(silos, message, trainer, round)   # in each silo
    server             = alg.server_step(server, update, weights)        # on the server

`SiloState.params` holds the (K, P) models of the silos a process hosts (all K in the
simulator, one in a networked client); `update` is what a silo sends back (K, P) or None.
Every algorithm declares its privacy cost per silo next to its code, in
`privacy_events`, as dp_accounting events built from the trainer's per-round events;
noise is calibrated to that declaration and the ledgers charge what actually runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np

from silofl.errors import ConfigError


@dataclass
class SiloState:
    params: np.ndarray  # (K, P) personal models


@dataclass
class ServerState:
    params: np.ndarray  # (P,) the shared model (global / mean model)


class Algorithm:
    name: str = "algorithm"
    #: local passes over the data per round (Ditto: 2)
    passes_per_round: int = 1

    def privacy_events(self, round_event: dpa.DpEvent, rounds: int) -> dpa.DpEvent:
        """Cost of a whole run for one silo, given the cost of one local pass."""
        return dpa.SelfComposedDpEvent(round_event, rounds * self.passes_per_round)

    def init(self, params0: np.ndarray, num_silos: int) -> tuple[SiloState, ServerState]:
        return SiloState(np.tile(params0, (num_silos, 1))), ServerState(params0.copy())

    def broadcast(self, server: ServerState) -> np.ndarray:
        return server.params

    def silo_step(self, silos: SiloState, message: np.ndarray, trainer, round: int):
        raise NotImplementedError

    def server_step(self, server: ServerState, update, weights: np.ndarray) -> ServerState:
        return server

    def personal_models(self, silos: SiloState, server: ServerState) -> np.ndarray:
        """(K, P) the model each silo uses for prediction."""
        return silos.params

    def describe(self) -> dict:
        return {"name": self.name}


def weighted_mean(update: np.ndarray, weights: np.ndarray) -> np.ndarray:
    w = np.asarray(weights, dtype=float)
    return (w[:, None] * update).sum(0) / w.sum()


def check_nonnegative(name: str, value: float) -> float:
    if not np.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a non-negative number, got {value}")
    return float(value)

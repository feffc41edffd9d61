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


@dataclass
class AggregatingServer(ServerState):
    last_step: np.ndarray | None = None  # (P,) the previous aggregate (centered clipping)


class Algorithm:
    """A federated method: a silo step and a server step over explicit state.

    Build one with `silofl.make_algorithm`; `silofl.simulate` runs it in one process and
    the networked runtime across institutions, with the same code. Subclasses override
    `silo_step` (and usually `server_step`) and declare their privacy cost per silo in
    `privacy_events`, to which the noise is calibrated and the ledgers charge.

    Attributes
    ----------
    name : str
        The method's name (one of `silofl.METHODS`).
    passes_per_round : int
        Local passes over the data per round (Ditto: 2).
    fixed_steps_per_pass : int or None
        DP-SGD steps per local pass fixed by the method (None: from local_epochs).
    """

    name: str = "algorithm"
    #: local passes over the data per round (Ditto: 2)
    passes_per_round: int = 1
    #: DP-SGD steps per local pass fixed by the method (None: from local_epochs)
    fixed_steps_per_pass: int | None = None

    def privacy_events(self, round_event: dpa.DpEvent, rounds: int,
                       target=None) -> dpa.DpEvent:
        """The privacy cost of a whole run for one silo.

        Parameters
        ----------
        round_event : dp_accounting.DpEvent
            The cost of one local pass (the trainer's DP-SGD steps).
        rounds : int
            Rounds in the run.
        target : PrivacyTarget, optional
            The silo's target, for mechanisms whose budget is a share of the silo's ε.

        Returns
        -------
        dp_accounting.DpEvent
            By default `round_event` composed rounds × passes_per_round times.
        """
        return dpa.SelfComposedDpEvent(round_event, rounds * self.passes_per_round)

    def bind_silos(self, names: list[str]) -> None:
        """Resolve settings that name silos against the federation.

        Called when planning, before `check_plan`.

        Parameters
        ----------
        names : list of str
            The federation's silo names, in order.

        Raises
        ------
        ConfigError
            A setting names a silo that is not in `names`.
        """

    def check_plan(self, num_silos: int, rounds: int, accountant: str | None) -> None:
        """Refuse settings this algorithm cannot run with, before any data access.

        Parameters
        ----------
        num_silos : int
            K, the number of silos.
        rounds : int
            Rounds in the run.
        accountant : {"pld", "rdp"} or None
            The accountant; None for a non-private run.

        Raises
        ------
        ConfigError, PrivacyError
            The settings cannot run.
        """

    def init(self, params0: np.ndarray, num_silos: int,
             rounds: int | None = None) -> tuple[SiloState, ServerState]:
        """The initial silo and server states.

        Parameters
        ----------
        params0 : numpy.ndarray
            The starting model, shape (P,).
        num_silos : int
            K, the silos this process hosts.
        rounds : int, optional
            The run's length, for algorithms with phases.

        Returns
        -------
        tuple of (SiloState, ServerState)
            Silo models (K, P) and the server's model (P,), all copies of `params0`.
        """
        return SiloState(np.tile(params0, (num_silos, 1))), ServerState(params0.copy())

    def broadcast(self, server: ServerState) -> np.ndarray:
        """What the server sends to the silos at the start of a round.

        Parameters
        ----------
        server : ServerState
            The server's state.

        Returns
        -------
        numpy.ndarray
            By default the shared model, shape (P,).
        """
        return server.params

    def silo_step(self, silos: SiloState, message: np.ndarray, trainer, round: int):
        """One round at the silos: private local training from the server's message.

        Parameters
        ----------
        silos : SiloState
            The hosted silos' state, params (K, P).
        message : numpy.ndarray
            What `broadcast` sent.
        trainer
            The DP-SGD trainer of these silos (``silofl.training.trainer``); every private
            step goes through it and is charged to the silos' ledgers.
        round : int
            The round, from 1.

        Returns
        -------
        tuple of (SiloState, numpy.ndarray or None)
            The new state and the update sent to the server, shape (K, P), or None.
        """
        raise NotImplementedError

    def server_step(self, server: ServerState, update, weights: np.ndarray) -> ServerState:
        """One round at the server: aggregate the silos' updates (post-processing only).

        Parameters
        ----------
        server : ServerState
            The server's state.
        update : numpy.ndarray or None
            The silos' updates, shape (K, P).
        weights : numpy.ndarray
            Aggregation weights, shape (K,) (training counts, or ones when unweighted).

        Returns
        -------
        ServerState
            The new server state (by default unchanged).
        """
        return server

    def personal_models(self, silos: SiloState, server: ServerState) -> np.ndarray:
        """The model each silo uses for prediction.

        Parameters
        ----------
        silos : SiloState
            The silos' state.
        server : ServerState
            The server's state.

        Returns
        -------
        numpy.ndarray
            Shape (K, P).
        """
        return silos.params

    def describe(self) -> dict:
        """The method and its settings, as recorded in results.

        Returns
        -------
        dict
            At least ``{"name": name}``.
        """
        return {"name": self.name}


def weighted_mean(update: np.ndarray, weights: np.ndarray) -> np.ndarray:
    w = np.asarray(weights, dtype=float)
    return (w[:, None] * update).sum(0) / w.sum()


def apply_mean_update(server: ServerState, update: np.ndarray,
                      weights: np.ndarray, aggregator=None) -> ServerState:
    """The averaging server step: move the shared model by the weighted mean update, or by
    `aggregator`'s rule (`robust.Aggregator`: screens out non-finite/wrong-shaped rows)."""
    if aggregator is None:
        return ServerState(server.params + weighted_mean(update, weights))
    step = aggregator.aggregate(update, weights, server.params.shape[0],
                                center=getattr(server, "last_step", None))
    return AggregatingServer(server.params + step, step)


def check_nonnegative(name: str, value: float) -> float:
    if not np.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a non-negative number, got {value}")
    return float(value)


def check_fraction(name: str, value: float, *, low_open: bool, high_open: bool) -> float:
    """`value` in the interval (0|[0, 1)|1] given by the open/closed ends, else ConfigError."""
    v = float(value)
    ok = np.isfinite(v) and (v > 0 if low_open else v >= 0) and (v < 1 if high_open else v <= 1)
    if not ok:
        interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
        raise ConfigError(f"{name} must be in {interval}, got {value}")
    return v


def phase_rounds(fraction: float, rounds: int, at_least: int = 0) -> int:
    """Number of rounds in a phase that takes `fraction` of `rounds` (rounded to nearest,
    halves up), at least `at_least`."""
    return max(at_least, min(rounds, int(np.floor(fraction * rounds + 0.5))))


def need_rounds(name: str, rounds: int | None) -> int:
    if rounds is None:
        raise ConfigError(f"{name} runs in phases and needs the number of rounds: "
                          "call init(params0, num_silos, rounds=...)")
    return int(rounds)

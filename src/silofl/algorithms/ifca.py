"""IFCA / HypCluster (Ghosh et al. 2020; Mansour et al. 2020) with private cluster selection
(appendix B.3), in three variants:

- `ifca` (IFCA + FedAvg): G cluster models on the server. In each of the first
  `selection_rounds` share of the rounds (at least one) every silo privately selects the
  cluster model with the lowest training error rate (exponential mechanism, see
  `training.selection`), trains it for one local pass and sends the change; each cluster
  model moves by the (weighted) mean change of its members. After the selection rounds each
  silo keeps its last choice and IFCA continues. A silo's model is its cluster's model.
- `ifca_local`: after the selection rounds, every silo trains alone from its cluster model.
- `ifca_finetune`: IFCA for the first `finetune_fraction` of the rounds (which must cover
  the selection rounds), then local training from the cluster model.

Cluster models start at the model's initial parameters plus independent N(0, init_scale²)
perturbations (default 0.1 per coordinate) from a fixed public seed `init_seed`: without
them every cluster would be identical (GLMs start at zero) and the selection meaningless.
They are data-independent, so they cost nothing.

Privacy. Every round costs one local DP-SGD pass, as for Local/FedAvg. Each selection is
ε_sel,k = selection_fraction · ε_k (3% of the silo's ε by default, as in the thesis), an
ε²/8-zCDP event charged before the data is read; `privacy_events` declares T·pass +
T_sel·selection, and σ_k is calibrated so that the composition meets the silo's target:
the selections are paid for with more DP-SGD noise. zCDP is supported by the RDP accountant
only, so these methods are calibrated and accounted under RDP whatever the preferred
accountant.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import dp_accounting as dpa
import numpy as np

from silofl.algorithms.base import (
    Algorithm,
    SiloState,
    check_fraction,
    need_rounds,
    phase_rounds,
    weighted_mean,
)
from silofl.errors import ConfigError, PrivacyError
from silofl.training import selection

if TYPE_CHECKING:
    from silofl.privacy.targets import PrivacyTarget
    from silofl.training.trainer import LocalTrainer

SELECT_LABEL = "select"


@dataclass(frozen=True)
class Schedule:
    """Rounds 1..select_until select a cluster privately; rounds 1..federate_until train the
    cluster models (FedAvg within clusters); later rounds are the variant's personal phase."""

    rounds: int
    select_until: int
    federate_until: int


@dataclass
class ClusterSilos(SiloState):
    choice: np.ndarray                  # (K,) cluster each silo chose last (0 before any)
    schedule: Schedule
    done: int = 0                       # rounds completed


@dataclass
class ClusterServer:
    clusters: np.ndarray  # (G, P) cluster models


@dataclass
class ClusterUpdate:
    delta: np.ndarray   # (K, P) change of each silo's model this round
    choice: np.ndarray  # (K,) the cluster each silo's change belongs to


def cluster_means(clusters: np.ndarray, update: ClusterUpdate,
                  weights: np.ndarray) -> np.ndarray:
    """Move each cluster model (G, P) by the weighted mean change of the silos that chose it;
    a cluster nobody chose stays put."""
    out = clusters.copy()
    w = np.asarray(weights, dtype=float)
    for g in np.unique(update.choice):
        members = update.choice == g
        out[g] += weighted_mean(update.delta[members], w[members])
    return out


class IFCA(Algorithm[ClusterSilos, ClusterServer]):
    name = "ifca"

    def __init__(self, clusters: int = 2, selection_fraction: float = 0.03,
                 selection_rounds: float = 0.1, weighted: bool = True, *,
                 loss_bound: float = selection.DEFAULT_LOSS_BOUND, init_scale: float = 0.1,
                 init_seed: int = 0) -> None:
        if isinstance(clusters, bool) or not isinstance(clusters, (int, np.integer)) \
                or clusters < 1:
            raise ConfigError(f"clusters must be a positive integer (the number of cluster "
                              f"models), got {clusters!r}")
        self.clusters = int(clusters)
        self.selection_fraction = check_fraction(
            "selection_fraction (share of a silo's ε spent per cluster selection)",
            selection_fraction, low_open=True, high_open=True)
        self.selection_rounds = check_fraction(
            "selection_rounds (share of rounds with cluster selection)", selection_rounds,
            low_open=True, high_open=False)
        if not (np.isfinite(loss_bound) and loss_bound > 0):
            raise ConfigError(f"loss_bound must be a positive number, got {loss_bound}")
        if not (np.isfinite(init_scale) and init_scale >= 0):
            raise ConfigError(f"init_scale must be a non-negative number, got {init_scale}")
        self.loss_bound, self.init_scale = float(loss_bound), float(init_scale)
        self.init_seed = int(init_seed)
        self.weighted = bool(weighted)

    # -- schedule and privacy ------------------------------------------------------------------
    def schedule(self, rounds: int) -> Schedule:
        """The run's phases for `rounds` rounds (public: from the settings only)."""
        sel = phase_rounds(self.selection_rounds, rounds, at_least=1)
        return Schedule(rounds, sel, self._federate_until(rounds, sel))

    def _federate_until(self, rounds: int, select_until: int) -> int:
        return rounds

    def check_plan(self, num_silos: int, rounds: int, accountant: str | None) -> None:
        if self.clusters > num_silos:
            raise ConfigError(f"{self.name}: clusters = {self.clusters} is more than the "
                              f"{num_silos} silos; use at most {num_silos} clusters")

    def privacy_events(self, round_event: dpa.DpEvent, rounds: int,
                       target: PrivacyTarget | None = None) -> dpa.DpEvent:
        if target is None:
            raise PrivacyError(f"{self.name}: the selection budget is a share of the silo's "
                               "ε, so privacy_events needs the silo's target")
        train = dpa.SelfComposedDpEvent(round_event, rounds * self.passes_per_round)
        eps_sel = self.selection_fraction * target.epsilon
        select = dpa.SelfComposedDpEvent(selection.selection_event(eps_sel),
                                         self.schedule(rounds).select_until)
        return dpa.ComposedDpEvent((train, select))  # a tuple keeps it hashable (memoized ε)

    # -- the algorithm -------------------------------------------------------------------------
    def init(self, params0: np.ndarray, num_silos: int,
             rounds: int | None = None) -> tuple[ClusterSilos, ClusterServer]:
        sched = self.schedule(need_rounds(self.name, rounds))
        rng = np.random.default_rng(self.init_seed)  # public, data-independent
        clusters = params0 + self.init_scale * rng.standard_normal((self.clusters, len(params0)))
        silos = ClusterSilos(np.tile(params0, (num_silos, 1)),
                             choice=np.zeros(num_silos, dtype=np.int64), schedule=sched)
        return silos, ClusterServer(clusters)

    def broadcast(self, server: ClusterServer) -> np.ndarray:
        return server.clusters

    def silo_step(self, silos: ClusterSilos, message: np.ndarray, trainer: LocalTrainer,
                  round: int) -> tuple[ClusterSilos, ClusterUpdate | None]:
        sched, choice = silos.schedule, silos.choice
        if round <= sched.select_until:
            eps = trainer.target_epsilons  # None when training without DP (exact argmin)
            choice = trainer.select_cluster(
                message, None if eps is None else self.selection_fraction * eps, round,
                loss_bound=self.loss_bound, label=SELECT_LABEL)
        silos = replace(silos, choice=choice)
        if round <= sched.federate_until:
            start = message[choice]
            new = trainer.run(start, round=round)
            return replace(silos, params=new, done=round), ClusterUpdate(new - start, choice)
        return self._personal_step(silos, message, trainer, round)

    def _personal_step(self, silos: ClusterSilos, message: np.ndarray, trainer: LocalTrainer,
                       round: int) -> tuple[ClusterSilos, ClusterUpdate | None]:
        """After the cluster phase: local training from the chosen cluster model."""
        first = silos.done == silos.schedule.federate_until
        start = message[silos.choice] if first else silos.params
        return replace(silos, params=trainer.run(start, round=round), done=round), None

    def server_step(self, server: ClusterServer, update: ClusterUpdate | None,
                    weights: np.ndarray) -> ClusterServer:
        if update is None:
            return server
        return ClusterServer(cluster_means(server.clusters, update, weights))

    def personal_models(self, silos: ClusterSilos, server: ClusterServer) -> np.ndarray:
        if silos.done > silos.schedule.federate_until:
            return silos.params
        return server.clusters[silos.choice]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "clusters": self.clusters,
                "selection_fraction": self.selection_fraction,
                "selection_rounds": self.selection_rounds, "weighted": self.weighted,
                "loss_bound": self.loss_bound, "init_scale": self.init_scale,
                "init_seed": self.init_seed}


class IFCALocal(IFCA):
    name = "ifca_local"

    def _federate_until(self, rounds: int, select_until: int) -> int:
        return select_until


class IFCAFinetune(IFCA):
    name = "ifca_finetune"

    def __init__(self, clusters: int = 2, selection_fraction: float = 0.03,
                 selection_rounds: float = 0.1, weighted: bool = True,
                 finetune_fraction: float = 0.5, **kw: Any) -> None:
        super().__init__(clusters, selection_fraction, selection_rounds, weighted, **kw)
        self.finetune_fraction = check_fraction("finetune_fraction", finetune_fraction,
                                                low_open=False, high_open=False)

    def _federate_until(self, rounds: int, select_until: int) -> int:
        return phase_rounds(self.finetune_fraction, rounds)

    def check_plan(self, num_silos: int, rounds: int, accountant: str | None) -> None:
        super().check_plan(num_silos, rounds, accountant)
        s = self.schedule(rounds)
        if s.federate_until < s.select_until:
            raise ConfigError(
                f"ifca_finetune: finetune_fraction = {self.finetune_fraction:g} gives "
                f"{s.federate_until} federated rounds of {rounds}, fewer than the "
                f"{s.select_until} selection rounds (selection_rounds = "
                f"{self.selection_rounds:g}); raise finetune_fraction or lower selection_rounds")

    def describe(self) -> dict[str, Any]:
        return dict(super().describe(), finetune_fraction=self.finetune_fraction)

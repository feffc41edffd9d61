"""The pandemic track on the core engine: graph data as a silo data source.

The core trainer (`training.trainer.LocalTrainer`) with the node-level privacy unit
(`training.sampling.NodeUnit`) runs every local pass; the planner (`runtime.plan.plan_job`,
``privacy_unit="node"``) calibrates σ; the simulator (`runtime.simulator.simulate`) runs
the algorithm's silo and server steps. This module supplies what is specific to graph
data:

* `GraphSource` — the trainer's data source: ``n`` (K,) persons per region and
  ``gather(silos, idx)``, which builds the neighbourhood examples of the drawn persons
  *per batch* (at each person's training window of the round, `start_round`) and maps
  them to the model's inputs (summaries / pooling, standardization). Every read of a
  labelled example goes through here, after the trainer charged the round.
* `GraphFederation` / `GraphSilo` — the public facts the planner and the simulator need
  (names, sizes, targets; no test rows: evaluation happens in `pipeline.evaluate`).
* `RegionMRMTL` — MR-MTL whose server step is the exactly rounded (``math.fsum``)
  size-weighted mean of the region *models*: the result does not depend on the order in
  which regions report (a networked server, `runtime.network.server`, runs the same step).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from silofl.algorithms import make_algorithm
from silofl.algorithms.base import ServerState, SiloState
from silofl.algorithms.ifca import IFCA, SELECT_LABEL
from silofl.algorithms.mrmtl import MRMTL
from silofl.data.federation import SiloCollection
from silofl.errors import ConfigError
from silofl.privacy.budget import PlannedCharge
from silofl.privacy.node_level import affected_examples
from silofl.privacy.targets import PrivacyTarget
from silofl.training import selection

#: methods that run on graph data (node-level unit): those built on local passes, the
#: IFCA family (node-level cluster selection, `training.selection.node_sensitivity`) and
#: Weight Erosion (one node-level DP-SGD step per round, or its local pass); not the
#: local-DP methods (privatekt, fedavg_ldp), whose uploads are accounted per example
NODE_METHODS = ("mrmtl", "local", "fedavg", "finetune", "ditto", "mocha", "ifca",
                "ifca_local", "ifca_finetune", "ifca_mrmtl", "weight_erosion")


@dataclass
class GraphSilo:
    """Public facts of one region for planning: name, persons, privacy target."""

    name: str
    n_train: int
    target: PrivacyTarget | None = None
    X_test: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    y_test: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def n_test(self) -> int:
        return 0


@dataclass
class GraphFederation(SiloCollection):
    silos: list[GraphSilo]
    task: str = "binary"
    name: str = "pandemic"


def exact_mean(W: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Mean of the models W (K, P) weighted by sizes (K,), exactly rounded sums
    (math.fsum): independent of the order of the rows."""
    W = np.asarray(W, dtype=np.float64)
    sizes = np.asarray(sizes, dtype=np.float64)
    weighted = sizes[:, None] * W
    return np.array([math.fsum(col) for col in weighted.T]) / math.fsum(sizes)


class RegionMRMTL(MRMTL):
    """MR-MTL (`algorithms.mrmtl`) sending the new personal models (not their change)
    and averaging them with `exact_mean`; same privacy cost, same silo step."""

    def silo_step(self, silos, message, trainer, round):
        anchor = message[None, :].repeat(silos.params.shape[0], 0)
        new = trainer.run(silos.params, anchor=anchor, lam=self.lam, round=round)
        return SiloState(new), new

    def server_step(self, server, update, weights):
        return ServerState(exact_mean(update, weights))


def make_method(name: str, lam: float, **options):
    """The algorithm `name` (one of `NODE_METHODS`) for graph data; `options` are
    `algorithms.make_algorithm`'s (clusters, selection_fraction, selection_rounds for the
    IFCA family; we_user — a region name —, we_p_s, we_p_d, we_options for Weight
    Erosion)."""
    if name not in NODE_METHODS:
        raise ConfigError(f"method {name!r} cannot run on the pandemic data (node-level "
                          f"privacy unit); choose one of {', '.join(NODE_METHODS)}")
    if name == "weight_erosion" and not options.get("we_user"):
        raise ConfigError("weight_erosion personalizes one model for a user region: set "
                          "we_user to a region's name (e.g. we_user = 'region-51001'; "
                          "`silofl pandemic train --we-user`)")
    return RegionMRMTL(lam) if name == "mrmtl" else make_algorithm(name, lam=lam, **options)


def method_of(cfg, names: list[str] | None = None):
    """`make_method` for a `pipeline.PandemicConfig` (its method, λ and method options),
    bound to the region `names` when given (Weight Erosion's user is a region name)."""
    alg = make_method(cfg.method, cfg.lam, clusters=cfg.clusters, we_user=cfg.we_user,
                      we_options={"update": cfg.we_update})
    if names is not None:
        alg.bind_silos(list(names))
    return alg


def selection_charges(alg, silo: str, method: str, epsilon: float, rounds: list[int],
                      total_rounds: int) -> list:
    """The budget-store charges of the IFCA family's private cluster selections among
    `rounds` (1-based, of a `total_rounds` run) on one region with target ε `epsilon`:
    one ε_sel = selection_fraction·ε exponential mechanism (ε_sel²/8-zCDP, label
    "select") per selection round. [] for other methods."""
    if not isinstance(alg, IFCA):
        return []
    until = alg.schedule(total_rounds).select_until
    count = sum(1 for t in rounds if t <= until)
    if not count:
        return []
    event = selection.selection_event(alg.selection_fraction * float(epsilon))
    return [PlannedCharge(silo, method, SELECT_LABEL, event, count)]


def selection_summary(alg, n: int, S: int, adjacency: str, epsilon: float,
                      rounds: int) -> dict | None:
    """What a region's privacy record says about the IFCA family's private cluster
    selections in a `rounds`-round run (None for other methods): how many, the ε of each,
    its zCDP ρ and the sensitivity it ran at. The graph model is a classifier (focal
    loss), so the score is the training error rate (B = 1) and Δ = A/n
    (`training.selection.node_sensitivity`)."""
    charges = selection_charges(alg, "", "", epsilon, list(range(1, rounds + 1)), rounds)
    if not charges:
        return None
    eps = alg.selection_fraction * float(epsilon)
    A = affected_examples(int(n), int(S), adjacency)
    return {"count": charges[0].count, "epsilon": eps, "zcdp_rho": charges[0].event.rho,
            "mechanism": "exponential mechanism (report-noisy-min, Gumbel), "
                         "node-level replacement adjacency",
            "score": "training error rate over all n persons' examples at the round's "
                     "training windows",
            "sensitivity": f"A/n = {A}/{int(n)} = {A / int(n):.4g} (A = affected examples)"}


class GraphSource:
    """Trainer data source over regions' neighbourhood features.

    regions: objects with ``.features`` (`features.NeighbourhoodFeatures`) and ``.n``;
    transform(k, X) maps gathered examples (B, D) of region k to model inputs (B, P − 1)
    float32; seed keys the (public, data-independent) training window of every person in
    every round (`NeighbourhoodFeatures.epoch_windows(seed, round)`)."""

    def __init__(self, regions: list, transform: Callable[[int, np.ndarray], np.ndarray],
                 seed: int):
        self.regions = regions
        self.transform = transform
        self.seed = int(seed)
        self.n = np.array([r.n for r in regions], dtype=np.int64)
        self._round = None
        self._windows: dict[int, np.ndarray] = {}

    def start_round(self, round: int) -> None:
        """Each person's training window in `round` (computed per region on first use)."""
        if round != self._round:
            self._round, self._windows = round, {}

    def _window(self, k: int) -> np.ndarray:
        w = self._windows.get(k)
        if w is None:
            self._windows.clear()  # one region's windows at a time (memory)
            w = self._windows[k] = self.regions[k].features.epoch_windows(self.seed,
                                                                          self._round)
        return w

    def gather(self, silos: np.ndarray, idx: np.ndarray):
        """Persons idx[j] of region silos[j] → X (k, B, P − 1) float32, y (k, B) float64,
        None (no precomputed norms)."""
        Xs, ys = [], []
        for k, persons in zip(np.asarray(silos), np.asarray(idx)):
            k = int(k)
            F = self.regions[k].features
            X, y = F.gather(persons, self._window(k)[persons].astype(np.int64))
            Xs.append(self.transform(k, X))
            ys.append(y.astype(np.float64))
        return np.stack(Xs), np.stack(ys), None

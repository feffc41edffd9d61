"""Flower classes for federated pandemic training and prediction (needs ``flwr``; import
it through `silofl.pandemic.federated`, which explains how to install it when missing).

The classes are thin: a client's `fit` is `silo.client_train_round` (which reserves and
settles the round in the client's own budget store, ``client_dir/budget.sqlite``), the
strategy's `aggregate_fit` is `silo.server_aggregate` (`pipeline.server_step`).
Parameters on the wire are one float64 vector: the region's weights (client → server) or
the mean model (server → client); in round 1 the server sends no tensor, meaning "start
from the common initialization" (its length depends on the clients' data layout).

`run_in_process` (the networked runtime's, `silofl.runtime.network.flower`) drives a
strategy and client factories through Flower's own `Server` loop without a network or a
simulation engine: each request builds a fresh client from its factory, as the
challenge's runtime does, so every client must rebuild its state from ``client_dir``.
"""

from __future__ import annotations

from pathlib import Path

import flwr as fl
from flwr.common import (EvaluateIns, FitIns, Parameters, ndarrays_to_parameters,
                         parameters_to_ndarrays)

from silofl.errors import SiloflError
from silofl.pandemic import silo
from silofl.pandemic.pipeline import PandemicConfig
# the networked runtime's in-process Flower driver (one for both tracks), re-exported
from silofl.runtime.network.flower import FitOnlyStrategy
from silofl.runtime.network.flower import InProcessClientProxy, run_in_process  # noqa: F401


class TrainClient(fl.client.NumPyClient):
    """One region's training client (state in ``client_dir``)."""

    def __init__(self, cid: str, paths, client_dir: Path, config: PandemicConfig):
        super().__init__()
        self.cid, self.paths, self.client_dir, self.config = cid, paths, client_dir, config

    def get_parameters(self, config):
        return []

    def fit(self, parameters, config):
        w, n, metrics = silo.client_train_round(self.cid, self.paths, self.client_dir,
                                                parameters, int(config["round"]),
                                                self.config)
        return [w], n, metrics

    def evaluate(self, parameters, config):
        return 0.0, 0, {}


class TestClient(fl.client.NumPyClient):
    """One region's prediction client: writes its predictions in `evaluate`."""

    def __init__(self, cid: str, paths, client_dir: Path, preds_format_path: Path,
                 preds_dest_path: Path):
        super().__init__()
        self.cid, self.paths, self.client_dir = cid, paths, client_dir
        self.preds_format_path, self.preds_dest_path = preds_format_path, preds_dest_path

    def get_parameters(self, config):
        return []

    def fit(self, parameters, config):
        return [], 0, {}

    def evaluate(self, parameters, config):
        n = silo.client_predict(self.cid, self.paths, self.client_dir,
                                self.preds_format_path, self.preds_dest_path)
        return 0.0, n, {}


def _all_clients(client_manager) -> list:
    clients = client_manager.all()
    return [clients[cid] for cid in sorted(clients)]


class TrainStrategy(FitOnlyStrategy):
    """MR-MTL server: broadcast the mean model, average the regions' models by size."""

    def __init__(self, server_dir: Path, config: PandemicConfig):
        super().__init__()
        self.server_dir, self.config = Path(server_dir), config

    def initialize_parameters(self, client_manager) -> Parameters:
        return ndarrays_to_parameters([])  # "start from the common initialization"

    def configure_fit(self, server_round, parameters, client_manager):
        ins = FitIns(parameters, {"round": int(server_round)})
        return [(c, ins) for c in _all_clients(client_manager)]

    def aggregate_fit(self, server_round, results, failures):
        if failures:
            raise SiloflError(f"{len(failures)} client(s) failed in round {server_round} "
                              f"(first: {failures[0]!r}); the mean model needs every "
                              "region's update, so training stops here")
        updates = [(parameters_to_ndarrays(res.parameters)[0], res.num_examples)
                   for _, res in results]
        mean = silo.server_aggregate(updates)
        silo.save_server_state(self.server_dir, mean, server_round,
                               [dict(res.metrics) for _, res in results])
        return ndarrays_to_parameters([mean]), {}


class TestStrategy(fl.server.strategy.Strategy):
    """One round in which every client writes its predictions."""

    def __init__(self, server_dir: Path):
        super().__init__()
        self.server_dir = Path(server_dir)

    def initialize_parameters(self, client_manager) -> Parameters:
        mean = silo.load_server_mean(self.server_dir)
        return ndarrays_to_parameters([] if mean is None else [mean])

    def configure_fit(self, server_round, parameters, client_manager):
        return []

    def aggregate_fit(self, server_round, results, failures):
        return None, {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        ins = EvaluateIns(parameters, {"round": int(server_round)})
        return [(c, ins) for c in _all_clients(client_manager)]

    def aggregate_evaluate(self, server_round, results, failures):
        if failures:
            raise SiloflError(f"{len(failures)} client(s) failed to predict "
                              f"(first: {failures[0]!r})")
        return None, {}

    def evaluate(self, server_round, parameters):
        return None

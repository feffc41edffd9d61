"""The PETs challenge's federated entry points (pandemic track): a preset over the
networked runtime (`silofl.runtime.network`), see `flower_app`.

The challenge's runtime calls four factories.  Each client holds one region's seven
input files (see `partition.partition_by_region` to split a dataset that way) and a
private ``client_dir`` that persists between rounds and between the training and test
stages; the server has ``server_dir``:

* ``train_client_factory(cid, <7 paths>, client_dir)`` → a Flower client running the
  networked silo program of its region (`network.RegionSiloProgram`): it checks every
  request against its own plan, reserves each round in its lifetime budget store
  (``client_dir/budget.sqlite``; refused when it would exceed the lifetime target) before
  its records are read, runs the algorithm's silo step and settles;
* ``train_strategy_factory(server_dir)`` → (strategy, rounds): a roster pins the clients'
  keys, then the networked server program runs the algorithm's server step (MR-MTL: the
  size-weighted mean of the region models);
* ``test_client_factory(cid, <7 paths>, client_dir, preds_format_path,
  preds_dest_path)`` → a client that writes its persons' risk scores (``pid,score``,
  in the order of the format file) with its personalized model;
* ``test_strategy_factory(server_dir)`` → (strategy, 1).

Every factory takes an optional ``config`` (a `pipeline.PandemicConfig`, default: the
default recipe with node-level ε = 5 per region, node+edges adjacency, secure noise,
declared preprocessing); the challenge's runtime passes none.  ``config.method`` may be
any of `engine.NODE_METHODS`.  Each client's config sets its own privacy target — the
server never does.  Without a network or Flower's simulation engine,
`flower_app.run_in_process` (the networked runtime's driver) runs the same factories in
one process.
"""

from __future__ import annotations

from pathlib import Path

from silofl.errors import ConfigError
from silofl.pandemic.pipeline import PandemicConfig


def _flower():
    """The Flower classes; ConfigError with the install hint when flwr is missing."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise ConfigError('the federated pandemic entry points need Flower (flwr); '
                          'install it with: pip install "silofl[flower]"') from None
    from silofl.pandemic import flower_app
    return flower_app


def train_client_factory(cid: str, person_data_path: Path, household_data_path: Path,
                         residence_location_data_path: Path,
                         activity_location_data_path: Path,
                         activity_location_assignment_data_path: Path,
                         population_network_data_path: Path,
                         disease_outcome_data_path: Path, client_dir: Path,
                         config: PandemicConfig | None = None):
    """A Flower NumPyClient training the region held in the seven files (the
    partition specific to client ``cid``); state lives in ``client_dir``."""
    paths = (person_data_path, household_data_path, residence_location_data_path,
             activity_location_data_path, activity_location_assignment_data_path,
             population_network_data_path, disease_outcome_data_path)
    return _flower().TrainClient(str(cid), paths, Path(client_dir),
                                 config or PandemicConfig())


def train_strategy_factory(server_dir: Path, config: PandemicConfig | None = None):
    """(Flower strategy, number of rounds) for training; the mean model and the
    clients' reported ε are saved in ``server_dir`` after every round."""
    cfg = config or PandemicConfig()
    cfg.validate()
    if not cfg.private:
        raise ConfigError("the federated entry points run private jobs only (each region "
                          "enforces its budget); train a non-private baseline in process "
                          "(`silofl pandemic train --no-private`)")
    return _flower().TrainStrategy(Path(server_dir), cfg), cfg.rounds


def test_client_factory(cid: str, person_data_path: Path, household_data_path: Path,
                        residence_location_data_path: Path,
                        activity_location_data_path: Path,
                        activity_location_assignment_data_path: Path,
                        population_network_data_path: Path,
                        disease_outcome_data_path: Path, client_dir: Path,
                        preds_format_path: Path, preds_dest_path: Path):
    """A Flower NumPyClient that writes client ``cid``'s predictions to
    ``preds_dest_path`` using the model trained into ``client_dir``."""
    paths = (person_data_path, household_data_path, residence_location_data_path,
             activity_location_data_path, activity_location_assignment_data_path,
             population_network_data_path, disease_outcome_data_path)
    return _flower().TestClient(str(cid), paths, Path(client_dir), Path(preds_format_path),
                                Path(preds_dest_path))


def test_strategy_factory(server_dir: Path):
    """(Flower strategy, 1): one round in which every client writes its predictions."""
    return _flower().TestStrategy(Path(server_dir)), 1


# pytest must not mistake the challenge's test_* factories for tests
test_client_factory.__test__ = False  # type: ignore[attr-defined]
test_strategy_factory.__test__ = False  # type: ignore[attr-defined]

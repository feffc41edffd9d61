"""The PETs challenge's federated entry points as a preset over the networked runtime
(needs ``flwr``; import it through `silofl.pandemic.federated`, which explains how to
install it when missing).

There is no second Flower integration here: a client is the networked runtime's
`SiloClient` over a `network.RegionSiloProgram` opened from the challenge's arguments, and
the training strategy is its `SiloflStrategy` over a `ServerProgram`. What the preset adds
is only what the challenge's runtime does not give:

* **identity**: each client makes its own signing key in ``client_dir/keys`` on first use;
  the strategy's first step is a roster — every connected client says who it is (its
  region's name, its public key, its model inputs) signed with that key — and the server
  pins those keys in ``server_dir/keys`` (trust on first use: the challenge's runtime is
  the authority that connects clients; `silofl deploy init` registers keys in advance
  instead). From then on every join and reply is verified as on any network;
* **settings**: the job is `network.graph_job` of the given `PandemicConfig`; each client's
  own (ε, δ = 1/n by default, noise mode) come from the config its factory received and
  are kept in ``client_dir/silo.json`` (the test stage re-opens the silo with them);
* **state on disk**: the runtime builds a fresh client for every request, so a client
  re-accepts its job from ``client_dir/state`` (`SiloProgram.resume`); its lifetime store
  is ``client_dir/budget.sqlite``;
* **every region in every round** (``min_silos`` = all): the challenge's mean model needs
  every region, so a round one region refuses stops the run (checkpointed).

The test stage is one evaluate round: the server sends its final broadcast (from its
checkpoint) and each client writes its own persons' scores; nothing leaves the silo.
"""

from __future__ import annotations

import json
from pathlib import Path

import flwr as fl
from flwr.common import EvaluateIns, GetPropertiesIns, Parameters, ndarrays_to_parameters

from silofl.errors import ConfigError, SiloflError
from silofl.io import write_json_atomic
from silofl.pandemic.challenge import write_predictions
from silofl.pandemic.engine import NODE_METHODS
from silofl.pandemic.network import RegionSiloProgram, graph_job, region_name
from silofl.pandemic.partition import input_directory
from silofl.pandemic.pipeline import PandemicConfig
from silofl.pandemic.readers import read_dataset
from silofl.privacy.ledger import silo_file_id
from silofl.runtime.network import messages as W
from silofl.runtime.network.clientapp import SiloClient
from silofl.runtime.network.deploy import write_silo_key

# the networked runtime's in-process Flower driver, re-exported for the challenge's users
from silofl.runtime.network.flower import (  # noqa: F401
    FitOnlyStrategy,
    InProcessClientProxy,
    SiloflStrategy,
    run_in_process,
)
from silofl.runtime.network.server import ServerConfig, ServerProgram
from silofl.runtime.network.silo import new_nonce
from silofl.runtime.network.silo_config import SiloConfig

SILO_FILE = "silo.json"       # the client's own settings (name, ε, δ, noise)
ROSTER_FILE = "roster.json"   # the server's job and pinned keys


def open_region_silo(cid: str, paths, client_dir: Path,
                     config: PandemicConfig | None) -> RegionSiloProgram:
    """The silo program of client ``cid`` (its seven files ``paths``, state in
    ``client_dir``), re-joined to the job it accepted before. ``config`` None (test stage):
    the settings kept by training."""
    client_dir = Path(client_dir)
    client_dir.mkdir(parents=True, exist_ok=True)
    folder = input_directory(paths, client_dir / "inputs")
    data = read_dataset(folder)
    name = region_name(data, cid)
    kept = client_dir / SILO_FILE
    saved = json.loads(kept.read_text()) if kept.is_file() else None
    if config is None:
        if saved is None:
            raise ConfigError(f"{client_dir} holds no trained client state; run the "
                              "training stage with this client_dir first")
        mine = saved
    else:
        config.validate()
        mine = {"name": name, "epsilon": float(config.epsilon),
                "delta": float(config.delta) if config.delta is not None
                else 1.0 / data.num_persons, "noise": config.noise}
        if saved is not None and saved != mine:
            raise ConfigError(f"{client_dir} holds the state of a different run (silo "
                              f"{saved['name']!r}, ε {saved['epsilon']}, δ {saved['delta']:.3g}"
                              f", noise {saved['noise']!r}); give each run and each client "
                              "its own fresh client_dir")
        if saved is None:
            write_json_atomic(kept, mine)
    if mine["name"] != name:
        raise ConfigError(f"client {cid!r} was trained as {mine['name']!r} but its files form "
                          f"{name!r}; use the same partition")
    key = client_dir / "keys" / "silo.key"
    if not key.is_file():
        write_silo_key(client_dir, "silo")
    cfg = SiloConfig(name=name, data=folder, epsilon=mine["epsilon"], delta=mine["delta"],
                     lifetime_epsilon=mine["epsilon"], budget_store=client_dir / "budget.sqlite",
                     state_dir=client_dir / "state", private_key=key, server_address="",
                     root_certificate=None, noise=mine["noise"], methods=NODE_METHODS,
                     data_kind="graph")
    program = RegionSiloProgram(cfg, data=data, recipe=config)
    program.resume()
    return program


class TrainClient(SiloClient):
    """One region's training client: the networked silo program."""

    def __init__(self, cid: str, paths, client_dir: Path, config: PandemicConfig):
        super().__init__(open_region_silo(cid, paths, client_dir, config))


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
        program = open_region_silo(self.cid, self.paths, self.client_dir, None)
        if program.plan is None:
            raise ConfigError(f"{self.client_dir} holds no trained client state; run the "
                              "training stage with this client_dir first")
        scores = program.predict(parameters[0] if len(parameters) else None)
        write_predictions(program.data.pid_index, scores, self.preds_format_path,
                          self.preds_dest_path)
        return 0.0, program.region.n, {}


class TrainStrategy(SiloflStrategy):
    """The networked server strategy, after a roster that pins the clients' keys and
    builds the job (`graph_job`) from the config and the regions that answered."""

    def __init__(self, server_dir: Path, config: PandemicConfig):
        self.server_dir, self.config = Path(server_dir), config
        super().__init__(None)

    def configure_fit(self, server_round, parameters, client_manager):
        if self.p is None:
            self.p = self._roster(client_manager)
        return super().configure_fit(server_round, parameters, client_manager)

    def _roster(self, client_manager) -> ServerProgram:
        keys, dims = {}, set()
        for cid, proxy in sorted(client_manager.all().items()):
            nonce = new_nonce()
            res = proxy.get_properties(GetPropertiesIns(
                {"protocol": W.PROTOCOL, "kind": "hello", "nonce": nonce}),
                timeout=60.0, group_id=None)
            rep = W.check_fields(dict(res.properties), W.HELLO_REPLY, "hi")
            if rep["nonce"] != nonce:
                raise W.ProtocolError(f"client {cid}: its hello does not answer this nonce")
            W.verify(W.public_key_from_pem(rep["public_key"]), rep, None)  # holds the key
            pinned = self.server_dir / "keys" / f"{silo_file_id(rep['silo'])}.pub"
            if pinned.is_file() and pinned.read_text() != rep["public_key"]:
                raise W.ProtocolError(f"client {cid} claims to be {rep['silo']!r} with another "
                                      f"key than the one pinned in {pinned}; rejected")
            if rep["silo"] in keys:
                raise ConfigError(f"two clients hold region {rep['silo']!r}; give each client "
                                  "a distinct partition")
            pinned.parent.mkdir(parents=True, exist_ok=True)
            pinned.write_text(rep["public_key"])
            keys[rep["silo"]], dims = pinned, dims | {rep["dim"]}
        if not keys:
            raise SiloflError("no client is connected; nothing to train")
        if len(dims) != 1:
            raise ConfigError(f"the regions' features give different model inputs {sorted(dims)}"
                              "; every client must use the same data layout")
        job = graph_job(self.config, sorted(keys), dims.pop())
        write_json_atomic(self.server_dir / ROSTER_FILE,
                          {"job": job, "keys": {n: str(p) for n, p in keys.items()}})
        return challenge_server(self.server_dir)


def challenge_server(server_dir: Path) -> ServerProgram:
    """The server program of the roster kept in ``server_dir`` (resumed from its
    checkpoint there)."""
    server_dir = Path(server_dir)
    path = server_dir / ROSTER_FILE
    if not path.is_file():
        raise ConfigError(f"{server_dir} holds no trained server state; run the training "
                          "stage with this server_dir first")
    roster = json.loads(path.read_text())
    n = len(roster["keys"])
    return ServerProgram(ServerConfig(
        address="", job=roster["job"], silos={k: Path(p) for k, p in roster["keys"].items()},
        state_dir=server_dir, expected_silos=n, min_silos=n, certificates=None))


class TestStrategy(FitOnlyStrategy):
    """One round in which every client writes its predictions with its personal model
    (the server's final broadcast attached, for methods whose personal model is shared)."""

    def __init__(self, server_dir: Path):
        super().__init__()
        self.server_dir = Path(server_dir)

    def initialize_parameters(self, client_manager) -> Parameters:
        return ndarrays_to_parameters([challenge_server(self.server_dir).message])

    def configure_fit(self, server_round, parameters, client_manager):
        return []

    def aggregate_fit(self, server_round, results, failures):
        return None, {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        ins = EvaluateIns(parameters, {"round": int(server_round)})
        clients = client_manager.all()
        return [(clients[cid], ins) for cid in sorted(clients)]

    def aggregate_evaluate(self, server_round, results, failures):
        if failures:
            raise SiloflError(f"{len(failures)} client(s) failed to predict "
                              f"(first: {failures[0]!r})")
        return None, {}

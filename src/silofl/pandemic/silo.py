"""One region's side and the server's side of federated MR-MTL, as plain functions over
files (no Flower here; `silofl.pandemic.flower_app` wraps these in Flower classes).

A federated client holds one region's seven input files and a private folder
(``client_dir``) that outlives each round — the challenge's runtime builds a fresh
client object every round, so everything a client must remember lives on disk:

* ``budget.sqlite`` — the region's lifetime budget store (`silofl.privacy.budget`).
  Every round reserves what it will spend there (the round's DP-SGD steps, and in the
  first round a private preprocessing release) *before* its data is read, and settles
  it afterwards (also on failure); a round that would take the region past its lifetime
  target (the client config's ε, δ when the store first sees the region) is refused.
* ``ledger.jsonl`` — the region's privacy ledger for this run: one line per charge,
  written before that charge's data is read (`pipeline.region_round`).  On every round
  the ledger is rebuilt from this file and may spend only what is reserved.
* ``preprocessing.json`` — with ``preprocessing="private"``: the released constants
  (charged once, in the first round; later rounds reuse them: post-processing).
* ``state.npz`` / ``state.json`` — the region's personalized weights (standardized input
  space, and folded to raw inputs for prediction), the rounds trained, the config.

Each round the client rebuilds its features from its files (deterministic: same pruning,
same constants), plans σ for the whole run exactly as the in-process `pipeline.train`
does (the core planner), and runs `pipeline.region_round` — one pass of the core
`LocalTrainer` with the node-level unit, the code `train` runs for each region.  The
server step is `pipeline.server_step` (`engine.exact_mean`, as in `train`).  MR-MTL only.  With the same config and seed (``noise="seeded"``),
and partitions as written by `partition.partition_by_region`, the federated run therefore
reproduces `train` exactly (see tests/pandemic/test_federated.py); with secure noise (the
default) no two runs draw the same noise.  With ``preprocessing="uncharged"`` and
``pooling="mean"`` or ``"concat"`` the location longitude/latitude z-scores, computed over
the locations a dataset lists, differ between a partition and the full data, and so do
the weights (declared constants do not).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from collections import Counter

from silofl.errors import ConfigError, PrivacyError
from silofl.pandemic.features import FeatureConstants
from silofl.pandemic.node_dp import NodeLevelDpEvent
from silofl.pandemic.partition import input_directory
from silofl.pandemic.pipeline import (
    PandemicConfig, Region, build_features, fit_region_scaling, initial_weights, new_model,
    open_budget, plan_regions, planned_charges, predict_region, privacy_entry, raw_weights,
    region_round, server_step, write_predictions,
)
from silofl.pandemic.readers import PandemicData, read_dataset
from silofl.privacy import events
from silofl.privacy.budget import BudgetStore

BUDGET_FILE = "budget.sqlite"
PREPROCESSING_FILE = "preprocessing.json"
LEDGER_FILE = "ledger.jsonl"
STATE_ARRAYS = "state.npz"
STATE_META = "state.json"
SERVER_MEAN = "mean_latest.npy"
SERVER_META = "server.json"


def silo_name(data: PandemicData, cid: str) -> str:
    """The silo's name, which also keys its random streams (`pipeline.region_streams`):
    ``region-<county>`` when every person of the partition lives in one county (the
    name the in-process federated mode gives that region), else ``client-<cid>``."""
    if data.num_regions == 1 and np.all(data.region == 0):
        return f"region-{int(data.region_codes[0])}"
    return f"client-{cid}"


@dataclass
class Silo:
    data: PandemicData
    region: Region


def open_silo(cid: str, paths, client_dir: Path, cfg: PandemicConfig, *,
              build: bool = True) -> Silo:
    """Read the client's files; its one region (all of its persons, contacts among them),
    with features built when ``build`` (constants: declared, uncharged, or the private
    ones saved in ``client_dir``); reads features and states, no labels."""
    cfg.validate()
    data = read_dataset(input_directory(paths, Path(client_dir) / "inputs"))
    region = Region(silo_name(data, cid), np.arange(data.num_persons), S=cfg.S)
    if build:
        saved = load_preprocessing(Path(client_dir))
        if cfg.preprocessing == "private" and saved is None:
            raise ConfigError(f"{client_dir} holds no private preprocessing release; run "
                              "the training stage with this client_dir first")
        _build(data, region, cfg, saved)
    return Silo(data, region)


def _build(data: PandemicData, r: Region, cfg: PandemicConfig, saved: dict | None) -> None:
    """Features with the saved private release (if any), and its input scaling."""
    build_features(data, r, cfg, None if saved is None else
                   FeatureConstants(**saved["constants"]))
    if saved is not None and saved.get("shift") is not None:
        r.shift = np.asarray(saved["shift"], np.float64)
        r.scale = np.asarray(saved["scale"], np.float64)


def load_preprocessing(client_dir: Path) -> dict | None:
    path = client_dir / PREPROCESSING_FILE
    return json.loads(path.read_text()) if path.is_file() else None


# --- the client's files ---------------------------------------------------------------

def _load_meta(client_dir: Path) -> dict | None:
    path = client_dir / STATE_META
    return json.loads(path.read_text()) if path.is_file() else None


def _check_meta(meta: dict, r: Region, cfg: PandemicConfig, client_dir: Path) -> None:
    if meta["region"] != r.name or meta["config"] != json.loads(json.dumps(asdict(cfg))):
        raise ConfigError(f"{client_dir} holds the state of a different run (region "
                          f"{meta['region']!r} or another config); give each run and "
                          "each client its own fresh client_dir")


def _ledger_lines(r: Region, client_dir: Path) -> list[dict]:
    path = client_dir / LEDGER_FILE
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    for d in lines:
        if d["silo"] != r.name:
            raise PrivacyError(f"{path} is the ledger of {d['silo']!r}, not of "
                               f"{r.name!r}; give each client its own client_dir")
    return lines


def restore_ledger(r: Region, client_dir: Path, lines: list[dict] | None = None) -> None:
    """Replay the charges recorded in ``client_dir/ledger.jsonl`` into ``r.ledger`` (a
    fresh ledger whose allowance covers them) and make it append there from now on."""
    for d in _ledger_lines(r, client_dir) if lines is None else lines:
        r.ledger.charge(NodeLevelDpEvent.from_dict(d["event"]), round=d["round"],
                        label=d["label"])
    r.ledger.path = client_dir / LEDGER_FILE


def client_train_round(cid: str, paths, client_dir: Path | str, parameters: list,
                       round: int, cfg: PandemicConfig) -> tuple[np.ndarray, int, dict]:
    """Round ``round`` on one client: ``parameters`` is the server's mean model ([] in
    round 1: start from the common initialization).  Plans σ for the whole run, reserves
    this round's spending in ``client_dir/budget.sqlite`` (BudgetExceeded, nothing read,
    if the region's lifetime budget cannot pay), restores the ledger, builds features
    (a private preprocessing release in the first round), charges and trains
    (`pipeline.region_round`), persists weights and state and settles the store.
    Returns (weights (P,), n persons, metrics)."""
    if cfg.method != "mrmtl":
        raise ConfigError(f"the challenge's Flower clients run MR-MTL only, got method "
                          f"{cfg.method!r}; train other methods in process (pipeline.train)")
    client_dir = Path(client_dir)
    client_dir.mkdir(parents=True, exist_ok=True)
    silo = open_silo(cid, paths, client_dir, cfg, build=False)
    r = silo.region
    meta = _load_meta(client_dir)
    if meta is not None:
        _check_meta(meta, r, cfg, client_dir)
        if round <= max(meta["rounds"], default=0):
            raise ConfigError(f"client {cid!r} already trained round {round} (rounds "
                              f"{meta['rounds']} are recorded in {client_dir}); rounds "
                              "must increase — start a new run with a fresh client_dir")
    plan_regions([r], cfg)
    saved = load_preprocessing(client_dir)
    store = reservation = None
    if cfg.private:
        lines = _ledger_lines(r, client_dir)
        spent: Counter = Counter()
        for d in lines:
            for e, c in events.flatten(NodeLevelDpEvent.from_dict(d["event"])).items():
                spent[e] += c
        release = cfg.private_preprocessing and saved is None
        store = BudgetStore(client_dir / BUDGET_FILE)
        try:
            reservation = open_budget(
                store, [r], cfg, command=f"silofl.pandemic client {cid} round {round}",
                charges={r.name: planned_charges(r, cfg, rounds=[round], preprocess=release)},
                allowance={r.name: spent})
        except BaseException:
            store.close()
            raise
    try:
        if reservation is not None:  # earlier rounds' charges, then this round's
            restore_ledger(r, client_dir, lines)
            reservation.start[r.name] = len(r.ledger.entries)
        w, rounds = _train_round(silo, r, cfg, client_dir, parameters, round, meta, saved)
        if reservation is not None:
            reservation.settle()
        privacy = privacy_entry(r, cfg, len(rounds), store,
                                reservation.run_id if reservation else None)
    except BaseException:
        if reservation is not None:
            reservation.settle("failed")
        raise
    finally:
        if store is not None:
            store.close()
    (client_dir / STATE_META).write_text(json.dumps(
        {"region": r.name, "config": asdict(cfg), "rounds": rounds, "privacy": privacy},
        indent=1, default=float))
    metrics = {"region": r.name, "rounds_trained": len(rounds)}
    if cfg.private:
        metrics.update(epsilon_spent=float(privacy["epsilon_spent"]),
                       target_epsilon=float(cfg.epsilon), delta=float(privacy["delta"]))
    return w, r.n, metrics


def _train_round(silo: Silo, r: Region, cfg: PandemicConfig, client_dir: Path,
                 parameters: list, round: int, meta: dict | None,
                 saved: dict | None) -> tuple[np.ndarray, list[int]]:
    _build(silo.data, r, cfg, saved)  # private and nothing saved: the release, charged
    if cfg.private_preprocessing and saved is None:
        (client_dir / PREPROCESSING_FILE).write_text(json.dumps(
            {"region": r.name, "constants": r.constants.to_dict(),
             "shift": None if r.shift is None else r.shift.tolist(),
             "scale": None if r.scale is None else r.scale.tolist()}, indent=1))
    fit_region_scaling(r, cfg)
    model = new_model(r.features, cfg)
    init = initial_weights(model, cfg)
    w = np.load(client_dir / STATE_ARRAYS)["w"] if meta is not None else init
    anchor = np.asarray(parameters[0], np.float64) if len(parameters) else init
    if anchor.shape != init.shape:
        raise ConfigError(f"the server sent a model of shape {anchor.shape}, client "
                          f"trains {init.shape}; server and clients must use the same "
                          "pooling and data layout")
    w = region_round(model, w, anchor, r, cfg, round)
    rounds = (meta["rounds"] if meta else []) + [int(round)]
    np.savez(client_dir / STATE_ARRAYS, w=w, w_raw=raw_weights(w, r))
    return w, rounds


def client_state(client_dir: Path | str) -> dict:
    """What a client recorded: region, config, rounds trained and its privacy entry."""
    meta = _load_meta(Path(client_dir))
    if meta is None:
        raise ConfigError(f"{client_dir} holds no trained client state; run the "
                          "training stage with this client_dir first")
    return meta


def client_predict(cid: str, paths, client_dir: Path | str, preds_format_path,
                   preds_dest_path) -> int:
    """Score the client's persons with its personalized model (saved by training in
    ``client_dir``, with the config it was trained with) and write them in the order of
    the format file.  Like the centralized `predict`, scores stay in the silo (written to
    its own preds file).  Returns the number of persons scored."""
    client_dir = Path(client_dir)
    meta = client_state(client_dir)
    cfg = PandemicConfig(**meta["config"])
    silo = open_silo(cid, paths, client_dir, cfg)
    if silo.region.name != meta["region"]:
        raise ConfigError(f"client {cid!r} was trained as {meta['region']!r} but its "
                          f"test files form {silo.region.name!r}; use the same partition")
    scores = predict_region(silo.region, np.load(client_dir / STATE_ARRAYS)["w_raw"], cfg)
    write_predictions(silo.data.pid_index, scores, preds_format_path, preds_dest_path)
    return silo.region.n


# --- the server -------------------------------------------------------------------------

def server_aggregate(updates: list[tuple[np.ndarray, int]]) -> np.ndarray:
    """The mean model from the clients' (weights (P,), n persons): `server_step`."""
    if not updates:
        raise ConfigError("no client returned a model this round; the mean model needs "
                          "every region's update")
    shapes = {np.shape(w) for w, _ in updates}
    if len(shapes) != 1:
        raise ConfigError(f"clients returned models of different shapes {sorted(shapes)}; "
                          "every client must use the same pooling and data layout")
    W = np.stack([np.asarray(w, np.float64) for w, _ in updates])
    return server_step(W, np.array([n for _, n in updates], np.float64))


def save_server_state(server_dir: Path | str, mean: np.ndarray, round: int,
                      clients: list[dict]) -> None:
    """Persist the mean model and the clients' reported privacy after ``round``."""
    server_dir = Path(server_dir)
    server_dir.mkdir(parents=True, exist_ok=True)
    np.save(server_dir / SERVER_MEAN, mean)
    (server_dir / SERVER_META).write_text(json.dumps(
        {"round": int(round), "clients": clients}, indent=1, default=float))


def load_server_mean(server_dir: Path | str) -> np.ndarray | None:
    path = Path(server_dir) / SERVER_MEAN
    return np.load(path) if path.is_file() else None

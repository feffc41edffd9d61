"""A networked dp_gbdt job's trees saved in the run-directory format of `silofl run`
(``models/dp_gbdt/``: `silofl.runtime.tree_release`, cards from its one builder), so that
`silofl predict --run <folder>` and ``silofl.load_run(folder).predictor(silo)`` work on a
silo's and the server's folder exactly as for a networked GLM (`release`):

* a silo's folder (``[silo] run_dir``): its own model under its name (the shared trees
  with its personal leaves and local trees, when the job grows them) and the shared
  ensemble as the pseudo-silo ``shared``;
* the server's folder (``[server] run_dir``): the shared ensemble as ``shared``.

Both beside the files the hosts already write (``gbdt*.json``, their XGBoost exports and
privacy reports). Post-processing of what the job released: no row is read, nothing is
charged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from silofl.config.run import TreesConfig
from silofl.errors import ConfigError
from silofl.models.trees import TreeEnsemble
from silofl.privacy import events
from silofl.privacy.ledger import silo_file_id
from silofl.runtime.network.gbdt_host import GBDT, SEEDED, bounds_note
from silofl.runtime.tree_release import (
    SHARED,
    tree_card,
    write_card,
    write_ensemble,
    write_manifest,
)


@dataclass
class Released:
    """What a card states beside the trees, from the GLM release's helpers (`release`
    computes it: preprocessing of new rows, classes, schema, adjacency)."""

    job: dict
    job_hash: str
    trees: TreesConfig
    names: list[str]
    preprocessing: dict
    classes: list | None
    schema: dict | None
    adjacency: str


def _save(folder: Path, r: Released, models: list[tuple[str, TreeEnsemble, dict]],
          shared: TreeEnsemble, bounds, n_train: int | None, notes: list[str]) -> Path:
    """Write ``folder/models/dp_gbdt/``: each (name, ensemble, privacy) of `models` with
    its card, the shared ensemble and the manifest; returns `folder`."""
    d = Path(folder) / "models" / GBDT
    d.mkdir(parents=True, exist_ok=True)
    method = {"name": GBDT, **r.trees.model_dump()}
    entries = []
    for name, ens, privacy in models:
        mine = name != SHARED
        fid = silo_file_id(name) if mine else SHARED
        stem = f"model-{fid}" if mine else SHARED  # the manifest's shared files
        files = {**write_ensemble(d, stem, ens), "card": f"card-{fid}.json"}
        card = tree_card(silo=name, file_id=fid, label=GBDT, method=method,
                         task=r.job["task"], classes=r.classes,
                         n_train=n_train if mine else None, bounds=bounds,
                         preprocessing=r.preprocessing, privacy=privacy,
                         sigma=privacy.get("sigma"), files=dict(files), personal=mine,
                         extra={"networked": True, "job_hash": r.job_hash})
        _state_bounds_source(card, r.job)
        entries.append({"name": name, "file_id": fid, **files,
                        "sha256": write_card(d, files, card)})
    write_manifest(d, label=GBDT, method=method, shared=shared, task=r.job["task"],
                   classes=r.classes, feature_names=r.names, schema=r.schema, silos=entries,
                   extra={"networked": True, "job_hash": r.job_hash, "private": True,
                          "noise": r.job["noise"], "notes": notes,
                          "run_id": r.job_hash[:16]})
    return Path(folder)


def _state_bounds_source(card: dict, job: dict) -> None:
    """The card states where its bins' bounds came from, as a run's does; pre-encoded data
    (no schema) says so instead of naming schema bounds it did not have."""
    card["bins"]["bounds_from"] = bounds_note(job)
    if not job["schema_sha256"]:
        card["bins"]["source"] = card["privacy"]["bins"]["source"] = bounds_note(job)


def _silo_privacy(host: Any, adjacency: str) -> dict:
    """A silo's statement: its own σ_k and the ε of what it ran, its store."""
    p, c = host.program, host.program.cfg
    mine = host.privacy()
    life = p.store.spent(c.name)
    notes = [f"lifetime store {Path(c.budget_store).resolve()}: {life['epsilon']:.4g} of ε "
             f"{life['target_epsilon']:g} spent (δ {life['delta']:g}) by every job it counted"]
    if c.noise == "seeded":
        notes.append(SEEDED)
    statement = (f"this model: ({mine['epsilon']:.4g}, {c.delta:g})-DP for the records of "
                 f"silo {c.name!r} (add/remove one record), {mine['accountant']} accountant, "
                 f"the whole run's releases (shared trees, bins, local trees) at σ_k = "
                 f"{mine['sigma']:.4g}; each round reserved in its store before it ran")
    return {**mine, "private": True, "statement": statement, "adjacency": adjacency,
            "privacy_unit": "example", "budget_store": str(Path(c.budget_store).resolve()),
            "lifetime": life, "notes": notes, "uncharged": [], "scratch_store": False}


def save_silo_models(host: Any, r: Released) -> Path:
    """Write a silo's trees (its own and the shared) in its release folder.

    Parameters
    ----------
    host : GbdtSiloHost
        The silo's host after the MODEL round.
    r : Released
        The job's facts every card states.

    Returns
    -------
    Path
        The folder (``[silo] run_dir``) to pass to ``silofl predict --run``.
    """
    p = host.program
    shared = host.silo.shared_ensemble
    if shared is None:
        raise ConfigError(f"silo {p.cfg.name!r} has not received the final model yet")
    shared = TreeEnsemble(**{**vars(shared), "feature_names": host.names})
    privacy = _silo_privacy(host, r.adjacency)
    shared_privacy = {**privacy, "statement": "the shared ensemble: post-processing of every "
                      "silo's noisy releases; this silo's records are covered by the "
                      "statement of its own card (the others' by theirs)"}
    return _save(p.cfg.release_dir, r, [(p.cfg.name, host.personal or shared, privacy),
                                        (SHARED, shared, shared_privacy)],
                 shared, host.silo.bounds, int(p.n_train), privacy["notes"])


def save_server_models(host: Any, r: Released, folder: Path) -> Path:
    """Write the server's shared ensemble (pseudo-silo ``shared``) in `folder`.

    Parameters
    ----------
    host : GbdtServerHost
        The server's host, its program done.
    r : Released
        The job's facts every card states.
    folder : Path
        ``[server] run_dir``.

    Returns
    -------
    Path
        `folder`.
    """
    p, srv = host.program, host.server
    notes = [SEEDED] if r.job["noise"] == "seeded" else []
    silos = {n: {"sigma": g.sigma, "q": g.q, "releases_per_tree": g.steps,
                 "status": g.status, "rounds": len(g.rounds),
                 "event": events.to_json(srv.s.run_event(g.sigma))}
             for n, g in p.silos.items()}
    privacy = {"private": True, "epsilon": None, "sigma": None, "silos": silos,
               "adjacency": r.adjacency, "privacy_unit": "example",
               "noise": r.job["noise"], "notes": notes, "uncharged": [],
               "budget_store": None, "scratch_store": False,
               "epsilon_note": "each silo's ε is in its own card (its δ stays at the silo); "
                               "'silos' states every σ_k and the event it charged",
               "statement": "the shared ensemble is post-processing of the silos' noisy "
                            "releases (bins' counts, histograms, leaf sums): the records of "
                            "each silo are protected by the guarantee in that silo's own "
                            "model card (σ_k calibrated and charged at the silo; the server "
                            "saw no row)"}
    return _save(folder, r, [(SHARED, srv.ensemble, privacy)], srv.ensemble, host.bounds,
                 None, notes)

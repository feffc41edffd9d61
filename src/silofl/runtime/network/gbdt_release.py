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

from pathlib import Path
from typing import Any

from silofl.config.run import TreesConfig
from silofl.errors import ConfigError
from silofl.models.trees import TreeEnsemble
from silofl.privacy import events
from silofl.privacy.ledger import silo_file_id
from silofl.runtime.network import release
from silofl.runtime.network.silo_table import declared_constants, read_schema
from silofl.runtime.tree_release import tree_card, write_card, write_ensemble, write_manifest

GBDT = "dp_gbdt"
SEEDED = "noise = 'seeded': reproducible experiment noise, NOT a privacy guarantee"


def _save(folder: Path, job: dict, job_hash: str, method: dict, models: list[tuple[str, TreeEnsemble, dict]],
          shared: TreeEnsemble, names: list[str], schema, constants: dict | None,
          bounds, n_train: int | None, notes: list[str]) -> Path:
    """Write ``folder/models/dp_gbdt/``: each (name, ensemble, privacy) of `models` with
    its card, the shared ensemble and the manifest; returns `folder`."""
    d = Path(folder) / "models" / GBDT
    d.mkdir(parents=True, exist_ok=True)
    classes = release._classes(schema)
    prep = release._preprocessing(names, schema, constants)
    entries = []
    for name, ens, privacy in models:
        mine = name != release.SHARED
        fid = silo_file_id(name) if mine else release.SHARED
        stem = f"model-{fid}" if mine else release.SHARED  # the manifest's shared files
        files = {**write_ensemble(d, stem, ens), "card": f"card-{fid}.json"}
        card = tree_card(silo=name, file_id=fid, label=GBDT, method=method, task=job["task"],
                         classes=classes, n_train=n_train if mine else None, bounds=bounds,
                         preprocessing=prep, privacy=privacy, sigma=privacy.get("sigma"),
                         files=dict(files), personal=mine,
                         extra={"networked": True, "job_hash": job_hash})
        entries.append({"name": name, "file_id": fid, **files,
                        "sha256": write_card(d, files, card)})
    write_manifest(d, label=GBDT, method=method, shared=shared, task=job["task"],
                   classes=classes, feature_names=names,
                   schema=None if schema is None else schema.to_dict(), silos=entries,
                   extra={"networked": True, "job_hash": job_hash, "private": True,
                          "noise": job["noise"], "notes": notes, "run_id": job_hash[:16]})
    return Path(folder)


def _silo_privacy(host: Any) -> dict:
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
    return {**mine, "private": True, "statement": statement,
            "adjacency": release.adjacency(p.job), "privacy_unit": "example",
            "budget_store": str(Path(c.budget_store).resolve()), "lifetime": life,
            "notes": notes, "uncharged": [], "scratch_store": False}


def save_silo_models(host: Any, trees: TreesConfig) -> Path:
    """Write a silo's trees (its own and the shared) in its release folder.

    Parameters
    ----------
    host : GbdtSiloHost
        The silo's host after the MODEL round.
    trees : TreesConfig
        The job's [trees] settings (`gbdt_host.job_trees`).

    Returns
    -------
    Path
        The folder (``[silo] run_dir``) to pass to ``silofl predict --run``.
    """
    p = host.program
    shared = host.silo.shared_ensemble
    if shared is None:
        raise ConfigError(f"silo {p.cfg.name!r} has not received the final model yet")
    names = list(host.names or [f"x{i}" for i in range(host.s.d)])
    shared = TreeEnsemble(**{**vars(shared), "feature_names": host.names})
    privacy = _silo_privacy(host)
    shared_privacy = {**privacy, "statement": "the shared ensemble: post-processing of every "
                      "silo's noisy releases; this silo's records are covered by the "
                      "statement of its own card (the others' by theirs)"}
    return _save(p.cfg.release_dir, p.job, p.hash, {"name": GBDT, **trees.model_dump()},
                 [(p.cfg.name, host.personal or shared, privacy),
                  (release.SHARED, shared, shared_privacy)], shared, names,
                 p.schema, getattr(p, "constants", None), host.silo.bounds, int(p.n_train),
                 privacy["notes"])


def save_server_models(host: Any, trees: TreesConfig, folder: Path) -> Path:
    """Write the server's shared ensemble (pseudo-silo ``shared``) in `folder`.

    Parameters
    ----------
    host : GbdtServerHost
        The server's host, its program done.
    trees : TreesConfig
        The job's [trees] settings.
    folder : Path
        ``[server] run_dir``.

    Returns
    -------
    Path
        `folder`.
    """
    p, srv = host.program, host.server
    job = p.job
    schema = None if p.cfg.schema is None else read_schema(p.cfg.schema, "server")
    constants = None if schema is None else declared_constants(schema, job)
    names = list(host.feature_names or [f"x{i}" for i in range(host.s.d)])
    notes = [SEEDED] if job["noise"] == "seeded" else []
    silos = {n: {"sigma": r.sigma, "q": r.q, "releases_per_tree": r.steps,
                 "status": r.status, "rounds": len(r.rounds),
                 "event": events.to_json(srv.s.run_event(r.sigma))}
             for n, r in p.silos.items()}
    privacy = {"private": True, "epsilon": None, "sigma": None, "silos": silos,
               "adjacency": release.adjacency(job), "privacy_unit": "example",
               "noise": job["noise"], "notes": notes, "uncharged": [],
               "budget_store": None, "scratch_store": False,
               "epsilon_note": "each silo's ε is in its own card (its δ stays at the silo); "
                               "'silos' states every σ_k and the event it charged",
               "statement": "the shared ensemble is post-processing of the silos' noisy "
                            "releases (bins' counts, histograms, leaf sums): the records of "
                            "each silo are protected by the guarantee in that silo's own "
                            "model card (σ_k calibrated and charged at the silo; the server "
                            "saw no row)"}
    return _save(folder, job, p.hash, {"name": GBDT, **trees.model_dump()},
                 [(release.SHARED, srv.ensemble, privacy)], srv.ensemble, names, schema,
                 constants, host.bounds, None, notes)

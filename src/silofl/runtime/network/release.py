"""The models a networked job released, saved in the format of `silofl run`
(`silofl.experiments.artifacts`), so that `silofl predict --run <folder>` and `load_run`
work on them.

* Each silo saves its own personal model and model card in its own folder
  (``[silo] run_dir``, default its state dir): ``models/<method>/``.
* The server saves the shared model (methods with one) in ``[server] run_dir`` (default its
  state dir) as the pseudo-silo ``shared``, with a card that says whose guarantee covers it.
* dp_gbdt: the same layout with tree ensembles (`gbdt_release`; cards from
  `silofl.runtime.tree_release.tree_card`, the builder `silofl run` uses), a silo's folder
  holding its own model and the shared ensemble (``shared``).

Saving is post-processing of what the job already released (the silo's DP-SGD outputs and
the broadcasts): it reads no rows and charges nothing. A card states only the guarantee the
code gives: the silo's own (ε, δ) under its own accountant, composed over the rounds it
ran, the adjacency, its noise mode and its store's path and lifetime position.
"""

from __future__ import annotations

import json
from pathlib import Path

import dp_accounting as dpa
import numpy as np

from silofl._version import FORMAT, FORMAT_VERSION, silofl_version
from silofl.errors import ConfigError
from silofl.io import dumps_strict, file_hashes, sha256_file, write_bytes_atomic, write_npz_atomic
from silofl.privacy.ledger import silo_file_id, tightest
from silofl.privacy.targets import ADJACENCY, PERSON_ADJACENCY
from silofl.runtime.network.gbdt_host import job_trees
from silofl.runtime.network.gbdt_release import Released, save_server_models, save_silo_models
from silofl.runtime.network.hosting import consortium_method, local_dp_family, round_events
from silofl.runtime.network.jobspec import job_model
from silofl.runtime.network.silo_table import declared_constants, is_private, read_schema
from silofl.runtime.simulator import _shared
from silofl.runtime.tree_release import SHARED  # the server's model: `predict --silo shared`

HYPER = ("rounds", "local_epochs", "batch_size", "lr", "clip", "l2", "seed", "weighted")
ORDER = ("encode by the schema, clip to 'clip', fill gaps with 'fill', then (x - center) / "
         "scale per 'standardize'")


def _json(obj) -> bytes:
    return dumps_strict(obj, indent=1, ensure_ascii=False).encode()


def _spec(job: dict, model) -> dict:
    return {"name": job["model"], "dim": int(job["dim"]), "num_classes": int(job["num_classes"]),
            "options": {}, "num_params": int(model.num_params)}


def _method(job: dict) -> dict:
    own = {"fedprox": ("prox_mu",), "apfl": ("apfl_alpha", "apfl_alpha_lr")}
    keys = ("lam", "finetune_fraction", "clusters", "we_user", *own.get(job["method"], ()))
    return {"name": job["method"], **{k: job[k] for k in keys}}


def _write(root: Path, job: dict, model, entry: dict, params: np.ndarray, card: dict,
           extra: dict) -> Path:
    """models/<method>/ with one model, its card and the manifest (artifacts' format)."""
    d = Path(root) / "models" / job["method"]
    d.mkdir(parents=True, exist_ok=True)
    spec = _spec(job, model)
    write_npz_atomic(d / entry["params"], params=np.asarray(params, dtype=np.float64),
                     spec=np.array(json.dumps(spec)))
    write_bytes_atomic(d / entry["card"], _json(card))
    # hashes checked on load, as for `silofl run`'s models (a swapped/truncated file is refused)
    entry = {**entry, "sha256": file_hashes(d, {k: entry[k] for k in ("params", "card")})}
    shared_sha = sha256_file(d / extra["shared"]) if extra.get("shared") else None
    write_bytes_atomic(d / "manifest.json", _json({
        "format": FORMAT, "format_version": FORMAT_VERSION, "silofl_version": silofl_version(),
        "method": job["method"], "method_params": _method(job), "model": spec,
        "task": job["task"], "silos": [entry], "networked": True, "job_hash": extra["job"],
        **{k: extra[k] for k in ("classes", "feature_names", "input_shape", "schema",
                                 "private", "noise", "notes", "run_id", "shared",
                                 "shared_kind")}, "shared_sha256": shared_sha}))
    return d


def _preprocessing(names: list[str], schema, constants: dict | None,
                   private: bool = False) -> dict:
    c = constants or {}
    silo = next(iter((c.get("silos") or {}).values()), None) if "silos" in c else c
    silo = silo or {}
    return {"feature_names": names, "schema": None if schema is None else schema.to_dict(),
            "steps": ("private: this silo's charged Gaussian release (post-processed)"
                      if private else "declared (schema constants; no cost)")
            if schema is not None else "none: pre-encoded .npz data", "clip": c.get("clip", {}),
            "fill": silo.get("fill", {}), "standardize": silo.get("standardize", {}),
            "order": ORDER, "note": "declared constants are public (from the schema); "
            "private ones are post-processed outputs of this silo's charged release"}


def adjacency(job: dict) -> str:
    """The neighbouring relation of a job's guarantees, in words (its privacy unit)."""
    return PERSON_ADJACENCY if job.get("privacy_unit") == "person" else ADJACENCY


def silo_privacy(program) -> dict:
    """What protects the records of this silo in its released model: its own target, the
    composition of the rounds it ran (reserved in its store before each ran), its store."""
    c, p, job = program.cfg, program.plan, program.job
    pass_event = None if program.cap is not None else program._data_pass_event()
    rounds = [round_events(program.algorithm, pass_event, t, job["rounds"], p.target)
              for t in range(1, program.done + 1)]
    prep = getattr(program, "prep", None)
    released = prep is not None and prep.private and not program.table_release_due
    if prep is not None and released:  # the private release, charged with its first round
        rounds.append(prep.events[c.name])
    eps, kind = tightest(dpa.ComposedDpEvent(rounds), c.delta) if rounds else (0.0, "none")
    life = program.store.spent(c.name)
    notes = [f"lifetime store {Path(c.budget_store).resolve()}: {life['epsilon']:.4g} of ε "
             f"{life['target_epsilon']:g} spent (δ {life['delta']:g}) by every job it counted"]
    if c.noise == "seeded":
        notes.append("seeded noise: reproducible experiment noise, NOT a privacy guarantee")
    if program.exhausted:
        notes.append(f"the silo stopped early: {getattr(program, '_why', '')[:300]}")
    person = job.get("privacy_unit") == "person"
    who = (f"the persons of silo {c.name!r} (person level: add/remove all rows of one "
           "person)" if person else f"the records of silo {c.name!r} (add/remove one record)")
    statement = (f"this model: ({eps:.4g}, {c.delta:g})-DP for {who}, {kind} accountant, "
                 "composed over the "
                 f"{program.done} round(s) it ran of the job's {job['rounds']}"
                 + (" and its private preprocessing release" if released else "")
                 + f" (calibrated at the silo for its job target ε = {c.epsilon:g})")
    if local_dp_family(program.algorithm):
        statement += "; each upload also passed the job's local-DP mechanism"
    if c.noise == "seeded":
        statement += "; " + notes[-1 if not program.exhausted else -2]
    shared = uldp_privacy(program)
    if shared is not None:
        statement += (f"; consortium-wide for a person in any number of silos, inside the "
                      f"SecAgg+ sum; this silo's own share alone (if SecAgg+ fails): "
                      f"ε = {shared['share_epsilon']:.4g}")
    return {"private": True, "statement": statement, "adjacency": adjacency(job),
            **({"uldp": shared} if shared is not None else {}),
            "privacy_unit": job.get("privacy_unit", "example"),
            "noise": c.noise, "epsilon": eps, "delta": c.delta, "accountant": kind,
            "target_epsilon": c.epsilon, "rounds_run": program.done,
            "noise_multiplier": getattr(program, "sigma_used", None) or p.noise_multiplier,
            "q": p.q, "steps_per_pass": p.steps_per_pass,
            "budget_store": str(Path(c.budget_store).resolve()), "lifetime": life, "notes": notes,
            "uncharged": [], "scratch_store": False}


def uldp_privacy(program) -> dict | None:
    """A uldp silo's two figures over the rounds it ran (`privacy.uldp.consortium_report`):
    the consortium-wide person-level ε (what its store was charged) and its share's ε if
    SecAgg+ fails (noise σ/√K); None for other methods or before a round ran."""
    if not consortium_method(program.algorithm) or program.done == 0 \
            or not program.sigma_used:
        return None
    from silofl.privacy.uldp import consortium_report
    return consortium_report(float(program.sigma_used), program.K, program.done,
                             program.plan.target, program.algorithm.sample_rate)


def save_silo_release(program) -> Path:
    """Write the silo's released personal model and its card under its release dir; returns
    the run folder (what `silofl predict --run` takes)."""
    if program.job is None or program.done == 0:
        raise ConfigError(f"silo {program.cfg.name!r} ran no round: no model to save")
    if getattr(program, "gbdt", None) is not None:  # trees: its files saved at MODEL
        program.gbdt.save_release()
        return save_silo_models(program.gbdt, _released(
            program.job, program.hash, program.feature_names, program.schema,
            getattr(program, "constants", None)))
    if program.job["data_kind"] != "tabular":
        raise ConfigError("graph regions keep their model in their state dir (pandemic track)")
    c, job = program.cfg, program.job
    fid = silo_file_id(c.name)
    entry = {"name": c.name, "file_id": fid, "params": f"model-{fid}.npz",
             "card": f"card-{fid}.json"}
    params = program.final_model()
    privacy = silo_privacy(program)
    names = list(program.feature_names or [f"x{i}" for i in range(job["dim"])])
    card = _card(job, c.name, fid, program.model, names, program.schema,
                 getattr(program, "constants", None), privacy, entry,
                 private=bool(getattr(program, "prep", None) and program.prep.private))
    card.update(n_train=int(program.plan.n), job_hash=program.hash)
    _write(c.release_dir, job, program.model, entry, params, card, _extra(
        job, program.hash, names, program.schema, privacy, program.hash[:16]))
    return c.release_dir


def save_server_release(program) -> Path | None:
    """Write the server's shared model (None: the method has none, e.g. Local, IFCA's
    clusters, Mocha); returns the run folder. ConfigError when the silos preprocessed with
    their own private constants: the shared model then has no one preprocessing to save."""
    job, cfg = program.job, program.cfg
    if getattr(program, "gbdt", None) is not None:  # the ensemble and its privacy report
        if program.gbdt.save_release(cfg.release_dir) is None:
            return None
        schema = None if cfg.schema is None else read_schema(cfg.schema, "server")
        return save_server_models(program.gbdt, _released(
            job, program.hash, program.gbdt.feature_names, schema,
            None if schema is None else declared_constants(schema, job)), cfg.release_dir)
    model = job_model(job)
    shared = _shared(program.server) if job["method"] != "local" else None
    if shared is None or np.ndim(shared) != 1 or program.done == 0:
        return None
    if job["data_kind"] == "tabular" and is_private(job):
        raise ConfigError("the silos standardized/imputed with their own private constants, "
                          "so the shared model has no single preprocessing to save with it; "
                          "use each silo's own saved model")
    schema = None if cfg.schema is None else read_schema(cfg.schema, "server")
    constants = None if schema is None else declared_constants(schema, job)
    names = schema.feature_names if schema is not None else \
        [f"x{i}" for i in range(job["dim"])]
    entry = {"name": SHARED, "file_id": SHARED, "params": "shared.npz",
             "card": f"card-{SHARED}.json"}
    privacy = {
        "private": True, "adjacency": adjacency(job),
        "privacy_unit": job.get("privacy_unit", "example"),
        "statement": ("the shared model is post-processing of the silos' DP updates: the "
                      + ("persons (person level: all rows of one person)"
                         if job.get("privacy_unit") == "person" else "records")
                      + " of each silo are protected by the guarantee in that silo's "
                      "own model card (its (ε, δ), calibrated and charged at the silo; the "
                      "server never sees them)"),
        "noise": job["noise"], "silos": {n: {"sigma": r.sigma, "q": r.q, "steps": r.steps,
                                              "rounds": r.rounds}
                                          for n, r in program.silos.items()},
        "notes": ([f"noise = {job['noise']!r}: reproducible experiment noise, NOT a privacy "
                   "guarantee"] if job["noise"] == "seeded" else []),
        "uncharged": [], "budget_store": None, "scratch_store": False}
    if consortium_method(program.algorithm):  # uldp: one σ, the sum of every silo's share
        privacy["uldp_sigma"] = program.consortium_sigma()
        privacy["statement"] += (
            f"; uldp: each round's step used only the SecAgg+ sum of all {len(program.names)} "
            f"silos' shares (noise σ = {privacy['uldp_sigma']:.4g} times the clip, person level "
            "across silos for a person in any number of silos); each silo's card states that "
            "figure and its own share's ε if SecAgg+ fails")
    card = _card(job, SHARED, SHARED, model, names, schema, constants,
                 privacy, entry)
    card.update(rounds_done=program.done, job_hash=program.hash)
    _write(cfg.release_dir, job, model, entry, shared, card, {
        **_extra(job, program.hash, names, schema, privacy, program.hash[:16]),
        "shared": "shared.npz", "shared_kind": "server model"})
    return cfg.release_dir


def _card(job, name, fid, model, names, schema, constants, privacy, entry,
          private: bool = False) -> dict:
    return {"format": FORMAT, "format_version": FORMAT_VERSION,
            "silofl_version": silofl_version(), "kind": "model card", "silo": name,
            "file_id": fid, "method": {"label": job["method"], **_method(job)},
            "hyperparameters": {k: job[k] for k in HYPER if k in job},
            "model": _spec(job, model), "task": job["task"], "classes": _classes(schema),
            "preprocessing": _preprocessing(names, schema, constants, private),
            "privacy": privacy, "files": {k: entry[k] for k in ("params", "card")},
            "networked": True}


def _released(job: dict, job_hash: str, names, schema, constants) -> Released:
    """What a tree card states beside the trees (as a GLM card states it)."""
    names = list(names or [f"x{i}" for i in range(job["dim"])])
    return Released(job, job_hash, job_trees(job), names,
                    _preprocessing(names, schema, constants), _classes(schema),
                    None if schema is None else schema.to_dict(), adjacency(job))


def _classes(schema):
    if schema is None or schema.label.kind == "regression":
        return None
    return list(schema.label.classes)


def _extra(job, job_hash, names, schema, privacy, run_id) -> dict:
    return {"job": job_hash, "classes": _classes(schema), "feature_names": list(names),
            "input_shape": [int(job["dim"])],
            "schema": None if schema is None else schema.to_dict(),
            "private": privacy["private"], "noise": job["noise"], "notes": privacy["notes"],
            "run_id": run_id, "shared": None, "shared_kind": None}

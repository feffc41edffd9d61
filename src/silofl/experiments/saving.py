"""Saving a run's released models: one folder per method under ``models/`` with each silo's
parameters, model card and a manifest with SHA-256 (the format `artifacts` reads back).

Saving is post-processing: the models and the private constants are DP outputs already;
nothing here reads training data or spends budget.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from silofl._version import FORMAT, FORMAT_VERSION, silofl_version
from silofl.data.exam import EXAM_SCHEMA
from silofl.data.heart import heart_schema
from silofl.data.schema import load_schema, schema_from_dict
from silofl.data.school import school_schema
from silofl.experiments.artifacts import NON_PRIVATE
from silofl.experiments.run_trees import TreeResult
from silofl.io import dumps_strict, file_hashes, sha256_file, write_bytes_atomic, write_npz_atomic
from silofl.privacy.ledger import silo_file_id
from silofl.privacy.targets import ADJACENCY
from silofl.runtime.rules import clip_entry


def _run_schema(dc) -> dict | None:
    """The declared schema the run encoded its table with (None: no schema, e.g. images,
    generated data, or a table encoded from the data itself)."""
    if dc.schema:
        return load_schema(dc.schema).to_dict()
    if dc.source == "heart":
        return heart_schema().to_dict()
    if dc.source == "school":
        return school_schema().to_dict()
    if dc.source == "exam":
        return schema_from_dict(EXAM_SCHEMA, where="exam schema").to_dict()
    return None


def model_spec(cfg, model, fed) -> dict:
    """Everything `make_model` needs to rebuild `model` (as `build.build_model` made it)."""
    mc = cfg.model
    options: dict = {}
    if mc.name == "focal":
        options = {"gamma": model.gamma, "alpha": model.alpha}
    elif hasattr(model, "module"):  # torch: the architecture follows from these
        options = {"task": model.task, "input_shape": list(model.input_shape),
                   "hidden": list(mc.hidden) or None, "seed": model.seed}
    spec = {"name": mc.name, "dim": int(fed.dim), "num_classes": max(fed.num_classes, 2),
            "options": options, "num_params": int(model.num_params)}
    if hasattr(model, "module"):
        spec["architecture"] = [[n, list(s)] for n, s in zip(model._names, model._shapes)]
    return spec


def release_info(cfg, model, fed) -> dict:
    """What `save_models` needs beyond the results (kept on `RunReport.release`)."""
    return {"model": None if model is None else model_spec(cfg, model, fed),  # None: trees only
            "schema": _run_schema(cfg.data),
            "feature_names": list(fed.feature_names), "task": fed.task,
            "classes": fed.meta.get("classes"),
            "input_shape": list(fed.silos[0].X_train.shape[1:]),
            "constants": fed.meta.get("constants")}


# --- writing ------------------------------------------------------------------------------------

def _json_bytes(obj) -> bytes:
    return dumps_strict(obj, indent=1, ensure_ascii=False).encode()


def card_notes(rep, r) -> list[str]:
    """The run's notes that concern method `r`: a note about another method (it starts with
    that method's label, e.g. "ditto(λ=auto): …") is left off this method's cards.

    Parameters
    ----------
    rep : RunReport
    r : ExperimentResult, one of ``rep.results``.

    Returns
    -------
    list of str
    """
    others = {rep.label(x) for x in rep.results} - {rep.label(r)}
    return [n for n in rep.notes() if not any(n.startswith(f"{o}: ") for o in others)]


def _privacy_statement(rep, r, k: int) -> dict:
    notes = card_notes(rep, r)
    adjacency = getattr(rep, "adjacency", ADJACENCY)  # per row unless the job is per person
    person = getattr(rep, "unit", "example") == "person"
    base = {"adjacency": adjacency, "privacy_unit": "person" if person else "example",
            "noise": rep.noise, "notes": notes,
            "uncharged": list(rep.uncharged), "run_id": rep.run_id,
            "budget_store": rep.store, "scratch_store": rep.scratch}
    if not rep.config.privacy.enabled or r.ledgers is None:
        return {"private": False, "statement": NON_PRIVATE, **base}
    led = r.privacy()[k]
    job = rep.combined_privacy[k] if k < len(rep.combined_privacy) else {}
    eps = led["epsilon"]
    whom = ("the persons of this silo (per person: add/remove all rows of one person)"
            if person else "the records of this silo (per row: add/remove one record)")
    statement = (f"this model: ({eps:.4g}, {led['delta']:g})-DP for {whom}, "
                 f"{led['accountant']} accountant")
    if job.get("epsilon") is not None:
        statement += (f"; all of this job's models and constants for the silo together: "
                      f"({job['epsilon']:.4g}, {led['delta']:g})-DP")
    if rep.noise == "seeded" or rep.scratch:
        statement += "; " + "; ".join(n for n in notes if not n.startswith("uncharged"))
    return {"private": True, "statement": statement, **base,
            "epsilon": eps, "accountant": led["accountant"], "delta": led["delta"],
            "epsilon_rdp": led["epsilon_rdp"], "epsilon_pld": led["epsilon_pld"],
            "target_epsilon": led["target_epsilon"],
            "noise_multiplier": led.get("noise_multiplier"),
            "calibrated_for": led.get("calibrated_for"),
            **({"adaptive_clip": clip_entry(r.plans[k].to_dict())}
               if r.plans and clip_entry(r.plans[k].to_dict()) else {}),
            "job": {key: job.get(key) for key in ("epsilon", "accountant", "epsilon_rdp",
                                                  "epsilon_pld", "target_epsilon", "methods")},
            "job_note": ("'job' is this silo's spend for the whole job (private preprocessing "
                         "and every method composed): what releasing all its models costs")}


def save_models(rep) -> Path:
    """Write every method's models and cards under ``rep.run_dir / "models"`` (format in
    the module docstring); returns that folder."""
    info = rep.release
    root = rep.run_dir / "models"
    tc = rep.config.training
    hyper = {k: getattr(tc, k) for k in ("rounds", "local_epochs", "batch_size", "lr", "clip",
                                          "l2", "seed", "weighted")}
    if tc.clip == "auto":  # private adaptive clipping: its settings (final C_k: privacy)
        hyper.update({k: getattr(tc, k) for k in ("clip_quantile", "clip_lr", "clip_init",
                                                  "clip_max", "clip_count_noise")})
    constants = info.get("constants") or {}
    version = silofl_version()
    for r in rep.results:
        label = rep.label(r)
        d = root / label
        if isinstance(r, TreeResult):  # dp_gbdt: trees + XGBoost export (`tree_saving`)
            from silofl.experiments.tree_saving import save_tree_models
            save_tree_models(rep, r, d, label, _privacy_statement)
            continue
        d.mkdir(parents=True, exist_ok=True)
        spec = info["model"]
        spec_json = json.dumps(spec)
        silos = []
        for k, name in enumerate(r.silos):
            fid = silo_file_id(name)
            files = {"params": f"model-{fid}.npz", "card": f"card-{fid}.json"}
            write_npz_atomic(d / files["params"],
                             params=np.asarray(r.params[k], dtype=np.float64),
                             spec=np.array(spec_json))
            plan = r.plans[k].to_dict() if r.plans else {}
            card = {
                "format": FORMAT, "format_version": FORMAT_VERSION,
                "silofl_version": version, "kind": "model card",
                "silo": name, "file_id": fid,
                "method": {"label": label, **r.method}, "hyperparameters": hyper,
                "model": spec, "task": info["task"], "classes": info["classes"],
                # training units: rows, or persons at the person level (public sizes)
                **({"n_persons": plan["n_persons"]} if "n_persons" in plan
                   else {"n_train": plan.get("n_train")}),
                "preprocessing": {
                    "feature_names": info["feature_names"], "schema": info["schema"],
                    "steps": rep.preprocessing, "clip": constants.get("clip", {}),
                    **(constants.get("silos", {}).get(name) or {"fill": {}, "standardize": {}}),
                    "order": "encode by the schema, clip to 'clip', fill gaps with 'fill', "
                             "then (x - center) / scale per 'standardize'",
                    "note": ("declared constants are public; private ones are post-processed "
                             "outputs of this silo's charged Gaussian release; uncharged ones "
                             "are listed under privacy.uncharged")},
                "data_fingerprint": {
                    "run": rep.run_id,
                    "note": "the silo's budget store (silo-internal) records the fingerprint "
                            "of the rows this run read under this run id. A hash of the "
                            "records is never put in a card: whoever knows all records but "
                            "one could test both candidates against it"},
                "privacy": _privacy_statement(rep, r, k),
                "files": files}
            write_bytes_atomic(d / files["card"], _json_bytes(card))
            silos.append({"name": name, "file_id": fid, **files,
                          "sha256": file_hashes(d, files)})  # checked on load
        shared = r.shared if r.method["name"] != "local" else None  # Local has no server model
        if shared is not None:
            write_npz_atomic(d / "shared.npz", params=np.asarray(shared, np.float64),
                             spec=np.array(spec_json))
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
                    "silofl_version": version, "method": label, "method_params": r.method,
                    "model": spec, "task": info["task"], "classes": info["classes"],
                    "feature_names": info["feature_names"], "input_shape": info["input_shape"],
                    "schema": info["schema"], "private": rep.config.privacy.enabled,
                    "noise": rep.noise, "notes": rep.notes(), "run_id": rep.run_id,
                    "silos": silos, "shared": "shared.npz" if shared is not None else None,
                    "shared_kind": None if shared is None else
                    ("clusters" if np.ndim(shared) == 2 else "server model"),
                    "shared_sha256": None if shared is None else
                    sha256_file(d / "shared.npz")}
        write_bytes_atomic(d / "manifest.json", _json_bytes(manifest))
    return root


# --- loading and predicting ---------------------------------------------------------------------

"""Saving a dp_gbdt run's released trees in its run directory (`artifacts` loads them).

On-disk format (``models/<method label>/``, beside the GLMs' format of `artifacts`)::

    manifest.json          as for GLMs, with model = {"name": "trees", ...}, the shared
                           ensemble's files and their SHA-256
    shared.trees.json      the shared TreeEnsemble (`runtime.tree_release.ensemble_to_dict`)
    shared.xgb.json        the same in XGBoost's JSON model format (xgboost.Booster;
                           feature names made XGBoost-safe by
                           `models.trees.xgboost_feature_names`; the manifest's
                           ``xgboost_name_map`` maps the originals to them)
    model-<silo id>.trees.json / .xgb.json
                           silo k's personal ensemble (the shared trees, plus its own
                           local trees when [trees] local_trees > 0)
    card-<silo id>.json    the silo's model card: settings, bins (public bounds),
                           preprocessing, n, the privacy statement (ε, δ, unit, σ_k),
                           the assumptions (one card builder for this and the
                           networked runs: `runtime.tree_release.tree_card`)

Saving and predicting (`artifacts.TreePredictor`) are post-processing of the released
trees: no budget is spent.
"""

from __future__ import annotations

from pathlib import Path

from silofl.privacy.ledger import silo_file_id
from silofl.runtime.tree_release import (
    tree_card,
    write_card,
    write_ensemble,
    write_manifest,
)


def _card(rep, r, k: int, label: str, files: dict, privacy: dict) -> dict:
    info = rep.release
    constants = info.get("constants") or {}
    name = r.silos[k]
    plan = r.plans[k].to_dict() if r.plans else {}
    sigma = r.plans[k].noise_multiplier if r.plans and privacy.get("private") else None
    return tree_card(
        silo=name, file_id=silo_file_id(name), label=label, method=dict(r.method),
        task=info["task"], classes=info["classes"], n_train=plan.get("n_train"),
        bounds=r.bounds, sigma=sigma, files=files, privacy=privacy,
        preprocessing={
            "feature_names": info["feature_names"], "schema": info["schema"],
            "steps": rep.preprocessing, "clip": constants.get("clip", {}),
            **(constants.get("silos", {}).get(name) or {"fill": {}, "standardize": {}}),
            "order": "encode by the schema, clip to 'clip', fill gaps with 'fill', "
                     "then (x - center) / scale per 'standardize'"},
        extra={"data_fingerprint": {"run": rep.run_id}})


def save_tree_models(rep, r, d: Path, label: str, privacy_of) -> None:
    """Write result `r`'s trees, cards and manifest into `d` (format in the module
    docstring); `privacy_of(rep, r, k)` is silo k's privacy statement."""
    d.mkdir(parents=True, exist_ok=True)
    info = rep.release
    silos = []
    for k, name in enumerate(r.silos):
        fid = silo_file_id(name)
        files = {**write_ensemble(d, f"model-{fid}", r.params[k]), "card": f"card-{fid}.json"}
        card = _card(rep, r, k, label, dict(files), privacy_of(rep, r, k))
        silos.append({"name": name, "file_id": fid, **files,
                      "sha256": write_card(d, files, card)})
    write_manifest(d, label=label, method=r.method, shared=r.ensemble, task=info["task"],
                   classes=info["classes"], feature_names=info["feature_names"],
                   schema=info["schema"], silos=silos, extra={
                       "private": rep.config.privacy.enabled, "noise": rep.noise,
                       "notes": rep.notes(), "run_id": rep.run_id})

"""Saving a dp_gbdt run's released trees in its run directory (`artifacts` loads them).

On-disk format (``models/<method label>/``, beside the GLMs' format of `artifacts`)::

    manifest.json          as for GLMs, with model = {"name": "trees", ...}, the shared
                           ensemble's files and their SHA-256
    shared.trees.json      the shared TreeEnsemble (`ensemble_to_dict`)
    shared.xgb.json        the same in XGBoost's JSON model format (xgboost.Booster;
                           feature names made XGBoost-safe by
                           `models.trees.xgboost_feature_names`; the manifest's
                           ``xgboost_name_map`` maps the originals to them)
    model-<silo id>.trees.json / .xgb.json
                           silo k's personal ensemble (the shared trees, plus its own
                           local trees when [trees] local_trees > 0)
    card-<silo id>.json    the silo's model card: settings, bins (public bounds),
                           preprocessing, n, the privacy statement (ε, δ, unit, σ_k),
                           the assumptions

Saving and predicting (`artifacts.TreePredictor`) are post-processing of the released
trees: no budget is spent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from silofl._version import FORMAT, FORMAT_VERSION, silofl_version
from silofl.experiments.notes import ASSUMPTIONS
from silofl.experiments.tree_format import ensemble_to_dict
from silofl.io import dumps_strict, file_hashes, write_bytes_atomic
from silofl.models.trees import TreeEnsemble, xgboost_feature_names, xgboost_name_map
from silofl.privacy.ledger import silo_file_id

#: the model spec of a tree run's manifest (`artifacts.SavedRun.predictor` reads "name")
TREES = "trees"


def _write(d: Path, stem: str, ens: TreeEnsemble) -> dict[str, str]:
    files = {"params": f"{stem}.trees.json", "xgboost": f"{stem}.xgb.json"}
    write_bytes_atomic(d / files["params"], dumps_strict(ensemble_to_dict(ens)).encode())
    write_bytes_atomic(d / files["xgboost"], dumps_strict(ens.to_xgboost_json()).encode())
    return files


def _card(rep, r, k: int, label: str, files: dict, privacy: dict) -> dict:
    info = rep.release
    constants = info.get("constants") or {}
    name = r.silos[k]
    plan = r.plans[k].to_dict() if r.plans else {}
    return {"format": FORMAT, "format_version": FORMAT_VERSION,
            "silofl_version": silofl_version(), "kind": "model card", "silo": name,
            "file_id": silo_file_id(name), "method": {"label": label, **r.method},
            "hyperparameters": dict(r.method), "model": {"name": TREES},
            "task": info["task"], "classes": info["classes"], "n_train": plan.get("n_train"),
            "bins": {"bounds": np.asarray(r.bounds).tolist(), "source": (
                "private quantiles: each silo's noisy fine histogram over the declared "
                "bounds, charged (training.private_bins)" if r.method.get("bins") == "private"
                else "declared schema bounds after preprocessing (public; never from the "
                "data)")},
            "personal": _personal_note(r.method),
            "preprocessing": {
                "feature_names": info["feature_names"], "schema": info["schema"],
                "steps": rep.preprocessing, "clip": constants.get("clip", {}),
                **(constants.get("silos", {}).get(name) or {"fill": {}, "standardize": {}}),
                "order": "encode by the schema, clip to 'clip', fill gaps with 'fill', "
                         "then (x - center) / scale per 'standardize'"},
            "data_fingerprint": {"run": rep.run_id},
            "privacy": {**privacy, "assumptions": list(ASSUMPTIONS)},
            "files": files}



def _personal_note(method: dict) -> str:
    """What a silo's saved model is: shared, + personal leaves, + local trees."""
    shrink = method.get("shrink") not in (None, "off")
    if not shrink and not method.get("local_trees"):
        return "the shared ensemble"
    base = (f"the shared trees with this silo's personal leaves (shrink = "
            f"{method['shrink']}, from its own released leaf sums)" if shrink
            else "the shared trees")
    return base + (" plus this silo's own local trees" if method.get("local_trees") else "")


def save_tree_models(rep, r, d: Path, label: str, privacy_of) -> None:
    """Write result `r`'s trees, cards and manifest into `d` (format in the module
    docstring); `privacy_of(rep, r, k)` is silo k's privacy statement."""
    d.mkdir(parents=True, exist_ok=True)
    info = rep.release
    silos = []
    for k, name in enumerate(r.silos):
        fid = silo_file_id(name)
        files = _write(d, f"model-{fid}", r.params[k])
        files["card"] = f"card-{fid}.json"
        card = _card(rep, r, k, label, dict(files), privacy_of(rep, r, k))
        write_bytes_atomic(d / files["card"],
                           dumps_strict(card, indent=1, ensure_ascii=False).encode())
        silos.append({"name": name, "file_id": fid, **files, "sha256": file_hashes(d, files)})
    shared = _write(d, "shared", r.ensemble)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
                "silofl_version": silofl_version(), "method": label, "method_params": r.method,
                "model": {"name": TREES, "dim": int(r.ensemble.n_features),
                          "num_classes": 2 if info["task"] == "binary" else 0},
                "task": info["task"], "classes": info["classes"],
                "feature_names": info["feature_names"], "input_shape": info["input_shape"],
                "xgboost_feature_names": xgboost_feature_names(r.ensemble.feature_names),
                "xgboost_name_map": xgboost_name_map(r.ensemble.feature_names),
                "schema": info["schema"], "private": rep.config.privacy.enabled,
                "noise": rep.noise, "notes": rep.notes(), "run_id": rep.run_id,
                "silos": silos, "shared": shared["params"], "shared_xgboost": shared["xgboost"],
                "shared_kind": "tree ensemble", "shared_sha256": file_hashes(d, shared)}
    write_bytes_atomic(d / "manifest.json",
                       dumps_strict(manifest, indent=1, ensure_ascii=False).encode())



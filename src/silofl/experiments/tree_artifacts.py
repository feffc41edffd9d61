"""A dp_gbdt run's released trees in its run directory, and loaded back to predict.

On-disk format (``models/<method label>/``, beside the GLMs' format of `artifacts`)::

    manifest.json          as for GLMs, with model = {"name": "trees", ...}, the shared
                           ensemble's files and their SHA-256
    shared.trees.json      the shared TreeEnsemble (`ensemble_to_dict`)
    shared.xgb.json        the same in XGBoost's JSON model format (xgboost.Booster)
    model-<silo id>.trees.json / .xgb.json
                           silo k's personal ensemble (the shared trees, plus its own
                           local trees when [trees] local_trees > 0)
    card-<silo id>.json    the silo's model card: settings, bins (public bounds),
                           preprocessing, n, the privacy statement (ε, δ, unit, σ_k),
                           the assumptions

Saving and predicting are post-processing of the released trees: no budget is spent.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from silofl._version import FORMAT, FORMAT_VERSION, silofl_version
from silofl.errors import DataError
from silofl.experiments.artifacts import Predictor
from silofl.experiments.integrity import verify_file
from silofl.experiments.notes import ASSUMPTIONS
from silofl.io import dumps_strict, file_hashes, write_bytes_atomic
from silofl.models.trees import Tree, TreeEnsemble
from silofl.privacy.ledger import silo_file_id

#: the model spec of a tree run's manifest (`artifacts.SavedRun.predictor` reads "name")
TREES = "trees"


def ensemble_to_dict(ens: TreeEnsemble) -> dict:
    """The ensemble as plain JSON data (exact: floats round-trip through JSON)."""
    return {"kind": "silofl.TreeEnsemble", "n_features": ens.n_features, "task": ens.task,
            "base_score": float(ens.base_score), "feature_names": ens.feature_names,
            "trees": [{k: getattr(t, k).tolist() for k in
                       ("feature", "threshold", "left", "right", "value")} for t in ens.trees]}


def ensemble_from_dict(d: dict) -> TreeEnsemble:
    """The inverse of `ensemble_to_dict`; DataError for anything else."""
    if not isinstance(d, dict) or d.get("kind") != "silofl.TreeEnsemble":
        raise DataError("not a silofl tree ensemble file (kind 'silofl.TreeEnsemble')")
    trees = [Tree(np.array(t["feature"], np.int32), np.array(t["threshold"], np.float64),
                  np.array(t["left"], np.int32), np.array(t["right"], np.int32),
                  np.array(t["value"], np.float64)) for t in d["trees"]]
    return TreeEnsemble(int(d["n_features"]), d["task"], float(d["base_score"]), trees,
                        d.get("feature_names"))


def xgboost_names(names: list[str] | None) -> list[str] | None:
    """Feature names XGBoost accepts (no '[', ']' or '<': e.g. ``cp=<missing>`` becomes
    ``cp=(missing)``); positional names f0, f1, ... if that makes two equal."""
    if not names:
        return None
    table = str.maketrans({"[": "(", "]": ")", "<": "(", ">": ")"})
    out = [n.translate(table) for n in names]
    return out if len(set(out)) == len(out) else [f"f{j}" for j in range(len(out))]


def _write(d: Path, stem: str, ens: TreeEnsemble) -> dict[str, str]:
    files = {"params": f"{stem}.trees.json", "xgboost": f"{stem}.xgb.json"}
    write_bytes_atomic(d / files["params"], dumps_strict(ensemble_to_dict(ens)).encode())
    xgb = TreeEnsemble(ens.n_features, ens.task, ens.base_score, ens.trees,
                       xgboost_names(ens.feature_names))
    write_bytes_atomic(d / files["xgboost"], dumps_strict(xgb.to_xgboost_json()).encode())
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
            "bins": {"bounds": np.asarray(r.bounds).tolist(), "source": "declared schema "
                     "bounds after preprocessing (public; never from the data)"},
            "personal": ("the shared trees plus this silo's own local trees" if
                         r.method.get("local_trees") else "the shared ensemble"),
            "preprocessing": {
                "feature_names": info["feature_names"], "schema": info["schema"],
                "steps": rep.preprocessing, "clip": constants.get("clip", {}),
                **(constants.get("silos", {}).get(name) or {"fill": {}, "standardize": {}}),
                "order": "encode by the schema, clip to 'clip', fill gaps with 'fill', "
                         "then (x - center) / scale per 'standardize'"},
            "data_fingerprint": {"run": rep.run_id},
            "privacy": {**privacy, "assumptions": list(ASSUMPTIONS)},
            "files": files}


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
                "xgboost_feature_names": xgboost_names(r.ensemble.feature_names),
                "schema": info["schema"], "private": rep.config.privacy.enabled,
                "noise": rep.noise, "notes": rep.notes(), "run_id": rep.run_id,
                "silos": silos, "shared": shared["params"], "shared_xgboost": shared["xgboost"],
                "shared_kind": "tree ensemble", "shared_sha256": file_hashes(d, shared)}
    write_bytes_atomic(d / "manifest.json",
                       dumps_strict(manifest, indent=1, ensure_ascii=False).encode())


def load_ensemble(path: Path, expected: str | None, what: str) -> TreeEnsemble:
    """A saved ensemble, its SHA-256 checked; DataError naming `path` if damaged."""
    verify_file(path, expected, what)
    try:
        return ensemble_from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{what} {str(path)!r} is damaged ({type(e).__name__}); restore the "
                        "run directory or run the job again") from None


class _TreesModel:
    name = TREES


class TreePredictor(Predictor):
    """A silo's saved tree ensemble with the preprocessing it was trained with
    (`Predictor`'s encoding, clip, fill and scaling; then ``TreeEnsemble.predict``)."""

    def __post_init__(self):
        self.model = _TreesModel()
        if not isinstance(self.params, TreeEnsemble):
            raise DataError(f"saved model of silo {self.silo!r} is not a tree ensemble")

    def predict(self, data) -> np.ndarray:
        """(n,) P(class 1) (binary) or the prediction (regression) of new records."""
        return self.params.predict(self.transform(data))

    def to_sklearn(self):
        raise DataError("a tree model has no scikit-learn counterpart; load its XGBoost "
                        "export (model-<silo>.xgb.json) with xgboost.Booster")


def tree_predictor(run_dir: Path, label: str, man: dict, entry: dict, card: dict,
                   silo: str) -> TreePredictor:
    """Silo `silo`'s TreePredictor from a tree run's manifest `entry` (hashes checked)."""
    d = run_dir / "models" / label
    hashes = entry.get("sha256") or {}
    ens = load_ensemble(d / entry["params"], hashes.get("params"),
                        f"tree model of silo {silo!r}")
    return TreePredictor(silo, man["method"], card, man, ens)  # type: ignore[arg-type]

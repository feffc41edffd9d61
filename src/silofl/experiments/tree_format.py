"""A tree ensemble's file: silofl's own JSON (exact) (`silofl.experiments.tree_saving`
writes it, `silofl.experiments.artifacts` reads it; XGBoost-safe feature names:
`silofl.models.trees.xgboost_feature_names`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from silofl.errors import DataError
from silofl.experiments.integrity import verify_file
from silofl.models.trees import Tree, TreeEnsemble


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


def load_ensemble(path: Path, expected: str | None, what: str) -> TreeEnsemble:
    """A saved ensemble, its SHA-256 checked; DataError naming `path` if damaged."""
    verify_file(path, expected, what)
    try:
        return ensemble_from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{what} {str(path)!r} is damaged ({type(e).__name__}); restore the "
                        "run directory or run the job again") from None

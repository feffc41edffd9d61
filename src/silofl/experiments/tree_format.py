"""A tree ensemble's file: silofl's own JSON (exact) (`silofl.experiments.tree_saving`
writes it, `silofl.experiments.artifacts` reads it; XGBoost-safe feature names:
`silofl.models.trees.xgboost_feature_names`)."""

from __future__ import annotations

import json
from pathlib import Path

from silofl.errors import DataError
from silofl.experiments.integrity import verify_file
from silofl.models.trees import TreeEnsemble
from silofl.runtime.tree_release import ensemble_from_dict


def load_ensemble(path: Path, expected: str | None, what: str) -> TreeEnsemble:
    """A saved ensemble, its SHA-256 checked; DataError naming `path` if damaged."""
    verify_file(path, expected, what)
    try:
        return ensemble_from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{what} {str(path)!r} is damaged ({type(e).__name__}); restore the "
                        "run directory or run the job again") from None

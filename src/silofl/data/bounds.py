"""The public per-feature bounds that tree bins are cut over: one function of the declared
schema (each encoded column's spec) and the declared preprocessing plan, used alike by
`silofl run` (`experiments.run_trees`) and the networked runtime (`runtime.network`).

Each feature's range is its DECLARED range after preprocessing, never read from the data:
a numeric column's schema [lower, upper] (values are clipped to it), mapped through its
declared standardization ((x − center)/scale, the same in every silo), [0, 1] for binary,
one-hot and missing-indicator columns. A column without declared bounds, or standardized
per silo (private or uncharged constants: every silo would get other bins), is refused.
"""

from __future__ import annotations

import json

import numpy as np

from silofl.data.preprocess import PreprocessPlan
from silofl.data.raw import RawFederation
from silofl.errors import ConfigError

__all__ = ["bounds_from_json", "bounds_to_json", "feature_bounds"]

_BOUNDED = ("standardize = \"none\" (trees need no scaling) or \"declared\" (declared "
            "mean/scale or lower/upper in the schema)")


def feature_bounds(raw: RawFederation, prep: PreprocessPlan) -> np.ndarray:
    """The (d, 2) public [lower, upper] of every encoded feature after preprocessing.

    Parameters
    ----------
    raw : RawFederation
        The encoded silos (only their schema specs and feature names are read; rows that
        merely fit the schema give the same answer).
    prep : PreprocessPlan
        The planned preprocessing (its steps; no statistic of the data).

    Returns
    -------
    numpy.ndarray
        (d, 2) float64, in the encoded features' units after preprocessing.

    Raises
    ------
    ConfigError
        A numeric feature without declared lower/upper, or standardized per silo.
    """
    steps = {s.column: s for s in prep.steps if s.what == "standardize"}
    out = np.tile([0.0, 1.0], (len(raw.feature_names), 1))  # one-hot and indicator columns
    for j, col in raw.specs.items():
        b = col.bounds
        if b is None:
            raise ConfigError(f"dp_gbdt cuts each feature's bins over its declared range, but "
                              f"column {col.name!r} declares no lower/upper; declare them in "
                              "the schema ([data] schema; bins never come from the data)")
        st = steps.get(col.name)
        if st is None:
            out[j] = b
        elif st.mode != "declared":
            raise ConfigError(f"dp_gbdt needs one range per feature in every silo, but column "
                              f"{col.name!r} is standardized per silo ({st.mode}); set [data] "
                              f"{_BOUNDED}")
        else:
            c, s = (col.mean, col.scale) if col.mean is not None and col.scale is not None \
                else ((b[0] + b[1]) / 2, (b[1] - b[0]) / 2)
            out[j] = [(b[0] - c) / s, (b[1] - c) / s]
    return out


def bounds_to_json(bounds: np.ndarray) -> str:
    """(d, 2) bounds as their canonical JSON (a list of [lower, upper]; floats round-trip
    exactly), as a job carries them."""
    return json.dumps(np.asarray(bounds, np.float64).tolist(), separators=(",", ":"))


def bounds_from_json(text: str, d: int, where: str) -> np.ndarray:
    """(d, 2) float64 bounds from `bounds_to_json`'s text.

    Parameters
    ----------
    text : str
        The JSON list of d pairs [lower, upper].
    d : int
        The feature count they must cover.
    where : str
        What to name in an error (e.g. "job: 'bounds'").

    Returns
    -------
    numpy.ndarray
        (d, 2) float64 with lower < upper, all finite (ConfigError otherwise).
    """
    try:
        b = np.asarray(json.loads(text), dtype=np.float64)
    except (json.JSONDecodeError, TypeError, ValueError):
        b = None
    if b is None or b.shape != (d, 2) or not np.isfinite(b).all() or \
            not (b[:, 0] < b[:, 1]).all():
        raise ConfigError(f"{where} must be the JSON of {d} finite pairs [lower, upper] with "
                          f"lower < upper (one per feature), got {text[:200]!r}")
    return b

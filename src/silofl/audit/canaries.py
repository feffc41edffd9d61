"""Canary records for auditing: built from public facts only, inserted into one silo.

A canary is a synthetic record in the silo's *encoded* feature space (the columns of the
raw federation, before preprocessing). Generated canaries use only the declared schema:
each numeric column with declared bounds takes its lower or its upper bound at random (an
extreme but valid value), every other column 0 or 1 at random; the label is a random class
(regression: 0 or 1). Nothing is read from the silo's rows, so the canaries — and any score
computed from them and the released models — are post-processing of the DP release.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from silofl.data.federation import Silo
from silofl.errors import ConfigError, DataError


@dataclasses.dataclass(frozen=True)
class Canaries:
    """m canary records: X (m, d) in the raw encoded feature space, y (m,)."""

    X: np.ndarray
    y: np.ndarray

    @property
    def m(self) -> int:
        return int(self.X.shape[0])


def make_canaries(raw, m: int, rng: np.random.Generator) -> Canaries:
    """`m` canaries for `raw` (a RawFederation) from its declared column bounds (see the
    module docstring). Raises ConfigError for m < 1 and image data."""
    if m < 1:
        raise ConfigError(f"the number of canaries must be at least 1, got {m}")
    if raw.silos[0].X_train.ndim != 2:
        raise ConfigError("auditing supports tabular data with a GLM (linear, logistic, "
                          "focal, svm, softmax); image data is not supported yet")
    d = raw.silos[0].X_train.shape[1]
    X = rng.integers(0, 2, size=(m, d)).astype(float)
    for j, spec in getattr(raw, "specs", {}).items():
        b = spec.bounds
        if b is not None:
            X[:, j] = np.where(rng.random(m) < 0.5, b[0], b[1])
    if raw.task == "regression":
        y = rng.integers(0, 2, size=m).astype(float)
    else:
        y = rng.integers(0, max(raw.num_classes, 2), size=m).astype(raw.silos[0].y_train.dtype)
    return Canaries(X, y)


def check_canaries(raw, silo: str, c: Canaries) -> None:
    """Refuse canaries that do not fit `silo` of `raw`: a wrong feature shape, non-finite
    values, labels outside the task's classes, or more canaries than the silo has training
    records (they would outnumber the people whose guarantee is audited, and change the
    sampling rate and noise of the audited job beyond recognition)."""
    s = raw.silo(silo)
    shape = s.X_train.shape[1:]
    if c.X.ndim != 2 or c.X.shape[1:] != shape or c.y.shape != (c.X.shape[0],):
        raise DataError(f"canaries of shape X {c.X.shape}, y {c.y.shape} do not fit silo "
                        f"{silo!r}, whose records have {shape[0] if shape else 0} encoded "
                        f"features (X must be (m, {shape[0] if shape else 0}), y (m,))")
    if not (np.all(np.isfinite(c.X)) and np.all(np.isfinite(c.y))):
        raise DataError("canaries must be finite (a canary holds NaN or infinity)")
    if raw.task != "regression":
        C = max(raw.num_classes, 2)
        if np.any(c.y != np.round(c.y)) or np.any((c.y < 0) | (c.y >= C)):
            raise DataError(f"canary labels must be class ids 0..{C - 1} for this "
                            f"{raw.task} task")
    if c.m > s.n_train:
        raise ConfigError(f"{c.m} canaries are more than the {s.n_train} training records "
                          f"of silo {silo!r}; use at most {s.n_train} (--canaries)")


def insert(raw, silo: str, c: Canaries, included: np.ndarray):
    """`raw` with the included canaries appended to `silo`'s training rows and *all*
    canaries appended to its test rows (the test rows only receive the silo's
    preprocessing, which is how the scores see the canaries as the model does; test rows
    are never trained on). Returns a new RawFederation."""
    inc = np.asarray(included, bool)
    silos = []
    for s in raw.silos:
        if s.name == silo:
            dt = s.y_train.dtype
            s = Silo(s.name, np.concatenate([s.X_train, c.X[inc].astype(s.X_train.dtype)]),
                     np.concatenate([s.y_train, c.y[inc].astype(dt)]),
                     np.concatenate([s.X_test, c.X.astype(s.X_test.dtype)]),
                     np.concatenate([s.y_test, c.y.astype(dt)]), s.target)
        silos.append(s)
    return dataclasses.replace(raw, silos=silos, meta=dict(raw.meta))

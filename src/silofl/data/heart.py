"""Built-in default dataset: UCI Heart Disease, four hospitals as four silos.

920 patients from Cleveland (304), Hungary (293), Switzerland (123) and VA Long Beach (200);
13 clinical features (age in years, blood pressure in mm Hg, cholesterol in mg/dl, ...).
Binary target: angiographic heart disease present (``num > 0``). The ``id`` column is
dropped. The table is encoded by the declared schema ``builtin/heart_schema.toml`` (kinds,
category levels and value bounds from the public UCI documentation, cited there), so the
default preprocessing is fully declared: numeric values clipped to their bounds and mapped
to [-1, 1], gaps filled with the bounds' midpoint plus ``col__missing`` indicators, nothing
read from the patients' rows and nothing charged. Provenance and licences:
builtin/PROVENANCE.md.
"""

from __future__ import annotations

from importlib import resources

import pandas as pd

from silofl.data.federation import Federation
from silofl.data.preprocess import PreprocessSpec, preprocess_without_budget
from silofl.data.raw import RawFederation
from silofl.data.row_persons import one_row_per_person
from silofl.data.schema import Schema, SchemaLike, schema_from_dict
from silofl.data.tabular import federation_from_frame_raw

HEART_FILE = "heart_disease_uci.csv"
HEART_SCHEMA = "heart_schema.toml"
SILO_COLUMN = "dataset"
TARGET = "disease"


def heart_disease_frame() -> pd.DataFrame:
    """The raw 920 x 16 table as shipped (read through importlib.resources, so it works
    from an installed wheel as well as from a source checkout)."""
    ref = resources.files("silofl.data").joinpath("builtin", HEART_FILE)
    with ref.open("rb") as f:
        return pd.read_csv(f)


def heart_schema() -> Schema:
    """The declared schema of the heart table (``builtin/heart_schema.toml``)."""
    import tomllib
    text = resources.files("silofl.data").joinpath("builtin", HEART_SCHEMA).read_text("utf-8")
    return schema_from_dict(tomllib.loads(text), where=f"builtin {HEART_SCHEMA}")


def load_heart_disease_raw(*, test_fraction: float = 0.2, seed: int = 0,
                           missing: str = "impute", schema: SchemaLike | None = None,
                           persons: bool = False) -> RawFederation:
    """The heart federation encoded by its schema (default `heart_schema()`) and split,
    before preprocessing: X (n_k, 34) float64 with NaN in the gaps of nullable columns.
    `persons`: set person ids = row ids (every row is a distinct patient of the study;
    `silofl.data.row_persons.one_row_per_person`)."""
    df = heart_disease_frame()
    df[TARGET] = (df["num"] > 0).astype("int64")
    df = df.drop(columns=["id", "num"])
    raw = federation_from_frame_raw(df, SILO_COLUMN, TARGET,
                                    schema=heart_schema() if schema is None else schema,
                                    test_fraction=test_fraction, seed=seed, missing=missing,
                                    name="heart-disease")
    raw.meta["source"] = f"silofl.data/builtin/{HEART_FILE}"
    raw.meta["target"] = "num > 0 (angiographic heart disease present)"
    return one_row_per_person(raw) if persons else raw


def load_heart_disease(*, test_fraction: float = 0.2, seed: int = 0,
                       standardize: str | bool = "auto", impute: str = "auto",
                       missing: str = "impute", schema: SchemaLike | None = None,
                       persons: bool = False) -> Federation:
    """The built-in UCI heart-disease data: four hospitals, one binary task.

    The data is public (UCI; provenance in ``silofl/data/builtin/PROVENANCE.md``), so a
    job on it may use the restartable demo budget store.

    Parameters
    ----------
    test_fraction : float, default 0.2
        Share of each hospital's rows held out for testing.
    seed : int, default 0
        Seed of the train/test split.
    standardize : str or bool, default "auto"
        Feature scaling mode (default: declared statistics, no privacy cost; private
        modes need `load_heart_disease_raw` and `silofl.data.plan_preprocessing`).
    impute : str, default "auto"
        Missing-value mode (default: declared).
    missing : {"impute", "drop", "error"}, default "impute"
        Rows with a missing feature value.
    schema : Schema, dict or path, optional
        Another schema than the built-in one.
    persons : bool, default False
        Set ``person_train`` / ``person_test`` to row ids: each row is a distinct patient
        of the UCI study, so person-level DP equals example-level DP here (noted in
        ``meta["persons"]``).

    Returns
    -------
    Federation
        Silos Cleveland, Hungary, Switzerland, VA Long Beach; X (n_k, 34) float64 with
        one-hot categorical columns, y (n_k,) int64 in {0, 1} (1 = disease);
        ``meta["uncharged"] == []``. The silos carry no privacy target yet: set them
        with ``fed.with_targets(PrivacyTarget(epsilon, delta), {name: ...})`` before a
        private `simulate`.
    """
    raw = load_heart_disease_raw(test_fraction=test_fraction, seed=seed, missing=missing,
                                 schema=schema, persons=persons)
    return preprocess_without_budget(raw, PreprocessSpec.of(standardize, impute),
                                     "load_heart_disease")

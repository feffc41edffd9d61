"""Silos, federations and loaders for tabular, School, Exam, Titanic, MNIST, built-in and synthetic
data, splitters that turn one table into simulated silos, declared schemas and two-phase
preprocessing (plan and charge first, then compute)."""

from silofl.data.ehr import ehr_silos, ehr_silos_raw, ehr_table, write_ehr_csv
from silofl.data.exam import EXAM_SCHEMA, load_exam, load_exam_raw
from silofl.data.federation import Federation, Silo, split_indices, split_silo, standardize
from silofl.data.heart import (
    heart_disease_frame,
    heart_schema,
    load_heart_disease,
    load_heart_disease_raw,
)
from silofl.data.lazy import load_table_lazy
from silofl.data.mnist import load_rotated_masked_mnist
from silofl.data.preprocess import (
    IMPUTE_MODES,
    STANDARDIZE_MODES,
    PreprocessPlan,
    PreprocessSpec,
    Step,
    apply_preprocessing,
    plan_preprocessing,
    preprocess_without_budget,
)
from silofl.data.raw import RawFederation
from silofl.data.schema import ColumnSpec, LabelSpec, Schema, load_schema, schema_from_dict
from silofl.data.schema_draft import draft_schema
from silofl.data.school import load_school, load_school_raw, school_schema
from silofl.data.splitters import (
    SEED_SPLITS,
    SPLITS,
    split_arrays,
    split_arrays_raw,
    split_frame,
    split_frame_raw,
    split_table,
    split_table_raw,
    table_arrays,
)
from silofl.data.synthetic import linear_silos, mean_estimation, vehicle_like
from silofl.data.tabular import (
    federation_from_frame,
    federation_from_frame_raw,
    load_table,
    load_table_raw,
    read_table,
)
from silofl.data.titanic import (
    TITANIC_SCHEMA,
    load_titanic,
    load_titanic_raw,
    titanic_frame,
    titanic_schema,
)

__all__ = [
    "Federation", "Silo", "split_indices", "split_silo", "standardize",
    "load_table", "load_table_raw", "federation_from_frame", "federation_from_frame_raw",
    "read_table", "load_table_lazy",
    "load_school", "load_school_raw", "school_schema",
    "load_heart_disease", "load_heart_disease_raw", "heart_disease_frame", "heart_schema",
    "load_exam", "load_exam_raw", "EXAM_SCHEMA", "load_rotated_masked_mnist",
    "load_titanic", "load_titanic_raw", "titanic_frame", "titanic_schema", "TITANIC_SCHEMA",
    "SPLITS", "SEED_SPLITS", "split_arrays", "split_arrays_raw", "split_frame", "split_frame_raw",
    "split_table", "split_table_raw", "table_arrays",
    "mean_estimation", "linear_silos", "vehicle_like",
    "ehr_silos", "ehr_silos_raw", "ehr_table", "write_ehr_csv",
    "Schema", "ColumnSpec", "LabelSpec", "load_schema", "schema_from_dict", "draft_schema",
    "RawFederation", "PreprocessSpec", "PreprocessPlan", "Step", "plan_preprocessing",
    "apply_preprocessing", "preprocess_without_budget", "STANDARDIZE_MODES", "IMPUTE_MODES",
]

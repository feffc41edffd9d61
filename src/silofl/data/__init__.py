"""Silos, federations and loaders for tabular, School, Exam, MNIST, built-in and synthetic
data, and splitters that turn one table into simulated silos."""

from silofl.data.exam import load_exam
from silofl.data.federation import (Federation, PrivacyTarget, Silo, split_indices, split_silo,
                                    standardize)
from silofl.data.heart import heart_disease_frame, load_heart_disease
from silofl.data.mnist import load_rotated_masked_mnist
from silofl.data.school import load_school
from silofl.data.splitters import SPLITS, split_arrays, split_frame, split_table, table_arrays
from silofl.data.synthetic import linear_silos, mean_estimation, vehicle_like
from silofl.data.tabular import federation_from_frame, load_table, read_table

__all__ = [
    "Federation", "PrivacyTarget", "Silo", "split_indices", "split_silo", "standardize",
    "load_table", "federation_from_frame", "read_table",
    "load_school", "load_heart_disease", "heart_disease_frame",
    "load_exam", "load_rotated_masked_mnist",
    "SPLITS", "split_arrays", "split_frame", "split_table", "table_arrays",
    "mean_estimation", "linear_silos", "vehicle_like",
]

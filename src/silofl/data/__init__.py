"""Silos, federations and loaders for tabular, School, built-in and synthetic data."""

from silofl.data.federation import Federation, PrivacyTarget, Silo, split_silo, standardize
from silofl.data.heart import heart_disease_frame, load_heart_disease
from silofl.data.school import load_school
from silofl.data.synthetic import linear_silos, mean_estimation, vehicle_like
from silofl.data.tabular import federation_from_frame, load_table, read_table

__all__ = [
    "Federation", "PrivacyTarget", "Silo", "split_silo", "standardize",
    "load_table", "federation_from_frame", "read_table",
    "load_school", "load_heart_disease", "heart_disease_frame",
    "mean_estimation", "linear_silos", "vehicle_like",
]

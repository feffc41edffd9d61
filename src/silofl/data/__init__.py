"""Silos, federations and loaders for tabular, School, built-in and synthetic data."""

from silofl.data.federation import Federation, PrivacyTarget, Silo, split_silo, standardize

__all__ = ["Federation", "PrivacyTarget", "Silo", "split_silo", "standardize"]

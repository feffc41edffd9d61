"""Shared fixtures for the pandemic tests: one small synthetic outbreak per session."""

from __future__ import annotations

import pytest

from silofl.pandemic import synthesize

#: Parameters of the shared small outbreak (4000 persons in 4 regions).
SMALL_OUTBREAK = dict(persons=4000, regions=4, seed=7)


def _outbreak(tmp_path_factory, name: str, params: dict):
    out = tmp_path_factory.mktemp("pandemic") / name
    synthesize(out, **params)
    return out


@pytest.fixture(scope="session")
def small_outbreak(tmp_path_factory):
    """Directory of a small synthetic dataset (CSV, with target and manifest). Treat as read-only."""
    return _outbreak(tmp_path_factory, "small", SMALL_OUTBREAK)


#: A 10k-person outbreak whose final week has enough positives (27) for AUPRC to mean
#: something; the learning regression test trains on it.
LEARNING_OUTBREAK = dict(persons=10_000, regions=4, seed=3)


@pytest.fixture(scope="session")
def learning_outbreak(tmp_path_factory):
    """Directory of the 10k-person outbreak (CSV, with target). Treat as read-only."""
    return _outbreak(tmp_path_factory, "learning", LEARNING_OUTBREAK)

"""Shared fixtures for the pandemic tests: one small synthetic outbreak per session."""

from __future__ import annotations

import pytest

from silofl.pandemic import synthesize

#: Parameters of the shared small outbreak (4000 persons in 4 regions).
SMALL_OUTBREAK = dict(persons=4000, regions=4, seed=7)


@pytest.fixture(scope="session")
def small_outbreak(tmp_path_factory):
    """Directory of a small synthetic dataset (CSV, with target and manifest). Treat as read-only."""
    out = tmp_path_factory.mktemp("pandemic") / "small"
    synthesize(out, **SMALL_OUTBREAK)
    return out

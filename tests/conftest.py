"""Suite-wide isolation: no test reads or writes the real user's silofl data.

silofl keeps per-user state outside the working folder: the default lifetime budget store
(under $SILOFL_HOME, else $XDG_DATA_HOME/silofl), crash logs ($SILOFL_LOG_DIR) and Flower's
home ($FLWR_HOME). A test that touched the real ones could spend a user's budget, read
another test's charges (tests run in parallel under pytest-xdist) or pass only on a machine
that already has them. Each test gets its own empty folders; session-scoped fixtures get one
per worker process. Subprocesses inherit the variables.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# pytest-xdist workers run with COLUMNS=80, and silofl.cli builds its rich Consoles at import:
# they would keep that width for good and ignore the COLUMNS a test passes to CliRunner (so
# wide tables would wrap differently under `make test` than in a single test). Tests that
# need a width set it themselves; the user's terminal must not matter either.
os.environ.pop("COLUMNS", None)

#: Per-user locations silofl (and Flower) read from the environment.
USER_DIRS = {
    "SILOFL_HOME": "silofl_home",
    "XDG_DATA_HOME": "xdg_data",
    "SILOFL_LOG_DIR": "silofl_logs",
}


def _point_at(root: Path, setenv) -> None:
    for var, sub in USER_DIRS.items():
        (root / sub).mkdir(parents=True, exist_ok=True)
        setenv(var, str(root / sub))


@pytest.fixture(scope="session", autouse=True)
def _session_user_dirs(tmp_path_factory):
    """For session/module fixtures, which run before any function-scoped fixture."""
    root = tmp_path_factory.mktemp("user_dirs")
    saved = {k: os.environ.get(k) for k in [*USER_DIRS, "FLWR_HOME"]}
    _point_at(root, os.environ.__setitem__)
    (root / "flwr_home").mkdir()
    os.environ["FLWR_HOME"] = str(root / "flwr_home")
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def _user_dirs(tmp_path_factory, monkeypatch):
    """Each test: fresh, empty per-user folders (not under tmp_path, which tests list)."""
    _point_at(tmp_path_factory.mktemp("user"), monkeypatch.setenv)

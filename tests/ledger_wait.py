"""Synchronising a test with a job running in another process: on its ledger file, never on
a wall-clock window (the job may be slow on a busy machine)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest


def wait_for_rounds(proc: subprocess.Popen, ledger: Path, n: int, *,
                    bound: float = 300.0) -> None:
    """Return once `ledger` holds `n` whole lines (rounds charged); fail if the job ends
    first or never gets there.

    Parameters
    ----------
    proc : subprocess.Popen
        The job's process (with stderr piped, its tail is shown on failure).
    ledger : Path
        One silo's ledger file (JSON lines, one per charged round).
    n : int
        The rounds to wait for.
    bound : float, default 300.0
        Seconds after which the test fails rather than hangs (an upper bound, not a
        synchronisation: the loop ends as soon as the file is ready).
    """
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        # whole lines only: a line caught half-written is a charge whose round never ran
        if ledger.exists() and ledger.read_text().count("\n") >= n:
            return
        if proc.poll() is not None:
            tail = proc.stderr.read()[-2000:] if proc.stderr else ""
            pytest.fail(f"the job ended before round {n}: {tail}")
        time.sleep(0.01)
    pytest.fail(f"the job never reached round {n}")

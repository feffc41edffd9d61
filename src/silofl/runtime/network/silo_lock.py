"""One process per silo state folder.

Started twice with the same `silo.toml` (a second terminal, a service restarted while the
old process still runs), two silo processes shared one state folder: the server took both
connections under the silo's key, the rounds were split between them and each saved "the"
model into the same folder at its end, the last writer winning (a newcomer saw 5 rounds in
one and 4 in the other). The budget store still counted every round once, but the saved
model could be a stale one. The first process now holds an exclusive lock on
``<state_dir>/silo.lock`` for its whole life (the OS drops it when the process dies, so a
killed silo never blocks its restart); a second is refused before it connects or reads a
row.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from silofl.errors import ConfigError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock (documented)
    fcntl = None  # type: ignore[assignment]


@contextlib.contextmanager
def hold(state_dir: str | Path, name: str) -> Iterator[None]:
    """Hold the silo's state-folder lock while the body runs; ConfigError naming the folder
    and the holder's pid when another live process holds it.

    Parameters
    ----------
    state_dir : the silo's `[silo] state_dir`.
    name : the silo's name (for the message).
    """
    if fcntl is None:
        yield
        return
    d = Path(state_dir)
    created = not d.exists()
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / "silo.lock", os.O_RDWR | os.O_CREAT, 0o600)
    ok = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise ConfigError(
                f"silo {name!r} is already running from state folder {str(d)!r} (process "
                f"{holder}); a second process would split its rounds and overwrite its saved "
                "model. Wait for it to end or stop it first") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
        ok = True
    finally:
        os.close(fd)  # closing drops the lock
        # a silo refused before it ran (bad config, bad table) leaves no folder behind
        if not ok and created and [p.name for p in d.iterdir()] == ["silo.lock"]:
            (d / "silo.lock").unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                d.rmdir()

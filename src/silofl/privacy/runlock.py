"""Who owns an unsettled run: process id, host and process start time.

A run's row in the budget store records its owner. Resuming settles the owner's
reservation to what it executed, which is only honest once the owner is dead: a live
owner would go on reading data its settled reservation no longer covers. A process id
alone can be reused after the owner dies, so the owner is identified by (host, pid,
start time): the boot id and the start time in clock ticks from ``/proc/<pid>/stat``
(field 22) on Linux, else psutil's create time where psutil is installed, else unknown
(then a live pid counts as the owner: refusing wrongly is safe, settling a live run is not).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def host() -> str:
    return socket.gethostname()


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str:
    """An identifier of the process `pid`'s start ('' if unknown or not running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        # the command name (field 2) may hold spaces and ')': split after its last ')'
        fields = stat[stat.rindex(")") + 2:].split()
        return f"{_boot_id()}:{fields[19]}"  # field 22 overall
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # optional
        return f"psutil:{psutil.Process(pid).create_time():.3f}"
    except Exception:  # noqa: BLE001 — not installed, or no such process
        return ""


def _pid_running(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _zombie(pid: int) -> bool:
    """A killed process its parent has not reaped yet: dead, whatever kill(0) says."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:].split()[0] in ("Z", "X")
    except (OSError, ValueError, IndexError):
        return False


def owner_alive(pid: int, owner_host: str, started: str | None) -> bool | None:
    """True: the owner runs on this host; False: it is dead; None: it is on another host
    (cannot be checked from here)."""
    if owner_host != host():
        return None
    if not _pid_running(pid) or _zombie(pid):
        return False
    if started:
        now = process_start(pid)
        if now and now != started:  # the pid was reused by another process
            return False
    return True

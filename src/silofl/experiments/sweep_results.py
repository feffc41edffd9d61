"""The sweep's results file: a JSON-lines header plus one record per finished run.

Reading it back (`read_results`), checking that a resumed sweep matches its header,
appending records so a torn last line from a crash is dropped, not misread, and the
exclusive lock that keeps two sweeps off one file.  Cheap to import (no training engine).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from silofl.errors import ConfigError, DataError
from silofl.experiments.sweep_config import SweepConfig
from silofl.io import write_text_atomic

FORMAT = 1


HEADER_KIND = "silofl-sweep"


def read_results(path: str | Path) -> tuple[dict, list[dict]]:
    """Header and run records of a results file. A torn last line (a crash mid-write) is
    ignored; any other unreadable line is an error."""
    p = Path(path)
    if p.is_dir():
        raise DataError(f"results file {str(p)!r} is a directory; pass the .jsonl file "
                        "`silofl sweep` wrote (sweep.results)")
    if not p.is_file():
        raise DataError(f"results file {str(p)!r} does not exist; run `silofl sweep` first")
    if p.suffix.lower() == ".toml":
        raise DataError(f"{str(p)!r} is a TOML file, not sweep results; pass the results "
                        "file the sweep wrote (sweep.results, a .jsonl file), not its config")
    try:
        text = p.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as e:
        raise DataError(f"cannot read results file {str(p)!r} ({type(e).__name__}); it is "
                        "not a silofl sweep results file (JSON lines)") from None
    lines = text.split("\n")
    torn = not text.endswith("\n")
    records, head = [], None
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if torn and i == len(lines) - 1:
                break
            if head is None:
                raise DataError(f"{str(p)!r} is not a silofl sweep results file (its first "
                                "line is not JSON); pass the .jsonl file `silofl sweep` "
                                "wrote (sweep.results)") from None
            raise DataError(f"{str(p)!r} line {i + 1} is not valid JSON; the file is damaged. "
                            "Remove that line (runs in it will be redone) or start a new "
                            "results file") from None
        if head is None:
            if not isinstance(obj, dict) or obj.get("kind") != HEADER_KIND:
                raise DataError(f"{str(p)!r} is not a silofl sweep results file (its first "
                                "line is not a sweep header); choose another results path")
            if obj.get("format") != FORMAT:
                raise DataError(f"{str(p)!r} has results format {obj.get('format')}, this "
                                f"silofl reads format {FORMAT}; start a new results file")
            lacking = [k for k in _HEADER_KEYS if k not in obj]
            if lacking:
                raise DataError(f"{str(p)!r}: the header lacks {', '.join(lacking)}; the "
                                "file is damaged. Start a new results file")
            head = obj
        elif isinstance(obj, dict) and obj.get("kind") == "run":
            lacking = [k for k in _RUN_KEYS if k not in obj]
            if lacking:
                raise DataError(f"{str(p)!r} line {i + 1} lacks {', '.join(lacking)}; the "
                                "file is damaged. Remove that line (its run will be redone) "
                                "or start a new results file")
            records.append(obj)
        elif not isinstance(obj, dict):
            raise DataError(f"{str(p)!r} line {i + 1} is not a JSON object; the file is "
                            "damaged. Remove that line or start a new results file")
    if head is None:
        raise DataError(f"results file {str(p)!r} is empty; run `silofl sweep` first")
    return head, records


_HEADER_KEYS = ("fingerprint", "config", "metric", "higher_is_better", "silos", "total_runs",
                "report_epsilon", "not_counted", "dropped_silos")


_RUN_KEYS = ("key", "method", "epsilon", "lam", "lr", "seed", "rounds", "test",
             "final_validation", "final_test")


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}")
    return out


def open_results(path: Path, sc: SweepConfig, head: dict) -> set[str]:
    """Create the results file with `head`, or check an existing one belongs to this sweep.
    Returns the keys of runs already recorded."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # the file appears with a complete header or not at all
        write_text_atomic(path, json.dumps(head, allow_nan=False) + "\n")
        return set()
    if path.is_file() and path.stat().st_size == 0:
        raise ConfigError(f"results file {str(path)!r} exists but is empty, so it was not "
                          "written by `silofl sweep` (which starts every file with a header); "
                          "delete it or choose another results path (--results)")
    old, records = read_results(path)
    if old["fingerprint"] != head["fingerprint"]:
        changed = _diff(old.get("config", {}), head["config"]) or ["the data file's contents"]
        raise ConfigError(
            f"results file {str(path)!r} belongs to a different sweep (fingerprint "
            f"{old['fingerprint']} ≠ {head['fingerprint']}; differs in: {', '.join(changed)}). "
            "Resuming would mix results of different configs. Use a new results path "
            "(sweep.results or --results), or delete the file to start over")
    _drop_torn_tail(path)
    return {r["key"] for r in records}


def _drop_torn_tail(path: Path) -> None:
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def append_record(path: Path, record: dict) -> None:
    """One complete line per call: a single O_APPEND write, then fsync."""
    line = (json.dumps(record, allow_nan=False) + "\n").encode()  # strict JSON
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


#: how long a second sweep on the same results file waits for the lock
LOCK_WAIT_S = 3.0


@contextlib.contextmanager
def exclusive_lock(path: Path):
    """An exclusive flock on `<results>.lock` for the whole sweep: two processes on one
    results file would both run the grid and append duplicate records."""
    import fcntl
    if path.exists() and not path.is_file():
        raise ConfigError(f"results path {str(path)!r} is not a file; name a .jsonl file "
                          "(--results or sweep.results)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = path.with_name(path.name + ".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(f"cannot create the results file's folder or lock beside "
                          f"{str(path)!r} ({type(e).__name__}); choose a writable results "
                          "path (--results)") from None
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ConfigError(
                        f"results file {str(path)!r} is in use by another `silofl sweep` "
                        f"(it holds {str(lock)!r}); wait for it to finish, then run this "
                        "command again to resume, or use another --results") from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # releases the lock

"""Where lifetime budget stores live, and the machine's registry of charged data.

A budget that lives in the output folder is escaped by running again from another folder
(or with another ``--out``). So the default store belongs to the *user and deployment*,
not to a run: ``<silofl home>/stores/<deployment>.sqlite``, where the silofl home is
``$SILOFL_HOME``, else ``$XDG_DATA_HOME/silofl``, else ``~/.local/share/silofl`` (the
platform's user data directory on Linux and the BSDs; no dependency needed), and the
deployment is ``[budget] deployment`` (default ``"default"``). An explicit store path
(``--store`` / ``[budget] store``) still wins.

The built-in public heart data (the README's first command) charges a separate, clearly
labelled *demo* store, ``<home>/stores/demo-heart.sqlite``, whose budget restarts (logged)
when a job no longer fits, so the demo can be repeated; no other source ever does.

The *registry* (``<home>/fingerprints.sqlite``) maps a keyed fingerprint of each silo's
data (HMAC-SHA256 under a machine-wide secret, ``<home>/machine.key``, mode 0600) to the
stores that charged it. A store that is new — or a silo new to its store — while the same
data was charged in another store on this machine is flagged loudly. The registry holds
no data digest an attacker could test guesses against: only keyed values.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from silofl.errors import ConfigError

DEFAULT_DEPLOYMENT = "default"
DEMO_SOURCE = "heart"  # the built-in public data behind `make run`
DEMO_NOTE = ("demo budget store (public built-in heart data): charges are recorded and "
             "shown, and its budget restarts (logged) when a job no longer fits, so the "
             "demo can be repeated; it guards no one's private data")
_DEPLOYMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def silofl_home() -> Path:
    """The per-user silofl data folder (see the module docstring)."""
    env = os.environ.get("SILOFL_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "silofl"


def check_deployment(name: str) -> str:
    """`name` if it is a valid deployment name (letters, digits, '.', '_', '-')."""
    if not _DEPLOYMENT.match(name or ""):
        raise ConfigError(f"[budget] deployment {name!r} is not a valid name: use 1-64 "
                          "letters, digits, '.', '_' or '-', starting with a letter or digit "
                          "(it names the store file <silofl home>/stores/<deployment>.sqlite)")
    return name


def default_store_path(deployment: str = DEFAULT_DEPLOYMENT) -> Path:
    """The lifetime store of `deployment` for this user."""
    return silofl_home() / "stores" / f"{check_deployment(deployment)}.sqlite"


def demo_store_path() -> Path:
    """The demo store of the built-in public heart data."""
    return silofl_home() / "stores" / f"demo-{DEMO_SOURCE}.sqlite"


def is_demo_store(path: Path) -> bool:
    """Whether the existing store file `path` is the demo store (read-only look)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM meta WHERE key = 'kind'").fetchone()
        finally:
            db.close()
    except sqlite3.DatabaseError:
        return False  # opening it as a BudgetStore gives the specific error
    return row is not None and row[0] == "demo"


# --- the machine registry ---------------------------------------------------------------

def _private_file(path: Path, make: Callable[[], bytes]) -> bytes:
    """Read `path`, creating it with `make()` (mode 0600, exclusive) if it is missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes()
    with os.fdopen(fd, "wb") as f:
        f.write(make())
        f.flush()
        os.fsync(f.fileno())
    return path.read_bytes()


def machine_key() -> bytes:
    """This user's machine-wide secret (created on first use, mode 0600)."""
    key = _private_file(silofl_home() / "machine.key",
                        lambda: secrets.token_hex(32).encode()).strip()
    if len(key) < 32:
        raise OSError(f"{silofl_home() / 'machine.key'} is truncated")
    return key


def keyed(key: bytes, digest: str) -> str:
    """HMAC-SHA256 of a data digest under `key` (hex, 32 characters)."""
    return hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()[:32]


def _registry() -> sqlite3.Connection:
    path = silofl_home() / "fingerprints.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), timeout=30.0, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS charged (fp TEXT NOT NULL, store TEXT NOT NULL, "
               "silo TEXT NOT NULL, time REAL NOT NULL, PRIMARY KEY (fp, store, silo))")
    db.execute("CREATE TABLE IF NOT EXISTS last_run (store TEXT PRIMARY KEY, "
               "run TEXT NOT NULL)")
    return db


def swap_last_run(store: Path, run_id: str) -> str | None:
    """Record `run_id` as the latest run reserved in `store`; returns the run recorded
    before (None: the first). A store never deletes a run, so a store lacking that earlier
    run was deleted, replaced or restored from an older copy (its charges since are
    gone). Concurrent runs are safe: whichever run is recorded had committed before."""
    where = str(Path(store).resolve())
    db = _registry()
    try:
        db.execute("BEGIN IMMEDIATE")
        row = db.execute("SELECT run FROM last_run WHERE store = ?", (where,)).fetchone()
        db.execute("INSERT INTO last_run VALUES (?, ?) ON CONFLICT (store) DO UPDATE SET "
                   "run = excluded.run", (where, run_id))
        db.execute("COMMIT")
    finally:
        db.close()
    return None if row is None else row[0]


def note_charged(store: Path, silos: dict[str, str]) -> dict[str, list[str]]:
    """Record that `store` charged each silo's data (`silos`: name -> data digest, never
    stored); returns, per silo, every store path on this machine that charged the same
    data before — this store's own path included (for a silo new to this store, that
    means the file was deleted or replaced since, or the data was charged there under
    another silo name: see `names_in`)."""
    key = machine_key()
    where = str(Path(store).resolve())
    out: dict[str, list[str]] = {}
    db = _registry()
    try:
        db.execute("BEGIN IMMEDIATE")
        for name, digest in silos.items():
            fp = keyed(key, digest)
            others = [r[0] for r in db.execute(
                "SELECT store FROM charged WHERE fp = ? GROUP BY store ORDER BY MIN(time)",
                (fp,))]
            if others:
                out[name] = others
            db.execute("INSERT OR IGNORE INTO charged VALUES (?, ?, ?, ?)",
                       (fp, where, name, time.time()))
        db.execute("COMMIT")
    finally:
        db.close()
    return out


def names_in(store: Path, digest: str) -> list[str]:
    """The silo names under which `store` charged data with `digest` (a renamed silo)."""
    fp = keyed(machine_key(), digest)
    db = _registry()
    try:
        return [r[0] for r in db.execute(
            "SELECT silo FROM charged WHERE fp = ? AND store = ? ORDER BY time",
            (fp, str(Path(store).resolve())))]
    finally:
        db.close()

"""The budget store's SQLite schema, its creation and its migrations, the folder of its
file and what a database error means to the user (`silofl.privacy.budget`)."""

from __future__ import annotations

import re
import secrets
import sqlite3
import time
from pathlib import Path
from typing import TypeVar

from silofl.privacy.store_paths import keyed

SCHEMA_VERSION = 3
#: the privacy unit of a charge: "example" (one row), "person" (all rows of one person of a
#: silo) or "node" (a person of a contact graph, `privacy.node_level`)
UNITS = ("example", "person", "node")
#: labels of node-level charges, and the word in the command of every node-level
#: (pandemic) job, whose tuned runs charge only labels that example-level tuning uses too
NODE_LABELS = ("node-dpsgd",)
NODE_COMMAND = "pandemic"

E = TypeVar("E", bound=Exception)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS silos (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, epsilon REAL NOT NULL,
    delta REAL NOT NULL, epoch INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, command TEXT NOT NULL, started REAL NOT NULL, finished REAL,
    status TEXT NOT NULL, noise TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,
    proc_start TEXT, parent TEXT);
CREATE TABLE IF NOT EXISTS charges (
    id INTEGER PRIMARY KEY, silo_id INTEGER NOT NULL REFERENCES silos(id),
    epoch INTEGER NOT NULL, run_id TEXT NOT NULL REFERENCES runs(id),
    method TEXT NOT NULL, label TEXT NOT NULL, event TEXT NOT NULL,
    count INTEGER NOT NULL, status TEXT NOT NULL, time REAL NOT NULL, fingerprint TEXT,
    unit TEXT NOT NULL DEFAULT 'example');
CREATE INDEX IF NOT EXISTS charges_by_silo ON charges (silo_id, epoch);
CREATE INDEX IF NOT EXISTS charges_by_run ON charges (run_id);
CREATE TABLE IF NOT EXISTS progress (
    run_id TEXT NOT NULL REFERENCES runs(id), silo_id INTEGER NOT NULL REFERENCES silos(id),
    method TEXT NOT NULL, label TEXT NOT NULL, event TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (run_id, silo_id, method, label, event));
CREATE TABLE IF NOT EXISTS log (
    id INTEGER PRIMARY KEY, time REAL NOT NULL, silo_id INTEGER, action TEXT NOT NULL,
    reason TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '');
"""


def prepare(db: sqlite3.Connection, demo: bool, where: str,
            error: type[Exception]) -> tuple[bytes, bool]:
    """Create or check the schema inside the caller's open transaction.

    Parameters
    ----------
    db : sqlite3.Connection
        The open store.
    demo : bool
        The caller opens the demo store (public built-in data, its budget restarts).
    where : str
        How messages name the store.
    error : type
        The exception raised for a store that cannot be used (`BudgetStoreError`).

    Returns
    -------
    (bytes, bool)
        The store's secret (keys its fingerprints) and whether a migration ran.
    """
    migrated = False
    for stmt in filter(str.strip, _SCHEMA.split(";")):
        db.execute(stmt)
    row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    if row is None:
        db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        db.execute("INSERT INTO meta VALUES ('secret', ?)", (secrets.token_hex(32),))
        db.execute("INSERT INTO meta VALUES ('kind', ?)", ("demo" if demo else "lifetime",))
    elif row[0] in ("1", "2"):
        if row[0] == "1":
            migrate_v1(db, 2)
        migrate_v2(db)
        migrated = True
    elif row[0] != str(SCHEMA_VERSION):
        raise error(f"budget store {where} has schema version {row[0]}, this "
                    f"silofl reads version {SCHEMA_VERSION}; use a matching silofl")
    secret = db.execute("SELECT value FROM meta WHERE key='secret'").fetchone()[0].encode()
    kind = db.execute("SELECT value FROM meta WHERE key='kind'").fetchone()
    if kind is not None and kind[0] == "demo" and not demo:
        raise error(f"budget store {where} is a demo store (public built-in data, "
                    "its budget restarts when spent); it cannot guard a private source. "
                    "Name another store with --store or [budget] store")
    if demo and (kind is None or kind[0] != "demo"):
        raise error(f"budget store {where} is a lifetime store, "
                    "not the demo store; it is never restarted")
    return secret, migrated


def migrate_v1(db: sqlite3.Connection, version: int) -> None:
    """Schema 1 -> `version` (2), inside the caller's open transaction: owner and parent
    columns on runs (the progress table is created by the schema script), a secret, and
    every stored fingerprint re-keyed — an unkeyed digest of the rows could be tested
    against guessed records. The charges themselves are kept as they are."""
    db.execute("ALTER TABLE runs ADD COLUMN proc_start TEXT")
    db.execute("ALTER TABLE runs ADD COLUMN parent TEXT")
    secret = secrets.token_hex(32)
    db.execute("INSERT INTO meta VALUES ('secret', ?)", (secret,))
    db.execute("INSERT INTO meta VALUES ('kind', 'lifetime')")
    key = secret.encode()
    for cid, fp in db.execute("SELECT id, fingerprint FROM charges WHERE fingerprint IS "
                              "NOT NULL").fetchall():
        db.execute("UPDATE charges SET fingerprint = ? WHERE id = ?", (keyed(key, fp), cid))
    for lid, detail in db.execute("SELECT id, detail FROM log WHERE action = "
                                  "'data-changed'").fetchall():
        db.execute("UPDATE log SET detail = ? WHERE id = ?", (re.sub(
            r"\b[0-9a-f]{16}\b", lambda m: keyed(key, m.group(0)), detail), lid))
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(version),))
    db.execute("INSERT INTO log (time, silo_id, action, reason, detail) VALUES (?, NULL, "
               "'migrate', 'schema 1 -> 2', 'fingerprints re-keyed; runs record their "
               "owner; progress is recorded per charge')", (time.time(),))


def migrate_v2(db: sqlite3.Connection) -> None:
    """Schema 2 -> 3, inside the caller's open transaction: every charge records its
    privacy unit. Stores before schema 3 knew two units: the charges of a run with a
    node-level charge (`NODE_LABELS`: its rounds and its preprocessing) or of a pandemic
    command (`NODE_COMMAND`: its tuned runs too) are "node", every other "example"."""
    db.execute("ALTER TABLE charges ADD COLUMN unit TEXT NOT NULL DEFAULT 'example'")
    marks = ", ".join("?" * len(NODE_LABELS))
    db.execute(f"UPDATE charges SET unit = 'node' WHERE run_id IN (SELECT DISTINCT run_id "
               f"FROM charges WHERE label IN ({marks})) OR run_id IN (SELECT id FROM runs "
               f"WHERE instr(command, ?) > 0)", (*NODE_LABELS, NODE_COMMAND))
    db.execute("UPDATE meta SET value = '3' WHERE key = 'schema'")
    db.execute("INSERT INTO log (time, silo_id, action, reason, detail) VALUES (?, NULL, "
               "'migrate', 'schema 2 -> 3', 'charges record their privacy unit: node-level "
               "runs node, every other charge example (per row)')", (time.time(),))


def configure(db: sqlite3.Connection, *, on_disk: bool) -> None:
    """The connection settings of a store.

    Parameters
    ----------
    db : sqlite3.Connection
        The newly opened store.
    on_disk : bool
        A file (write-ahead log, full sync), not an in-memory scratch store.
    """
    if on_disk:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA foreign_keys=ON")
    # deleted content (e.g. the unkeyed fingerprints a migration replaces) is
    # overwritten, not left in free pages of the file
    db.execute("PRAGMA secure_delete=ON")


def make_folder(path: Path, error: type[Exception]) -> None:
    """Create the folder of a store file, refusing a path that is a folder or lies under a
    file.

    Parameters
    ----------
    path : Path
        The store file.
    error : type
        The exception raised (`BudgetStoreError`).
    """
    if path.is_dir():
        raise error(f"budget store {str(path)!r} is a directory; "
                    "give a file path such as stores/budget.sqlite")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise error(
                    f"budget store {str(path)!r} cannot be created: "
                    f"{str(parent)!r} is a file, not a folder; choose another path")
            break
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise error(f"cannot create the folder of budget store "
                    f"{str(path)!r}: {e.strerror}") from None


def db_error(e: Exception, where: str, error: type[E]) -> E:
    """What a database error of the store means to the user: locked, unwritable, or not a
    silofl budget database (never delete it).

    Parameters
    ----------
    e : Exception
        The sqlite3 error.
    where : str
        How messages name the store.
    error : type
        The exception to build (`BudgetStoreError`).

    Returns
    -------
    Exception
        An `error` with the message, to raise.
    """
    msg = str(e)
    if "locked" in msg or "busy" in msg:
        return error(
            f"budget store {where} is locked by another process (waited for it); "
            "wait for that run to finish and try again")
    if "readonly" in msg or "unable to open" in msg:
        return error(f"cannot write budget store {where}: {msg}; check "
                     "its permissions and the disk")
    return error(
        f"budget store {where} is not a readable silofl budget database ({msg}). "
        "Do not delete it: it is the only record of what each silo has spent; restore "
        "it from a backup, or point [budget] store at the right file")

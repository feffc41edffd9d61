"""Migrations of the budget store's schema (`silofl.privacy.budget`)."""

from __future__ import annotations

import re
import secrets
import sqlite3
import time

from silofl.privacy.store_paths import keyed


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

"""Lifetime privacy budgets per silo, kept in an embedded SQLite database.

A silo's guarantee is about everything ever computed from its records, not about one run.
The store holds, per silo, the lifetime target (ε_k, δ_k) and every charge ever made
(event, run, method, label, time, fingerprint of the data it read). The protocol:

1. `reserve` — before any data access, in one transaction (``BEGIN IMMEDIATE``, so two
   processes cannot both pass the check): compose everything already counted for each
   silo with the run's planned events; refuse the whole run (`BudgetExceeded`, nothing
   written) if any silo's lifetime ε would exceed its target; otherwise record the plan
   as *reserved* charges. Reserved charges count exactly like executed ones.
2. the run executes; its per-run ledgers never let it execute more than it reserved.
3. `settle` — replace the run's reservation by what it actually executed (on success or
   on a handled failure). A run killed before settling keeps its whole reservation
   counted: charge first, then compute, so re-running never resets a budget.

Resets are explicit (`reset`, with a reason, logged): they start a new *epoch* for the
silo; older charges stay in the database for audit but are no longer composed. A change
of the data a silo trains on (new patients) is recorded and shown; the budget carries
over, because the composition still covers everyone present in both versions.

Progress (schema 2, `store_progress`): every charge a run's ledgers make is also recorded
in the store, in its own transaction, before the data is read (`record_progress`);
settling never goes below what the store recorded, so deleting or editing a run folder's
ledger files cannot make the store forget executed work. Each run row names its owner
(pid, host, process start time, `silofl.privacy.runlock`), so a resume can refuse while
the owner is alive.

Data fingerprints are keyed: the store keeps HMAC-SHA256(secret, digest of the rows) with
a secret in its meta table that no output ever shows, so a guess of one record's value
cannot be tested against the store's content.

The store is silo-internal; it is not a report to publish.
`path=None` gives an in-memory *scratch* store: an experiment, not a release — every
report made with it says so.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from silofl.errors import BudgetExceeded, SiloflError
from silofl.privacy import (
    events,
    runlock,
    store_admin,
    store_paths,
    store_progress,
    store_registry,
    units,
)
from silofl.privacy.ledger import tightest
from silofl.privacy.store_schema import configure, db_error, make_folder, prepare
from silofl.privacy.targets import PrivacyTarget

SCRATCH_NOTE = "scratch budget store: an experiment, not a release"


class BudgetStoreError(SiloflError):
    """The budget database cannot be used (corrupt, locked, unwritable, wrong schema)."""


@dataclass(frozen=True)
class PlannedCharge:
    """One privacy event a run will execute (or executed) on one silo's data."""

    silo: str
    method: str   # e.g. "mrmtl", or "-" for steps outside a method (preprocessing)
    label: str    # e.g. "dpsgd", "select", "preprocess"
    event: object
    count: int = 1


def _per_silo(charges: list[PlannedCharge], *, nonnegative: bool = False
              ) -> dict[str, Counter]:
    """Base-event counts per silo of `charges` (a negative count is refused if
    `nonnegative`, where it is met)."""
    by_silo: dict[str, Counter] = {}
    for p in charges:
        if nonnegative and p.count < 0:
            raise ValueError("a charge count cannot be negative")
        bucket = by_silo.setdefault(p.silo, Counter())
        for e, c in events.flatten(p.event).items():
            bucket[e] += c * p.count
    return by_silo


def new_run_id() -> str:
    """A fresh run id: the local time and 8 random hex digits (sortable, unique)."""
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]


class BudgetStore:
    """Per-silo lifetime privacy budgets in one SQLite file.

    Every run reserves its planned charges here before it reads any data (`reserve`),
    records progress before each read (`record_progress`) and settles to what executed
    (`settle`); a reservation that would take a silo over its lifetime target is
    refused for the whole job. Nothing an ordinary action does makes the store forget a
    charge: a `reset` is logged with its reason and earlier charges stay in the file.
    Old stores are migrated on open.

    Parameters
    ----------
    path : str, Path or None
        The SQLite file (created with its folder if missing); None: an in-memory scratch
        store (an experiment, not a release).
    timeout : float, default 30.0
        Seconds to wait for another process's lock.
    demo : bool, default False
        Open (or create) the restartable demo store of public built-in data; a demo store
        cannot guard a private source, nor a lifetime store act as one.

    Attributes
    ----------
    path : Path or None
        The file.
    scratch : bool
        An in-memory store.
    created : bool
        This object created the file.

    Raises
    ------
    BudgetStoreError
        The path is a folder or cannot be created, the file is corrupt or of a newer
        schema, or a demo/lifetime mismatch.
    """

    #: what `store_admin` raises for this store (it cannot import this module)
    _error = BudgetStoreError

    def __init__(self, path: str | Path | None, *, timeout: float = 30.0,
                 demo: bool = False):
        self.path = None if path is None else Path(path)
        self.scratch = path is None
        #: the file did not exist before this object opened it (say so loudly)
        self.created = False
        # silos this object has already recorded in the machine registry: a store created
        # by this object is new only for its first reservation (a networked silo reserves
        # every round on one object; later rounds are not "new" nor "deleted since")
        self._registered: set[str] = set()
        #: the demo store of the built-in public data (`store_paths.DEMO_NOTE`)
        self.demo = demo
        #: the privacy unit of the next reservations (`use_unit`; None: inferred)
        self.unit: str | None = None
        # silo name → row id, for `record_progress` (every round): a silo's row is never
        # deleted nor renumbered, so an id once read stays right
        self._silo_ids: dict[str, int] = {}
        if self.path is not None:
            make_folder(self.path, BudgetStoreError)
            self.created = not self.path.exists()
        try:
            self._db = sqlite3.connect(":memory:" if path is None else str(self.path),
                                       timeout=timeout, isolation_level=None)
            configure(self._db, on_disk=path is not None)
            with self._tx():
                self._secret, migrated = prepare(self._db, demo, self.where, BudgetStoreError)
            if migrated:  # the old pages leave the write-ahead log too
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.DatabaseError as e:
            raise self._db_error(e) from None

    def keyed(self, digest: str) -> str:
        """The store's keyed fingerprint of a data digest (the secret never leaves).

        Parameters
        ----------
        digest : str
            A hex digest of a silo's rows.

        Returns
        -------
        str
            HMAC of the digest under the store's secret (hex).
        """
        return store_paths.keyed(self._secret, digest)

    # -- plumbing -------------------------------------------------------------------------
    @property
    def where(self) -> str:
        return "(in-memory scratch)" if self.path is None else repr(str(self.path))

    def describe(self) -> str:
        """What outputs print about this store (its path and kind); see
        `store_admin.describe`."""
        return store_admin.describe(self)

    def _db_error(self, e: Exception) -> BudgetStoreError:
        return db_error(e, self.where, BudgetStoreError)

    @contextmanager
    def _tx(self) -> Iterator[None]:
        """One write transaction, taking the write lock at once (BEGIN IMMEDIATE), so a
        check-then-write cannot interleave with another process's."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as e:
            raise self._db_error(e) from None
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        try:
            self._db.execute("COMMIT")
        except sqlite3.DatabaseError as e:
            raise self._db_error(e) from None

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            raise self._db_error(e) from None

    def close(self) -> None:
        """Close the database connection (also on leaving a ``with`` block)."""
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- silos ----------------------------------------------------------------------------
    def _silo(self, name: str) -> tuple | None:
        rows = self._read("SELECT id, epsilon, delta, epoch FROM silos WHERE name = ?", (name,))
        return rows[0] if rows else None

    def silos(self) -> list[str]:
        """The silos the store knows, in registration order; see `store_admin.silos`."""
        return store_admin.silos(self)

    def target(self, name: str) -> PrivacyTarget | None:
        """A silo's lifetime target (None if unknown); see `store_admin.target`.

        Parameters
        ----------
        name : str
            The silo.
        """
        return store_admin.target(self, name)

    def register(self, targets: dict[str, PrivacyTarget], *, explicit: bool = False) -> None:
        """Give silos seen for the first time their lifetime target (a silo already in the
        store keeps its own); see `store_admin.register`.

        Parameters
        ----------
        targets : dict of str to PrivacyTarget
            Lifetime targets by silo name.
        explicit : bool, default False
            The user stated these targets: a different one for a known silo is an error.
        """
        store_admin.register(self, targets, explicit=explicit)

    # -- composition ----------------------------------------------------------------------
    def _counted(self, silo_id: int, epoch: int) -> Counter:
        """Base-event counts of every reserved or executed charge of the current epoch."""
        counts: Counter = Counter()
        for text, count in self._read(
                "SELECT event, SUM(count) FROM charges WHERE silo_id = ? AND epoch = ? "
                "GROUP BY event", (silo_id, epoch)):
            for e, c in events.flatten(events.from_json(text)).items():
                counts[e] += c * count
        return counts

    def spent(self, name: str) -> dict:
        """A silo's lifetime position: its target and what it has spent (reserved +
        executed, composed); see `store_admin.spent`.

        Parameters
        ----------
        name : str
            The silo.
        """
        return store_admin.spent(self, name)

    def use_unit(self, unit: str) -> None:
        """Reserve jobs of privacy `unit` from now on (`silofl.privacy.units`; unset:
        inferred from the labels).

        Parameters
        ----------
        unit : {"example", "person", "node"}
            What the next jobs' guarantees protect: one row, all rows of one person, or
            one person of a graph.
        """
        self.unit = unit

    # -- the protocol ---------------------------------------------------------------------
    def reserve(self, run_id: str, planned: list[PlannedCharge], *, command: str,
                noise: str, fingerprints: dict[str, str] | None = None,
                parent: str | None = None, unit: str | None = None) -> None:
        """Reserve a run's planned charges, all or nothing, in one transaction.

        Parameters
        ----------
        run_id : str
            The run's id in the store.
        planned : list of PlannedCharge
            Every privacy event the run will execute, per silo.
        command : str
            What is running (logged).
        noise : str
            The noise mode (logged).
        fingerprints : dict of str to str, optional
            Digests of each silo's rows; the store keeps only their keyed hash.
        parent : str, optional
            The settled run this one continues (a resume); a run is continued at most
            once.
        unit : str, optional
            The job's privacy unit (default: `use_unit`'s, else inferred from the labels).

        Raises
        ------
        BudgetExceeded
            Naming every silo that cannot pay; nothing is recorded.
        BudgetStoreError
            A silo's charges are of another privacy unit (`use_unit`); nothing recorded.
        """
        by_silo = _per_silo(planned, nonnegative=True)
        unit = unit or self.unit or units.infer_unit((p.label for p in planned), command)
        digests = fingerprints or {}
        fingerprints = {n: self.keyed(d) for n, d in digests.items()}
        now = time.time()
        with self._tx():
            if parent is not None:
                store_admin.check_parent(self, parent)
            ids = self._check_fits(by_silo, unit)
            fresh = self._write_reservation(run_id, planned, ids, fingerprints, now,
                                            command=command, noise=noise, parent=parent,
                                            unit=unit)
        if self.path is not None and not self.demo and digests:
            # a silo is new to a store once (the newcomer review: a networked silo's own new
            # store was re-flagged at every round of the same process)
            new = set(fresh) | (set(ids) - self._registered if self.created else set())
            store_registry.check(self, self.path, run_id,
                                 {n: d for n, d in digests.items() if n in ids}, new)
            self._registered |= set(ids)

    def _check_fits(self, by_silo: dict[str, Counter], unit: str) -> dict[str, tuple]:
        """Inside the reservation's transaction: every silo is registered, its charges are
        of `unit` and its lifetime ε with `by_silo` (its added base-event counts) stays
        within its target, or raise `BudgetExceeded` naming every silo that cannot pay.
        Returns each silo's row."""
        problems = []
        ids = {}
        for name, added in by_silo.items():
            row = self._silo(name)
            if row is None:
                raise BudgetStoreError(f"silo {name!r} has no lifetime target in budget "
                                       f"store {self.where}; register it first")
            sid, eps_t, delta, epoch = ids[name] = row
            eps, kind = tightest(events.compose(self._counted(sid, epoch) + added), delta)
            if not eps <= eps_t:  # no tolerance: a violation can never round to a pass
                before, _ = tightest(events.compose(self._counted(sid, epoch)), delta)
                problems.append(
                    f"silo {name!r}: lifetime ε would reach {eps:.4g} ({kind}) > its "
                    f"target {eps_t:g} (δ = {delta:g}); already spent {before:.4g}")
        units.check_units(self._db, ids, unit, self.where, BudgetStoreError)
        if problems:
            raise BudgetExceeded(
                "; ".join(problems) + f". Nothing was executed (budget store "
                f"{self.where}; `silofl budget show` lists every charge). Spend less "
                "(fewer rounds or methods, a smaller ε for this run), or — only if the "
                "silo's data governance allows — raise its lifetime target with "
                "`silofl budget set-target`; for an experiment on one machine use a scratch "
                "store (`silofl run --scratch`), whose reports say it is not a release")
        return ids

    def _write_reservation(self, run_id: str, planned: list[PlannedCharge],
                           ids: dict[str, tuple], fingerprints: dict[str, str], now: float,
                           *, command: str, noise: str, parent: str | None,
                           unit: str = "example") -> list[str]:
        """Inside the reservation's transaction, after `_check_fits`: the run row, the
        data-change notes and the reserved charges (`fingerprints` keyed). Returns the
        silos new to this store: no charge and no other run since their registration
        (checked in the machine registry)."""
        self._db.execute(
            "INSERT INTO runs VALUES (?, ?, ?, NULL, 'reserved', ?, ?, ?, ?, ?)",
            (run_id, command, now, noise, runlock.host(), os.getpid(),
             runlock.process_start(os.getpid()), parent))
        # new to this store: no earlier run since it was registered (a run settled to zero
        # keeps none of its charges, yet the silo is not new: the newcomer review)
        fresh = [n for n in ids if self._db.execute(
            "SELECT 1 FROM silos s WHERE s.id = ? AND (EXISTS (SELECT 1 FROM charges c "
            "WHERE c.silo_id = s.id) OR EXISTS (SELECT 1 FROM runs r WHERE r.id != ? AND "
            "r.started >= s.created))", (ids[n][0], run_id)).fetchone() is None]
        for name, fp in fingerprints.items():
            if name in ids:
                store_registry.note_data_change(self, ids[name][0], ids[name][3], fp,
                                                run_id, now)
        for p in planned:
            sid, _, _, epoch = ids[p.silo]
            self._db.execute(
                "INSERT INTO charges (silo_id, epoch, run_id, method, label, event, "
                "count, status, time, fingerprint, unit) VALUES (?, ?, ?, ?, ?, ?, ?, "
                "'reserved', ?, ?, ?)", (sid, epoch, run_id, p.method, p.label,
                                         events.to_json(p.event), p.count, now,
                                         fingerprints.get(p.silo), unit))
        return fresh

    def record_progress(self, run_id: str, rows: list[tuple[str, str, str, str, int]]
                        ) -> None:
        """Record charges a run is about to execute, before the data is read; settling
        never goes below them. See `store_progress.record`.

        Parameters
        ----------
        run_id : str
            The run's id in the store.
        rows : list of (silo, method, label, event JSON, count)
            The charges.
        """
        store_progress.record(self, run_id, rows)

    def progress(self, run_id: str) -> list[PlannedCharge]:
        """What the store recorded a run as executing (`record_progress`); see
        `store_progress.recorded`.

        Parameters
        ----------
        run_id : str
            The run's id in the store.
        """
        return [PlannedCharge(*row) for row in store_progress.recorded(self, run_id)]

    def owner(self, run_id: str) -> dict | None:
        """The process that owns a run (pid, host, ..., child); see `store_admin.owner`.

        Parameters
        ----------
        run_id : str
            The run's id in the store.
        """
        return store_admin.owner(self, run_id)

    def settle(self, run_id: str, executed: list[PlannedCharge], *,
               status: str = "finished") -> None:
        """Replace a run's reservation by what it executed.

        Never by less than the store recorded as its progress (`record_progress`): what
        `executed` misses of it (a deleted or edited ledger file) is charged as recorded.

        Parameters
        ----------
        run_id : str
            The run's id in the store.
        executed : list of PlannedCharge
            What the run executed.
        status : str, default "finished"
            The run's final status ("finished", "failed", "interrupted", ...).

        Raises
        ------
        BudgetStoreError
            Executing more than was reserved, or settling a run that is not reserved.
        """
        store_admin.check_reserved(self, run_id)
        executed = self._with_floor(run_id, executed)
        reserved = _per_silo([PlannedCharge(name, "", "", events.from_json(text), count)
                              for text, name, count in self._read(
            "SELECT c.event, s.name, c.count FROM charges c JOIN silos s ON s.id = c.silo_id "
            "WHERE c.run_id = ? AND c.status = 'reserved'", (run_id,))])
        for name, counts in _per_silo(executed).items():
            have = reserved.get(name, Counter())
            if any(c > have.get(e, 0) for e, c in counts.items()):
                raise BudgetStoreError(f"run {run_id} executed more on silo {name!r} than it "
                                       "reserved; its reservation stays counted")
        now = time.time()
        with self._tx():
            store_admin.check_reserved(self, run_id)  # another process may have settled
            rows = self._db.execute(
                "SELECT DISTINCT silo_id, epoch, fingerprint, unit FROM charges WHERE "
                "run_id = ? AND status = 'reserved'", (run_id,)).fetchall()
            where = {self._db.execute("SELECT name FROM silos WHERE id = ?", (r[0],)
                                      ).fetchone()[0]: r for r in rows}  # keeps the unit
            self._db.execute("DELETE FROM charges WHERE run_id = ? AND status = 'reserved'",
                             (run_id,))
            for p in executed:
                if p.count == 0:
                    continue
                sid, epoch, fp, unit = where[p.silo]
                self._db.execute(
                    "INSERT INTO charges (silo_id, epoch, run_id, method, label, event, "
                    "count, status, time, fingerprint, unit) VALUES (?, ?, ?, ?, ?, ?, ?, "
                    "'charged', ?, ?, ?)", (sid, epoch, run_id, p.method, p.label,
                                            events.to_json(p.event), p.count, now, fp,
                                            unit))
            self._db.execute("UPDATE runs SET finished = ?, status = ? WHERE id = ?",
                             (now, status, run_id))

    def _with_floor(self, run_id: str, executed: list[PlannedCharge]
                    ) -> list[PlannedCharge]:
        """`executed` plus whatever the store's progress records of `run_id` beyond it."""
        rows = [(p.silo, p.method, p.label, p.event, p.count) for p in executed]
        return list(executed) + [PlannedCharge(*r)
                                 for r in store_progress.shortfall(self, run_id, rows)]

    def run_status(self, run_id: str) -> str | None:
        """A run's status (None: never seen); see `store_admin.run_status`.

        Parameters
        ----------
        run_id : str
            The run's id in the store.
        """
        return store_admin.run_status(self, run_id)

    # -- administration -------------------------------------------------------------------
    def reset(self, name: str, reason: str, *, new_cohort: bool = False) -> int:
        """Start a fresh budget for a silo, logged; see `store_admin.reset`.

        Parameters
        ----------
        name : str
            The silo.
        reason : str
            Why (required; logged).
        new_cohort : bool, default False
            The silo's data is now other people's (logged as a new cohort, not a reset).
        """
        return store_admin.reset(self, name, reason, new_cohort=new_cohort)

    def set_target(self, name: str, target: PrivacyTarget, reason: str) -> None:
        """Change a silo's lifetime target, logged; see `store_admin.set_target`.

        Parameters
        ----------
        name : str
            The silo.
        target : PrivacyTarget
            The new lifetime target.
        reason : str
            Why (logged).
        """
        store_admin.set_target(self, name, target, reason)

    def charges(self, name: str, *, all_epochs: bool = False) -> list[dict]:
        """A silo's charges, oldest first; see `store_admin.charges`.

        Parameters
        ----------
        name : str
            The silo.
        all_epochs : bool, default False
            Include charges from before resets.
        """
        return store_admin.charges(self, name, all_epochs=all_epochs)

    def log(self, name: str | None = None) -> list[dict]:
        """The store's log of registrations, resets and target changes; see
        `store_admin.log`.

        Parameters
        ----------
        name : str, optional
            Only this silo's entries.
        """
        return store_admin.log(self, name)

    def export(self) -> dict:
        """Everything in the store as plain data; see `store_admin.export`."""
        return store_admin.export(self)

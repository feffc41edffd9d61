"""A run's progress in the budget store (`silofl.privacy.budget`, schema 2): every charge a
run's ledgers make is recorded in the store, in its own transaction, before the data is
read (`record`); settling never goes below what was recorded (`shortfall`), so deleting or
editing a run folder's ledger files cannot make the store forget executed work. The
store's methods `record_progress`, `progress` and `settle` call these."""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from silofl.privacy import events

#: one recorded charge: (silo, method, label, event, count)
Row = tuple[str, str, str, Any, int]


class BudgetStore(Protocol):
    """What this module uses of `silofl.privacy.budget.BudgetStore` (which imports this
    module, so it is described here rather than imported)."""

    _db: sqlite3.Connection
    path: Path | None
    _silo_ids: dict[str, int]  # silo name → row id, remembered across rounds

    @property
    def _error(self) -> type[Exception]: ...

    @property
    def where(self) -> str: ...

    def _tx(self) -> AbstractContextManager[Any]: ...

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]: ...


def record(store: BudgetStore, run_id: str, rows: list[tuple[str, str, str, str, int]]
           ) -> None:
    """Record charges run `run_id` is about to execute, before the data is read.

    Parameters
    ----------
    store : BudgetStore
        The store that reserved the run.
    run_id : str
        The run's id in the store.
    rows : list of (silo, method, label, event JSON, count)
        The charges.

    Raises
    ------
    BudgetStoreError
        The run is no longer reserved (settled by another process): the caller must stop
        before reading anything; or a silo of the rows is not in the store.
    """
    on_disk = store.path is not None
    try:
        # durable against a killed process (WAL); a power loss may lose the last records,
        # but the reservation they narrow stays counted in full
        if on_disk:
            store._db.execute("PRAGMA synchronous=NORMAL")
        with store._tx():
            st = store._db.execute("SELECT status FROM runs WHERE id = ?",
                                   (run_id,)).fetchone()
            if st is None or st[0] != "reserved":
                raise store._error(
                    f"run {run_id} is no longer reserved in budget store {store.where} "
                    f"({'unknown' if st is None else st[0]}): another process settled it. "
                    "Stopping before any further data is read")
            ids = _silo_ids(store, sorted({r[0] for r in rows}))
            lost = [r[0] for r in rows if r[0] not in ids]
            if lost:  # a reservation names only silos it registered
                raise store._error(f"budget store {store.where} lost silo {lost[0]!r} "
                                   f"of run {run_id}; restore the store")
            store._db.executemany(
                "INSERT INTO progress VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT "
                "(run_id, silo_id, method, label, event) DO UPDATE SET "
                "count = count + excluded.count",
                [(run_id, ids[silo], method, label, event, count)
                 for silo, method, label, event, count in rows])
    finally:
        if on_disk:
            store._db.execute("PRAGMA synchronous=FULL")


def _silo_ids(store: BudgetStore, names: list[str]) -> dict[str, int]:
    """Silo name -> id, for the names the store has; remembered by the store (silo rows
    are never deleted or renumbered), so a round looks up only names it has not seen."""
    ids = store._silo_ids
    names = [n for n in names if n not in ids]
    for i in range(0, len(names), 500):  # under SQLite's 999-parameter floor
        part = names[i:i + 500]
        ids.update(store._db.execute(
            f"SELECT name, id FROM silos WHERE name IN ({', '.join('?' * len(part))})",
            part).fetchall())
    return ids


def recorded(store: BudgetStore, run_id: str) -> list[Row]:
    """What the store recorded a run as executing (`record`).

    Parameters
    ----------
    store : BudgetStore
        The store.
    run_id : str
        The run's id in the store.

    Returns
    -------
    list of (silo, method, label, event, count)
        The recorded charges (the event parsed), by silo, method and label.
    """
    return [(name, method, label, events.from_json(ev), count)
            for name, method, label, ev, count in store._read(
                "SELECT s.name, p.method, p.label, p.event, p.count FROM progress p "
                "JOIN silos s ON s.id = p.silo_id WHERE p.run_id = ? ORDER BY s.id, "
                "p.method, p.label", (run_id,))]


def shortfall(store: BudgetStore, run_id: str, executed: Iterable[Row]) -> Iterator[Row]:
    """What the store recorded of run `run_id` beyond `executed` (a deleted or edited
    ledger file), compared per (silo, method, label, event).

    Parameters
    ----------
    store : BudgetStore
        The store.
    run_id : str
        The run's id in the store.
    executed : iterable of (silo, method, label, event, count)
        What the run says it executed.

    Yields
    ------
    (silo, method, label, event, count)
        Each recorded charge's count missing from `executed` (positive).
    """
    have: Counter = Counter()
    for silo, method, label, event, count in executed:
        have[(silo, method, label, events.to_json(event))] += count
    for silo, method, label, event, count in recorded(store, run_id):
        short = count - have.get((silo, method, label, events.to_json(event)), 0)
        if short > 0:
            yield silo, method, label, event, short

"""The budget store's side of the machine registry (`store_paths`): after a store
reserved a run, record its charges and that run, and flag (warning + store log) a silo
new to the store whose data was charged elsewhere on this machine (another store, or this
one under another silo name) and a store that lacks the run recorded before (deleted,
replaced or restored from an older copy). Flags are warnings: the run goes on. Inside a
reservation, a silo whose data changed since its last charge is logged the same way
(`note_data_change`)."""

from __future__ import annotations

import sqlite3
import time
import warnings
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from silofl.privacy import store_paths


class BudgetStore(Protocol):
    """What this module uses of `silofl.privacy.budget.BudgetStore` (which imports this
    module, so it is described here rather than imported)."""

    _db: sqlite3.Connection

    @property
    def where(self) -> str: ...

    def run_status(self, run_id: str) -> str | None: ...

    def _tx(self) -> AbstractContextManager[Any]: ...

    def _silo(self, name: str) -> Any: ...


def check(store: BudgetStore, path: Path, run_id: str, digests: dict[str, str],
          new: set[str]) -> None:
    """Record `store`'s charges and its run `run_id` in the machine registry; a silo in
    `new` (new to this store) whose data (`digests`: silo -> data digest) was charged
    elsewhere is flagged, and so is a store that lacks the run recorded before this one
    (warning + store log).

    Parameters
    ----------
    store : BudgetStore
        The file-backed store that just reserved the charges.
    path : Path
        Its file (a scratch store has none and is never registered).
    run_id : str
        The run whose charges were reserved.
    digests : dict of str to str
        Silo name -> digest of the data charged.
    new : set of str
        The silos new to this store.
    """
    try:
        elsewhere = store_paths.note_charged(path, digests)
        before = store_paths.swap_last_run(path, run_id)
    except (OSError, sqlite3.DatabaseError) as e:
        warnings.warn(f"could not check the machine registry of charged data in "
                      f"{store_paths.silofl_home()}: {e}", stacklevel=3)
        return
    if before is not None and store.run_status(before) is None:
        _flag_rollback(store, before)
    here = str(path.resolve())
    flagged = {n: [x if x != here else _here(path, n, digests[n]) for x in w]
               for n, w in elsewhere.items() if n in new}
    if not flagged:
        return
    text = "; ".join(f"silo {n!r}: already charged in {', '.join(w)}"
                     for n, w in flagged.items())
    with store._tx():
        for name in flagged:
            store._db.execute(
                "INSERT INTO log (time, silo_id, action, reason, detail) VALUES "
                "(?, ?, 'charged-elsewhere', ?, ?)",
                (time.time(), store._silo(name)[0], "the same data was charged in "
                 "another budget store on this machine", ", ".join(flagged[name])))
    warnings.warn(
        f"budget store {store.where} is new for data that was already charged on this "
        f"machine ({text}). Its lifetime position does NOT include those charges: the "
        "same people's privacy was spent there too. Use (or restore) that store "
        "(--store) unless this really is a separate budget", stacklevel=3)


def note_data_change(store: BudgetStore, sid: int, epoch: int, fp: str, run_id: str,
                     now: float) -> None:
    """Inside a reservation's transaction: log (not refuse) that run `run_id` reads other
    data than the silo's last charge of this epoch; the budget carries over.

    Parameters
    ----------
    store : BudgetStore
        The store reserving the run.
    sid : int
        The silo's id in the store.
    epoch : int
        Its current epoch.
    fp : str
        The keyed fingerprint of the data the run reads.
    run_id : str
        The run.
    now : float
        The reservation's time (seconds since the epoch).
    """
    last = store._db.execute(
        "SELECT fingerprint FROM charges WHERE silo_id = ? AND epoch = ? AND "
        "fingerprint IS NOT NULL ORDER BY id DESC LIMIT 1", (sid, epoch)).fetchone()
    if last is not None and last[0] != fp:
        store._db.execute(
            "INSERT INTO log (time, silo_id, action, reason, detail) VALUES "
            "(?, ?, 'data-changed', ?, ?)",
            (now, sid, f"run {run_id} reads different data than the last charge",
             f"{last[0]} -> {fp}; the budget carries over (the composition covers "
             "everyone present in both versions)"))


def _here(path: Path, name: str, digest: str) -> str:
    """How the store at `path` itself charged the data of `name` before: under another silo
    name (a rename is not a new budget), or the file was deleted or replaced."""
    other = [n for n in store_paths.names_in(path, digest) if n != name]
    if other:
        return (f"this store as silo {other[0]!r} (the same data under another silo "
                "name: a renamed silo is not a new budget)")
    return (f"{path.resolve()} itself (this file was deleted or replaced since: "
            "those charges are gone from it)")


def _flag_rollback(store: BudgetStore, missing: str) -> None:
    """The store lacks a run this machine saw it reserve: warn and log."""
    text = (f"budget store {store.where} has fewer runs than this machine saw it reserve: "
            f"run {missing} is missing, so the file was deleted, replaced or restored "
            "from an older copy, and the charges made since are NOT in its lifetime "
            "position. Restore the latest copy of the store")
    with store._tx():
        store._db.execute("INSERT INTO log (time, silo_id, action, reason, detail) VALUES "
                          "(?, NULL, 'store-rolled-back', ?, ?)",
                          (time.time(), "a run the machine registry saw reserved here "
                           "is missing", f"run {missing}"))
    warnings.warn(text, stacklevel=4)

"""The budget store's administration and read-only reports (`silofl.privacy.budget`):
how outputs name the store, its silos and their lifetime targets (given to new silos),
resets and target changes (each logged with its reason), a silo's lifetime position and
charges, the store's log, a run's status and owner (and the checks that
a run is reserved or may be continued), and the whole store as
plain data. Each function works on a `BudgetStore` through the methods below; the
store's methods of the same names call these."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from silofl.errors import SiloflError
from silofl.privacy import accounting, events, units
from silofl.privacy.ledger import tightest
from silofl.privacy.store_schema import SCHEMA_VERSION
from silofl.privacy.targets import PrivacyTarget, check_target


class BudgetStore(Protocol):
    """What this module uses of `silofl.privacy.budget.BudgetStore` (which imports this
    module, so it is described here rather than imported)."""

    _db: sqlite3.Connection
    path: Path | None
    scratch: bool
    demo: bool

    @property
    def where(self) -> str: ...

    @property
    def _error(self) -> type[Exception]: ...

    def _tx(self) -> AbstractContextManager[Any]: ...

    def _silo(self, name: str) -> Any: ...

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]: ...

    def _counted(self, silo_id: int, epoch: int) -> Counter: ...



def describe(store: BudgetStore) -> str:
    """What outputs print about this store.

    Parameters
    ----------
    store : BudgetStore
        The store.

    Returns
    -------
    str
        Its path and kind (lifetime, demo, scratch).
    """
    if store.path is None:
        return "scratch (in memory)"
    return f"{store.path} (demo store)" if store.demo else str(store.path)


def silos(store: BudgetStore) -> list[str]:
    """The silos the store knows, in registration order.

    Parameters
    ----------
    store : BudgetStore
        The store.

    Returns
    -------
    list of str
        Silo names.
    """
    return [r[0] for r in store._read("SELECT name FROM silos ORDER BY id")]


def target(store: BudgetStore, name: str) -> PrivacyTarget | None:
    """A silo's lifetime target.

    Parameters
    ----------
    store : BudgetStore
        The store.
    name : str
        The silo.

    Returns
    -------
    PrivacyTarget or None
        Its lifetime (ε, δ); None if the store has not seen it.
    """
    row = store._silo(name)
    return None if row is None else PrivacyTarget(row[1], row[2])


def check_lifetime(store: BudgetStore, name: str, t: PrivacyTarget) -> None:
    """A lifetime target in the range every job target is held to (`privacy.targets`):
    under δ ≥ 0.5 every charge composes to ε ≈ 0, so the budget would never run out.

    Parameters
    ----------
    store : BudgetStore
        The store the target is for (its error type is raised).
    name : str
        The silo.
    t : PrivacyTarget
        Its lifetime target.

    Raises
    ------
    BudgetStoreError
        The target is out of range; nothing was changed.
    """
    try:
        check_target(t.epsilon, t.delta, f"the lifetime target of silo {name!r}: ")
    except SiloflError as e:
        raise store._error(f"{e}. Nothing was changed") from None


def register(store: BudgetStore, targets: dict[str, PrivacyTarget], *,
             explicit: bool = False) -> None:
    """Give silos seen for the first time their lifetime target.

    A silo already in the store keeps its target.

    Parameters
    ----------
    store : BudgetStore
        The store.
    targets : dict of str to PrivacyTarget
        Lifetime targets by silo name.
    explicit : bool, default False
        The user stated these targets: a different target for a known silo is an
        error rather than silently ignored.

    Raises
    ------
    BudgetStoreError
        An explicit target differs from the stored one.
    """
    for name, t in targets.items():  # before the transaction: nothing is written
        if not store.scratch:  # a scratch store guards nothing (Python experiments)
            check_lifetime(store, name, t)
    with store._tx():
        for name, t in targets.items():
            row = store._silo(name)
            if row is None:
                store._db.execute("INSERT INTO silos (name, epsilon, delta, created) "
                                  "VALUES (?, ?, ?, ?)", (name, t.epsilon, t.delta,
                                                          time.time()))
            elif explicit and (row[1], row[2]) != (t.epsilon, t.delta) and store.demo:
                # public data: the demo follows the config (logged); if the job then
                # does not fit, `open_job` restarts the demo budget
                store._db.execute("UPDATE silos SET epsilon = ?, delta = ? WHERE id = ?",
                                  (t.epsilon, t.delta, row[0]))
                store._db.execute(
                    "INSERT INTO log (time, silo_id, action, reason, detail) VALUES "
                    "(?, ?, 'set-target', 'demo store: the config states the target', ?)",
                    (time.time(), row[0], f"ε {row[1]:g} -> {t.epsilon:g}, "
                                           f"δ {row[2]:g} -> {t.delta:g}"))
            elif explicit and (row[1], row[2]) != (t.epsilon, t.delta):
                raise store._error(
                    f"silo {name!r} has lifetime target ε = {row[1]:g}, δ = {row[2]:g} in "
                    f"budget store {store.where}, but the config states ε = "
                    f"{t.epsilon:g}, δ = {t.delta:g}. A lifetime target changes only "
                    "by `silofl budget set-target` (logged, with a reason)")


def spent(store: BudgetStore, name: str) -> dict:
    """A silo's lifetime position: its target and what it has spent.

    Parameters
    ----------
    store : BudgetStore
        The store.
    name : str
        The silo.

    Returns
    -------
    dict
        ``target_epsilon``, ``delta``, ``epsilon`` (spent: reserved + executed,
        composed, the tightest guarantee), ``accountant``, ``epsilon_rdp``,
        ``epsilon_pld``, ``remaining``, ``unfinished_runs``, ``within_target``,
        ``epoch``, ``reset``, ``unit`` (the privacy unit of the composed charges:
        "example", "person" or "node"; None before the first charge) and ``adjacency``
        (that unit in words, `silofl.privacy.units.ADJACENCY`).

    Raises
    ------
    BudgetStoreError
        The store has no such silo.
    """
    row = store._silo(name)
    if row is None:
        raise store._error(f"silo {name!r} is not in budget store {store.where}; "
                           f"silos there: {', '.join(silos(store)) or 'none'}")
    sid, eps_t, delta, epoch = row
    counts = store._counted(sid, epoch)
    event = events.compose(counts)
    eps, kind = tightest(event, delta)
    both = accounting.epsilons(event, delta)
    reserved = store._read("SELECT COUNT(DISTINCT run_id) FROM charges WHERE silo_id = ? "
                           "AND epoch = ? AND status = 'reserved'", (sid, epoch))[0][0]
    # the latest `reset` (not a new cohort): the same people's earlier charges are out
    last = store._read("SELECT action, reason, time FROM log WHERE silo_id = ? AND action "
                       "IN ('reset', 'new-cohort') ORDER BY id DESC LIMIT 1", (sid,))
    reset = ({"reason": last[0][1], "time": last[0][2]}
             if last and last[0][0] == "reset" else None)
    unit = store._read("SELECT unit FROM charges WHERE silo_id = ? AND epoch = ? ORDER BY "
                       "id LIMIT 1", (sid, epoch))  # one unit per epoch (units.check_units)
    return {"silo": name, "target_epsilon": eps_t, "delta": delta, "epoch": epoch,
            "epsilon": eps, "accountant": kind, "epsilon_rdp": both["rdp"],
            "epsilon_pld": both["pld"], "remaining": max(eps_t - eps, 0.0),
            "unfinished_runs": reserved, "within_target": eps <= eps_t,
            "reset": reset, "unit": unit[0][0] if unit else None,
            "adjacency": units.adjacency(unit[0][0]) if unit else None}


def run_status(store: BudgetStore, run_id: str) -> str | None:
    """A run's status.

    Parameters
    ----------
    store : BudgetStore
        The store.
    run_id : str
        The run's id in the store.

    Returns
    -------
    str or None
        "reserved" (not settled: running, or killed), "finished", "failed", ...;
        None if the store never saw the run.
    """
    rows = store._read("SELECT status FROM runs WHERE id = ?", (run_id,))
    return rows[0][0] if rows else None


def check_reserved(store: BudgetStore, run_id: str) -> None:
    """Refuse to settle a run that is not (or no longer) reserved: settling twice would
    replace another process's settlement.

    Parameters
    ----------
    store : BudgetStore
        The store (inside or outside its transaction).
    run_id : str
        The run's id in the store.

    Raises
    ------
    BudgetStoreError
        The run is unknown or already settled; nothing was changed.
    """
    st = store._db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
    if st is None or st[0] != "reserved":
        state = "unknown" if st is None else f"already settled ({st[0]})"
        raise store._error(f"run {run_id} is {state} in budget store {store.where}; "
                           "nothing was changed")


def check_parent(store: BudgetStore, parent: str) -> None:
    """Inside a reservation's transaction: a resume continues a settled run, and at most
    once (two resumes of one run would each reserve its remaining work).

    Parameters
    ----------
    store : BudgetStore
        The store.
    parent : str
        The run a resume continues.

    Raises
    ------
    BudgetStoreError
        `parent` is unknown, not settled, or already continued.
    """
    row = store._db.execute("SELECT status FROM runs WHERE id = ?", (parent,)).fetchone()
    if row is None or row[0] == "reserved":
        state = "unknown" if row is None else "not settled"
        raise store._error(f"run {parent} is {state} in budget store {store.where}; "
                           "it cannot be continued")
    child = store._db.execute("SELECT id FROM runs WHERE parent = ?", (parent,)).fetchone()
    if child is not None:
        raise store._error(f"run {parent} was already continued by run {child[0]} "
                           "(another resume); resume that run instead")


def owner(store: BudgetStore, run_id: str) -> dict | None:
    """The process that owns a run.

    Parameters
    ----------
    store : BudgetStore
        The store.
    run_id : str
        The run's id in the store.

    Returns
    -------
    dict or None
        pid, host, proc_start, status, parent, command and child; None for an
        unknown run.
    """
    rows = store._read("SELECT pid, host, proc_start, status, parent, command FROM runs "
                       "WHERE id = ?", (run_id,))
    if not rows:
        return None
    child = store._read("SELECT id FROM runs WHERE parent = ?", (run_id,))
    return dict(zip(("pid", "host", "proc_start", "status", "parent", "command"), rows[0]),
                child=child[0][0] if child else None)


def reset(store: BudgetStore, name: str, reason: str, *, new_cohort: bool = False) -> int:
    """Start a fresh budget for a silo (only when its data governance allows it).

    Earlier charges stay in the database for audit and are no longer composed.

    Parameters
    ----------
    store : BudgetStore
        The store.
    name : str
        The silo.
    reason : str
        Why (required; logged).
    new_cohort : bool, default False
        The silo's data is now other people's (logged as a new cohort, not a reset).

    Returns
    -------
    int
        The new epoch.

    Raises
    ------
    BudgetStoreError
        No reason, or an unknown silo.
    """
    if not reason or not reason.strip():
        raise store._error("a budget reset needs a reason (it is logged)")
    with store._tx():
        row = store._silo(name)
        if row is None:
            raise store._error(f"silo {name!r} is not in budget store {store.where}")
        epoch = row[3] + 1
        store._db.execute("UPDATE silos SET epoch = ? WHERE id = ?", (epoch, row[0]))
        store._db.execute("INSERT INTO log (time, silo_id, action, reason, detail) "
                          "VALUES (?, ?, ?, ?, ?)",
                          (time.time(), row[0], "new-cohort" if new_cohort else "reset",
                           reason.strip(), f"epoch {row[3]} -> {epoch}"))
    return int(epoch)


def set_target(store: BudgetStore, name: str, target: PrivacyTarget, reason: str) -> None:
    """Change a silo's lifetime target.

    Parameters
    ----------
    store : BudgetStore
        The store.
    name : str
        The silo.
    target : PrivacyTarget
        The new lifetime target.
    reason : str
        Why (logged).

    Raises
    ------
    BudgetStoreError
        A target below what the silo has already spent (composed at the new δ): it
        would print a lifetime position the released models already break.
    """
    if not reason or not reason.strip():
        raise store._error("changing a lifetime target needs a reason (it is logged)")
    check_lifetime(store, name, target)
    with store._tx():
        row = store._silo(name)
        if row is None:
            raise store._error(f"silo {name!r} is not in budget store {store.where}")
        spent, kind = tightest(events.compose(store._counted(row[0], row[3])),
                               target.delta)
        if not spent <= target.epsilon:
            raise store._error(
                f"silo {name!r} has already spent ε = {spent:.4g} ({kind}, at δ = "
                f"{target.delta:g}, reserved and executed charges of the current epoch); "
                f"the requested lifetime target ε = {target.epsilon:g} is below that. "
                "Nothing was changed: a target can only be lowered to at least what is "
                "spent")
        store._db.execute("UPDATE silos SET epsilon = ?, delta = ? WHERE id = ?",
                          (target.epsilon, target.delta, row[0]))
        store._db.execute("INSERT INTO log (time, silo_id, action, reason, detail) "
                          "VALUES (?, ?, 'set-target', ?, ?)",
                          (time.time(), row[0], reason.strip(),
                           f"ε {row[1]:g} -> {target.epsilon:g}, "
                           f"δ {row[2]:g} -> {target.delta:g}"))


def charges(store: BudgetStore, name: str, *, all_epochs: bool = False) -> list[dict]:
    """A silo's charges, oldest first.

    Parameters
    ----------
    store : BudgetStore
        The store.
    name : str
        The silo.
    all_epochs : bool, default False
        Include charges from before resets.

    Returns
    -------
    list of dict
        One dict per charge: epoch, run, command, method, label, event, count,
        status, time, fingerprint, noise, run_status, unit.

    Raises
    ------
    BudgetStoreError
        The store has no such silo.
    """
    row = store._silo(name)
    if row is None:
        raise store._error(f"silo {name!r} is not in budget store {store.where}")
    sql = ("SELECT c.epoch, c.run_id, r.command, c.method, c.label, c.event, c.count, "
           "c.status, c.time, c.fingerprint, r.noise, r.status, c.unit FROM charges c "
           "JOIN runs r "
           "ON r.id = c.run_id WHERE c.silo_id = ?" + ("" if all_epochs else
                                                       " AND c.epoch = ?") +
           " ORDER BY c.id")
    args = (row[0],) if all_epochs else (row[0], row[3])
    keys = ("epoch", "run", "command", "method", "label", "event", "count", "status",
            "time", "fingerprint", "noise", "run_status", "unit")
    return [dict(zip(keys, r)) for r in store._read(sql, args)]


def log(store: BudgetStore, name: str | None = None) -> list[dict]:
    """The store's log of registrations, resets and target changes.

    Parameters
    ----------
    store : BudgetStore
        The store.
    name : str, optional
        Only this silo's entries.

    Returns
    -------
    list of dict
        ``time``, ``silo``, ``action``, ``reason``, ``detail``, oldest first.
    """
    sql = ("SELECT l.time, s.name, l.action, l.reason, l.detail FROM log l LEFT JOIN "
           "silos s ON s.id = l.silo_id" + (" WHERE s.name = ?" if name else "") +
           " ORDER BY l.id")
    return [dict(zip(("time", "silo", "action", "reason", "detail"), r))
            for r in store._read(sql, (name,) if name else ())]


def export(store: BudgetStore) -> dict:
    """Everything in the store as plain data.

    Parameters
    ----------
    store : BudgetStore
        The store.

    Returns
    -------
    dict
        The store's path and kind, schema version, every silo's position with all
        its charges, and the runs; JSON-ready.
    """
    return {"store": str(store.path) if store.path else None, "scratch": store.scratch,
            "schema_version": SCHEMA_VERSION,
            "silos": [dict(spent(store, n), charges=charges(store, n, all_epochs=True))
                      for n in silos(store)],
            "store_kind": "demo" if store.demo else ("scratch" if store.scratch
                                                     else "lifetime"),
            "runs": [dict(zip(("id", "command", "started", "finished", "status", "noise",
                               "host", "pid", "proc_start", "parent"), r))
                     for r in store._read(
                         "SELECT id, command, started, finished, status, noise, host, "
                         "pid, proc_start, parent FROM runs ORDER BY started")],
            "log": log(store)}

"""A job's privacy budget: its reservation in the lifetime store and the ledgers that
spend it.

    job = open_job(store, {"mrmtl": plans}, lifetime, ...)   # reserve (or BudgetExceeded)
    ledgers = job.ledgers("mrmtl", ledger_dir)               # per-run audit trail
    ... training charges the ledgers before every data access ...
    job.settle()                                             # executed replaces reserved

Every private access of a job — preprocessing statistics, every method's DP-SGD steps and
selections — is reserved in one transaction before the first one happens; the ledgers
refuse anything the reservation does not cover, and every charge they make is recorded
in the store (`BudgetStore.record_progress`) before the data is read, so settling — by
this process, or by a resume after it was killed — never goes below what executed, even
if the run folder's ledger files are gone. If the process dies before `settle`, the whole
reservation stays counted until a resume settles it. Both tracks reserve here: the tabular
experiments and the pandemic pipeline (`pandemic.charges.reserve_regions`: node-level
charges recorded by label via `reserve`, its preprocessing release spent through the
method's ledgers).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from silofl.data.federation import Federation
from silofl.errors import BudgetExceeded, PrivacyError
from silofl.io import array_digest
from silofl.privacy import accounting, events
from silofl.privacy.budget import BudgetStore, BudgetStoreError, PlannedCharge, new_run_id
from silofl.privacy.critical import deferred_signals
from silofl.privacy.ledger import Ledger, silo_file_id
from silofl.privacy.targets import PrivacyTarget

#: the method name of charges made outside any method (e.g. preprocessing)
NO_METHOD = "-"


def accountant_kind(name: str) -> accounting.Accountant:
    """`name` as one of the accountants' names.

    Parameters
    ----------
    name : an accountant's name as configured (``"rdp"`` or ``"pld"``).

    Returns
    -------
    The same name, typed as `privacy.accounting.Accountant`.

    Raises
    ------
    PrivacyError
        `name` is no accountant's (the message `privacy.accounting.make_accountant` gives).
    """
    if name == "rdp":
        return "rdp"
    if name == "pld":
        return "pld"
    raise PrivacyError(f"unknown accountant {name!r}; choose one of "
                       f"{', '.join(accounting.ACCOUNTANTS)}")


def fingerprint(X: np.ndarray, y: np.ndarray) -> str:
    """A digest of one silo's training rows. Never written anywhere as is: the budget
    store keeps its keyed hash (`BudgetStore.keyed`), so that a change of the data (new
    patients) shows in the store while a guessed record cannot be tested against it."""
    return array_digest(X, y)


def silo_digest(silo) -> str:
    """A digest of one silo's rows, training and test together and in no particular
    order: what the budget store keys (`BudgetStore.keyed`) and the machine registry
    compares. Another train/test split of the same rows (data.seed, data.test_fraction,
    tuning's validation rows) is the same people: it must not look like new data to the
    registry that flags a new store for data charged elsewhere. Never written as is."""
    lazy = getattr(silo.X_train, "file", None)
    if lazy is not None:  # rows on disk (data.lazy): the digest made as they were read
        return str(lazy.digest)
    parts = []
    for X, y in ((silo.X_train, silo.y_train), (silo.X_test, silo.y_test)):
        n, X, y = len(y), np.asarray(X, np.float64), np.asarray(y, np.float64)
        # explicit widths: reshape(0, -1) fails on a silo with no test rows (a small
        # silo whose few persons all fell on the training side)
        parts.append(np.column_stack([X.reshape(n, int(np.prod(X.shape[1:]))),
                                      y.reshape(n, int(np.prod(y.shape[1:])))]))
    rows = np.ascontiguousarray(np.concatenate(parts))
    if rows.shape[0] == 0:
        return fingerprint(rows, np.zeros(0))
    # one opaque item per row, sorted bytewise: the digest ignores the rows' order
    items = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    h = hashlib.sha256(str(rows.shape[1]).encode())
    h.update(np.sort(items).tobytes())
    return h.hexdigest()[:16]


def fingerprints(fed: Federation) -> dict[str, str]:
    """Per silo, `silo_digest` of its rows."""
    return {s.name: silo_digest(s) for s in fed.silos}


@dataclass
class Job:
    store: BudgetStore
    run_id: str
    accountant: accounting.Accountant
    planned: dict[str, list] = field(default_factory=dict)  # method → [SiloPlan]
    targets: dict[str, PrivacyTarget] = field(default_factory=dict)  # job target per silo
    _ledgers: dict[str, list[Ledger]] = field(default_factory=dict)
    _extra: list[PlannedCharge] = field(default_factory=list)  # reserved outside methods
    _extra_done: list[PlannedCharge] = field(default_factory=list)
    _restored: dict = field(default_factory=dict)  # (method, silo) → entries of an earlier run
    #: (method, silo) → base-event counts its ledger may spend (default: the plan's declared
    #: events; `open_job(reserve=...)`: the charges reserved for that method)
    _allowance: dict = field(default_factory=dict)
    settled: bool = False
    #: the demo store restarted its budget to fit this job (public built-in data only)
    demo_restarted: bool = False
    _json: dict = field(default_factory=dict, repr=False)  # id(event) → (event, JSON)

    def _progress(self, method: str, silo: str, event, round: int, label: str) -> None:
        """A ledger's charge, recorded in the store before the data is read."""
        hit = self._json.get(id(event))
        if hit is None or hit[0] is not event:
            hit = self._json[id(event)] = (event, events.to_json(event))
        self.store.record_progress(self.run_id, [(silo, method, label, hit[1], 1)])

    def _progress_many(self, charges: list[tuple]) -> None:
        """Several ledgers' charges (`ledger.charge_all`: (hook, event, round, label), each
        hook a `_progress` partial of this job) recorded in one store transaction."""
        rows = []
        for hook, event, _, label in charges:
            method, silo = hook.args
            hit = self._json.get(id(event))
            if hit is None or hit[0] is not event:
                hit = self._json[id(event)] = (event, events.to_json(event))
            rows.append((silo, method, label, hit[1], 1))
        self.store.record_progress(self.run_id, rows)

    @property
    def scratch(self) -> bool:
        return self.store.scratch

    def ledgers(self, method: str, ledger_dir: Path | None = None,
                restored: dict[str, list] | None = None) -> list[Ledger]:
        """The per-run ledgers of `method`, one per silo, each allowed exactly what the job
        reserved for that method on that silo. `restored[silo]` (resuming) are entries an
        earlier process charged for this method, already settled in the store: the ledger
        counts them, and they are not settled again. Asking again for the same method without
        any of these returns the same ledgers (a caller that charges before `simulate`, then
        hands it the job)."""
        if method in self._ledgers:
            if ledger_dir is None and restored is None:
                return self._ledgers[method]
            raise ValueError(f"ledgers for {method!r} were already handed out")
        out = []
        for p in self.planned[method]:
            path = None
            if ledger_dir is not None:
                ledger_dir.mkdir(parents=True, exist_ok=True)
                path = ledger_dir / f"{silo_file_id(p.name)}.jsonl"
            old = (restored or {}).get(p.name, [])
            reserved = self._allowance.get((method, p.name))
            allowance = Counter(events.flatten(p.declared) if reserved is None else reserved)
            for e in old:
                allowance.update(events.flatten(e.event))
            hook = partial(self._progress, method, p.name)
            hook.many = self._progress_many  # type: ignore[attr-defined]  # charge_all
            led = Ledger(p.name, self.targets[p.name], self.accountant, path,
                         allowance=allowance, run_id=self.run_id, on_charge=hook)
            led.restore(old)
            self._restored[(method, p.name)] = len(old)
            out.append(led)
        self._ledgers[method] = out
        return out

    def spend_extra(self, silo: str, label: str) -> None:
        """Record that the reserved extra charge (`label`) of `silo` is about to execute."""
        for c in self._extra:
            if c.silo == silo and c.label == label:
                with deferred_signals():  # the store and `executed` agree
                    self.store.record_progress(self.run_id, [(c.silo, c.method, c.label,
                                                              events.to_json(c.event),
                                                              c.count)])
                    self._extra_done.append(c)
                return
        raise KeyError(f"no reserved {label!r} charge for silo {silo!r}")

    def executed(self) -> list[PlannedCharge]:
        out = list(self._extra_done)
        for method, ledgers in self._ledgers.items():
            for led in ledgers:
                by: dict[tuple[str, int], list] = {}
                for entry in led.entries[self._restored.get((method, led.silo), 0):]:
                    slot = by.setdefault((entry.label, id(entry.event)), [entry.event, 0])
                    slot[1] += 1
                out += [PlannedCharge(led.silo, method, label, ev, n)
                        for (label, _), (ev, n) in by.items()]
        return out

    def settle(self, status: str = "finished") -> None:
        """Replace the reservation by what executed (idempotent)."""
        if not self.settled:
            self.store.settle(self.run_id, self.executed(), status=status)
            self.settled = True


def open_job(store: BudgetStore, plans: dict[str, list], *,
             lifetime: dict[str, PrivacyTarget], explicit_lifetime: bool = False,
             command: str, noise: str, accountant: str,
             fingerprints: dict[str, str] | None = None,
             extra: list[PlannedCharge] | None = None,
             reserve: dict[str, list[PlannedCharge]] | None = None,
             parent: str | None = None) -> Job:
    """Register the silos' lifetime targets and reserve everything the job will spend:
    every method's declared events per silo (`plans`: method → [SiloPlan]) and `extra`
    charges (e.g. preprocessing, spent with `Job.spend_extra`). Raises BudgetExceeded,
    reserving nothing, if any silo's lifetime budget cannot cover it.

    `reserve[method]` (optional) is what to record for that method instead of one "plan"
    charge of each silo's declared events: labelled charges (e.g. "node-dpsgd" × rounds)
    and anything else the method's own ledgers charge (e.g. a preprocessing release its
    silo steps make). Per silo they must cover the declared events (ValueError
    otherwise); the method's ledgers may then spend exactly them. `parent`: the settled
    run this job continues (a resume).

    On the demo store of the public built-in data (`store.demo`) a job that does not fit
    restarts the budget of its silos there (logged) and reserves again, so the demo can be
    repeated; every other store refuses."""
    kind = accountant_kind(accountant)  # before touching the store
    planned: list[PlannedCharge] = []
    allowances: dict[tuple[str, str], Counter] = {}
    labelled = reserve or {}
    for method, ps in plans.items():
        if method not in labelled:
            planned += [PlannedCharge(p.name, method, "plan", p.declared) for p in ps]
            continue
        allowances.update(_covering(method, ps, labelled[method]))  # before touching the store
        planned += labelled[method]
    planned += list(extra or [])
    store.register(lifetime, explicit=explicit_lifetime)
    unit = plans_unit(plans)  # what the plans protect, whoever opens the job
    run_id = new_run_id()
    restarted = False
    try:
        try:
            store.reserve(run_id, planned, command=command, noise=noise,
                          fingerprints=fingerprints, parent=parent, unit=unit)
        except BudgetExceeded:
            if not store.demo:
                raise
            for name in sorted({p.silo for p in planned}):
                store.reset(name, "demo store (public built-in data): budget restarted so "
                            "the demo can be repeated")
            store.reserve(run_id, planned, command=command, noise=noise,
                          fingerprints=fingerprints, parent=parent, unit=unit)
            restarted = True
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM before the caller holds the job
        _release_unstarted(store, run_id)
        raise
    targets = {p.name: p.target for ps in plans.values() for p in ps}
    return Job(store, run_id, kind, dict(plans), targets, _extra=list(extra or []),
               _allowance=allowances, demo_restarted=restarted)


def plans_unit(plans: dict[str, list]) -> str | None:
    """The privacy unit the plans protect: "person" or "node" when their plans say so,
    None (the store's own: `BudgetStore.use_unit`, else inferred) otherwise."""
    ps = [p for v in plans.values() for p in v]
    if any(getattr(p, "unit", "example") == "person" for p in ps):
        return "person"
    if any(getattr(p, "node", None) is not None for p in ps):
        return "node"
    return None


def _release_unstarted(store: BudgetStore, run_id: str) -> None:
    """An interrupt after `run_id`'s reservation committed (e.g. in the registry check)
    but before its caller got the job: nothing was read, so it settles to nothing. If
    that fails (the interrupt left a transaction open), the reservation stays counted."""
    try:
        if store.run_status(run_id) == "reserved":
            store.settle(run_id, [], status="interrupted")
    except (BudgetStoreError, sqlite3.DatabaseError):
        pass


def _covering(method: str, plans: list,
              charges: list[PlannedCharge]) -> dict[tuple[str, str], Counter]:
    """(method, silo) → base-event counts of `charges`, checked to be `method`'s charges on
    the plans' silos and to cover each plan's declared events."""
    out: dict[tuple[str, str], Counter] = {(method, p.name): Counter() for p in plans}
    for c in charges:
        if (c.method, c.silo) not in out:
            raise ValueError(f"charge {c.label!r} of {c.method!r} on {c.silo!r} is not one "
                             f"of method {method!r}'s silos")
        for e, k in events.flatten(c.event).items():
            out[(method, c.silo)][e] += k * c.count
    for p in plans:
        have = out[(method, p.name)]
        if any(k > have.get(e, 0) for e, k in events.flatten(p.declared).items()):
            raise ValueError(f"the charges reserved for {method!r} on {p.name!r} do not "
                             "cover its plan's declared events")
    return out

"""A reserved job executed away from its budget store (a sweep's Ray worker).

The process that holds the lifetime store reserves the whole run there (`open_job`) and
keeps the store; the worker gets a `DetachedJob`: the same run id, plans, targets and
per-silo allowances, but no store. Its ledgers still charge before every data access and
refuse anything beyond the reservation; the charges they make are kept in the job's `log`,
which goes back with the result. The reserving process then records that log as the run's
progress and settles (`settle_detached`); a run whose result never comes back keeps its
whole reservation (`settle_in_full`). A detached job can neither open a store nor settle,
so the worker has no way to skip or undo a charge: the budget was spent when the run was
reserved, and settling can only narrow it to what the ledgers charged.

    job = open_job(store, {"mrmtl": plans}, ...)        # driver: reserve (or BudgetExceeded)
    result, log = worker(detach(job))                   # worker: simulate(..., job=...)
    settle_detached(job, log)                           # driver: executed replaces reserved
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from silofl.errors import PrivacyError
from silofl.privacy import events
from silofl.privacy.budget import PlannedCharge
from silofl.privacy.critical import deferred_signals
from silofl.runtime.job import Job

#: one charge kind a detached job's ledgers made: (silo, method, label, event JSON, count),
#: the rows of `BudgetStore.record_progress`
ChargeRow = tuple[str, str, str, str, int]


@dataclass
class DetachedJob(Job):
    """A `Job` without its store: ledgers limited to the reservation, charges logged.

    Attributes
    ----------
    counts : Counter
        (silo, method, label, event JSON) → how many times the ledgers charged it.
    """

    counts: Counter = field(default_factory=Counter)

    def _progress(self, method: str, silo: str, event: Any, round: int, label: str) -> None:
        """A ledger's charge, logged before the data is read (sent back with the result)."""
        hit = self._json.get(id(event))
        if hit is None or hit[0] is not event:
            hit = self._json[id(event)] = (event, events.to_json(event))
        self.counts[(silo, method, label, hit[1])] += 1

    def _progress_many(self, charges: list[tuple]) -> None:
        """Several ledgers' charges of one round (`ledger.charge_all`), logged like
        `_progress`: a detached job has no store for `Job`'s one transaction."""
        for hook, event, round, label in charges:
            self._progress(*hook.args, event, round, label)

    @property
    def scratch(self) -> bool:
        return False  # charged to the lifetime store its reserving process holds

    @property
    def log(self) -> list[ChargeRow]:
        """What the ledgers charged, as `BudgetStore.record_progress` rows."""
        return [(*key, n) for key, n in self.counts.items()]

    def spend_extra(self, silo: str, label: str) -> None:
        raise PrivacyError(f"a detached job has no store to record the extra charge {label!r} "
                           f"of silo {silo!r} in; run this job where its store is")

    def settle(self, status: str = "finished") -> None:
        raise PrivacyError(f"run {self.run_id} is settled by the process that reserved it "
                           "(it holds the budget store); a detached job cannot settle")


def detach(job: Job) -> DetachedJob:
    """A copy of a reserved, unsettled `job` to execute elsewhere, without its store.

    Parameters
    ----------
    job : Job
        From `open_job`, before any ledger was handed out.

    Returns
    -------
    DetachedJob
        Picklable; its ledgers may spend exactly what `job` reserved.

    Raises
    ------
    PrivacyError
        `job` is settled, already handed out ledgers or reserved extra charges.
    """
    if job.settled or job._ledgers or job._extra:
        raise PrivacyError(f"run {job.run_id} cannot be detached: it is settled, already "
                           "executing here, or has extra charges that need its store")
    return DetachedJob(None, job.run_id, job.accountant,  # type: ignore[arg-type]
                       dict(job.planned), dict(job.targets), _allowance=dict(job._allowance))


def settle_detached(job: Job, log: list[ChargeRow], *, status: str = "finished") -> None:
    """Settle `job` (held by the reserving process) to what its detached copy charged.

    The log is first recorded as the run's progress, so the store's own floor applies:
    settling never goes below it, and a log beyond the reservation is refused (the whole
    reservation then stays counted).

    Parameters
    ----------
    job : Job
        The job `detach` copied, still reserved.
    log : list of (silo, method, label, event JSON, count)
        `DetachedJob.log` of the copy that executed.
    status : str, default "finished"
        The run's final status ("finished", "failed").

    Raises
    ------
    BudgetStoreError
        The log exceeds the reservation or the run is no longer reserved.
    """
    executed = [PlannedCharge(s, m, label, events.from_json(e), n)
                for s, m, label, e, n in log]
    with deferred_signals():  # the log is recorded and settled, or a signal waits
        if log:
            job.store.record_progress(job.run_id, log)
        job.store.settle(job.run_id, executed, status=status)
        job.settled = True


def settle_in_full(job: Job, *, status: str) -> None:
    """Settle `job` to its whole reservation: its detached copy may have charged anything
    up to it and its log never came back (a lost worker, an interrupted sweep).

    Parameters
    ----------
    job : Job
        A reserved job opened without labelled charges (`open_job` without `reserve`).
    status : str
        The run's final status ("lost", "interrupted").
    """
    if job.settled:
        return
    if job._allowance:
        raise PrivacyError(f"run {job.run_id} reserved labelled charges; its reservation "
                           "stays counted as reserved")
    full = [PlannedCharge(p.name, method, "plan", p.declared)
            for method, ps in job.planned.items() for p in ps]
    job.store.settle(job.run_id, full, status=status)
    job.settled = True


__all__ = ["ChargeRow", "DetachedJob", "detach", "settle_detached", "settle_in_full"]

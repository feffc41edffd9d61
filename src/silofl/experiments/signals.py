"""SIGTERM and Ctrl-C during a job: settle to what executed, then say what was charged
and how to continue.

`silofl run` installs `terminate_as_interrupt`, so SIGTERM (a scheduler stopping the job,
`kill PID`) unwinds like Ctrl-C: the job's `except KeyboardInterrupt` settles its
reservation to what executed (never below what the store recorded) and keeps the
checkpoint. The exception then carries `InterruptInfo`, from which the command prints the
charge and the resume command, and exits 130 (SIGINT) or 143 (SIGTERM).

A signal never splits a charge: while one is being recorded (`privacy.critical`), both
handlers only note the signal, and it is raised right after the charge is complete.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from silofl.privacy import critical


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered as an interrupt so that every job settles the same way."""

    signum = signal.SIGTERM


@dataclass
class InterruptInfo:
    """What an interrupted job leaves: its settled run, store, charges and checkpoint."""
    run_id: str | None = None
    store: str | None = None          # `BudgetStore.describe()`
    lifetime: list[dict] = field(default_factory=list)  # per silo, after settling
    resume_dir: Path | None = None    # a run directory with a checkpoint
    settled: bool = False
    error: str | None = None          # settling failed: the reservation stays counted


def exit_code(exc: BaseException) -> int:
    """130 for Ctrl-C (SIGINT), 143 for SIGTERM (128 + the signal number)."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


def _on_term(signum, frame):
    if not critical.defer(signum):
        raise Terminated()


def _on_int(signum, frame):
    if not critical.defer(signum):
        raise KeyboardInterrupt()


@contextmanager
def terminate_as_interrupt():
    """While active, SIGTERM raises `Terminated` and SIGINT `KeyboardInterrupt` in the main
    thread — each deferred to the end of a charge being recorded (`privacy.critical`). A
    SIGINT that is ignored or handled elsewhere (not Python's default) is left alone."""
    try:
        old_term = signal.signal(signal.SIGTERM, _on_term)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    old_int = signal.getsignal(signal.SIGINT)
    if old_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_int)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_term)
        if old_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, old_int)


def attach(exc: BaseException, job, run_dir: Path | None, checkpoint: str) -> None:
    """Settle `job` as interrupted (if it is not yet) and attach `InterruptInfo` to `exc`."""
    info = InterruptInfo()
    if job is not None:
        info.run_id, info.store = job.run_id, job.store.describe()
        try:
            job.settle("interrupted")
            info.settled = True
            names = sorted({p.name for ps in job.planned.values() for p in ps})
            info.lifetime = [job.store.spent(n) for n in names]
        except Exception as e:  # noqa: BLE001 — report it, the interrupt goes on
            info.error = str(e)
    if run_dir is not None and (Path(run_dir) / checkpoint).is_dir():
        info.resume_dir = Path(run_dir)
    exc.silofl_interrupt = info  # type: ignore[attr-defined]


def describe(exc: BaseException) -> list[str]:
    """The lines an interrupted command prints (no record values: figures only)."""
    name = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C (SIGINT)"
    info: InterruptInfo | None = getattr(exc, "silofl_interrupt", None)
    if info is None or info.run_id is None:
        return [f"interrupted by {name}: no budget was reserved, nothing was charged"]
    out = [f"interrupted by {name}."]
    if info.error:
        out.append(f"run {info.run_id} could not be settled ({info.error}); its whole "
                   f"reservation stays counted in budget store {info.store}")
    else:
        out.append(f"run {info.run_id} was settled to what it executed in budget store "
                   f"{info.store}; lifetime position now:")
        for r in info.lifetime:
            out.append(f"  {r['silo']}: ε spent {r['epsilon']:.4g} of {r['target_epsilon']:g} "
                       f"(δ = {r['delta']:g}, {r['accountant']})")
    if info.resume_dir is not None:
        out.append(f"continue it with: silofl run --resume {info.resume_dir}")
    else:
        out.append("no checkpoint was kept: start a new run to continue")
    return out

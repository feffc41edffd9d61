"""The sweep's Ray engine (sweep.engine = "ray"): the grid's runs as tasks on a Ray cluster.

This process (the driver) keeps everything a sweep must keep in one place: the results
file and its lock, the resume logic, and the lifetime budget store. `sweep.run_sweep`
prepares the data once (put in Ray's object store here: a worker never reads the data
file itself) and calibrates the plans; for each run this module

1. has the run reserved in the lifetime store first (`sweep.reserve_run`: exactly the
   reservation the local engine's `simulate` makes: same plans, lifetime targets, data
   fingerprints); a run that does not fit raises BudgetExceeded here, before any worker
   sees it, and the sweep stops after the runs in flight;
2. ships the worker a `DetachedJob` (no store: its ledgers charge before every data
   access, only up to the reservation, and log what they charged); the worker process is
   marked so that opening the store fails (`sweep.execute_detached`);
3. when the result comes back, appends the record and settles the run to the worker's
   log (`settle_detached`); a failed run settles to what it charged, a lost one (worker
   died, task cancelled, sweep interrupted) to its whole reservation.

Tasks are never retried (``max_retries=0``): a retry would execute a run twice under one
reservation. Without a lifetime store every run charges its own scratch store in the
worker, as with the local engine.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

from silofl.errors import BudgetExceeded, ConfigError, SiloflError
from silofl.runtime.detached import detach, settle_detached, settle_in_full
from silofl.runtime.job import Job

PIP = "pip install 'silofl[ray]'  (or: pip install ray==2.60.0)"


def require_ray() -> Any:
    """The `ray` module, or ConfigError saying how to install it (nothing has run)."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"sweep.engine = \"ray\" needs Ray, which is not installed here: "
                          f"{PIP}; or run on this machine with sweep.engine = \"local\" "
                          "(--engine local)") from None
    return ray


def check_address(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a cluster address nothing listens at (Ray itself retries for minutes).

    Parameters
    ----------
    address : str
        "host:port" of the head node's GCS (``ray start --head`` prints it), optionally
        with a ``ray://`` scheme, or "auto" (the cluster ``ray start`` left on this machine).
    timeout : float, default 5.0
        Seconds to wait for the TCP connection.
    """
    where = address.removeprefix("ray://")
    if where == "auto":
        return
    host, sep, port = where.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"sweep.address = {address!r} is not a Ray cluster address; give the "
                          "head node's host:port (e.g. \"10.0.0.5:6379\", printed by `ray start "
                          "--head`), \"auto\", or leave it empty to start a local cluster")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConfigError(f"no Ray cluster answers at sweep.address = {address!r} "
                          f"({type(e).__name__}: {e}); check the head node is up (`ray status` "
                          "there) and the port, or leave the address empty to start a local "
                          "cluster") from None


@contextlib.contextmanager
def ray_session(address: str, workers: int) -> Iterator[Any]:
    """Connect to the cluster at `address` or start a local one with `workers` CPUs; a
    session this process already opened (``ray.init`` by the caller) is used as it is.

    Yields
    ------
    module
        `ray`, initialised; shut down on exit if this call started it.
    """
    ray = require_ray()
    if address.strip():  # a named cluster must answer, even if a session is already open
        check_address(address.strip())
    if ray.is_initialized():
        yield ray
        return
    try:
        ray.init(address=address.strip() or "local",
                 num_cpus=None if address.strip() else workers,
                 include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
        where = f"the Ray cluster at {address!r}" if address.strip() else "a local Ray cluster"
        raise ConfigError(f"cannot start or reach {where}: {e}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _run_remote(entry: Callable, box: list, args: tuple, job) -> tuple:
    """In a Ray worker: ``entry(load, *args, job)``, where ``load()`` fetches the object the
    driver put once (the prepared data)."""
    import ray
    return entry(lambda: ray.get(box[0]), *args, job)


def run_on_ray(ray, todo: list, *, entry: Callable[..., tuple], args: Callable[[Any], tuple],
               reserve: Callable[[Any], Job | None], shared: object,
               finished: Callable[[dict], None], workers: int) -> None:
    """Execute `todo` on the cluster, at most `workers` runs in flight.

    Parameters
    ----------
    ray : module
        From `ray_session`.
    todo : list
        The runs (each with a ``key``, named in errors).
    entry : callable (load, *args, job) -> (record, charge log, error)
        A module-level function the worker calls; it must not raise, so the driver learns
        what a failed run charged (`sweep.execute_detached`).
    args : callable spec -> tuple
        `entry`'s arguments for one run (called here).
    reserve : callable spec -> Job or None
        Reserves the run in the lifetime store, here, before it is submitted (None: nothing
        to reserve); may raise BudgetExceeded, which stops submitting.
    shared : object
        Put in Ray's object store once; the worker's ``load()`` returns it.
    finished : callable (record) -> None
        Called here as each run comes back (any order), before the next is submitted.
    workers : int
        Runs in flight at most.

    Raises
    ------
    SiloflError
        The first run's error (BudgetExceeded as it is), after the runs in flight have been
        recorded and settled.
    """
    task = ray.remote(num_cpus=1, max_retries=0)(_run_remote)
    box = [ray.put(shared)]  # nested: a worker fetches it once, not with every task
    inflight: dict = {}  # ObjectRef → (spec, reserved job or None)
    it = iter(todo)
    error: tuple | None = None

    def submit() -> None:
        nonlocal error
        spec = next(it, None)
        if spec is None or error:
            return
        try:
            job = reserve(spec)
        except BudgetExceeded as e:
            error = (spec, e)
            return
        inflight[task.remote(entry, box, args(spec), None if job is None else detach(job))] = \
            (spec, job)

    try:
        for _ in range(workers):
            submit()
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1)
            spec, job = inflight.pop(ready[0])
            rec, e = _collect(ray, ready[0], job)
            if e is not None:
                error = error or (spec, e)
            else:
                finished(rec)
                submit()
    except BaseException:
        for ref, (_, job) in inflight.items():
            ray.cancel(ref, force=True)
            if job is not None:
                settle_in_full(job, status="interrupted")
        raise
    if error:
        _raise(*error)


def _collect(ray, ref, job: Job | None) -> tuple[dict | None, BaseException | None]:
    """A finished task's record or error; its reservation settled either way."""
    try:
        rec, log, e = ray.get(ref)
    except ray.exceptions.RayError as lost:  # the worker died or could not start: no log
        if job is not None:
            settle_in_full(job, status="lost")
        first = (str(lost).strip().splitlines() or [""])[0][:300]
        return None, SiloflError(
            f"a Ray worker did not return this run ({type(lost).__name__}: {first}); it is "
            "charged in full. Check that every node has the same silofl as this machine, "
            "then run the sweep again to resume")
    if job is not None:
        settle_detached(job, log, status="finished" if e is None else "failed")
    return rec, e


def _raise(spec, e: BaseException) -> None:
    if isinstance(e, BudgetExceeded):
        raise e
    if isinstance(e, SiloflError):
        raise type(e)(f"run {spec.key}: {e}") from None
    raise e


__all__ = ["check_address", "ray_session", "require_ray", "run_on_ray"]

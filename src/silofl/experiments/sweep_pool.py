"""The sweep's local engine (sweep.engine = "local", workers > 1): runs in spawned worker
processes on this machine, a few queued per worker, recorded as each finishes.

Each worker opens the sweep's lifetime store itself (`sweep.budget_store`), reserves its run
there and settles it, as `silofl run` does; the Ray engine (`sweep_ray`) keeps the store in
the driver instead.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from silofl.errors import SiloflError


def run_in_pool(fn: Callable[..., dict], todo: list, args: Callable[[Any], tuple],
                workers: int, finished: Callable[[dict], None]) -> None:
    """Call ``fn(*args(spec))`` for every spec of `todo` in `workers` spawned processes.

    Parameters
    ----------
    fn : callable
        A module-level function (picklable) returning a run's record.
    todo : list
        The runs (each with a ``key``, named in errors).
    args : callable spec -> tuple
        `fn`'s arguments for one run (called in this process).
    workers : int
        Processes.
    finished : callable (record) -> None
        Called in this process as each run comes back.

    Raises
    ------
    SiloflError
        A run's error, prefixed with its key, after the other finished runs are recorded.
    """
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    ex = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(workers,))
    try:
        # keep a few tasks queued per worker rather than pickling the whole grid up front
        it = iter(todo)
        pending: dict = {}
        for spec in it:
            pending[ex.submit(fn, *args(spec))] = spec
            if len(pending) >= 2 * workers:
                break
        while pending:
            ready, _ = wait(pending, return_when=FIRST_COMPLETED)
            error = None
            for f in ready:
                spec = pending.pop(f)
                if f.exception() is not None:  # record the other finished runs first
                    error = error or (spec, f.exception())
                    continue
                finished(f.result())
                nxt = None if error else next(it, None)
                if nxt is not None:
                    pending[ex.submit(fn, *args(nxt))] = nxt
            if error:
                spec, e = error
                if isinstance(e, SiloflError):
                    raise type(e)(f"run {spec.key}: {e}") from None
                raise e
    except BaseException:
        ex.shutdown(wait=True, cancel_futures=True)
        raise
    ex.shutdown(wait=True)


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Workers inherit this environment: one BLAS/OpenMP thread each, so `workers`
    processes use `workers` cores instead of oversubscribing them."""
    keys = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    old = {k: os.environ.get(k) for k in keys}
    for k in keys:
        os.environ.setdefault(k, "1")
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _init_worker(workers: int = 1) -> None:
    import logging

    from silofl.privacy.randomness import WORKERS_ENV
    os.environ[WORKERS_ENV] = str(workers)  # the noise prefetch sees the cores taken by runs
    warnings.simplefilter("ignore")
    logging.getLogger("absl").setLevel(logging.ERROR)


__all__ = ["one_blas_thread", "run_in_pool"]

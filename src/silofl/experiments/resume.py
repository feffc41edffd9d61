"""Resuming a killed `run` from its checkpoint, with the budget made whole first.

The run that last worked on the folder is settled to what it executed (never less than
the store recorded), its ledgers are cut back to the checkpoint, and the rest of the job
is reserved anew before any data is read again.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import cast

from silofl.config import Config, config_from_dict
from silofl.errors import ConfigError
from silofl.experiments import signals
from silofl.experiments.run import (
    CHECKPOINT,
    _execute,
    _lifetime,
    _prepare,
    _Prepared,
    _preprocess,
    _result_path,
    _state_path,
    check_demo_store,
)
from silofl.experiments.run_report import RunReport
from silofl.experiments.run_trees import is_trees
from silofl.io import write_text_atomic
from silofl.privacy import events, runlock, store_paths
from silofl.privacy.budget import BudgetStore, BudgetStoreError, PlannedCharge
from silofl.privacy.ledger import read_entries, silo_file_id
from silofl.runtime.job import NO_METHOD, fingerprints, open_job
from silofl.runtime.plan import TrainingConfig


def resume_run(run_dir: str | Path,
               on_progress: Callable[[str, int, int, float], None] | None = None, *,
               store: BudgetStore | None = None, force: bool = False) -> RunReport:
    """Continue a killed `run` from its last checkpoint, with the config it started with.

    Budget: the run that last worked on this folder (the original run, or the latest
    resume of it: the store links each resume to the run it continues) is settled to what
    it executed — its ledger lines, and never less than the store recorded as its progress
    (so deleted or edited ledger files change nothing) — unless it settled itself (Ctrl-C,
    SIGTERM). Resuming is refused while that run's owner (pid, host, start time) is alive:
    settling a live run would let it go on reading data nothing covers. An owner on
    another host cannot be checked: `force` (only when it is known to be dead). The rest of
    the job is reserved anew. Rounds re-run after the checkpoint read the data again and
    are charged again. Seeded runs continue their noise stream exactly; secure runs draw
    fresh entropy.

    Parameters
    ----------
    run_dir : str or Path
        The killed run's directory (it holds a checkpoint).
    on_progress : callable, optional
        As for `run`.
    store : BudgetStore, optional
        The store the run charged (default: the one its config names).
    force : bool, default False
        Settle a run whose owner is on another host (only when it is known to be dead).

    Returns
    -------
    RunReport
        The finished job, as `run` returns it.

    Raises
    ------
    ConfigError
        No resumable run in `run_dir`, or its owner is still alive.
    """
    run_dir = Path(run_dir)
    info, cfg = _read_job_file(run_dir)
    p = _prepare(cfg)
    _check_resumable(cfg, p)
    done, states = _read_checkpoints(run_dir, p)
    _check_plans_hold(run_dir, p, done, states)
    job, latest = None, info["run_id"]
    if p.tcfg.private:
        store = _reopen_store(info, cfg, store)
        latest = _settle_previous(store, info["run_id"], run_dir, p, force)
    restored = _restore_ledgers(run_dir, p, done, states)
    resumed = [f"resumed from {CHECKPOINT} at " + ", ".join(
        f"{lb}: " + (f"round {states[lb]['round']}" if lb in states else "from its start")
        for lb in restored)]
    raw_fps = fingerprints(p.raw)  # digests: the store keeps only their keyed hash
    if p.tcfg.private:
        remaining = {lb: [_remaining(pl, restored[lb].get(pl.name, [])) for pl in plans]
                     for lb, plans in zip(p.labels, p.plans) if lb in restored}
        store.use_unit(p.tcfg.privacy_unit)  # the interrupted run's unit (from its config)
        job = open_job(store, remaining, lifetime=_lifetime(cfg, p.raw),
                       command="silofl run --resume", noise=p.tcfg.noise,
                       accountant=p.tcfg.accountant, fingerprints=raw_fps, parent=latest)
        resumed.append(f"run {latest} was interrupted; its executed charges stay in the "
                       f"budget store and the rest of the job is run {job.run_id}")
        if p.tcfg.noise == "secure":
            resumed.append("secure noise after resuming is drawn with fresh OS entropy")
    try:
        fed = _preprocess(p, cfg)
        return _execute(cfg, p, fed, job, run_dir, on_progress, done=done,
                        states=states, restored=restored, resumed=resumed)
    except KeyboardInterrupt as e:
        signals.attach(e, job, run_dir, CHECKPOINT)
        raise
    except BaseException:
        if job is not None and not job.settled:
            job.settle("failed")
        raise


def _read_job_file(run_dir: Path) -> tuple[dict, Config]:
    """The checkpoint's job file and the config the run started with (checked before any
    data is read)."""
    jf = run_dir / CHECKPOINT / "job.json"
    if not jf.is_file():
        raise ConfigError(f"{str(run_dir)!r} holds no resumable run (no {CHECKPOINT}/job.json: "
                          "the run finished, was not checkpointed, or died before training "
                          "started; its budget reservation stays counted). Start a new run")
    info = json.loads(jf.read_text())
    cfg = config_from_dict(info["config"])
    if info.get("demo") and cfg.data.source != store_paths.DEMO_SOURCE:
        # job.json is a plain file: the restartable demo store is for the built-in public
        # data only, whatever the file says (checked before any data is read)
        raise ConfigError(f"{str(jf)!r} names the demo budget store but its config reads "
                          f"data.source {cfg.data.source!r}: the demo store (its budget "
                          "restarts) guards only the built-in heart data. The job file was "
                          "edited; start a new run, which charges the source's lifetime store")
    return info, cfg


def _check_resumable(cfg: Config, p: _Prepared) -> None:
    """Refuse runs whose remaining charges cannot be derived without spending again."""
    if cfg.tuning.mode == "private":
        raise ConfigError("resuming a privately tuned run is not supported: the trials would "
                          "re-read the rounds after the checkpoint, and the tuned release's "
                          "RepeatAndSelect charge covers one run of each trial. Start a new "
                          "run (the killed run's charges stay counted)")
    if p.prep.private:
        raise ConfigError("resuming a run with private preprocessing is not supported: its "
                          "noisy statistics cannot be derived again without spending budget "
                          "again. Start a new run (the killed run's charges stay counted)")


def _check_plans_hold(run_dir: Path, p: _Prepared, done: dict, states: dict) -> None:
    """Refuse (before the store is touched) a resume whose re-planned job no longer holds
    the rounds the checkpoint keeps: the data changed since the run was killed (other rows,
    or at person level other person ids: another number of units gives another q), so the
    kept rounds and the rest would be two different mechanisms that no plan composes."""
    tcfg = cast(TrainingConfig, p.tcfg)
    if not tcfg.private:  # nothing charged, nothing to compose
        return
    what = "rows or person ids" if tcfg.privacy_unit == "person" else "rows"
    for label, plans in zip(p.labels, p.plans):
        kept = _kept(label, states, p)
        for plan in plans if label not in done else []:
            path = run_dir / "ledgers" / label / f"{silo_file_id(plan.name)}.jsonl"
            counts = Counter(events.flatten(plan.declared))
            for e in read_entries(path):
                if e.round <= kept:
                    counts.subtract(events.flatten(e.event))
            if min(counts.values(), default=0) < 0:
                raise ConfigError(
                    f"cannot resume {label} for silo {plan.name!r}: the rounds its checkpoint "
                    f"keeps were charged under another plan than the job's data gives now "
                    f"(its {what} changed since the run was killed, so q, σ or the "
                    "steps differ). Start a new run; the killed run's charges stay counted. "
                    "Nothing was charged")


def _read_checkpoints(run_dir: Path, p: _Prepared) -> tuple[dict, dict]:
    """Per method label: its finished result (``done``) or its last round's state."""
    done, states = {}, {}
    for label in p.labels:
        if _result_path(run_dir, label).is_file():
            done[label] = pickle.loads(_result_path(run_dir, label).read_bytes())
        elif _state_path(run_dir, label).is_file():
            states[label] = pickle.loads(_state_path(run_dir, label).read_bytes())
    return done, states


def _reopen_store(info: dict, cfg: Config, store: BudgetStore | None) -> BudgetStore:
    """The budget store the run was charged to (``store`` overrides the job file's path)."""
    if store is None and info["store"] and not Path(info["store"]).is_file():
        # opening it would create an empty store, unannounced to the next run
        raise ConfigError(f"budget store {info['store']!r}, which this run was charged "
                          "to, does not exist (deleted or moved): restore it, or pass "
                          "its new path with --store. Nothing was created or charged")
    store = store if store is not None else (
        BudgetStore(Path(info["store"]), demo=bool(info.get("demo")))
        if info["store"] else BudgetStore(None))
    check_demo_store(cfg, store)
    return store


def _settle_previous(store: BudgetStore, first: str, run_dir: Path, p: _Prepared,
                     force: bool) -> str:
    """The run a resume continues: the latest in the chain of resumes from `first`,
    settled to what it executed if it was killed. Refused while its owner lives."""
    latest, seen = first, {first}
    while True:
        own = store.owner(latest)
        if own is None:
            raise ConfigError(f"budget store {store.where} has no run {latest} (the run this "
                              "folder belongs to); pass the store it was charged to with "
                              "--store")
        if own["child"] is None or own["child"] in seen:
            break
        latest = own["child"]
        seen.add(latest)
    if own["status"] == "finished":
        raise ConfigError(f"run {latest} of this folder already finished; nothing to resume")
    if own["status"] != "reserved":  # settled itself (interrupted, failed) or by a resume
        return latest
    alive = runlock.owner_alive(own["pid"], own["host"], own["proc_start"])
    if alive:
        raise ConfigError(
            f"run {latest} is still running (pid {own['pid']} on this host); resuming it now "
            "would settle a live run's reservation while it goes on reading data. Wait for "
            f"it to end, or stop it (kill -TERM {own['pid']}: it settles what it executed "
            "and prints how to resume), then resume")
    if alive is None and not force:
        raise ConfigError(
            f"run {latest} belongs to pid {own['pid']} on host {own['host']!r}, which cannot "
            "be checked from here; if you know that process is dead, resume with "
            "--force-resume")
    executed = []
    for label in p.labels:  # the ledger lines that run wrote (the store's progress floors them)
        for name in p.raw.names:
            path = run_dir / "ledgers" / label / f"{silo_file_id(name)}.jsonl"
            executed += [PlannedCharge(name, label, e.label, e.event)
                         for e in read_entries(path, run=latest)]
    if latest == first:  # the original run also spent its preprocessing
        executed += [PlannedCharge(n, NO_METHOD, "preprocess", e) for n, e in p.extra.items()]
    try:
        store.settle(latest, executed, status="killed")
    except BudgetStoreError as e:
        raise ConfigError(f"cannot settle the interrupted run {latest}: {e}") from None
    return latest


def _restore_ledgers(run_dir: Path, p: _Prepared, done: dict, states: dict) -> dict:
    """Per method not done, per silo: the ledger entries the checkpoint keeps (rounds up
    to its round); each file is rewritten to them (rounds after it are re-run)."""
    restored = {}
    for label in p.labels:
        if label in done:
            continue
        kept = _kept(label, states, p)
        restored[label] = {}
        for name in p.raw.names:
            path = run_dir / "ledgers" / label / f"{silo_file_id(name)}.jsonl"
            keep = [e for e in read_entries(path) if e.round <= kept]
            restored[label][name] = keep
            if path.exists():  # the model's own trail: rounds after the checkpoint are re-run
                write_text_atomic(path, "".join(_ledger_line(name, e) for e in keep))
    return restored


def _kept(label: str, states: dict, p: _Prepared) -> int:
    """The last round of `label` its checkpoint keeps: −1 for dp_gbdt, which keeps no
    partial ensemble (its trees are numbered from 0) and restarts from its first tree;
    its releases before the kill stay charged."""
    if label in states:
        return states[label]["round"]
    return -1 if any(is_trees(a) for a, lb in zip(p.algorithms, p.labels) if lb == label) \
        else 0


def _remaining(plan, kept: list):
    """`plan` with `declared` reduced by the entries an earlier process kept."""
    counts = Counter(events.flatten(plan.declared))
    for e in kept:
        counts.subtract(events.flatten(e.event))
    return dataclasses.replace(plan, declared=events.compose(+counts))


def _ledger_line(name: str, e) -> str:
    line = {"silo": name, "round": e.round, "label": e.label,
            "event": events.to_dict(e.event)}
    if e.run is not None:
        line["run"] = e.run
    return json.dumps(line) + "\n"

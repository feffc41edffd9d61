"""One experiment run (a *job*): every requested method on one federation, written to a
run directory with the resolved config, per-round history, ledgers, privacy report,
summary and a plot.

Validation, calibration and the reservation of *every* private access of the job in
the lifetime budget store happen before the run directory is created or any training
data is touched, so bad input leaves nothing behind and spends nothing. The job's
methods share each silo's target for this job (one σ per silo, calibrated for their
composition), and the whole job is charged to the silo's lifetime budget.
"""

from __future__ import annotations

import pickle
import shutil
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from silofl.config import Config
from silofl.data.preprocess import apply_preprocessing
from silofl.errors import ConfigError
from silofl.experiments import build, linkage, run_trees, saving, signals
from silofl.experiments.person_report import job_persons
from silofl.experiments.reference import add_nonprivate_reference
from silofl.experiments.run_report import RunReport, assess_all, record_alpha, write_outputs
from silofl.io import write_bytes_atomic, write_json_atomic, write_text_atomic
from silofl.privacy import accounting, events, store_paths
from silofl.privacy.budget import BudgetStore, PlannedCharge
from silofl.privacy.ledger import silo_file_id, tightest
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import ADJACENCY, PrivacyTarget  # noqa: F401 (audits: run.ADJACENCY)
from silofl.runtime.job import NO_METHOD, fingerprints, open_job
from silofl.runtime.plan import plan_job
from silofl.runtime.simulator import RunResult, bind_data, simulate
from silofl.tuning import setup as tuning_setup


@dataclass
class _Prepared:
    """Everything a job needs that is fixed before any data access."""
    raw: object
    tcfg: object
    prep: object
    model: object
    algorithms: list
    labels: list[str]
    plans: list
    extra: dict
    tuning_counts: object = None  # (K,) validation rows carved for private tuning, or None
    link: linkage.LinkagePlan | None = None  # persons linked by keyed pseudonyms


def _prepare(cfg: Config, raw=None) -> _Prepared:
    # `raw`: encoded and split, no statistic computed; preprocessing is planned (public
    # facts only) so that its private statistics are reserved with the training.
    # (`raw` given: `silofl.audit` passes the silos with its canaries inserted.)
    if raw is None:
        build.check_unit(cfg)  # a misspelt unit fails before a large table is read
        raw = build.apply_privacy(build.load_raw(cfg.data), cfg)
    # --- private tuning (silofl.tuning): validation rows leave the training rows first
    tuning_counts = None
    tuning_setup.validate(cfg.tuning)  # every mode: a misspelt key value is refused too
    tuning_setup.check_with_training(cfg.tuning, cfg.training.methods, cfg.training.lam,
                                     cfg.privacy.unit)
    if cfg.tuning.mode == "private":
        raw, tuning_counts = tuning_setup.carve_into_test(
            raw, cfg.tuning.validation_fraction, cfg.data.seed)
    tcfg = build.training_config(cfg)
    prep = build.plan_data(cfg.data, raw, tcfg.accountant, tcfg.privacy_unit)
    if prep.private and not tcfg.private:
        raise ConfigError("private preprocessing (data.standardize/impute = 'private') needs "
                          "privacy; a non-private run has no budget to charge")
    # a job of trees alone needs no parametric model ([model] is for the DP-SGD methods)
    trees_only = set(cfg.training.methods) == {"dp_gbdt"}
    model = None if trees_only else build.build_model(cfg, raw)
    if trees_only:
        build.check_metric(cfg.model.metric, raw.task)
    link = linkage.plan_linkage(cfg, raw)  # the key checked before anything is reserved
    algorithms = linkage.link_algorithms(build.build_algorithms(cfg), link, raw)
    if tuning_counts is not None:  # the tuned method replaces its untuned version
        algorithms = _tuned_algorithms(cfg, algorithms, raw, tuning_counts)
    elif cfg.tuning.mode == "proxy":  # λ chosen on declared public data: free for the silos
        from silofl.experiments.proxy_tuning import proxy_algorithms
        algorithms = proxy_algorithms(cfg, algorithms, raw)
    for alg in algorithms:  # PrivateKT: the public set and the model, checked before planning
        bind_data(alg, raw, model)
    run_trees.bind_bounds(algorithms, raw, prep)  # dp_gbdt: declared bins, before any data
    extra = {n: e for n, e in prep.events.items() if e is not None}
    plans = plan_job(raw, algorithms, tcfg, extra=linkage.merged(extra, link) or None)
    linkage.note_calibration(plans, extra, link)
    return _Prepared(raw, tcfg, prep, model, algorithms,
                     [alg.describe()["name"] for alg in algorithms], plans, extra,
                     tuning_counts, link)


def _tuned_algorithms(cfg: Config, algorithms: list, raw, counts) -> list:
    """[tuning] mode = "private": tuning.method in training.methods runs privately tuned
    (its validation rows are bound after preprocessing, `_preprocess`)."""
    tc = cfg.tuning
    if tc.method not in cfg.training.methods:
        raise ConfigError(f"[tuning] tunes {tc.method!r}, which is not in training.methods "
                          f"{cfg.training.methods}; add it or set tuning.method")
    # the raw validation rows, for the checks at planning (preprocessed ones replace them)
    raw_val = [(s.X_test[len(s.y_test) - m:], s.y_test[len(s.y_test) - m:])
               for s, m in zip(raw.silos, counts)]
    tuned = tuning_setup.tuned_algorithm(tc, tc.lam or list(tuning_setup.DEFAULT_LAMS), tc.lr,
                                         raw_val, cfg.training.weighted)
    return [tuned if m == tc.method else a for m, a in zip(cfg.training.methods, algorithms)]


def run(cfg: Config, out_dir: Path | None = None,
        on_progress: Callable[[str, int, int, float], None] | None = None, *,
        store: BudgetStore | None = None) -> RunReport:
    """Run every method in `cfg` as one job, as ``silofl run`` does.

    All methods share each silo's target (their composition is calibrated to it). The
    whole job is reserved in the lifetime budget store before any data is read, and
    settled to what executed. With [output] checkpoint_every > 0 the run directory keeps
    a checkpoint, so a killed run continues with `resume_run`.

    Parameters
    ----------
    cfg : Config
        The job (`load_config`).
    out_dir : Path, optional
        Where the run directory goes (default [output] dir), plus [output] name; with
        no directory configured (output.dir = "") nothing is written.
    on_progress : callable (method, round, rounds, metric) -> None, optional
        Called after every evaluated round.
    store : BudgetStore, optional
        The store to charge (default: [budget] store, else the deployment's store in the
        silofl home; a scratch in-memory store with [budget] scratch = true).

    Returns
    -------
    RunReport
        Results per method, the composed privacy per silo, the lifetime position and the
        run directory (results, ledgers, figures, saved models).

    Raises
    ------
    ConfigError, DataError
        Bad input, before any budget is reserved.
    BudgetExceeded
        The job would take a silo over its lifetime target: nothing runs.
    """
    # --- everything that can fail on bad input, before any data access ---------------
    p = _prepare(cfg)
    base = _base_dir(cfg, out_dir)
    job = None
    raw_fps = fingerprints(p.raw)  # of the raw training rows: what the budget store records
    if p.tcfg.private:
        store = store if store is not None else open_store(cfg, base)
        check_demo_store(cfg, store)
        job = open_job(store, dict(zip(p.labels, p.plans)), lifetime=_lifetime(cfg, p.raw),
                       explicit_lifetime=cfg.budget.epsilon is not None,
                       command="silofl run", noise=p.tcfg.noise, accountant=p.tcfg.accountant,
                       fingerprints=raw_fps,
                       extra=[PlannedCharge(n, NO_METHOD, "preprocess", e)
                              for n, e in p.extra.items()] + linkage.charges(p.link))
    # --- from here on the job's budget is reserved: settle it whatever happens ----------
    run_dir = None
    try:
        for name in p.extra:  # reserved above; recorded as executed before the data is read
            job.spend_extra(name, "preprocess")
        if job is not None:  # charged (ledger, store) before any person id is read
            linkage.release(p.link, p.raw, job, p.tcfg.noise, cfg.training.seed)
        fed = _preprocess(p, cfg)
        run_dir = _make_run_dir(cfg, base)
        if run_dir and cfg.output.checkpoint_every:
            _write_job_file(run_dir, cfg, job)
        return _execute(cfg, p, fed, job, run_dir, on_progress)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (`signals.Terminated`)
        signals.attach(e, job, run_dir, CHECKPOINT)
        if run_dir is not None and not (run_dir / CHECKPOINT).is_dir():
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    except BaseException:
        if job is not None:
            job.settle("failed")
        if run_dir is not None:  # leave nothing half-written; the store keeps the charges
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _preprocess(p: _Prepared, cfg: Config):
    fed = apply_preprocessing(p.raw, p.prep, Randomness.for_mode(
        p.tcfg.noise if p.tcfg.private else "seeded", [cfg.training.seed, 0x9E7]))
    if p.tuning_counts is not None:  # private tuning: its validation rows, preprocessed
        fed, val = tuning_setup.split_from_test(fed, p.tuning_counts)
        for alg in p.algorithms:
            if hasattr(alg, "validation"):
                alg.validation = val
    return fed


def _execute(cfg: Config, p: _Prepared, fed, job, run_dir: Path | None,
             on_progress, done: dict | None = None, states: dict | None = None,
             restored: dict | None = None, resumed: list[str] | None = None) -> RunReport:
    """Train every method not in `done` (label → RunResult of an earlier process), from
    `states[label]` where an earlier process checkpointed it; settle; report; write."""
    results = []
    every = cfg.output.checkpoint_every if run_dir else 0
    for alg, alg_plans, label in zip(p.algorithms, p.plans, p.labels):
        if done and label in done:
            results.append(done[label])
            continue

        def tick(t, pooled, _label=label):
            if on_progress:
                on_progress(_label, t, p.tcfg.rounds, pooled)

        def save(state, _label=label):
            write_bytes_atomic(_state_path(run_dir, _label), pickle.dumps(state))
        ledger_dir = run_dir / "ledgers" / label if run_dir else None
        if run_trees.is_trees(alg):  # dp_gbdt: restarts from its first tree on resume
            r = run_trees.run_trees(fed, alg, p.tcfg, alg_plans, job=job, label=label,
                                    metric=cfg.model.metric or None, ledger_dir=ledger_dir,
                                    restored=(restored or {}).get(label),
                                    on_round=lambda t, v, _l=label, _n=alg.total_trees:
                                    on_progress and on_progress(_l, t, _n, v))
        else:
            r = simulate(fed, p.model, alg, p.tcfg, metric=cfg.model.metric or None,
                         plans=alg_plans, on_round=tick, job=job, method=label,
                         ledger_dir=ledger_dir, resume=(states or {}).get(label),
                         checkpoint=save if every else None, checkpoint_every=every or 1,
                         restored=(restored or {}).get(label))
        if hasattr(alg, "alpha_history"):  # Weight Erosion: α per round into history.json
            record_alpha(r, alg, p.tcfg.rounds)
        if every:
            write_bytes_atomic(_result_path(run_dir, label), pickle.dumps(r))
        results.append(r)
    add_nonprivate_reference(cfg, fed, p.model, p.algorithms, p.tcfg, results)
    if job is not None:
        job.settle()
    spent = linkage.merged(p.extra, p.link)  # preprocessing and the overlap release
    report = RunReport(run_dir, cfg, results, _combined(results, spent), uncharged=list(
        fed.meta.get("uncharged", [])), preprocessing=fed.meta.get("preprocessing"),
        release=saving.release_info(cfg, p.model, fed), resumed=resumed or [],
        dropped_silos=list(p.raw.meta.get("dropped_silos", [])))
    report.quality = assess_all(report, p.model, fed)
    if p.tcfg.privacy_unit == "person":  # what a person seen by m silos is guaranteed
        report.persons = job_persons(results, spent, cfg.privacy.delta,
                                     cfg.privacy.persons_in_silos,
                                     overlap=p.link.released if p.link else None)
    report.linkage = linkage.describe(p.link)
    if job is not None:
        report.run_id, report.scratch = job.run_id, job.scratch
        report.store = None if job.store.path is None else str(job.store.path)
        report.demo, report.store_created = job.store.demo, job.store.created
        report.lifetime = [job.store.spent(n) for n in fed.names]
    if run_dir:
        write_outputs(report)
        shutil.rmtree(run_dir / CHECKPOINT, ignore_errors=True)  # finished: nothing to resume
    return report


# --- checkpoints (resuming: `resume.resume_run`) ---------------------------------------------

CHECKPOINT = "checkpoint"


def _state_path(run_dir: Path, label: str) -> Path:
    return run_dir / CHECKPOINT / f"{silo_file_id(label)}.state.pkl"


def _result_path(run_dir: Path, label: str) -> Path:
    return run_dir / CHECKPOINT / f"{silo_file_id(label)}.result.pkl"


def _write_job_file(run_dir: Path, cfg: Config, job) -> None:
    (run_dir / CHECKPOINT).mkdir(exist_ok=True)
    write_json_atomic(run_dir / CHECKPOINT / "job.json", {
        "format": 1, "config": _toml_safe(cfg.to_dict()),
        "run_id": job.run_id if job else None,
        "store": str(job.store.path.resolve()) if job and job.store.path else None,
        "demo": bool(job and job.store.demo)})


def open_store(cfg: Config, base: Path | None = None) -> BudgetStore:
    """The lifetime budget store a job charges: a scratch in-memory store with [budget]
    scratch = true; else [budget] store; else the built-in public heart data's demo store;
    else the deployment's store in the silofl home (`store_paths.default_store_path`).
    Never a file in the output folder: another folder or --out must not be a new budget.
    (`base`, the output folder, is no longer used.) A store created here is announced
    loudly (a warning naming its path)."""
    if cfg.budget.scratch:
        return BudgetStore(None)
    demo = False
    if cfg.budget.store:
        path = Path(cfg.budget.store)
    elif cfg.data.source == store_paths.DEMO_SOURCE:
        path, demo = store_paths.demo_store_path(), True
    else:
        path = store_paths.default_store_path(cfg.budget.deployment)
    st = BudgetStore(path, demo=demo)
    if st.created:
        warnings.warn(f"NEW budget store created: {path}{' (demo store)' if demo else ''}. "
                      "It holds no earlier charges: if these silos' data was charged in "
                      "another store, that spending is not counted here (use that store "
                      "with --store)", stacklevel=2)
    return st


def check_demo_store(cfg: Config, store: BudgetStore) -> None:
    """Refuse the demo store (its budget restarts when spent) for any source but the
    built-in public heart data, however the store was handed over (Python API, job file);
    then set the job's privacy unit on the store (`BudgetStore.use_unit`: every charge
    records it, a silo's charges of another unit are refused).

    Raises
    ------
    ConfigError
        before anything is registered or reserved.
    """
    if store.demo and cfg.data.source != store_paths.DEMO_SOURCE:
        raise ConfigError(f"budget store {store.where} is the demo store (its budget "
                          f"restarts); data.source {cfg.data.source!r} is not the built-in "
                          "public heart data. Charge the source's lifetime store (leave "
                          "[budget] store empty) or name another store")
    store.use_unit(cfg.privacy.unit if cfg.privacy.enabled else "example")


def _lifetime(cfg: Config, fed) -> dict[str, PrivacyTarget]:
    """Each silo's lifetime target when the store first sees it: [budget] epsilon/delta,
    else the silo's target for this job."""
    b = cfg.budget
    return {s.name: PrivacyTarget(b.epsilon if b.epsilon is not None else s.target.epsilon,
                                  b.delta if b.delta is not None else s.target.delta)
            for s in fed.silos}


def _combined(results: list[RunResult], extra: dict | None = None) -> list[dict]:
    """Per silo, the whole job: private preprocessing and every method's executed events
    composed (what releasing all of the job's models costs), checked against the silo's
    target for this job."""
    if not results or results[0].ledgers is None:
        return []
    out = []
    for k, silo in enumerate(results[0].silos):
        counts = Counter()
        if extra and silo in extra:
            counts += events.flatten(extra[silo])
        for r in results:
            counts += r.ledgers[k].spent_counts()
        led = results[0].ledgers[k]
        event = events.compose(counts)
        eps, kind = tightest(event, led.target.delta)
        both = accounting.epsilons(event, led.target.delta)
        out.append({"silo": silo, "target_epsilon": led.target.epsilon,
                    "delta": led.target.delta, "epsilon": eps, "accountant": kind,
                    "epsilon_rdp": both["rdp"], "epsilon_pld": both["pld"],
                    "within_target": eps <= led.target.epsilon, "methods": len(results)})
    return out


def _base_dir(cfg: Config, out_dir: Path | None) -> Path | None:
    if out_dir is not None:
        return Path(out_dir)
    return Path(cfg.output.dir) if cfg.output.dir else None


def _make_run_dir(cfg: Config, base: Path | None) -> Path | None:
    if base is None:
        return None
    name = cfg.output.name or time.strftime("%Y%m%d-%H%M%S")
    run_dir = base / name
    i = 1
    while run_dir.exists():
        run_dir = base / f"{name}-{i}"
        i += 1
    run_dir.mkdir(parents=True)
    import tomli_w  # only a run that writes a folder needs it (a cheap process start)
    write_text_atomic(run_dir / "config.toml", tomli_w.dumps(_toml_safe(cfg.to_dict())))
    return run_dir


def _toml_safe(d):
    if isinstance(d, dict):
        return {k: _toml_safe(v) for k, v in d.items() if v is not None}
    return d

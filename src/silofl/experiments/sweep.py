"""Privacy-utility sweeps: a grid of runs, executed in worker processes, recorded one
JSON line per finished run, resumable.

Grid: seeds × (ε list + non-private) × methods × lr × (λ list for LAMBDA_METHODS, one run
for the others). Every run is one `simulate()` on the same federation, whose silos each
give up `validation_fraction` of their *training* rows as a validation set: runs are
evaluated per round on validation (for choosing hyperparameters) and on test (for
reporting); test rows never take part in selection.

Results file (JSON lines): line 1 is a header with the sweep's fingerprint (a hash of the
normalized config and the data file) and the data layout; every further line is one
finished run. Lines are appended with a single write each and the file is fsynced, so a
crash leaves complete lines (a torn last line is dropped on the next start). Re-running the
same sweep skips the runs already recorded; a results file of a different sweep is refused.

Privacy: every private run trains under ledgers that charge each silo before its data is
touched (as `silofl run` does); the ε each silo actually spent is read from its ledger
into the record. By default each run charges a *scratch* budget store: the sweep is an
experiment, not a release, and its report says so. With [budget] store (and [budget]
epsilon, the total ε the sweep may spend per silo) every run is reserved in that lifetime
store, workers included, and the sweep stops with BudgetExceeded when the budget is
spent. What is NOT counted on a scratch store: the composition of all runs and the cost
of choosing among them (thesis appendix E); the non-private runs use the data without any
DP and exist only as a reference.

sweep.tuning: "uncounted" (the above), "none" (one fixed setting per method: nothing is
chosen) or "private": the grid as above plus, per ε and seed, [tuning] method privately
tuned (`silofl.tuning`: random h per silo, best-only release, its cost counted), for the
comparison of `silofl.tuning.report`. Plans are calibrated once in the parent process and
shipped to the workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from silofl.algorithms import LAMBDA_METHODS, make_algorithm
from silofl.config.sweep import check_engine
from silofl.data.federation import Federation
from silofl.data.persons import split_training
from silofl.errors import ConfigError, DataError, PrivacyError
from silofl.experiments import build
from silofl.experiments.sweep_config import _ALG_DEFAULTS, SweepConfig
from silofl.experiments.sweep_pool import one_blas_thread, run_in_pool
from silofl.experiments.sweep_ray import ray_session, require_ray, run_on_ray
from silofl.experiments.sweep_record import _clean, _nonfinite, tuning_summary
from silofl.experiments.sweep_results import (
    FORMAT,
    HEADER_KIND,
    append_record,
    exclusive_lock,
    open_results,
)
from silofl.models.base import Model
from silofl.models.metrics import HIGHER_IS_BETTER, default_metric
from silofl.privacy.budget import SCRATCH_NOTE, BudgetStore
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.detached import DetachedJob
from silofl.runtime.job import Job, fingerprints, open_job
from silofl.runtime.plan import SEEDED_NOTE, TrainingConfig, plan_silos
from silofl.runtime.simulator import bind_data, simulate
from silofl.tuning import setup as tuning_setup

NOT_COUNTED = (
    "The privacy cost of hyperparameter selection is not counted. Every private run meets each "
    "silo's (ε, δ) on its own, but this sweep trained many configurations on the same data "
    "and the report picks the best by validation metric; releasing that choice (or several "
    "runs) costs more privacy than one run (thesis §1.7 and appendix E: naive tuning over h "
    "runs can cost up to h·ε). Non-private runs use the data without DP and are a reference "
    "only.")


# --- the grid ----------------------------------------------------------------------------

@dataclass(frozen=True)
class RunSpec:
    """One point of the grid. epsilon None = non-private; lam None = method has no λ."""

    method: str
    epsilon: float | None
    lam: float | str | None  # "auto": λ_k from the released updates
    lr: float
    seed: int

    @property
    def key(self) -> str:
        return json.dumps([self.method, self.epsilon, self.lam, self.lr, self.seed])

    @property
    def private(self) -> bool:
        return self.epsilon is not None


def expand(sc: SweepConfig) -> list[RunSpec]:
    """All runs of the sweep, seeds outermost (so a partial sweep covers every ε early)."""
    s = sc.sweep
    eps = list(s.epsilon) + ([None] if s.nonprivate else [])
    out = [RunSpec(m, e, lam, lr, seed)
           for seed in s.seeds for e in eps for m in s.methods for lr in s.lr
           for lam in (s.lam if m in LAMBDA_METHODS else [None])]
    if s.tuning in ("private", "proxy"):  # one tuned run per (ε, seed)
        out += [RunSpec(tuned_name(sc), e, None, s.lr[0], seed)
                for seed in s.seeds for e in s.epsilon]
    return out


def tuned_name(sc: SweepConfig) -> str:
    """The tuned method's name in results: "<method>_tuned" (private) or "_proxy"."""
    kind = "proxy" if sc.sweep.tuning == "proxy" else "tuned"
    return f"{sc.base.tuning.method}_{kind}"


# --- data: validation carved from training rows -------------------------------------------

@dataclass
class Prepared:
    """The federation every run trains on, its per-silo validation sets (X, y), the model
    and the metric. `dropped` lists silos removed by sweep.min_silo_train."""

    fed: Federation
    validation: list[tuple[np.ndarray, np.ndarray]]
    model: Model
    metric: str
    dropped: list[dict]


def carve_validation(fed: Federation, fraction: float, seed: int
                     ) -> tuple[Federation, list[tuple[np.ndarray, np.ndarray]]]:
    """Split each silo's training rows into training and validation (seeded, per silo, with
    `split_training`: by person where persons are named); test rows are untouched. Returns
    the reduced federation and the validation (X (m_k, d), y (m_k,)) of every silo."""
    rng = np.random.default_rng([seed, 0x5EED])  # its own stream: the test split is unchanged
    silos, val = [], []
    for s in fed.silos:
        part = split_training(s, fraction, rng, seed, "sweep-validation")  # persons whole
        silos.append(dataclasses.replace(s, X_train=part.X_train, y_train=part.y_train,
                                         person_train=part.person_train))
        val.append((part.X_test, part.y_test))
    try:
        return dataclasses.replace(fed, silos=silos), val
    except DataError as e:
        raise DataError(f"after carving sweep.validation_fraction = {fraction} of each silo's "
                        f"training rows for validation: {e}. Lower validation_fraction or "
                        "set sweep.min_silo_train to drop small silos") from None


def prepare(sc: SweepConfig) -> Prepared:
    """Load the data, carve validation sets, drop silos below sweep.min_silo_train, build
    the model. Touches no training example beyond loading and splitting."""
    build.require_row_unit(sc.base, "silofl sweep")  # its reports state per-row DP
    fed = build.load_federation(sc.base.data)
    fed, val = carve_validation(fed, sc.sweep.validation_fraction, sc.base.data.seed)
    dropped = []
    if sc.sweep.min_silo_train:
        keep = [k for k, s in enumerate(fed.silos) if s.n_train >= sc.sweep.min_silo_train]
        dropped = [{"silo": s.name, "n_train": s.n_train} for k, s in enumerate(fed.silos)
                   if k not in keep]
        if not keep:
            raise ConfigError(f"sweep.min_silo_train = {sc.sweep.min_silo_train} drops every "
                              "silo; lower it")
        fed = dataclasses.replace(fed, silos=[fed.silos[k] for k in keep])
        val = [val[k] for k in keep]
    model = build.build_model(sc.base, fed)
    return Prepared(fed, val, model, sc.base.model.metric or default_metric(fed.task), dropped)


def training_config(sc: SweepConfig, spec: RunSpec) -> TrainingConfig:
    return dataclasses.replace(build.training_config(sc.base), lr=spec.lr, seed=spec.seed,
                               private=spec.private)


def algorithm(sc: SweepConfig, spec: RunSpec, prep: Prepared | None = None):
    if spec.method.endswith("_proxy"):  # λ chosen on the declared-public proxy: free
        return _proxy_algorithm(sc, spec, prep)
    if spec.method.endswith("_tuned"):  # grid: tuning.lam (default sweep.lam), tuning.lr
        tc = sc.base.tuning
        grid = tc.lam or [v for v in sc.sweep.lam if v != "auto"]  # a λ to try is a number
        return tuning_setup.tuned_algorithm(tc, grid, tc.lr,
                                            prep.validation, sc.base.training.weighted)
    lam = _ALG_DEFAULTS["lam"] if spec.lam is None else spec.lam
    alg = make_algorithm(spec.method, lam=lam, **sc.algorithm_options())
    if prep is not None:  # methods that need the data before planning (PrivateKT)
        bind_data(alg, prep.fed, prep.model)
    return alg


_PROXY: dict = {}  # (ε, lr, seed) → (λ, report info) chosen on the proxy, per process


def _proxy_algorithm(sc: SweepConfig, spec: RunSpec, prep: Prepared | None):
    """tuning.method at the λ the proxy grid picks for this run's ε, lr and seed."""
    from silofl.experiments.proxy_tuning import proxy_chosen
    from silofl.tuning.proxy import chosen_algorithm
    key = (spec.epsilon, spec.lr, spec.seed)
    if key not in _PROXY:
        if prep is None:
            raise ConfigError("a proxy-tuned sweep run needs the prepared data")
        alg = proxy_chosen(sc.base, prep.fed.feature_names, prep.fed.task,
                           training_config(sc, spec), spec.epsilon)
        _PROXY[key] = (alg.proxy_info["chosen_lam"], alg.proxy_info)
    lam, info = _PROXY[key]
    return chosen_algorithm(sc.base.tuning.method, lam, info, sc.base.training.weighted)


def targeted(sc: SweepConfig, fed: Federation, spec: RunSpec) -> Federation:
    if not spec.private:
        return fed
    return fed.with_targets(PrivacyTarget(spec.epsilon, sc.base.privacy.delta))


# --- one run (in a worker) ------------------------------------------------------------------

_CACHE: dict[str, Prepared] = {}
_PLANS: dict[tuple, list] = {}  # (method, ε) → calibrated per-silo plans, per process
_STORES: dict[str, BudgetStore] = {}  # per process: the sweep's lifetime store, opened once
#: set in a Ray worker (`sweep_ray`): the store stays with the driver, which reserves
_DETACHED = False


def budget_store(sc: SweepConfig) -> BudgetStore | None:
    """The lifetime store the sweep charges (None: each run on its own scratch store)."""
    b = sc.base.budget
    if b.scratch or not b.store:
        return None
    if _DETACHED:
        raise PrivacyError("a sweep's Ray worker never opens the budget store: the driver "
                           "reserves every run there and ships the worker its job")
    st = _STORES.get(b.store)
    if st is None:
        st = _STORES[b.store] = BudgetStore(Path(b.store))
    return st


def lifetime_targets(sc: SweepConfig, fed: Federation) -> dict[str, PrivacyTarget] | None:
    b = sc.base.budget
    if budget_store(sc) is None:
        return None
    return {s.name: PrivacyTarget(b.epsilon, b.delta if b.delta is not None
                                  else sc.base.privacy.delta) for s in fed.silos}


def execute(sc: SweepConfig, spec: RunSpec, fingerprint: str, plans: dict | None = None,
            job: Job | None = None) -> dict:
    """Run one grid point; returns its results record (plain JSON data). `plans`: (method,
    ε) → plans calibrated by the parent process (`ship`; else calibrated here, once).
    `job`: the run's reservation made elsewhere (a `DetachedJob` on a Ray worker); else a
    private run reserves in the sweep's store (or a scratch one) itself."""
    prep = _CACHE.get(fingerprint)
    if prep is None:
        _CACHE.clear()
        _PLANS.clear()
        prep = _CACHE[fingerprint] = prepare(sc)
    fed = targeted(sc, prep.fed, spec)
    tcfg = training_config(sc, spec)
    alg = algorithm(sc, spec, prep)
    # σ_k depends on the method and ε only (not λ, lr or seed): calibrate once per pair
    plan_key = (spec.method, spec.epsilon)
    _PLANS.update(plans or {})
    charge = ({"job": job} if job is not None else {} if not spec.private else
              {"store": budget_store(sc), "lifetime": lifetime_targets(sc, fed)})
    res = simulate(fed, prep.model, alg, tcfg, metric=prep.metric,
                   plans=_PLANS.get(plan_key) if spec.private else None,
                   eval_sets={"validation": prep.validation}, **charge)
    if spec.private:
        _PLANS[plan_key] = res.plans
    privacy = None
    if res.ledgers is not None:
        reports = [led.report() for led in res.ledgers]
        spent = [r["epsilon"] for r in reports]  # the guarantee the check uses
        targets = [led.target.epsilon for led in res.ledgers]
        privacy = {"accountant": [r["accountant"] for r in reports],
                   "calibrated_with": tcfg.accountant, "noise": tcfg.noise,
                   "scratch_store": res.scratch, "run_id": res.run_id,
                   "delta": [led.target.delta for led in res.ledgers],
                   "target_epsilon": targets, "epsilon_spent": spent,
                   "noise_multiplier": [p.noise_multiplier for p in res.plans],
                   "max_epsilon_spent": max(spent),
                   "over_target": [led.silo for led, e, t in zip(res.ledgers, spent, targets)
                                   if not e <= t]}
    val = res.history.extra["validation"]
    tuning = None
    if spec.method.endswith("_tuned"):
        tuning = tuning_summary(sc, spec.epsilon, alg, res,
                                _PLANS.get((sc.base.tuning.method, spec.epsilon)))
    elif spec.method.endswith("_proxy"):  # declared public: the choice cost the silos 0
        tuning = getattr(alg, "proxy_info", None)
    return _clean({
        "kind": "run", "key": spec.key, "method": spec.method, "private": spec.private,
        "epsilon": spec.epsilon, "delta": sc.base.privacy.delta if spec.private else None,
        "lam": spec.lam, "lr": spec.lr, "seed": spec.seed, "algorithm": res.method,
        "training": dataclasses.asdict(tcfg),
        "metric": res.metric, "rounds": res.history.rounds,
        "validation": val["pooled"], "test": res.history.pooled,
        "final_validation": val["pooled"][-1], "final_test": res.final_pooled,
        "final_test_per_silo": res.final_per_silo, "privacy": privacy,
        "seconds": res.seconds, "nonfinite": _nonfinite(res, val), "tuning": tuning,
        "n_silos": len(res.silos),
        "sampling_rate": [p.q for p in res.plans]})


def reserve_run(sc: SweepConfig, spec: RunSpec, prep: Prepared, plans: dict,
                digests: dict[str, str]) -> Job | None:
    """Reserve `spec` in the sweep's lifetime store here, exactly as `simulate(store=...)`
    would in `execute` (same plans, lifetime targets and data fingerprints `digests`), for a
    run executed elsewhere (`execute_detached`). None: a non-private run or a scratch sweep.
    Raises BudgetExceeded, reserving nothing, when the run does not fit."""
    store = budget_store(sc)
    if store is None or not spec.private:
        return None
    tcfg = training_config(sc, spec)
    method = algorithm(sc, spec, prep).name
    return open_job(store, {method: plans[(spec.method, spec.epsilon)]},
                    lifetime=lifetime_targets(sc, prep.fed), explicit_lifetime=True,
                    command=f"simulate {method} (sweep, ray)", noise=tcfg.noise,
                    accountant=tcfg.accountant, fingerprints=digests)


def execute_detached(load: Callable[[], Prepared], sc: SweepConfig, spec: RunSpec,
                     fingerprint: str, plans: dict, proxy: dict, job: DetachedJob | None
                     ) -> tuple[dict | None, list, BaseException | None]:
    """`execute` in a process without the budget store (a Ray worker): the run's
    reservation is `job` (None: nothing to reserve), and this process can no longer open
    the store. `load()` gives the prepared data, fetched once per sweep. Returns (record,
    what the job's ledgers charged, error): never raises, so the reserving process can
    settle a failed run to what it charged."""
    global _DETACHED
    _DETACHED = True
    warnings.simplefilter("ignore")
    logging.getLogger("absl").setLevel(logging.ERROR)

    def log() -> list:
        return [] if job is None else job.log

    try:
        if fingerprint not in _CACHE:
            _CACHE.clear()
            _PLANS.clear()
            _CACHE[fingerprint] = load()
        _PROXY.update(proxy)
        return execute(sc, spec, fingerprint, plans, job=job), log(), None
    except Exception as e:
        e.add_note(traceback.format_exc())
        return None, log(), e


# --- the results file -----------------------------------------------------------------------

def header(sc: SweepConfig, prep: Prepared, fingerprint: str, total: int) -> dict:
    fed = prep.fed
    return _clean({
        "kind": HEADER_KIND, "format": FORMAT, "fingerprint": fingerprint,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": sc.normalized(),
        "report": sc.report.model_dump(), "report_epsilon": sc.report_epsilon,
        "metric": prep.metric, "higher_is_better": HIGHER_IS_BETTER[prep.metric],
        "task": fed.task, "silos": fed.names, "n_train": [s.n_train for s in fed.silos],
        "n_validation": [len(y) for _, y in prep.validation],
        "n_test": [s.n_test for s in fed.silos], "dropped_silos": prep.dropped,
        "total_runs": total, "not_counted": NOT_COUNTED, "notes": sweep_notes(sc, prep)})


def sweep_notes(sc: SweepConfig, prep: Prepared) -> list[str]:
    """What every reader of the sweep's outputs must be told, first."""
    out = []
    if budget_store(sc) is None:
        out.append(SCRATCH_NOTE + " (each run on its own scratch store; runs are not "
                   "composed)")
    else:
        out.append(f"every run charged the lifetime budget store {sc.base.budget.store}")
    if sc.base.privacy.noise == "seeded":
        out.append(SEEDED_NOTE)
    out += [f"uncharged: {u}" for u in prep.fed.meta.get("uncharged", [])]
    return out


# --- the sweep ------------------------------------------------------------------------------

@dataclass
class SweepOutcome:
    results: Path
    total: int
    skipped: int      # already in the results file
    executed: int
    seconds: float


def preflight(sc: SweepConfig, prep: Prepared) -> None:
    """Fail before anything is written: every method's plan (batch below every silo's size,
    calibration at the smallest ε) must succeed, and a lifetime store needs its budget."""
    b = sc.base.budget
    if b.store and not b.scratch:
        if b.epsilon is None:
            raise ConfigError("[budget] store is set, so every run of this sweep charges that "
                              "lifetime store: declare the total budget the sweep may spend "
                              "per silo with [budget] epsilon (and delta), or remove [budget] "
                              "store to run on scratch stores (an experiment, not a release)")
        budget_store(sc)  # a locked or corrupt store fails here, before anything is written
    methods = list(sc.sweep.methods) + ([tuned_name(sc)] if sc.sweep.tuning in
                                        ("private", "proxy") else [])
    for method in methods:
        spec = RunSpec(method, min(sc.sweep.epsilon), sc.sweep.lam[0] if method in
                       LAMBDA_METHODS else None, sc.sweep.lr[0], sc.sweep.seeds[0])
        _PLANS[(method, spec.epsilon)] = plan_silos(
            targeted(sc, prep.fed, spec), algorithm(sc, spec, prep), training_config(sc, spec))


def ship(plans: dict, spec: RunSpec, sc: SweepConfig) -> dict:
    """The plans a worker needs for `spec` (a tuned run also its untuned method's)."""
    keys = [(spec.method, spec.epsilon)]
    if spec.method.endswith("_tuned"):
        keys.append((sc.base.tuning.method, spec.epsilon))
    return {k: plans[k] for k in keys if k in plans}


def calibrate_all(sc: SweepConfig, prep: Prepared, specs: list[RunSpec]) -> dict:
    """(method, ε) → plans, calibrated once here in the parent and shipped to the workers
    (each would otherwise calibrate every pair itself)."""
    out = {}
    for spec in specs:
        key = (spec.method, spec.epsilon)
        if not spec.private:
            continue
        need = [spec]
        if spec.method.endswith("_tuned"):  # its summary composes the untuned method's plan
            need.append(RunSpec(sc.base.tuning.method, spec.epsilon, sc.base.tuning.pivot_lam,
                                spec.lr, spec.seed))
        for sp in need:
            key = (sp.method, sp.epsilon)
            if key not in out:
                out[key] = _PLANS.get(key) or plan_silos(
                    targeted(sc, prep.fed, sp), algorithm(sc, sp, prep),
                    training_config(sc, sp))
    return out


Progress = Callable[[int, int, dict | None], None]


def run_sweep(sc: SweepConfig, *, results: str | Path | None = None, workers: int | None = None,
              on_progress: Progress | None = None, engine: str | None = None,
              address: str | None = None) -> SweepOutcome:
    """Run (or resume) a privacy-utility sweep, as ``silofl sweep`` does.

    Runs already in the results file are skipped, so a killed sweep resumes.

    Parameters
    ----------
    sc : SweepConfig
        From `load_sweep_config`.
    results : str or Path, optional
        The JSON-lines results file (default: the sweep's own).
    workers : int, optional
        Worker processes (default: the sweep's; they are spawned, so call this under
        ``if __name__ == "__main__":`` or pass workers=1); engine "ray": runs in flight at
        once (and the CPUs of a local cluster it starts).
    on_progress : callable (done, total, record) -> None, optional
        Called once before the first run (record None; done = runs already recorded) and
        after every run.
    engine : {"local", "ray"}, optional
        Where runs execute (default: sweep.engine); "ray": see `silofl.experiments.sweep_ray`
        (the results file, its lock and the budget store stay in this process).
    address : str, optional
        engine "ray": the cluster ("host:port", "auto"; default sweep.address; "" starts a
        local one). An already initialised ``ray`` session is used as it is.

    Returns
    -------
    SweepOutcome
        ``results`` (the file's path), ``total``, ``skipped``, ``executed``, ``seconds``.

    Raises
    ------
    ConfigError
        Before anything is written or charged: a plan that cannot run, a lifetime store
        without the budget for the sweep, engine "ray" without Ray installed or with a
        cluster address that does not answer.
    """
    t0 = time.perf_counter()
    path = Path(results) if results is not None else sc.results_path
    workers = sc.sweep.workers if workers is None else workers
    engine = sc.sweep.engine if engine is None else engine
    address = sc.sweep.address if address is None else address
    check_engine(engine, address)
    if workers < 1:
        raise ConfigError(f"workers must be ≥ 1, got {workers}")
    session = contextlib.nullcontext()
    if engine == "ray":
        require_ray()  # before anything is prepared or charged
        session = ray_session(address, workers)
    prep = prepare(sc)
    preflight(sc, prep)
    specs = expand(sc)
    fingerprint = sc.fingerprint()
    with exclusive_lock(path), session as ray:
        return _run_locked(sc, path, workers, prep, specs, fingerprint, on_progress, t0, ray)


def _run_locked(sc, path, workers, prep, specs, fingerprint, on_progress, t0,
                ray=None) -> SweepOutcome:
    done = open_results(path, sc, header(sc, prep, fingerprint, len(specs)))
    todo = [s for s in specs if s.key not in done]
    skipped = len(specs) - len(todo)
    if on_progress:
        on_progress(skipped, len(specs), None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # preflight already showed the planning warnings
        plans = calibrate_all(sc, prep, todo)
    _CACHE.clear()
    _PLANS.clear()
    _PLANS.update(plans)
    _CACHE[fingerprint] = prep  # in-process runs reuse the prepared data
    count = skipped

    def finished(rec: dict) -> None:
        nonlocal count
        append_record(path, rec)
        count += 1
        if on_progress:
            on_progress(count, len(specs), rec)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # preflight already showed the planning warnings
        if ray is not None:  # engine "ray": this process reserves, settles and records
            _on_ray(ray, sc, todo, fingerprint, prep, plans, finished, workers)
        elif workers == 1 or len(todo) <= 1:
            for spec in todo:
                finished(execute(sc, spec, fingerprint, ship(plans, spec, sc)))
        else:
            with one_blas_thread():  # workers start at the first submit
                run_in_pool(execute, todo, lambda spec: (sc, spec, fingerprint,
                                                         ship(plans, spec, sc)),
                            min(workers, len(todo)), finished)
    return SweepOutcome(path, len(specs), skipped, len(todo), time.perf_counter() - t0)


def _on_ray(ray, sc, todo, fingerprint, prep, plans, finished, workers) -> None:
    digests = fingerprints(prep.fed) if budget_store(sc) is not None else {}
    for spec in todo:  # λ chosen on the public proxy once, here: workers get it shipped
        if spec.method.endswith("_proxy"):
            algorithm(sc, spec, prep)
    run_on_ray(ray, todo, entry=execute_detached, shared=prep, finished=finished,
               workers=workers, reserve=lambda spec: reserve_run(sc, spec, prep, plans, digests),
               args=lambda spec: (sc, spec, fingerprint, ship(plans, spec, sc), dict(_PROXY)))


__all__ = ["NOT_COUNTED", "Prepared", "RunSpec", "SweepOutcome", "carve_validation", "execute",
           "expand", "prepare", "run_sweep"]

"""Audits of a `silofl run` job (the engine's plug-in for tabular data, example-level DP),
run through the real engine: the config's loading, preprocessing, planning (σ calibrated
for the data with its canaries), budget reservation, DP-SGD and accounting —
`experiments.run._prepare` and `runtime.simulator.simulate`, no second training loop.

* one run: m canaries per audited silo, each included with probability ½, one job with
  every audited silo's canaries; each canary is scored on the silo's released models
  (black-box: minus its loss; white-box: the alignment of the model's total update
  w_T − w_0 with the canary's gradient direction at w_0).
* many runs: D (the silo's data) and D′ = D + one canary, `runs` jobs each; statistics of
  the released models (the canary's loss and alignment and every model coordinate). Needs
  a scratch store: N jobs on the silo's data are experiments, not releases.

The one-run and multi-run procedures, the coin flips and the Bonferroni correction are the
engine's (`silofl.audit.engine`). Every job is reserved in the budget store before its
data is read and settled after; the one-run job is charged like any job (or to a scratch
store, and then every output says so).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

import silofl.audit.persons as persons
import silofl.audit.server as server
from silofl.audit.canaries import Canaries, check_canaries, insert, make_canaries
from silofl.audit.engine import (
    AUDIT_NOTE,
    AuditReport,
    Claim,
    canary_count,
    check_confidence,
    check_kind,
    check_runs,
    multi_run,
    one_run,
)
from silofl.audit.estimate import ESTIMATE_ASSUMES
from silofl.audit.jobs import audited_silos, claim_of, run_job
from silofl.config import AuditSection
from silofl.errors import ConfigError
from silofl.experiments import run as run_mod
from silofl.experiments.notes import job_notes
from silofl.models import TORCH_MODELS
from silofl.privacy.budget import BudgetStore

_AUDIT = AuditSection()  # the defaults of [audit] (one place: silofl.config)
VIEWS = ("server", "model", "release")
#: jobs pooled by a multi-run server-view audit, and jobs per side of a model-view one
SERVER_RUNS = 4
_AUDIT_MODEL_RUNS = 200

#: canaries per silo when not given: at most 1000, at most the silo's training records
DEFAULT_CANARIES = 1000


def audit(cfg, *, view: str = _AUDIT.view, kind: str = _AUDIT.kind, silo: str | None = None,
          canaries: int | Canaries | None = None, runs: int | None = None,
          confidence: float = _AUDIT.confidence, store: BudgetStore | None = None,
          seed: int | None = None, on_progress: Callable[[int, int], None] | None = None,
          weaken=None, init: str = "worst-case", source_class: type | None = None
          ) -> AuditReport:
    """Audit the job `cfg` describes: does each silo's claimed ε survive an attack?

    The real job runs with canaries; an attacker guesses which canaries were trained on,
    giving an empirical lower bound on ε at `confidence`. A bound above the claim is a
    violation. A job of method dp_gbdt (alone) is audited by `audit.gbdt.audit_gbdt`
    (tree canaries; both the server's and the ensemble's view, whatever `view` except
    "release"; scratch store only). The audit's own runs are charged to the budget store like any job.
    Everything that can fail on bad input fails before any budget is reserved.

    Parameters
    ----------
    cfg : Config
        The job (`load_config`); privacy must be enabled.
    view : {"server", "model", "release"}, default "server"
        What the attacker sees. "server" (white box): every round's released update, with
        m Dirac gradient canaries per silo in auditing-only coordinates (`audit.server`);
        "model" (black box): the released models only, with canary records; "release":
        the private preprocessing statistics only (`audit.release`, `runs` releases on
        each of D and D′, scratch store).
    kind : {"one-run", "multi-run"}, default "one-run"
        One training run with many canaries (Steinke et al. 2023), or many runs (server:
        `runs` jobs pooled; model: `runs` jobs on each of D and D′, Clopper–Pearson).
    silo : str, optional
        The silo audited (default: every silo).
    canaries : int or Canaries, optional
        server: m per silo (default 50000, fewer for many silos or rounds); model one-run: m per silo (default
        min(1000, n_k)) or explicit `Canaries`; model multi-run: explicit `Canaries` whose
        first record is the canary, else one generated canary.
    runs : int, optional
        multi-run jobs (default: server 4, model 200 on each of D and D′).
    confidence : float, default 0.95
        Family-wise confidence of the bounds (and of the estimate, server view).
    store : BudgetStore, optional
        The store charged (default: as `run`: [budget] store, else a scratch store when
        [budget] scratch).
    seed : int, optional
        Seed of the canaries, coin flips and canary sampling (default: OS entropy).
    on_progress : callable (done, total) -> None, optional
        Progress of the audit's jobs.
    weaken : callable, optional
        Server view only, the self-test's deliberately weakened rule (`whitebox.WEAKENINGS`).
    source_class : type, optional
        Server view at `[privacy] unit = "person"` only: the self-test's deliberately
        broken person source (`persons.UnitWeights`), for the trainer and the canaries.
    init : {"worst-case", "default"}, default "worst-case"
        Model view of a torch model only (`audit.lastiter`): the start model of the
        audited jobs.

    Returns
    -------
    AuditReport
        Per silo the claimed ε, the rigorous lower bound and (server) the estimate.

    Raises
    ------
    ConfigError
        An unknown view or kind, privacy disabled, or an unsupported model.
    """
    t0 = time.perf_counter()
    check_kind(kind)
    if view not in VIEWS:
        raise ConfigError(f"unknown audit view {view!r}; choose one of {', '.join(VIEWS)}")
    if not cfg.privacy.enabled:
        raise ConfigError("an audit compares a claimed ε with an empirical lower bound, but "
                          "this config has no ε claim (privacy is disabled); enable "
                          "[privacy] with epsilon and delta")
    if getattr(cfg.privacy, "unit", "example") == "person" and view != "server":
        raise ConfigError(f"[privacy] unit = \"person\" is audited in the server view, with "
                          f"canary persons of several rows each (audit.persons); --view "
                          f"{view} puts single canary records in and cannot test a claim "
                          "about persons: use --view server")
    if view == "model" and cfg.model.name in TORCH_MODELS:  # black box, last iterate
        from silofl.audit.lastiter import audit_last_iterate
        return audit_last_iterate(cfg, kind=kind, silo=silo, canaries=canaries, runs=runs,
                                  confidence=confidence, store=store, seed=seed, init=init,
                                  on_progress=on_progress)
    check_confidence(confidence)
    if "dp_gbdt" in list(cfg.training.methods) and view != "release":
        return _trees(cfg, kind, silo, canaries, runs, confidence, store, seed)
    rng = np.random.default_rng(seed)  # None: OS entropy
    raw, names = audited_silos(cfg, silo)
    if view == "release":
        return _release(cfg, kind, silo, runs, canaries, confidence, store, seed, t0,
                        on_progress)
    if view == "server":
        return _server(cfg, raw, names, kind, canaries, runs, confidence, store, rng, seed,
                       t0, on_progress, weaken, source_class)
    runs = _AUDIT_MODEL_RUNS if runs is None else runs
    if kind == "one-run":
        return _one_run(cfg, raw, names, canaries, confidence, store, rng, t0, on_progress)
    return _multi_run(cfg, raw, names, canaries, runs, confidence, store, rng, t0,
                      on_progress)


def _trees(cfg, kind, silo, canaries, runs, confidence, store, seed) -> AuditReport:
    """Method dp_gbdt: the trees' membership audit (`audit.gbdt`) of the job's federation
    with its declared bounds and [trees] settings, on in-memory ledgers (a scratch store
    is required: the audited job is the job plus auditing columns)."""
    from silofl.audit.gbdt import audit_gbdt
    from silofl.audit.jobs import trees_job
    if isinstance(canaries, Canaries):
        raise ConfigError("the trees' audit makes its own tree canaries (auditing columns): "
                          "give --canaries as a number")
    _require_scratch(cfg, store, "the trees' audit trains the job with auditing columns "
                     "added (and, multi-run, many times)")
    fed, names, bounds, trees = trees_job(cfg, silo)
    if seed is None and cfg.privacy.noise == "seeded":  # a seeded experiment, end to end
        seed = int(cfg.training.seed)
    rep = audit_gbdt(fed, silo=silo, canaries=canaries, kind=kind, runs=runs,
                     confidence=confidence, seed=seed, bounds=bounds, **trees)
    rep.notes = _notes(cfg, BudgetStore(None), [], rep.notes[1:])
    return rep


def _server(cfg, raw, names, kind, canaries, runs, confidence, store, rng, seed, t0,
            on_progress, weaken, source_class=None) -> AuditReport:
    """The server-view audit (`audit.server`): one job, or `runs` jobs pooled on a
    scratch store; rows per silo."""
    if isinstance(canaries, Canaries):
        raise ConfigError("the server view uses gradient canaries, not records: give "
                          "--canaries as a number (or --view model for record canaries)")
    passes = cfg.training.rounds * max(1, len(cfg.training.methods))
    m = server.canary_count(canaries, len(names), passes)
    jobs = 1 if kind == "one-run" else (SERVER_RUNS if runs is None else int(runs))
    if jobs < 1:
        raise ConfigError(f"a multi-run server-view audit needs at least 1 job, got {jobs}")
    experiment = kind == "multi-run" or weaken is not None or source_class is not None
    if experiment:
        _require_scratch(cfg, store, "a multi-run or self-test audit trains several jobs "
                         "(the self-test with deliberately broken privacy)")
    p = run_mod._prepare(cfg, raw)
    local_dp = [lb for lb, plans in zip(p.labels, p.plans) if plans[0].noise_multiplier is None]
    if local_dp:  # before any budget: the probe would see no DP-SGD step at all
        raise ConfigError(f"the server view audits DP-SGD steps; {', '.join(local_dp)} "
                          "uploads under local DP with no DP-SGD step; use --view model")
    unit = getattr(p.tcfg, "privacy_unit", "example")
    person = unit == "person"
    if person != (getattr(cfg.privacy, "unit", "example") == "person"):  # before any budget
        raise ConfigError(f"[privacy] unit = {cfg.privacy.unit!r} did not reach the training "
                          f"config (privacy_unit {unit!r}): the audit would test the wrong "
                          "claim")
    if source_class is not None and not person:
        raise ConfigError("a person source (source_class) only exists at [privacy] unit = "
                          "\"person\"")
    cls = persons.PersonSource if source_class is None else source_class
    factory = None if source_class is None else (
        lambda fed: persons.person_source(fed, p.tcfg, cls))
    st = BudgetStore(None) if experiment else _store(cfg, store)
    parts, run_ids, uncharged, checks = [], [], [], []
    rows_seen: list[np.ndarray] = []
    for i in range(jobs):
        if on_progress:
            on_progress(i, jobs)
        s_i = None if seed is None else seed + i
        model, probe = (persons.plan_probe(p, names, m, rng, s_i, weaken, source_class=cls)
                        if person else server.plan_probe(p, names, m, rng, s_i, weaken))
        what = "self-test" if experiment and kind == "one-run" else kind
        fed, results, job = run_job(cfg, p, st, f"silofl audit (server view, {what})",
                                    model=model, probe=probe, source=factory)
        if isinstance(probe, persons.CanaryPersons):
            rows_seen.append(probe.rows)
        run_ids.append(job.run_id)
        uncharged = fed.meta.get("uncharged", [])
        claims = {n: claim_of(results, p, n) for n in names}
        parts.append(server.observe(p, probe, results, claims, p.tcfg.clip, p.extra))
        checks.append(persons.check_job(probe, p.model, fed, rng,
                                        getattr(p.tcfg, "max_rows_per_person", 0)))
    if on_progress:
        on_progress(jobs, jobs)
    obs = server.pool(parts)
    cross = server.cross_scores(obs)
    clip = max(checks, key=lambda c: c["ratio"])
    rows = [server.assess(n, obs[n], confidence, len(names), cross.get(n), clip)
            for n in names]
    if person:  # canary rows, and ε were a person to add r·C (the self-test's truth)
        rows = [persons.with_person_details(r, obs[r.silo], "person", np.concatenate(rows_seen),
                                 getattr(p.tcfg, "max_rows_per_person", 0)) for r in rows]
    notes = [server.SERVER_NOTE, "estimate: " + ESTIMATE_ASSUMES] + (
        [persons.PERSON_NOTE] if person else [])
    if not st.scratch:
        notes.append("the audit job trains every silo, so it is charged to every silo's "
                     "budget")
    return AuditReport(kind, rows, p.labels, _notes(cfg, st, uncharged, notes),
                       None if st.path is None else str(st.path), st.scratch, run_ids,
                       time.perf_counter() - t0, confidence, cfg.privacy.noise,
                       neighbouring=persons.PERSON_ADJACENCY if person else run_mod.ADJACENCY,
                       view="server")


def _release(cfg, kind, silo, runs, canaries, confidence, store, seed, t0,
             on_progress) -> AuditReport:
    """The preprocessing release's audit as an AuditReport: one-run, the white box
    (`audit.release_server`: canary rows in one release); multi-run, `audit.release`
    (`runs` releases on D and D′ = D + one canary record)."""
    from silofl.audit.release import CHARGED_NOTE, DEFAULT_RUNS, audit_job_release
    from silofl.audit.release_server import audit_job as audit_release_white_box
    if kind == "one-run":
        if isinstance(canaries, Canaries):
            raise ConfigError("the one-run release audit uses canary rows, not records: "
                              "give --canaries as a number")
        rows = audit_release_white_box(cfg, silo=silo, rows=canaries,
                                        confidence=confidence, store=store, seed=seed)
        what = (f"release audit, white box: {rows[0].details['canaries']} canary rows per "
                "audited silo in one release (each a record's full sensitivity, in with "
                "probability 1/2); each row's claim is the release's own ε")
    else:
        n = DEFAULT_RUNS if runs is None else int(runs)
        rows = audit_job_release(cfg, silo=silo, runs=n, confidence=confidence, store=store,
                                 seed=seed, on_progress=on_progress)
        what = (f"release audit: {n} releases on D and {n} on D′ = D + one canary record per "
                "audited silo; each row's claim is the release's own ε")
    return AuditReport(kind, rows, ["preprocessing release"], _notes(
        cfg, BudgetStore(None), [], [CHARGED_NOTE, what]),
        None, True, [], time.perf_counter() - t0, confidence, cfg.privacy.noise,
        neighbouring=run_mod.ADJACENCY, view="release")


def _require_scratch(cfg, store: BudgetStore | None, what: str) -> None:
    if store is not None and not store.scratch or store is None and not cfg.budget.scratch:
        raise ConfigError(f"{what}: that is an experiment, not a release, and would spend "
                          "many jobs' worth of the silo's lifetime budget. Run it on a "
                          "scratch store (--scratch, or [budget] scratch = true), or use a "
                          "one-run audit (--kind one-run) on the real store")


# --- the plug-in ---------------------------------------------------------------------------

def _store(cfg, store: BudgetStore | None) -> BudgetStore:
    store = store if store is not None else run_mod.open_store(cfg, run_mod._base_dir(cfg,
                                                                                      None))
    run_mod.check_demo_store(cfg, store)
    return store


def _scores(model, fed, results, silo: str, m: int) -> dict[str, np.ndarray]:
    """(m,) scores of the last m test rows of `silo` (its canaries, preprocessed like its
    data) over the job's released models: black-box −Σ loss, white-box Σ alignment of
    w_T − w_0 with −∇loss(w_0) / ‖∇loss(w_0)‖."""
    k = fed.names.index(silo)
    s = fed.silo(silo)
    X, y = s.X_test[-m:], s.y_test[-m:]
    w0 = model.init_params()
    g = model.per_example_grads(w0, X, y)
    u = -g / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-12)
    black, white = np.zeros(m), np.zeros(m)
    for r in results:
        w = r.params[k]
        black -= model.loss(w, X, y)
        white += u @ (w - w0)
    return {"black-box": black, "white-box": white}


def _statistics(model, fed, results, silo: str) -> dict[str, float]:
    sc = _scores(model, fed, results, silo, 1)
    out = {k: float(v[0]) for k, v in sc.items()}
    k = fed.names.index(silo)
    for j, r in enumerate(results):
        for i, v in enumerate(r.params[k]):
            out[f"model {j} coordinate {i}"] = float(v)
    return out


class _FinishedJob:
    def __init__(self, p, fed, results):
        self.p, self.fed, self.results = p, fed, results
        self.m = {}

    def scores(self, unit: str) -> dict[str, np.ndarray]:
        return _scores(self.p.model, self.fed, self.results, unit, self.m[unit])

    def claim(self, unit: str) -> Claim:
        return claim_of(self.results, self.p, unit)


class TableMechanism:
    """The engine's plug-in for a `silofl run` job over a RawFederation `raw`; records the
    run ids, the methods and the uncharged items of the jobs it runs."""

    def __init__(self, cfg, raw, store: BudgetStore | None):
        self.cfg, self.raw, self.store = cfg, raw, store
        self.run_ids: list[str] = []
        self.labels: list[str] = []
        self.uncharged: list = []
        self.st: BudgetStore | None = None

    def draw(self, unit: str, canaries, rng: np.random.Generator) -> Canaries:
        if isinstance(canaries, Canaries):
            c = canaries
        else:
            c = make_canaries(self.raw, canary_count(
                canaries, min(DEFAULT_CANARIES, self.raw.silo(unit).n_train)), rng)
        check_canaries(self.raw, unit, c)
        return c

    def prepare_one(self, chosen):
        audited = self.raw
        for name, (c, inc) in chosen.items():
            audited = insert(audited, name, c, inc)
        p = run_mod._prepare(self.cfg, audited)  # plans σ for the data with its canaries
        self.st = _store(self.cfg, self.store)
        return p, {name: c.m for name, (c, _inc) in chosen.items()}

    def run_one(self, prepared) -> _FinishedJob:
        p, m = prepared
        fed, results, job = run_job(self.cfg, p, self.st, "silofl audit (one run)")
        self.run_ids.append(job.run_id)
        self.labels, self.uncharged = p.labels, fed.meta.get("uncharged", [])
        done = _FinishedJob(p, fed, results)
        done.m = m
        return done

    def neighbours(self, unit: str, canary: Canaries):
        check_canaries(self.raw, unit, canary)
        return (run_mod._prepare(self.cfg, insert(self.raw, unit, canary, np.array([False]))),
                run_mod._prepare(self.cfg, insert(self.raw, unit, canary, np.array([True]))))

    def run_neighbour(self, unit: str, pair, which: int):
        p = pair[which]
        fed, results, job = run_job(self.cfg, p, BudgetStore(None), "silofl audit (multi run)")
        self.run_ids.append(job.run_id)
        self.uncharged = fed.meta.get("uncharged", [])
        self.labels = p.labels
        return _statistics(p.model, fed, results, unit), claim_of(results, p, unit)


def _notes(cfg, store: BudgetStore, uncharged, extra=()) -> list[str]:
    return job_notes(private=True, noise=cfg.privacy.noise, scratch=store.scratch,
                             demo=store.demo, uncharged=uncharged, extra=[AUDIT_NOTE, *extra])


def _one_run(cfg, raw, names, canaries, confidence, store, rng, t0, on_progress):
    mech = TableMechanism(cfg, raw, store)
    rows, _p, _job = one_run(mech, names, canaries, confidence, rng, on_progress)
    st = mech.st
    return AuditReport("one-run", rows, mech.labels, _notes(
        cfg, st, mech.uncharged,
        ["canaries: synthetic records at declared column bounds (or given), each included "
         "with probability 1/2; the job's σ was calibrated with them in",
         "the audit job trains every silo, so it is charged to every silo's budget"]),
        None if st.path is None else str(st.path), st.scratch, mech.run_ids,
        time.perf_counter() - t0, confidence, cfg.privacy.noise,
        neighbouring=run_mod.ADJACENCY)


def _multi_run(cfg, raw, names, canaries, runs, confidence, store, rng, t0, on_progress):
    _require_scratch(cfg, store, "a multi-run audit trains `runs` jobs on each of D and D′")
    check_runs(runs)
    c = canaries if isinstance(canaries, Canaries) else make_canaries(raw, 1, rng)
    if isinstance(canaries, int) and not isinstance(canaries, bool) and canaries != 1:
        raise ConfigError("a multi-run audit uses one canary (D′ = D + one record); "
                          "leave --canaries out or set it to 1")
    c = Canaries(c.X[:1], c.y[:1])
    mech = TableMechanism(cfg, raw, store)
    rows = multi_run(mech, names, c, runs, confidence, on_progress)
    run_ids = mech.run_ids
    return AuditReport("multi-run", rows, mech.labels, _notes(
        cfg, BudgetStore(None), mech.uncharged,
        [f"multi-run: {runs} jobs on D and {runs} on D′ = D + one canary per audited silo, "
         "each on its own scratch store"]), None, True, run_ids[:1] + (
        [f"... {len(run_ids) - 1} more"] if len(run_ids) > 1 else []),
        time.perf_counter() - t0, confidence, cfg.privacy.noise,
        neighbouring=run_mod.ADJACENCY)

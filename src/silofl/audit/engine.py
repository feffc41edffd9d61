"""Audits run through the real engine: the config's loading, preprocessing, planning (σ
calibrated for the data with its canaries), budget reservation, DP-SGD and accounting —
`experiments.run._prepare` and `runtime.simulator.simulate`, no second training loop.

* one run: m canaries per audited silo, each included with probability ½ (the auditor's own
  OS-entropy coin flips), one job with every audited silo's canaries; each canary is scored
  on the silo's released models (black-box: minus its loss; white-box: the alignment of the
  model's total update w_T − w_0 with the canary's gradient direction at w_0), and the
  guesses turn into a bound by `bounds.one_run_audit`.
* many runs: neighbouring datasets D (the silo's data) and D′ = D + one canary, `runs`
  jobs each; statistics of the released models (the canary's loss and alignment and every
  model coordinate) feed `bounds.multi_run_epsilon`. Needs a scratch store: N jobs on the
  silo's data are experiments, not releases.

With several audited silos each bound is taken at 1 − (1 − confidence)/K (Bonferroni), so
`confidence` is family-wise: a false violation anywhere has probability below 1 − confidence.

Every job is reserved in the budget store before its data is read and settled after; the
one-run job is charged like any job (or to a scratch store, and then every output says so).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import silofl.audit.bounds as bounds
from silofl.audit.canaries import Canaries, check_canaries, insert, make_canaries
from silofl.config import AuditSection
from silofl.errors import ConfigError
from silofl.experiments import build
from silofl.experiments import run as run_mod
from silofl.models import TORCH_MODELS
from silofl.privacy.budget import BudgetStore, PlannedCharge
from silofl.runtime.job import NO_METHOD, fingerprints, open_job
from silofl.runtime.simulator import simulate

_AUDIT = AuditSection()  # the defaults of [audit] (one place: silofl.config)

KINDS = ("one-run", "multi-run")
#: canaries per silo when not given: at most 1000, at most the silo's training records
DEFAULT_CANARIES = 1000
AUDIT_NOTE = ("audit: canary runs measure the guarantee empirically; their models are not "
              "a release and are not saved")
LOWER_BOUND_NOTE = ("an empirical lower bound: a bound above the claimed ε proves a "
                    "violation (at the stated confidence); a bound below it proves nothing "
                    "about the guarantee — it only says this attack did not refute it")


@dataclass
class SiloAudit:
    """One silo's audit: the job's claimed ε for it (all methods composed, what its privacy
    report states), and the empirical lower bound at `confidence`."""

    silo: str
    claimed_epsilon: float
    target_epsilon: float
    delta: float
    lower_bound: float
    details: dict = field(default_factory=dict)

    @property
    def violation(self) -> bool:
        return self.lower_bound > self.claimed_epsilon

    def to_dict(self) -> dict:
        return {"silo": self.silo, "claimed_epsilon": self.claimed_epsilon,
                "target_epsilon": self.target_epsilon, "delta": self.delta,
                "lower_bound": self.lower_bound, "violation": self.violation,
                "details": self.details}


@dataclass
class AuditReport:
    """What `run_audit` returns.

    Attributes
    ----------
    kind : str
        "one-run" or "multi-run".
    rows : list of SiloAudit
        Per silo: claimed ε, target, δ, the empirical lower bound, details.
    methods : list of str
        The job's methods.
    notes : list of str
        What every reader must be told (seeded noise, scratch store, ...).
    store : str or None
        The budget store charged.
    scratch : bool
        Charged to a scratch store.
    run_ids : list of str
        The store's ids of the audit's runs.
    seconds : float
        Wall-clock time.
    confidence : float
        Confidence of the lower bounds.
    noise : str
        The noise mode.
    """

    kind: str
    rows: list[SiloAudit]
    methods: list[str]
    notes: list[str]
    store: str | None
    scratch: bool
    run_ids: list[str]
    seconds: float
    confidence: float
    noise: str

    @property
    def violations(self) -> list[str]:
        return [r.silo for r in self.rows if r.violation]

    def to_dict(self) -> dict:
        """The report as audit.json records it.

        Returns
        -------
        dict
            Kind, confidence, notes, budget store, violations, and one entry per silo.
        """
        return {"kind": self.kind, "confidence": self.confidence, "methods": self.methods,
                "noise": self.noise, "notes": self.notes, "budget_store": self.store,
                "scratch_store": self.scratch, "run_ids": self.run_ids,
                "seconds": self.seconds, "violations": self.violations,
                "what_it_means": LOWER_BOUND_NOTE,
                "neighbouring_relation": run_mod.ADJACENCY,
                "silos": [r.to_dict() for r in self.rows]}


def audit(cfg, *, kind: str = _AUDIT.kind, silo: str | None = None,
          canaries: int | Canaries | None = None, runs: int = _AUDIT.runs,
          confidence: float = _AUDIT.confidence, store: BudgetStore | None = None,
          seed: int | None = None,
          on_progress: Callable[[int, int], None] | None = None) -> AuditReport:
    """Audit the job `cfg` describes: does each silo's claimed ε survive an attack?

    The real job runs with canary records inserted; an attacker guesses which canaries
    were trained on, giving an empirical lower bound on ε at `confidence`. A bound above
    the claim is a violation. The audit's own runs are charged to the budget store like
    any job. Everything that can fail on bad input fails before any budget is reserved.

    Parameters
    ----------
    cfg : Config
        The job (`load_config`); privacy must be enabled.
    kind : {"one-run", "multi-run"}, default "one-run"
        One training run with many canaries (Steinke et al. 2023), or many runs on
        neighbouring datasets D and D′ (Clopper–Pearson).
    silo : str, optional
        The silo audited (default: every silo).
    canaries : int or Canaries, optional
        one-run: the number m per silo (default min(1000, n_k)) or explicit `Canaries`
        (raw encoded features); multi-run: explicit `Canaries` whose first record is the
        canary, else one generated canary.
    runs : int, default 200
        multi-run: jobs on each of D and D′.
    confidence : float, default 0.95
        Confidence of the lower bound.
    store : BudgetStore, optional
        The store charged (default: as `run`: [budget] store, else a scratch store when
        [budget] scratch).
    seed : int, optional
        Seed of the canaries and coin flips (default: OS entropy).
    on_progress : callable (done, total) -> None, optional
        Progress of the audit's runs.

    Returns
    -------
    AuditReport
        Per silo the claimed ε and the empirical lower bound.

    Raises
    ------
    ConfigError
        An unknown kind, privacy disabled, or an unsupported model.
    """
    t0 = time.perf_counter()
    if kind not in KINDS:
        raise ConfigError(f"unknown audit kind {kind!r}; choose one of {', '.join(KINDS)}")
    if not cfg.privacy.enabled:
        raise ConfigError("an audit compares a claimed ε with an empirical lower bound, but "
                          "this config has no ε claim (privacy is disabled); enable "
                          "[privacy] with epsilon and delta")
    if cfg.model.name in TORCH_MODELS:
        raise ConfigError(f"auditing supports the GLMs (linear, logistic, focal, svm, "
                          f"softmax), not model {cfg.model.name!r}")
    if not 0.5 <= confidence < 1:
        raise ConfigError(f"confidence must be in [0.5, 1), got {confidence}")
    rng = np.random.default_rng(seed)  # None: OS entropy
    raw = build.apply_privacy(build.load_raw(cfg.data), cfg)
    names = [raw.silo(silo).name] if silo is not None else raw.names
    for s in raw.silos:
        if s.target is None:
            raise ConfigError(f"silo {s.name!r} has no ε claim; set [privacy] epsilon/delta")
    if kind == "one-run":
        return _one_run(cfg, raw, names, canaries, confidence, store, rng, t0, on_progress)
    return _multi_run(cfg, raw, names, canaries, runs, confidence, store, rng, t0,
                      on_progress)


# --- the engine ----------------------------------------------------------------------------

def _store(cfg, store: BudgetStore | None) -> BudgetStore:
    store = store if store is not None else run_mod.open_store(cfg, run_mod._base_dir(cfg,
                                                                                      None))
    run_mod.check_demo_store(cfg, store)
    return store


def _run_job(cfg, p, store: BudgetStore, command: str):
    """One job exactly as `silofl run` executes it (reserve, preprocess, every method,
    settle), without writing a run directory. Returns (fed, results, job)."""
    job = open_job(store, dict(zip(p.labels, p.plans)), lifetime=run_mod._lifetime(cfg, p.raw),
                   explicit_lifetime=cfg.budget.epsilon is not None, command=command,
                   noise=p.tcfg.noise, accountant=p.tcfg.accountant,
                   fingerprints=fingerprints(p.raw),
                   extra=[PlannedCharge(n, NO_METHOD, "preprocess", e)
                          for n, e in p.extra.items()])
    try:
        for name in p.extra:
            job.spend_extra(name, "preprocess")
        fed = run_mod._preprocess(p, cfg)
        results = [simulate(fed, p.model, alg, p.tcfg, metric=cfg.model.metric or None,
                            plans=plans, job=job, method=label)
                   for alg, plans, label in zip(p.algorithms, p.plans, p.labels)]
    except BaseException:
        job.settle("failed")
        raise
    job.settle()
    return fed, results, job


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


def _per_silo(confidence: float, k: int) -> float:
    """Each of k audited silos' bound at 1 − (1 − confidence)/k (Bonferroni), so that the
    chance of flagging *any* silo whose claim holds stays below 1 − confidence."""
    return 1 - (1 - confidence) / k


def _claims(results, p, silo: str) -> dict:
    for c in run_mod._combined(results, p.extra):
        if c["silo"] == silo:
            return c
    raise KeyError(silo)


def _notes(cfg, store: BudgetStore, uncharged, extra=()) -> list[str]:
    return run_mod.job_notes(private=True, noise=cfg.privacy.noise, scratch=store.scratch,
                             demo=store.demo, uncharged=uncharged, extra=[AUDIT_NOTE, *extra])


def _one_run(cfg, raw, names, canaries, confidence, store, rng, t0, on_progress):
    per_silo = {}
    for name in names:
        if isinstance(canaries, Canaries):
            c = canaries
        else:
            m = int(canaries) if canaries is not None else \
                min(DEFAULT_CANARIES, raw.silo(name).n_train)
            if m < 2:
                raise ConfigError(f"a one-run audit needs at least 2 canaries, got {m}")
            c = make_canaries(raw, m, rng)
        check_canaries(raw, name, c)
        per_silo[name] = (c, rng.random(c.m) < 0.5)
    audited = raw
    for name, (c, inc) in per_silo.items():
        audited = insert(audited, name, c, inc)
    p = run_mod._prepare(cfg, audited)  # plans σ for the data with its canaries
    st = _store(cfg, store)
    if on_progress:
        on_progress(0, 1)
    fed, results, job = _run_job(cfg, p, st, "silofl audit (one run)")
    if on_progress:
        on_progress(1, 1)
    rows = []
    for name, (c, inc) in per_silo.items():
        claim = _claims(results, p, name)
        res = bounds.one_run_audit(_scores(p.model, fed, results, name, c.m), inc,
                                   claim["delta"], _per_silo(confidence, len(per_silo)))
        rows.append(SiloAudit(name, claim["epsilon"], claim["target_epsilon"],
                              claim["delta"], res["epsilon"], res))
    return AuditReport("one-run", rows, p.labels, _notes(
        cfg, st, fed.meta.get("uncharged", []),
        ["canaries: synthetic records at declared column bounds (or given), each included "
         "with probability 1/2; the job's σ was calibrated with them in",
         "the audit job trains every silo, so it is charged to every silo's budget"]),
        None if st.path is None else str(st.path), st.scratch, [job.run_id],
        time.perf_counter() - t0, confidence, cfg.privacy.noise)


def _statistics(model, fed, results, silo: str) -> dict[str, float]:
    sc = _scores(model, fed, results, silo, 1)
    out = {k: float(v[0]) for k, v in sc.items()}
    k = fed.names.index(silo)
    for j, r in enumerate(results):
        for i, v in enumerate(r.params[k]):
            out[f"model {j} coordinate {i}"] = float(v)
    return out


def _multi_run(cfg, raw, names, canaries, runs, confidence, store, rng, t0, on_progress):
    if store is not None and not store.scratch or store is None and not cfg.budget.scratch:
        raise ConfigError("a multi-run audit trains `runs` jobs on each of D and D′: that is "
                          "an experiment, not a release, and would spend many jobs' worth of "
                          "the silo's lifetime budget. Run it on a scratch store (--scratch, "
                          "or [budget] scratch = true), or use a one-run audit (--kind one-run)"
                          " on the real store")
    if runs < 8:
        raise ConfigError(f"a multi-run audit needs at least 8 runs per dataset (half choose "
                          f"the test, half bound it), got {runs}")
    c = canaries if isinstance(canaries, Canaries) else make_canaries(raw, 1, rng)
    if isinstance(canaries, int) and not isinstance(canaries, bool) and canaries != 1:
        raise ConfigError("a multi-run audit uses one canary (D′ = D + one record); "
                          "leave --canaries out or set it to 1")
    c = Canaries(c.X[:1], c.y[:1])
    prepared = {}
    for name in names:  # everything planned (and validated) before any job runs
        check_canaries(raw, name, c)
        prepared[name] = (run_mod._prepare(cfg, insert(raw, name, c, np.array([False]))),
                          run_mod._prepare(cfg, insert(raw, name, c, np.array([True]))))
    rows, run_ids, uncharged = [], [], []
    total, done = 2 * runs * len(names), 0
    labels = []
    for name, (pd0, pd1) in prepared.items():
        stats = ({}, {})
        claim = 0.0
        for i in range(2 * runs):
            which = i % 2  # interleaved, so a drift in time cannot masquerade as a signal
            p = (pd0, pd1)[which]
            fed, results, job = _run_job(cfg, p, BudgetStore(None), "silofl audit (multi run)")
            run_ids.append(job.run_id)
            for key, v in _statistics(p.model, fed, results, name).items():
                stats[which].setdefault(key, []).append(v)
            c_eps = _claims(results, p, name)
            claim = max(claim, c_eps["epsilon"])
            uncharged = fed.meta.get("uncharged", [])
            labels = p.labels
            done += 1
            if on_progress:
                on_progress(done, total)
        res = bounds.multi_run_epsilon({k: np.array(v) for k, v in stats[0].items()},
                                       {k: np.array(v) for k, v in stats[1].items()},
                                       c_eps["delta"], _per_silo(confidence, len(names)))
        res["runs"] = runs
        rows.append(SiloAudit(name, claim, c_eps["target_epsilon"], c_eps["delta"],
                              res["epsilon"], res))
    return AuditReport("multi-run", rows, labels, _notes(
        cfg, BudgetStore(None), uncharged,
        [f"multi-run: {runs} jobs on D and {runs} on D′ = D + one canary per audited silo, "
         "each on its own scratch store"]), None, True, run_ids[:1] + (
        [f"... {len(run_ids) - 1} more"] if len(run_ids) > 1 else []),
        time.perf_counter() - t0, confidence, cfg.privacy.noise)

"""One audited job, the way `silofl run` executes it (reserve, preprocess, every method,
settle) without writing a run directory — shared by every audit plug-in that trains
(`audit.tabular`, `audit.lastiter`) — and a finished job's claim for one silo."""

from __future__ import annotations

import math

import numpy as np

from silofl.audit.engine import Claim
from silofl.errors import ConfigError
from silofl.experiments import build
from silofl.experiments import run as run_mod
from silofl.privacy.budget import BudgetStore, PlannedCharge
from silofl.runtime.job import NO_METHOD, Job, fingerprints, open_job
from silofl.runtime.simulator import simulate


def run_job(cfg, p, store: BudgetStore, command: str, *, model=None, probe=None,
            tcfg=None, params0: np.ndarray | None = None, source=None):
    """Run the prepared job `p` (`experiments.run._prepare`) on `store`.

    Parameters
    ----------
    cfg : Config
        The job's configuration.
    p : prepared job
        Its plans, algorithms and data.
    store : BudgetStore
        Where the job is reserved before any data is read and settled after.
    command : str
        What the store records as the command.
    model, probe : optional
        The server view's wrapped model and step probe (`audit.whitebox`).
    tcfg : TrainingConfig, optional
        Another training config than `p.tcfg` (a run's own seed); a non-private one trains
        without a reservation (power checks with DP off).
    params0 : numpy.ndarray, optional
        (P,) the start model of every method.
    source : callable, optional
        fed → the trainer's data source (the person-level self-test's broken source);
        default the run's own (`runtime.sources.training_source`).

    Returns
    -------
    (fed, results, job or None)
    """
    tcfg = p.tcfg if tcfg is None else tcfg
    model = p.model if model is None else model
    if probe is not None and tcfg.adaptive_clip:  # before anything is reserved
        raise ConfigError("clip = \"auto\" cannot be audited: the white-box audit assumes "
                          "a fixed clip C; set [training] clip to a number for an audit")
    job: Job | None = None
    if tcfg.private:
        job = open_job(store, dict(zip(p.labels, p.plans)),
                       lifetime=run_mod._lifetime(cfg, p.raw),
                       explicit_lifetime=cfg.budget.epsilon is not None, command=command,
                       noise=tcfg.noise, accountant=tcfg.accountant,
                       fingerprints=fingerprints(p.raw),
                       extra=[PlannedCharge(n, NO_METHOD, "preprocess", e)
                              for n, e in p.extra.items()])
    try:
        for name in p.extra if job is not None else ():
            job.spend_extra(name, "preprocess")
        fed = run_mod._preprocess(p, cfg)
        data = None if source is None else source(fed)
        results = [simulate(fed, model, alg, tcfg, metric=cfg.model.metric or None,
                            plans=plans, job=job, method=label, probe=probe,
                            params0=params0, source=data)
                   for alg, plans, label in zip(p.algorithms, p.plans, p.labels)]
    except BaseException:
        if job is not None:
            job.settle("failed")
        raise
    if job is not None:
        job.settle()
    return fed, results, job


def claim_of(results, p, silo: str) -> Claim:
    """The finished job's composed claim for `silo` (ε = ∞, δ = 0 when it was not private:
    no claim)."""
    for c in run_mod._combined(results, p.extra):
        if c["silo"] == silo:
            return Claim(c["epsilon"], c["target_epsilon"], c["delta"])
    return Claim(math.inf, math.inf, 0.0)


def audited_silos(cfg, silo: str | None):
    """The job's raw federation with its privacy targets, and the audited silos' names
    (`silo`, else all); ConfigError for a silo without an ε claim."""
    raw = build.apply_privacy(build.load_raw(cfg.data), cfg)
    names = [raw.silo(silo).name] if silo is not None else raw.names
    for s in raw.silos:
        if s.target is None:
            raise ConfigError(f"silo {s.name!r} has no ε claim; set [privacy] epsilon/delta")
    return raw, names


def trees_job(cfg, silo: str | None):
    """What the trees' audit (`audit.gbdt`) takes from a dp_gbdt job: the federation the
    job trains (encoded, preprocessed from declared facts only), the audited silos'
    names, the features' declared bounds and the [trees] settings.

    Parameters
    ----------
    cfg : Config
        The job; [training] methods must be ["dp_gbdt"] alone.
    silo : str, optional
        The audited silo (default: every silo).

    Returns
    -------
    (Federation, list of str, numpy.ndarray (d, 2), dict)
        As `audit.gbdt.audit_gbdt` takes them (fed, silo names, bounds, **trees).

    Raises
    ------
    ConfigError
        Other methods beside dp_gbdt (their σ would be calibrated with the trees'), or
        private preprocessing (a release the audit would not charge); before any data is
        read beyond the encoded table.
    """
    from silofl.data.bounds import feature_bounds
    from silofl.experiments import run_trees
    methods = list(cfg.training.methods)
    if methods != ["dp_gbdt"]:
        raise ConfigError(f"the trees' audit audits method dp_gbdt alone, but this job "
                          f"trains {methods}: its σ would be calibrated for all of them "
                          "composed. Audit the trees with [training] methods = "
                          "[\"dp_gbdt\"], and the other methods without dp_gbdt")
    if getattr(cfg.privacy, "unit", "example") != "example":
        raise ConfigError(f"the trees' audit tests an example-level claim; [privacy] unit = "
                          f"{cfg.privacy.unit!r} is not one dp_gbdt trains (use unit = "
                          "\"example\")")
    raw, names = audited_silos(cfg, silo)
    p = run_mod._prepare(cfg, raw)
    if p.extra:
        raise ConfigError("the trees' audit trains on in-memory ledgers and would not charge "
                          f"this job's private preprocessing ({', '.join(p.extra)}); set "
                          "[data] standardize and impute to declared statistics or none")
    fed = run_mod._preprocess(p, cfg)
    return fed, names, feature_bounds(p.raw, p.prep), run_trees.trees_kwargs(cfg)

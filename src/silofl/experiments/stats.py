"""`silofl stats`: a consortium's first look at its data -- per silo and pooled private
counts, means, standard deviations, histograms and quantiles of declared columns.

Planned from public facts only (the schema's declared bounds, each silo's size and
target), reserved and charged to every silo's lifetime budget store as a run of its own
(command ``silofl stats``, label ``stats``) BEFORE any statistic of the rows is computed,
with the machinery of private preprocessing (`runtime.job.open_job(extra=...)`,
`Job.spend_extra`). The mechanism and its sensitivity: `silofl.data.fed_stats`. The
silos' numbers of rows (persons at the person unit) are public by the project's
assumption that silo sizes are public; every other figure is a post-processed noisy
release. Pooled figures sum the silos' noisy releases: post-processing, no extra charge.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from silofl.config import Config
from silofl.data import fed_stats
from silofl.data.raw import RawFederation
from silofl.errors import ConfigError
from silofl.experiments import build
from silofl.experiments.run import _lifetime, check_demo_store, open_store
from silofl.privacy import accounting
from silofl.privacy.budget import BudgetStore, PlannedCharge
from silofl.privacy.randomness import Randomness
from silofl.runtime.job import NO_METHOD, accountant_kind, fingerprints, open_job

#: default share of each silo's job ε (``[privacy] epsilon``) the statistics cost
DEFAULT_SHARE = 0.1
LABEL = "stats"


@dataclass
class StatsPlan:
    """What `federated_stats` releases, fixed from public facts before any row is read.

    Attributes
    ----------
    columns : list of str
        The released columns; `index` their encoded column ids.
    lower, upper : numpy.ndarray
        (d,) their declared bounds.
    bins : int
        Histogram bins per column.
    epsilon, delta : dict of str to float
        Per silo the release's (ε, δ).
    sigmas : dict of str to float
        Per silo the noise multiplier σ_k; the noise std is σ_k·`sensitivity`.
    sensitivity : float
        Δ₂ = √(3·d).
    events : dict
        Per silo the ``GaussianDpEvent(σ_k)`` charged.
    """

    columns: list[str]
    index: list[int]
    lower: np.ndarray
    upper: np.ndarray
    bins: int
    epsilon: dict[str, float]
    delta: dict[str, float]
    sigmas: dict[str, float]
    sensitivity: float
    events: dict[str, Any] = field(default_factory=dict)


@dataclass
class StatsReport:
    """`federated_stats`'s answer: per silo and pooled figures (noisy), and the charge."""

    plan: StatsPlan
    unit: str
    silos: dict[str, dict[str, Any]]
    pooled: dict[str, Any]
    run_id: str | None = None
    store: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (noisy figures and public facts only)."""
        p = self.plan
        return {"columns": p.columns, "bounds": {c: [float(lo), float(hi)] for c, lo, hi
                                                 in zip(p.columns, p.lower, p.upper)},
                "bins": p.bins, "bin_edges": {c: np.linspace(lo, hi, p.bins + 1).tolist()
                                              for c, lo, hi in zip(p.columns, p.lower, p.upper)},
                "unit": self.unit, "sensitivity": p.sensitivity,
                "mechanism": "Gaussian; quantiles by noisy histogram + linear interpolation",
                "silos": self.silos, "pooled": self.pooled, "charged": True,
                "run_id": self.run_id, "budget_store": self.store,
                "public": "each silo's number of rows (persons at the person unit)"}


def select_columns(raw: RawFederation, wanted: list[str] | None) -> list[int]:
    """Encoded ids of the columns to release: `wanted` (schema names), else every numeric or
    binary column with declared bounds.

    Raises
    ------
    ConfigError
        An unknown name, a categorical column, or a column without declared bounds.
    """
    by_name: dict[str, list[int]] = {}
    for j, spec in sorted(raw.specs.items()):
        by_name.setdefault(spec.name, []).append(j)
    if wanted is None:
        out = [js[0] for js in by_name.values() if raw.specs[js[0]].kind in ("numeric", "binary")
               and raw.specs[js[0]].bounds is not None]
        if not out:
            raise ConfigError(f"{raw.name}: no numeric or binary column declares lower/upper "
                              "bounds; declare them in the schema ([[columns]] lower, upper)")
        return out
    out = []
    for name in wanted:
        if name not in by_name and any(f.startswith(name + "=") for f in raw.feature_names):
            raise ConfigError(f"--columns: column {name!r} is categorical (one-hot encoded); "
                              "silofl stats releases numeric and binary columns only")
        if name not in by_name:
            near = difflib.get_close_matches(name, list(by_name), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(f"--columns: no column {name!r} in the schema{hint}; choose "
                              f"from {', '.join(by_name)}")
        spec = raw.specs[by_name[name][0]]
        if spec.kind not in ("numeric", "binary"):
            raise ConfigError(f"--columns: column {name!r} is {spec.kind}; silofl stats "
                              "releases numeric and binary columns only")
        if spec.bounds is None:
            raise ConfigError(f"--columns: column {name!r} has no declared lower/upper bounds, "
                              "which a private histogram and quantiles need; declare public "
                              "bounds in the schema (lower = ..., upper = ...) or leave the "
                              "column out")
        out.append(by_name[name][0])
    return out


def plan_stats(cfg: Config, raw: RawFederation, columns: list[str] | None = None,
               epsilon: float | None = None, bins: int = fed_stats.DEFAULT_BINS) -> StatsPlan:
    """Fix the release from public facts (schema bounds, silo targets): columns, σ_k, events.

    Parameters
    ----------
    cfg : Config
        A private job config (its [privacy] unit, accountant, targets).
    raw : RawFederation
        Encoded silos with their targets; no statistic of them is computed here.
    columns : list of str, optional
        Schema column names (default: every bounded numeric or binary column).
    epsilon : float, optional
        Each silo's ε for the release (default: `DEFAULT_SHARE` × the silo's job ε), at
        the silo's δ.
    bins : int
        Histogram bins per column (≥ 2).

    Returns
    -------
    StatsPlan
    """
    import dp_accounting as dpa  # local: slow to import

    if not cfg.privacy.enabled:
        raise ConfigError("silofl stats releases private statistics charged to each silo's "
                          "budget: keep [privacy] enabled (it never releases uncharged ones)")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
        raise ConfigError(f"bins must be an integer ≥ 2, got {bins!r}")
    if epsilon is not None and not (isinstance(epsilon, (int, float)) and 0 < epsilon < 1e6):
        raise ConfigError(f"--epsilon must be a positive number, got {epsilon!r}")
    if cfg.privacy.unit == "person" and not raw.has_persons:
        raise ConfigError("silofl stats at [privacy] unit = \"person\" needs [data] "
                          "person_column (each person contributes the mean of their rows); "
                          "or use [privacy] unit = \"example\"")
    idx = select_columns(raw, columns)
    bounds = [raw.specs[j].bounds for j in idx]
    lower = np.array([b[0] for b in bounds if b is not None])
    upper = np.array([b[1] for b in bounds if b is not None])
    kind = accountant_kind(cfg.privacy.accountant)
    eps, dlt, sigmas, evs = {}, {}, {}, {}
    for s in raw.silos:
        if s.target is None:
            raise ConfigError(f"silo {s.name!r} has no privacy target; set [privacy] epsilon")
        e = float(epsilon) if epsilon is not None else DEFAULT_SHARE * s.target.epsilon
        eps[s.name], dlt[s.name] = e, s.target.delta
        sigmas[s.name] = accounting.calibrate(lambda sg: dpa.GaussianDpEvent(sg), e,
                                              s.target.delta, kind=kind)
        evs[s.name] = dpa.GaussianDpEvent(sigmas[s.name])
    return StatsPlan([raw.specs[j].name for j in idx], idx, lower, upper, bins, eps, dlt,
                     sigmas, fed_stats.sensitivity(len(idx)), evs)


def _rows(s, idx: list[int], person: bool) -> tuple[np.ndarray, np.ndarray | None, int]:
    """All rows of a silo (training and test), their persons, and the public size."""
    X = np.concatenate([np.asarray(s.X_train, np.float64)[:, idx],
                        np.asarray(s.X_test, np.float64)[:, idx]])
    if not person:
        return X, None, len(X)
    per = np.concatenate([np.asarray(s.person_train).astype(str),
                          np.asarray(s.person_test).astype(str)])
    return X, per, int(len(np.unique(per)))


def federated_stats(cfg: Config, columns: list[str] | None = None,
                    epsilon: float | None = None, bins: int = fed_stats.DEFAULT_BINS,
                    store: BudgetStore | None = None,
                    qs: tuple[float, ...] = fed_stats.DEFAULT_QUANTILES) -> StatsReport:
    """Release per silo private statistics of declared columns, charged first.

    Parameters
    ----------
    cfg : Config
        The job config (data, schema, [privacy], [budget]).
    columns, epsilon, bins
        As in `plan_stats`.
    store : BudgetStore, optional
        The store to charge (default: the job's, `experiments.run.open_store`).
    qs : tuple of float
        Quantile levels.

    Returns
    -------
    StatsReport

    Raises
    ------
    ConfigError
        Bad input: nothing reserved, nothing read beyond loading.
    BudgetExceeded
        A silo cannot pay: nothing is charged, no statistic is computed.
    """
    build.check_unit(cfg)
    raw = build.apply_privacy(build.load_raw(cfg.data), cfg)
    plan = plan_stats(cfg, raw, columns, epsilon, bins)
    st = store if store is not None else open_store(cfg)
    check_demo_store(cfg, st)
    job = open_job(st, {}, lifetime=_lifetime(cfg, raw),
                   explicit_lifetime=cfg.budget.epsilon is not None, command="silofl stats",
                   noise=cfg.privacy.noise, accountant=cfg.privacy.accountant,
                   fingerprints=fingerprints(raw),
                   extra=[PlannedCharge(n, NO_METHOD, LABEL, e) for n, e in plan.events.items()])
    person = cfg.privacy.unit == "person"
    rng = Randomness.for_mode(cfg.privacy.noise, [cfg.training.seed, 0x57A7])
    released, sizes = {}, {}
    try:
        for s in raw.silos:
            job.spend_extra(s.name, LABEL)  # recorded in the store before the rows are read
            X, per, sizes[s.name] = _rows(s, plan.index, person)
            released[s.name] = fed_stats.release(
                X, plan.lower, plan.upper, plan.bins,
                plan.sigmas[s.name] * plan.sensitivity, rng, per)
    except BaseException:
        job.settle("failed")
        raise
    job.settle()
    silos = {n: {"n": sizes[n], "epsilon": plan.epsilon[n], "delta": plan.delta[n],
                 "sigma": plan.sigmas[n], "noise_std": plan.sigmas[n] * plan.sensitivity,
                 "columns": dict(zip(plan.columns, fed_stats.summarize(
                     r, plan.lower, plan.upper, sizes[n], qs)))}
             for n, r in released.items()}
    total = sum(released.values())
    n_all = sum(sizes.values())
    pooled = {"n": n_all, "epsilon_charged": 0.0,
              "noise_std": float(np.sqrt(sum((plan.sigmas[n] * plan.sensitivity) ** 2
                                             for n in released))),
              "note": ("sum of the silos' noisy releases (post-processing, no charge); at the "
                       "person level a person seen by m silos counts m times"),
              "columns": dict(zip(plan.columns, fed_stats.summarize(
                  np.asarray(total), plan.lower, plan.upper, n_all, qs)))}
    return StatsReport(plan, cfg.privacy.unit, silos, pooled, job.run_id,
                       None if st.path is None else str(st.path))

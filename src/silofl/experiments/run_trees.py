"""Method "dp_gbdt" in a job (`silofl run`, `silofl.run`): the [trees] settings as
`train_dp_gbdt` keyword arguments, the public per-feature bounds its bins are cut over,
and one run charged to the job's ledgers.

Privacy: the job plans dp_gbdt like any method (`silofl.runtime.plan`: its declared event
is ``ensemble_event(σ_k, T + local_trees, releases, q)``, after the private bins' release
with [trees] bins = "private" (`DpGbdt.run_event`), σ_k calibrated for the job's
methods composed) and reserves the whole ensemble in the lifetime store before any row is
read; `train_dp_gbdt` charges each release to the job's ledger (and so the store) before
it reads the silo's rows; the job settles to what executed.

Bins: each feature's bins are equal width over its DECLARED range after preprocessing
(or, with bins = "private", noisy quantiles over that range, charged), never read from the
data for free: `silofl.data.bounds.feature_bounds` (the one rule, also the network's)
maps each column's declared range through its declared preprocessing; per-silo
standardization (private or uncharged) would give every silo other bins, so it is refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from silofl.algorithms.gbdt_method import SETTINGS, DpGbdt
from silofl.data.bounds import feature_bounds
from silofl.errors import ConfigError
from silofl.models import metrics as M
from silofl.runtime.simulator import History, RunResult

#: the other metrics every tree run records per round (history.json) and at the end
TASK_METRICS = {"binary": ("accuracy", "roc_auc"), "regression": ("mse",)}


def is_trees(alg) -> bool:
    """Whether `alg` is method dp_gbdt (run here, not by the DP-SGD simulator)."""
    return isinstance(alg, DpGbdt)


def _auto_or_positive(key: str, v) -> float | None:
    if v == "auto":
        return None
    if isinstance(v, str):
        raise ConfigError(f"[trees] {key} must be a positive number or \"auto\", got {v!r}")
    return v


def trees_kwargs(cfg) -> dict:
    """The [trees] section as `train_dp_gbdt` keyword arguments; the one place that maps
    them.

    Parameters
    ----------
    cfg : Config
        The job.

    Returns
    -------
    dict
        Keyword arguments (`SETTINGS` and, when accepted, bins/bins_share/shrink).

    Raises
    ------
    ConfigError
        A value not supported (naming the [trees] key and what to use).
    """
    t = cfg.trees
    out = {k: getattr(t, k) for k in SETTINGS}
    for key in ("trees", "depth"):  # auto: train_dp_gbdt's None (resolved from the data)
        v = getattr(t, key)
        if isinstance(v, str) and v != "auto":
            raise ConfigError(f"[trees] {key} must be a whole number or \"auto\", got {v!r}")
        out[key] = None if v == "auto" else v
    if isinstance(t.n_bins, str) and t.n_bins != "auto":
        raise ConfigError(f"[trees] n_bins must be a whole number or \"auto\", got {t.n_bins!r}")
    out["clip_h"] = _auto_or_positive("clip_h", t.clip_h)
    out["max_leaf"] = _auto_or_positive("max_leaf", t.max_leaf)
    if t.bins not in ("schema", "private"):
        raise ConfigError(f"[trees] bins must be \"schema\" (declared bounds, free) or "
                          f"\"private\" (noisy quantiles, charged), got {t.bins!r}")
    if t.bins == "private":
        out.update(bins=t.bins, bins_share=t.bins_share)
    elif t.bins_share != type(t)().bins_share:
        raise ConfigError("[trees] bins_share applies only with bins = \"private\"; remove it")
    if t.shrink != "off":
        out["shrink"] = t.shrink
    return out


def bind_bounds(algorithms: list, raw, prep) -> None:
    """Give every dp_gbdt of a job its feature bounds (public; before any data access)."""
    trees = [a for a in algorithms if is_trees(a)]
    if trees and raw.silos[0].X_train.ndim == 2:
        bounds = feature_bounds(raw, prep)
        for a in trees:
            a.bind_bounds(bounds)


class TreeModel:
    """What the reports' quality check calls a model: ``predict(ensemble, X)``."""

    name = "trees"

    @staticmethod
    def predict(ensemble, X: np.ndarray) -> np.ndarray:
        """(n,) P(y = 1) (binary) or the prediction (regression)."""
        return ensemble.predict(X)


@dataclass
class TreeResult(RunResult):
    """A dp_gbdt run as a job's result: `params[k]` is silo k's personal TreeEnsemble (the
    shared ensemble, plus its local trees when [trees] local_trees > 0); `ensemble` the
    shared one; `final_metrics` {metric: per-silo values}."""

    ensemble: object = None
    bounds: np.ndarray | None = None
    final_metrics: dict | None = None


def _history(fed, models: list, metric: str, T: int) -> tuple[History, dict]:
    """Per tree count t = 1..T, every silo's metric of its model's first t trees (test
    rows; post-processing of the released trees, like every method's round metrics)."""
    hist = History()
    names = (metric,) + tuple(m for m in TASK_METRICS[fed.task] if m != metric)
    per: dict = {m: [] for m in names}
    margins = [np.full(s.n_test, float(e.base_score)) for s, e in zip(fed.silos, models)]
    counts = np.array([s.n_test for s in fed.silos])
    for t in range(T):
        scores = []
        for k, (s, e) in enumerate(zip(fed.silos, models)):
            tree = e.trees[t]
            margins[k] += tree.value[tree.apply(s.X_test)]
            scores.append(1 / (1 + np.exp(-margins[k])) if fed.task == "binary" else margins[k])
        for m in names:
            fn = M.metric_fn(m, TreeModel.name)
            per[m].append([fn(s.y_test, sc) if s.n_test else float("nan")
                           for s, sc in zip(fed.silos, scores)])
    hist.rounds = list(range(1, T + 1))
    hist.per_silo = per[metric]
    hist.pooled = [M.pooled(np.array(v), counts) for v in per[metric]]
    for m in names[1:]:
        hist.extra[m] = {"pooled": [M.pooled(np.array(v), counts) for v in per[m]],
                         "per_silo": per[m]}
    return hist, {m: dict(zip(fed.names, per[m][-1])) for m in names}


def run_trees(fed, alg: DpGbdt, tcfg, plans: list, *, metric: str | None = None, job=None,
              label: str = "dp_gbdt", ledger_dir=None, restored=None,
              on_round=None) -> TreeResult:
    """Train dp_gbdt on the preprocessed `fed`, charging `job`'s ledgers.

    Parameters
    ----------
    fed : Federation
        Preprocessed silos (features within `alg.bounds`).
    alg : DpGbdt
        The method, its bounds bound (`bind_bounds`).
    tcfg : TrainingConfig
        private, noise, seed, accountant.
    plans : list of SiloPlan
        The job's plans for this method (σ_k of the job's composition).
    metric : str, optional
        The job's metric (default: accuracy for binary, MSE for regression).
    job : Job, optional
        The job's reservation (private runs); its ledgers for `label` are charged.
    label, ledger_dir, restored
        The method's label, where its ledgers are written, restored entries (resume).
    on_round : callable (tree, pooled metric) -> None, optional
        Called per tree of the history.

    Returns
    -------
    TreeResult
    """
    from silofl.algorithms.dp_gbdt import train_dp_gbdt
    t0 = time.perf_counter()
    if alg.bounds is None:
        raise ConfigError("dp_gbdt has no feature bounds; run it through silofl.run, or "
                          "call train_dp_gbdt with bounds=")
    metric = metric or M.default_metric(fed.task)
    private = bool(tcfg.private)
    if private and job is None:
        raise ConfigError("a private dp_gbdt run charges a job's reservation: run it with "
                          "silofl.run (or train_dp_gbdt with ledgers)")
    ledgers = job.ledgers(label, ledger_dir, restored) if private else None
    # noise = "secure": each silo's stream is the CSPRNG (gbdt_programs.noise_stream); the
    # seed then drives only the public streams (column draws, random splits)
    res = train_dp_gbdt(fed, **alg.settings, bounds=alg.bounds, seed=int(tcfg.seed),
                        noise=tcfg.noise if private else "seeded", ledgers=ledgers,
                        private=private, noise_multipliers=[p.noise_multiplier for p in plans]
                        if private else None)
    models = res.personal or [res.ensemble] * fed.num_silos
    hist, finals = _history(fed, models, metric, min(len(e.trees) for e in models))
    for t, v in zip(hist.rounds, hist.pooled):
        if on_round:
            on_round(t, v)
    params = np.empty(fed.num_silos, dtype=object)
    params[:] = models
    return TreeResult(method=alg.describe(), metric=metric, silos=list(fed.names),
                      history=hist, final_per_silo=list(hist.per_silo[-1]),
                      final_pooled=hist.pooled[-1], plans=plans, ledgers=ledgers,
                      params=params, seconds=time.perf_counter() - t0, noise=tcfg.noise,
                      run_id=job.run_id if private else None,
                      scratch=bool(job is not None and job.scratch), ensemble=res.ensemble,
                      bounds=alg.bounds, final_metrics=finals)

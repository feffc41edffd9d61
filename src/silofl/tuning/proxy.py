"""Tuning on declared public proxy data (`[tuning] mode = "proxy"`): free for the silos.

The λ grid of the tuned method (MR-MTL or Ditto) is evaluated *non-privately* on a proxy
federation that the configuration declares public (a built-in source or a table that is
not the silos' own data, `experiments.proxy_tuning`); the best λ by the proxy's own
held-out rows is then trained once, privately, on the silos. Nothing the silos hold is
read before that run, so the choice costs them ε = 0 — the privacy claim rests on the
declaration that the proxy is public, which the run report repeats.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from silofl.algorithms import make_algorithm
from silofl.algorithms.ditto import Ditto
from silofl.algorithms.mrmtl import MRMTL
from silofl.errors import ConfigError
from silofl.models.metrics import HIGHER_IS_BETTER
from silofl.runtime.simulator import simulate


class _ProxyChosen:
    """Mix-in: the method's own behaviour, and a description that says where λ came from."""

    proxy_info: dict

    def describe(self):
        return {**super().describe(), "tuning": self.proxy_info}  # type: ignore[misc]


class ProxyChosenMRMTL(_ProxyChosen, MRMTL):
    """MR-MTL with the λ chosen on a public proxy."""


class ProxyChosenDitto(_ProxyChosen, Ditto):
    """Ditto with the λ chosen on a public proxy."""


_CHOSEN = {"mrmtl": ProxyChosenMRMTL, "ditto": ProxyChosenDitto}


def grid_on_proxy(fed, model, method: str, lams: list[float], tcfg, metric: str,
                  weighted: bool = True, target=None, repeats: int = 2) -> list[dict]:
    """Train `method` once per λ on the public proxy federation: non-privately, or with
    the run's DP-SGD noise simulated (`target` given: the proxy's silos get the run's
    (ε, δ), so λ is chosen for the noise the private run will see; the proxy is public,
    so this noise protects nothing and nothing is charged to any silo of the run).

    Parameters
    ----------
    fed : Federation
        The proxy, preprocessed; its test rows score the grid (public rows).
    model : Model
        The run's model (the proxy must have the silos' features).
    method : {"mrmtl", "ditto"}
    lams : list of float
        The λ grid.
    tcfg : TrainingConfig
        The run's training settings (made non-private here).
    metric : str
        The run's metric (`models.metrics.HIGHER_IS_BETTER`).
    weighted : bool
        Weighted server averaging, as in the run.
    target : PrivacyTarget, optional
        Simulate the run's noise at this (ε, δ) per proxy silo (seeded noise).
    repeats : int
        Simulated noise: seeds averaged per λ.

    Returns
    -------
    list of dict
        One {"lam", "score"} per λ, the final pooled test metric on the proxy (mean over
        `repeats` seeds with simulated noise).
    """
    if target is None:
        cfg, seeds = dataclasses.replace(tcfg, private=False), [tcfg.seed]
    else:
        cfg = dataclasses.replace(tcfg, private=True, noise="seeded")
        fed, seeds = fed.with_targets(target), [tcfg.seed + i for i in range(int(repeats))]
    out = []
    for lam in lams:
        vals = [simulate(fed, model, make_algorithm(method, lam=float(lam), weighted=weighted),
                         dataclasses.replace(cfg, seed=s), metric=metric).final_pooled
                for s in seeds]
        out.append({"lam": float(lam), "score": float(np.mean(vals))})
    return out


def best_lam(scores: list[dict], metric: str) -> float:
    """The λ with the best proxy score (non-finite scores rank last; ties: smallest λ)."""
    higher = HIGHER_IS_BETTER[metric]
    key = [(s["score"] if higher else -s["score"]) if np.isfinite(s["score"]) else -np.inf
           for s in scores]
    if not np.isfinite(max(key)):
        raise ConfigError("every λ of the tuning grid diverged on the proxy data; lower "
                          "training.lr or change tuning.lam")
    order = sorted(range(len(scores)), key=lambda i: (-key[i], scores[i]["lam"]))
    return scores[order[0]]["lam"]


def chosen_algorithm(method: str, lam: float, info: dict, weighted: bool = True):
    """`method` with λ = `lam`, describing its proxy choice (`info`) in the run report.

    Parameters
    ----------
    method : {"mrmtl", "ditto"}
    lam : float
        The chosen λ.
    info : dict
        What the report says about the choice (proxy, grid scores, cost 0 to the silos).
    weighted : bool

    Returns
    -------
    ProxyChosenMRMTL or ProxyChosenDitto
    """
    if method not in _CHOSEN:
        raise ConfigError(f"tuning.mode = 'proxy' tunes mrmtl or ditto, got {method!r}")
    alg = _CHOSEN[method](lam, weighted=weighted)
    alg.proxy_info = info
    return alg

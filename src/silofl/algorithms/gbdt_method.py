"""Method "dp_gbdt" as a job's method: DP federated gradient-boosted trees
(`silofl.algorithms.dp_gbdt.train_dp_gbdt`) with its settings checked before any data is
read, and its whole run's privacy event as a function of the noise multiplier σ, so that a
job calibrates one σ_k per silo for dp_gbdt composed with its other methods.

It is not a DP-SGD method: it has no silo/server round steps for the simulator;
`silofl.experiments.run_trees` runs it. What it declares (`run_event`): every tree's
releases, ``training.histograms.ensemble_event(σ, T + local_trees, releases, q)``, after
the private bins' release when [trees] bins = "private" (`training.private_bins.run_event`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import dp_accounting as dpa
import numpy as np

from silofl.algorithms.base import Algorithm
from silofl.errors import ConfigError
from silofl.training.histograms import ensemble_event
from silofl.training.private_bins import check_share
from silofl.training.private_bins import run_event as bins_run_event

if TYPE_CHECKING:
    from silofl.privacy.targets import PrivacyTarget

#: train_dp_gbdt's settings a job passes (the [trees] keys with these names)
SETTINGS = ("trees", "depth", "n_bins", "lr", "lam", "clip_g", "clip_h", "subsample",
            "colsample", "min_child_hessian", "max_leaf", "base_score", "splits",
            "local_trees")
#: refused tasks and units, with what to do instead
MULTICLASS = ("dp_gbdt trains binary or regression trees only; this table's label is "
              "multiclass. Use a multiclass method (e.g. fedavg with [model] name = "
              "\"softmax\"), or declare a binary label (e.g. one class against the rest) in "
              "the schema")
PERSON_UNIT = ("dp_gbdt protects single rows only ([privacy] unit = \"example\"): its "
               "histogram sensitivity counts one row's gradient once, and person-level trees "
               "are not implemented. Set [privacy] unit = \"example\", or train the person-"
               "level job with a DP-SGD method")

NOT_SIMULATED = ("dp_gbdt is not a DP-SGD method: `silofl run` / silofl.run train it "
                 "(silofl.experiments.run_trees), or call "
                 "silofl.algorithms.dp_gbdt.train_dp_gbdt; the DP-SGD simulator cannot")


def _integer(key: str, v: Any, lo: int, hi: int) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v \
            or not lo <= v <= hi:
        raise ConfigError(f"[trees] {key} must be a whole number in [{lo}, {hi}], got {v!r}")


def _positive(key: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or v <= 0:
        raise ConfigError(f"[trees] {key} must be a positive number, got {v!r}")


def check_settings(s: dict) -> None:
    """Refuse a bad [trees] value with a ConfigError naming the key (before any data).

    Parameters
    ----------
    s : dict
        `train_dp_gbdt` keyword arguments (`SETTINGS`; clip_h and max_leaf may be None).
    """
    if s["trees"] is not None:  # None: two passes over the features (cyclic), else 20
        _integer("trees", s["trees"], 1, 10_000)
    if s["depth"] is not None:  # None: log2(bins) (cyclic), else 3
        _integer("depth", s["depth"], 1, 12)
    if s["n_bins"] != "auto":  # auto: from the rows and the noise (gbdt_splits.auto_bins)
        _integer("n_bins", s["n_bins"], 2, 4096)
    _integer("local_trees", s["local_trees"], 0, 10_000)
    for key in ("lr", "lam", "clip_g", "min_child_hessian"):
        _positive(key, s[key])
    for key in ("clip_h", "max_leaf"):
        if s[key] is not None:
            _positive(key, s[key])
    for key in ("subsample", "colsample"):
        v = s[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise ConfigError(f"[trees] {key} must be in (0, 1], got {v!r}")
    b = s["base_score"]
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b):
        raise ConfigError(f"[trees] base_score must be a finite number, got {b!r}")
    if s["splits"] not in ("histogram", "random", "cyclic"):
        raise ConfigError(f"[trees] splits must be \"cyclic\" (one feature per tree, leaves = "
                          f"its bins), \"histogram\" (noisy level histograms) or \"random\" "
                          f"(drawn from public randomness), got {s['splits']!r}")
    if s.get("bins", "schema") == "private":
        check_share(s.get("bins_share", 0.1))


def default_settings() -> dict:
    """`train_dp_gbdt`'s defaults of `SETTINGS` (the [trees] section's defaults)."""
    import inspect

    from silofl.algorithms.dp_gbdt import train_dp_gbdt
    params = inspect.signature(train_dp_gbdt).parameters
    return {k: params[k].default for k in SETTINGS}


class DpGbdt(Algorithm):
    """dp_gbdt as a job's method: its settings, bounds and declared privacy event.

    Parameters
    ----------
    settings : dict
        `train_dp_gbdt` keyword arguments (`SETTINGS`, plus any newer ones it accepts).
    """

    name = "dp_gbdt"
    #: why a person- or node-level job refuses it (`runtime.plan`)
    unit_error = PERSON_UNIT

    def __init__(self, settings: dict) -> None:
        check_settings(settings)
        self.settings = dict(settings)
        #: (d, 2) declared per-feature [lower, upper] after preprocessing (`bind_bounds`)
        self.bounds: np.ndarray | None = None

    @property
    def releases(self) -> int:
        """Gaussian releases per tree: D + 1 (histogram splits) or 1 (random, cyclic)."""
        if self.settings["splits"] != "histogram":
            return 1
        return int(self.settings["depth"] if self.settings["depth"] is not None else 3) + 1

    @property
    def total_trees(self) -> int:
        """Shared plus local trees: every one is charged (trees = None is resolved from
        the features by `bind_data`)."""
        if self.settings["trees"] is None:
            raise ConfigError("dp_gbdt: [trees] trees = \"auto\" needs the table's features; "
                              "call bind_data(fed, model) before planning")
        return int(self.settings["trees"]) + int(self.settings["local_trees"])

    @property
    def sampling_rate(self) -> float:
        """Poisson row-sampling rate q per tree (1: no subsampling)."""
        return float(self.settings["subsample"])

    def run_event(self, sigma: float) -> dpa.DpEvent:
        """The whole run's releases from one silo at noise multiplier σ.

        Parameters
        ----------
        sigma : float
            σ_k, in units of each release's L2 sensitivity.

        Returns
        -------
        dp_accounting.DpEvent
            ``ensemble_event(σ, T + local_trees, releases, q)``, composed after the bins
            release ``GaussianDpEvent(σ_b(σ))`` when bins = "private".
        """
        trees = ensemble_event(sigma, self.total_trees, self.releases, self.sampling_rate)
        if self.settings.get("bins", "schema") != "private":
            return trees
        return bins_run_event(sigma, self.settings["bins_share"],
                              self.total_trees * self.releases,
                              lambda s: ensemble_event(s, self.total_trees, self.releases,
                                                       self.sampling_rate))

    def privacy_events(self, round_event: dpa.DpEvent, rounds: int,
                       target: PrivacyTarget | None = None) -> dpa.DpEvent:
        raise ConfigError("dp_gbdt declares its run with run_event(σ), not DP-SGD rounds")

    def bind_data(self, fed: Any, model: Any) -> None:
        """Refuse what trees cannot learn, before any budget is reserved."""
        if fed.task == "multiclass":
            raise ConfigError(MULTICLASS)
        if fed.task not in ("binary", "regression"):
            raise ConfigError(f"dp_gbdt needs a binary or regression label, got {fed.task!r}")
        if fed.silos[0].X_train.ndim != 2:
            raise ConfigError("dp_gbdt needs tabular (n, d) features, not images; use a "
                              "DP-SGD method with [model] name = \"convnet\"")
        if self.settings["trees"] is None:  # as train_dp_gbdt resolves it
            d = fed.silos[0].X_train.shape[1]
            self.settings["trees"] = 2 * d if self.settings["splits"] == "cyclic" else 20

    def bind_bounds(self, bounds: np.ndarray) -> None:
        """Set the (d, 2) public per-feature bounds the bins are cut over."""
        self.bounds = np.asarray(bounds, dtype=np.float64)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **{k: v for k, v in self.settings.items()}}

    def init(self, *args: Any, **kwargs: Any) -> Any:  # not DP-SGD (module docstring)
        raise ConfigError(NOT_SIMULATED)

    def silo_step(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError(NOT_SIMULATED)

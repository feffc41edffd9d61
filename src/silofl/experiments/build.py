"""From a validated Config to the objects a run needs: federation, model, algorithms.
Everything here happens before any training data is touched."""

from __future__ import annotations

import difflib
import inspect

from silofl import data as D
from silofl.algorithms import make_algorithm
from silofl.algorithms.base import Algorithm
from silofl.data.federation import Federation, PrivacyTarget
from silofl.errors import ConfigError
from silofl.experiments.config import Config, DataConfig
from silofl.models import make_model
from silofl.models.base import Model
from silofl.models.metrics import METRICS, default_metric
from silofl.runtime.plan import TrainingConfig

SOURCES = ("heart", "table", "school", "synthetic")
GENERATORS = {"linear": D.linear_silos, "mean": D.mean_estimation, "vehicle": D.vehicle_like}


def load_federation(dc: DataConfig) -> Federation:
    common = dict(test_fraction=dc.test_fraction, seed=dc.seed)
    if dc.source == "heart":
        return D.load_heart_disease(standardize=dc.standardize, missing=dc.missing, **common)
    if dc.source == "table":
        if not dc.path or not dc.silo_column or not dc.label_column:
            raise ConfigError("data.source = 'table' needs data.path, data.silo_column and "
                              "data.label_column")
        return D.load_table(dc.path, dc.silo_column, dc.label_column, task=dc.task,
                            features=dc.features or None, standardize=dc.standardize,
                            missing=dc.missing, **common)
    if dc.source == "school":
        if not dc.path:
            raise ConfigError("data.source = 'school' needs data.path (the school.mat file)")
        return D.load_school(dc.path, standardize=dc.standardize, **common)
    if dc.source == "synthetic":
        gen = GENERATORS.get(dc.generator)
        if gen is None:
            raise ConfigError(f"unknown data.generator {dc.generator!r}; choose one of "
                              f"{', '.join(GENERATORS)}")
        params = inspect.signature(gen).parameters
        for key in dc.options:
            if key not in params:
                near = difflib.get_close_matches(key, list(params), n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise ConfigError(f"unknown option data.options.{key} for generator "
                                  f"{dc.generator!r}{hint}")
        kw = dict(dc.options)
        if "seed" in params:
            kw.setdefault("seed", dc.seed)
        if "test_fraction" in params:
            kw.setdefault("test_fraction", dc.test_fraction)
        return gen(**kw)
    near = difflib.get_close_matches(dc.source, SOURCES, n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise ConfigError(f"unknown data.source {dc.source!r}; choose one of {', '.join(SOURCES)}.{hint}")


def apply_privacy(fed: Federation, cfg: Config) -> Federation:
    """Attach each silo's (ε_k, δ_k): the default target unless overridden by name."""
    pc = cfg.privacy
    if not pc.enabled:
        return fed
    default = PrivacyTarget(pc.epsilon, pc.delta)
    overrides = {}
    for name, sp in pc.silos.items():
        if name not in fed.names:
            near = difflib.get_close_matches(name, fed.names, n=1)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"[privacy.silos.{name}] names no silo; silos are "
                              f"{', '.join(fed.names)}.{hint}")
        overrides[name] = PrivacyTarget(pc.epsilon if sp.epsilon is None else sp.epsilon,
                                        pc.delta if sp.delta is None else sp.delta)
    return fed.with_targets(default, overrides)


def build_model(cfg: Config, fed: Federation) -> Model:
    mc = cfg.model
    opts = {"gamma": mc.gamma, "alpha": mc.alpha} if mc.name == "focal" else {}
    model = make_model(mc.name, fed.dim, max(fed.num_classes, 2), **opts)
    model.check_task(fed.task)
    if mc.metric and mc.metric not in METRICS:
        raise ConfigError(f"unknown model.metric {mc.metric!r}; choose one of {', '.join(METRICS)}")
    if mc.metric == "mse" and fed.task != "regression" or \
            mc.metric in ("accuracy", "auprc", "roc_auc") and fed.task == "regression":
        raise ConfigError(f"metric {mc.metric!r} does not fit a {fed.task} task; use "
                          f"{default_metric(fed.task)!r}")
    if mc.metric in ("auprc", "roc_auc") and fed.task != "binary":
        raise ConfigError(f"metric {mc.metric!r} needs binary labels")
    return model


def build_algorithms(cfg: Config) -> list[Algorithm]:
    tc = cfg.training
    if not tc.methods:
        raise ConfigError("training.methods is empty; list at least one of local, fedavg, mrmtl")
    return [make_algorithm(m, lam=tc.lam, weighted=tc.weighted) for m in tc.methods]


def training_config(cfg: Config) -> TrainingConfig:
    tc, pc = cfg.training, cfg.privacy
    out = TrainingConfig(rounds=tc.rounds, local_epochs=tc.local_epochs, batch_size=tc.batch_size,
                         lr=tc.lr, clip=tc.clip, l2=tc.l2, private=pc.enabled,
                         accountant=pc.accountant, noise=pc.noise, seed=tc.seed,
                         eval_every=tc.eval_every)
    out.validate()
    return out

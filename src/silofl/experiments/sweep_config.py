"""Sweep configuration: a run config ([data], [model], [training], [privacy], [output])
plus a [sweep] grid and optional [report] settings.

The grid replaces the run config's single values: methods × ε (+ non-private) × λ (only for
LAMBDA_METHODS) × lr × seeds. Setting those single values in the other sections as well
(training.methods, training.lam, training.lr, training.seed, privacy.epsilon,
privacy.enabled, privacy.silos) is an error, so a file never means two things.

Relative paths (data.path, sweep.results, budget.store) are resolved against the directory of the
config file, so `silofl sweep examples/school.toml` works from any working directory.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path

from silofl.algorithms import LAMBDA_METHODS, METHODS, make_algorithm
from silofl.config import Config, config_from_dict, read_toml, validate
from silofl.config.base import Source
from silofl.config.input import (
    apply_overrides,
    check_config_paths,
    resolve_config_paths,
    where_set,
)
from silofl.config.sweep import ReportSection, SweepFile, SweepSection
from silofl.errors import ConfigError
from silofl.tuning import setup as tuning_setup

_ALG_DEFAULTS = {k: p.default for k, p in inspect.signature(make_algorithm).parameters.items()
                 if p.default is not inspect.Parameter.empty}

#: keys of the run sections that the [sweep] grid replaces → the sweep key to use instead
_REPLACED = {("training", "methods"): "sweep.methods", ("training", "lam"): "sweep.lam",
             ("training", "lr"): "sweep.lr", ("training", "seed"): "sweep.seeds",
             ("privacy", "epsilon"): "sweep.epsilon", ("privacy", "enabled"): "sweep.nonprivate",
             ("privacy", "silos"): "sweep.epsilon (every silo gets the swept ε)"}


@dataclass
class SweepConfig:
    base: Config                   # the run sections; data.path already resolved
    sweep: SweepSection
    report: ReportSection
    root: Path                     # directory relative paths were resolved against
    data_path_as_written: str = ""

    @property
    def results_path(self) -> Path:
        return _resolve(self.root, self.sweep.results)

    def algorithm_options(self) -> dict:
        """Keyword arguments for make_algorithm besides `lam`, from [training] (the
        registry's defaults for keys a config version does not have)."""
        tc = self.base.training
        return {k: getattr(tc, k, v) for k, v in _ALG_DEFAULTS.items() if k != "lam"}

    def normalized(self) -> dict:
        """Everything that determines the runs' results, as plain data: the fingerprint's
        input. Excludes where results go (sweep.results, [output]), how many processes run
        them (sweep.workers, engine, address) and presentation ([report])."""
        d = self.base.to_dict()
        d.pop("output")
        d.pop("budget")  # where runs are charged changes whether they run, not their results
        d["data"]["path"] = self.data_path_as_written
        for sec, key in _REPLACED:
            d[sec].pop(key, None)
        sw = self.sweep.model_dump()
        for key in ("workers", "results", "engine", "address"):
            sw.pop(key)
        if sw["tuning"] == "uncounted":  # the default: fingerprints of older sweeps hold
            sw.pop("tuning")
        d["sweep"] = sw
        return d

    def fingerprint(self) -> str:
        """sha256 of the normalized config and of the data file's bytes (when there is one)."""
        h = hashlib.sha256(json.dumps(self.normalized(), sort_keys=True).encode())
        path = self.base.data.path
        if path and Path(path).is_file():
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        return h.hexdigest()[:16]

    @property
    def report_epsilon(self) -> float:
        """ε used by the fixed-ε figures: report.epsilon, else the middle of the ε grid."""
        if self.report.epsilon is not None:
            return self.report.epsilon
        eps = sorted(self.sweep.epsilon)
        return eps[len(eps) // 2]


def _resolve(root: Path, p: str) -> Path:
    path = Path(p).expanduser()
    return path if path.is_absolute() else Path(os.path.normpath(root / path))


def validate_sweep(s: SweepSection) -> SweepSection:
    """Check the grid's methods against the algorithm registry (its numbers were checked
    by `SweepSection`); returns a copy."""
    s = s.model_copy(deep=True)
    if not s.methods:
        raise ConfigError(f"'sweep.methods' is empty; list some of {', '.join(METHODS)}")
    for m in s.methods:
        if not isinstance(m, str) or m not in METHODS:
            near = difflib.get_close_matches(str(m), list(METHODS), n=1)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"unknown method {m!r} in sweep.methods; choose from "
                              f"{', '.join(METHODS)}.{hint}")
    if "dp_gbdt" in s.methods:  # its runs are not DP-SGD rounds (experiments.run_trees)
        raise ConfigError("dp_gbdt is not available in `silofl sweep` yet; train trees with "
                          "`silofl run` (training.methods = [\"dp_gbdt\"], settings in [trees])")
    if len(set(s.methods)) != len(s.methods):
        raise ConfigError("'sweep.methods' lists a method more than once; list every method once")
    return s


def sweep_config_from_dict(raw: dict, root: Path | str = ".", source: Source = ""
                           ) -> SweepConfig:
    """Validate a parsed sweep TOML. Relative paths resolve against `root`; `source` (the
    file) is named in error messages."""
    raw = copy.deepcopy(raw)
    if "sweep" not in raw:
        raise ConfigError("a sweep config needs a [sweep] section (methods, epsilon, lam, lr, "
                          "seeds, …); for a single run use `silofl run --config`")
    sweep = validate_sweep(validate(SweepSection, raw.pop("sweep"), "sweep", source))
    report = validate(ReportSection, raw.pop("report", {}), "report", source)
    for (sec, key), instead in _REPLACED.items():
        if isinstance(raw.get(sec), dict) and key in raw[sec]:
            raise ConfigError(f"'{sec}.{key}' is set by the sweep grid in a sweep config; "
                              f"remove it and use {instead}")
    base = config_from_dict(raw, source)
    if base.tuning.mode != "none":
        raise ConfigError("in a sweep config the tuning mode is sweep.tuning; remove "
                          "tuning.mode (the other [tuning] keys set up tuning = 'private')")
    if sweep.tuning == "private":
        _check_private_tuning(sweep, base)
    elif sweep.tuning == "proxy":
        from silofl.experiments.proxy_tuning import proxy_data_config
        tuning_setup.validate(base.tuning, sweep=True)
        proxy_data_config(base)  # declared, not the silos' own data, λ only
    root = Path(root)
    sc = SweepConfig(base, sweep, report, root, base.data.path)
    for m in sweep.methods:  # the registry refuses unimplemented methods and bad options
        make_algorithm(m, lam=sweep.lam[0], **sc.algorithm_options())
        if "auto" in sweep.lam and m in LAMBDA_METHODS:  # only MR-MTL and Ditto take it
            make_algorithm(m, lam="auto", **sc.algorithm_options())
    if base.data.path:
        base.data.path = str(_resolve(root, base.data.path))
    if base.budget.store:
        base.budget.store = str(_resolve(root, base.budget.store))
    if report.epsilon is not None and float(report.epsilon) not in sweep.epsilon:
        raise ConfigError(f"report.epsilon = {report.epsilon} is not in sweep.epsilon "
                          f"{sweep.epsilon}; pick one of the swept values")
    return sc


def _check_private_tuning(s: SweepSection, base: Config) -> None:
    """sweep.tuning = "private": the tuned method must be swept (its fixed public λ̄ and the
    uncounted choice are the comparison) and λ̄ must be on the grid."""
    tc = base.tuning
    tuning_setup.validate(tc, sweep=True)
    if tc.select == "subsample" and base.training.clip == "auto":  # before any run charges
        raise ConfigError("tuning select = 'subsample' needs a fixed clip: with [training] "
                          "clip = \"auto\" set tuning.select = 'random' or 'em', or set "
                          "[training] clip to a number")
    if tc.method not in s.methods:
        raise ConfigError(f"sweep.tuning = 'private' tunes tuning.method = {tc.method!r}, which "
                          f"is not in sweep.methods {s.methods}; add it (its fixed-λ̄ and "
                          "uncounted runs are what the tuned runs are compared with)")
    if float(tc.pivot_lam) not in s.lam:
        raise ConfigError(f"tuning.pivot_lam = {tc.pivot_lam} (the public λ̄) is not in "
                          f"sweep.lam {s.lam}; add it so the fixed-λ̄ baseline is run")


def load_sweep_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()
                      ) -> SweepConfig:
    """Read and validate a sweep TOML file.

    Parameters
    ----------
    path : str or Path
        The sweep file (paths in it are relative to its directory); see
        ``examples/school-quick.toml``.
    overrides : sequence of str, default ()
        ``SECTION.KEY=VALUE`` items applied on top, as ``silofl sweep --set`` does: any
        key of a run config, [sweep] or [report].

    Returns
    -------
    SweepConfig
        The base job, the grid of ε, methods and seeds, and the report settings.

    Raises
    ------
    ConfigError
        An unknown key or an invalid value, naming the file or the ``--set`` item.
    """
    root = Path(path).resolve().parent  # one rule for every config: relative to its folder
    raw = resolve_config_paths(read_toml(path, "sweep config"), root)
    raw = check_config_paths(apply_overrides(raw, overrides, model=SweepFile))
    return sweep_config_from_dict(raw, root, where_set(path, overrides, "sweep config"))


__all__ = ["LAMBDA_METHODS", "ReportSection", "SweepConfig", "SweepSection",
           "load_sweep_config", "sweep_config_from_dict", "validate_sweep"]

"""The sweep's own sections: the [sweep] grid and [report] settings (a sweep file is a run
config, `silofl.config.run`, plus these). The grid's numbers are checked here; which
methods exist (and sweep.methods) is the algorithm registry's business
(`silofl.experiments.sweep_config`).
"""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import Field, model_validator

from silofl.config.base import Section
from silofl.config.run import Config
from silofl.errors import ConfigError

__all__ = ["SWEEP_ENGINES", "SWEEP_MODES", "ReportSection", "SweepFile", "SweepSection",
           "check_engine"]

#: sweep.tuning: how hyperparameters are chosen (see `SweepSection.tuning`)
SWEEP_MODES = ("none", "private", "proxy", "uncounted")

#: sweep.engine: where the runs execute (see `SweepSection.engine`)
SWEEP_ENGINES = ("local", "ray")


class SweepSection(Section):
    """[sweep]: methods × ε (+ non-private) × λ × lr × seeds, and how a setting is chosen."""

    section: ClassVar[str] = "sweep"
    methods: list = Field(default_factory=lambda: ["local", "fedavg", "mrmtl"])
    epsilon: list = Field(default_factory=lambda: [1.0])  # per-silo target ε, same for all
    nonprivate: bool = False       # also run every method without DP (reference only)
    lam: list = Field(default_factory=lambda: [0.1])  # only for LAMBDA_METHODS
    lr: list = Field(default_factory=lambda: [0.1])
    seeds: list = Field(default_factory=lambda: [0])
    validation_fraction: float = 0.2  # of each silo's training rows, for selection
    min_silo_train: int = 0        # drop silos with fewer training rows (after validation)
    workers: int = 2               # processes (engine "ray": runs in flight at once)
    #: where runs execute: "local" (worker processes on this machine) or "ray" (tasks on a
    #: Ray cluster; the budget store and the results file stay with this process)
    engine: str = "local"
    address: str = ""              # engine "ray": an existing cluster; "" = start a local one
    results: str = "results.jsonl"
    #: hyperparameter choice: "uncounted" (the grid, best on validation; its cost is NOT
    #: counted), "none" (one fixed setting per method), "private" (also run
    #: [tuning] method privately tuned: random h, best-only; silofl.tuning), "proxy" (also
    #: run [tuning] method with λ chosen on the declared-public [tuning] proxy: free)
    tuning: str = "uncounted"

    @model_validator(mode="after")
    def _check_grid(self) -> SweepSection:
        self.epsilon = _number_list(self.epsilon, "sweep.epsilon", positive=True)
        self.lam = _lam_list(self.lam)
        self.lr = _number_list(self.lr, "sweep.lr", positive=True)
        self.seeds = _number_list(self.seeds, "sweep.seeds", integer=True)
        if not 0 < self.validation_fraction < 1:
            raise ConfigError(f"'sweep.validation_fraction' must be in (0, 1), got "
                              f"{self.validation_fraction}; e.g. 0.2 keeps 80% of each "
                              "silo's training rows for training")
        if self.min_silo_train < 0:
            raise ConfigError(f"'sweep.min_silo_train' must be ≥ 0, got {self.min_silo_train}")
        if self.workers < 1:
            raise ConfigError(f"'sweep.workers' must be ≥ 1, got {self.workers}")
        check_engine(self.engine, self.address)
        if self.tuning not in SWEEP_MODES:
            raise ConfigError(f"'sweep.tuning' must be one of {', '.join(SWEEP_MODES)}, got "
                              f"{self.tuning!r}")
        if self.tuning == "none" and (len(self.lam) > 1 or len(self.lr) > 1):
            raise ConfigError("sweep.tuning = 'none' runs one fixed, public setting per "
                              f"method: give one value in sweep.lam (got {self.lam}) and "
                              f"sweep.lr (got {self.lr}), or use tuning = 'private' / "
                              "'uncounted'")
        if not self.results.strip():
            raise ConfigError("'sweep.results' is empty; name a results file, e.g. "
                              "results = \"results/sweep.jsonl\"")
        return self


def check_engine(engine: str, address: str) -> None:
    """Raise ConfigError unless `engine` is one of SWEEP_ENGINES and `address` is used only
    with engine "ray".

    Parameters
    ----------
    engine : str
        sweep.engine or ``--engine``.
    address : str
        sweep.address or ``--address`` ("" = none).
    """
    if engine not in SWEEP_ENGINES:
        raise ConfigError(f"'sweep.engine' must be one of {', '.join(SWEEP_ENGINES)}, got "
                          f"{engine!r}")
    if address.strip() and engine != "ray":
        raise ConfigError(f"'sweep.address' = {address!r} names a Ray cluster, but "
                          f"sweep.engine = {engine!r}; set engine = \"ray\" (--engine ray) or "
                          "remove the address")


class ReportSection(Section):
    """[report]: presentation of a sweep's figures."""

    section: ClassVar[str] = "report"
    epsilon: float | None = None   # ε of the λ and over-rounds figures (default: middle ε)


def _lam_list(value: list) -> list:
    """sweep.lam: distinct numbers ≥ 0 and at most one "auto" (λ_k from the released
    updates, MR-MTL and Ditto), in the order given."""
    if not isinstance(value, list):
        raise ConfigError(f"'sweep.lam' must be a list, e.g. [0.1, 1, \"auto\"], got {value!r}")
    for v in value:
        if isinstance(v, str) and v != "auto":
            hint = ("write it exactly as \"auto\"" if v.strip().lower() == "auto" else
                    "give numbers ≥ 0 or \"auto\"")
            raise ConfigError(f"'sweep.lam' holds {v!r}: {hint}")
    if value.count("auto") > 1:
        raise ConfigError("'sweep.lam' lists \"auto\" more than once; list it once")
    numbers = [v for v in value if v != "auto"]
    checked = iter(_number_list(numbers, "sweep.lam") if numbers or not value else [])
    return [v if v == "auto" else next(checked) for v in value]


def _number_list(value: list, where: str, *, positive: bool = False,
                 integer: bool = False) -> list:
    """A non-empty list of distinct finite numbers ≥ 0 (> 0 with `positive`)."""
    if not value:
        raise ConfigError(f"'{where}' is empty; give at least one value, e.g. {where} = [1]")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                integer and not isinstance(v, int):
            kind = "integers" if integer else "numbers"
            raise ConfigError(f"'{where}' must be a list of {kind}, got {v!r} in {value!r}")
        if not math.isfinite(v):
            raise ConfigError(f"'{where}' holds {v!r}; use finite values")
        if positive and not v > 0:
            raise ConfigError(f"'{where}' must hold positive values, got {v!r}")
        if v < 0:
            raise ConfigError(f"'{where}' must hold non-negative values, got {v!r}")
        out.append(v if integer else float(v))
    dup = sorted({v for v in out if out.count(v) > 1})
    if dup:
        raise ConfigError(f"'{where}' lists {dup} more than once; list every value once")
    return out


class SweepFile(Config):
    """The sections a sweep file may hold: a run's plus [sweep] and [report] (the keys
    ``silofl sweep --set`` accepts). `silofl.experiments.sweep_config` validates them."""

    sweep: SweepSection = Field(default_factory=SweepSection)
    report: ReportSection = Field(default_factory=ReportSection)

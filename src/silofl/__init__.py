"""silofl: private, personalized cross-silo federated learning.

The public API is the names in ``__all__`` below, importable from ``silofl`` itself::

    import silofl
    # every silo needs its own target (ε, δ): example-level DP, add/remove one record
    fed = silofl.load_heart_disease(seed=0).with_targets(silofl.PrivacyTarget(1.0, 1e-4))
    model = silofl.make_model("logistic", fed.dim)
    store = silofl.BudgetStore("budget.sqlite")  # each silo's lifetime budget, charged first
    result = silofl.simulate(fed, model, silofl.make_algorithm("mrmtl"),
                             silofl.TrainingConfig(rounds=30, batch_size=16, lr=0.03),
                             store=store)
    print(result.final_pooled)

Everything else (every submodule and any name starting with ``_``) is private by
convention: it may change in any release without notice (see the versioning policy in the
documentation). The names are resolved lazily (PEP 562), so ``import silofl`` stays cheap:
it imports neither numpy-heavy modules nor torch, flwr or pandas until a name is used —
a Flower ClientApp process imports silofl for every message.
"""

from __future__ import annotations

import importlib

from silofl._version import __version__

# not `from typing import TYPE_CHECKING`: importing typing alone costs ~6 ms per process
# start; type checkers and griffe treat a module-level TYPE_CHECKING = False the same way
TYPE_CHECKING = False

#: public name -> (module that defines it today, attribute there). The one place to update
#: when a module moves; the TYPE_CHECKING block below mirrors it for type checkers and docs.
_API: dict[str, tuple[str, str]] = {
    # errors
    "SiloflError": ("silofl.errors", "SiloflError"),
    "ConfigError": ("silofl.errors", "ConfigError"),
    "DataError": ("silofl.errors", "DataError"),
    "PrivacyError": ("silofl.errors", "PrivacyError"),
    "CalibrationError": ("silofl.errors", "CalibrationError"),
    "BudgetExceeded": ("silofl.errors", "BudgetExceeded"),
    "BudgetStoreError": ("silofl.privacy.budget", "BudgetStoreError"),
    # federations and data loading
    "Federation": ("silofl.data.federation", "Federation"),
    "Silo": ("silofl.data.federation", "Silo"),
    "PrivacyTarget": ("silofl.privacy.targets", "PrivacyTarget"),
    "Schema": ("silofl.data.schema", "Schema"),
    "load_schema": ("silofl.data.schema", "load_schema"),
    "load_table": ("silofl.data.tabular", "load_table"),
    "federation_from_frame": ("silofl.data.tabular", "federation_from_frame"),
    "split_table": ("silofl.data.splitters", "split_table"),
    "load_heart_disease": ("silofl.data.heart", "load_heart_disease"),
    "ehr_silos": ("silofl.data.ehr", "ehr_silos"),
    # models
    "Model": ("silofl.models.base", "Model"),
    "make_model": ("silofl.models", "make_model"),
    # algorithms
    "Algorithm": ("silofl.algorithms.base", "Algorithm"),
    "make_algorithm": ("silofl.algorithms", "make_algorithm"),
    "METHODS": ("silofl.algorithms", "METHODS"),
    # training in Python (no run directory)
    "TrainingConfig": ("silofl.runtime.plan", "TrainingConfig"),
    "simulate": ("silofl.runtime.simulator", "simulate"),
    "RunResult": ("silofl.runtime.simulator", "RunResult"),
    # jobs as the CLI runs them (configuration, run directory, sweeps)
    "Config": ("silofl.config", "Config"),
    "load_config": ("silofl.config", "load_config"),
    "run": ("silofl.experiments.run", "run"),
    "resume_run": ("silofl.experiments.resume", "resume_run"),
    "RunReport": ("silofl.experiments.run_report", "RunReport"),
    "load_sweep_config": ("silofl.experiments.sweep_config", "load_sweep_config"),
    "run_sweep": ("silofl.experiments.sweep", "run_sweep"),
    "write_report": ("silofl.experiments.report", "write_report"),
    # the lifetime budget store
    "BudgetStore": ("silofl.privacy.budget", "BudgetStore"),
    # accounting
    "dpsgd_event": ("silofl.privacy.accounting", "dpsgd_event"),
    "epsilon": ("silofl.privacy.accounting", "epsilon"),
    "epsilons": ("silofl.privacy.accounting", "epsilons"),
    "calibrate": ("silofl.privacy.accounting", "calibrate"),
    "calibrate_dpsgd": ("silofl.privacy.accounting", "calibrate_dpsgd"),
    # persons: what example level gives a person, what a person in m silos is guaranteed
    "group_bound": ("silofl.privacy.group", "group_bound"),
    "example_level_person_epsilon": ("silofl.privacy.group", "example_level_person_epsilon"),
    "person_composition": ("silofl.privacy.person_composition", "person_composition"),
    # empirical audit ("audit" itself is the subpackage silofl.audit, so the function is
    # exported as run_audit: a package attribute cannot be both)
    "run_audit": ("silofl.audit.tabular", "audit"),
    "AuditReport": ("silofl.audit.engine", "AuditReport"),
    "write_audit": ("silofl.audit.report", "write_audit"),
    # saved models
    "load_run": ("silofl.experiments.artifacts", "load_run"),
    "SavedRun": ("silofl.experiments.artifacts", "SavedRun"),
    "Predictor": ("silofl.experiments.artifacts", "Predictor"),
}

#: the public API, sorted (a literal: linters, type checkers and the docs
#: read it without running this module; a test checks it against `_API`)
__all__ = [
    "METHODS",
    "Algorithm",
    "AuditReport",
    "BudgetExceeded",
    "BudgetStore",
    "BudgetStoreError",
    "CalibrationError",
    "Config",
    "ConfigError",
    "DataError",
    "Federation",
    "Model",
    "Predictor",
    "PrivacyError",
    "PrivacyTarget",
    "RunReport",
    "RunResult",
    "SavedRun",
    "Schema",
    "Silo",
    "SiloflError",
    "TrainingConfig",
    "__version__",
    "calibrate",
    "calibrate_dpsgd",
    "dpsgd_event",
    "ehr_silos",
    "epsilon",
    "epsilons",
    "example_level_person_epsilon",
    "federation_from_frame",
    "group_bound",
    "load_config",
    "load_heart_disease",
    "load_run",
    "load_schema",
    "load_sweep_config",
    "load_table",
    "make_algorithm",
    "make_model",
    "person_composition",
    "resume_run",
    "run",
    "run_audit",
    "run_sweep",
    "simulate",
    "split_table",
    "write_audit",
    "write_report",
]

if TYPE_CHECKING:  # pragma: no cover - what type checkers and mkdocstrings read
    from typing import Any

    from silofl.algorithms import METHODS, make_algorithm
    from silofl.algorithms.base import Algorithm
    from silofl.audit.engine import AuditReport
    from silofl.audit.report import write_audit
    from silofl.audit.tabular import audit as run_audit
    from silofl.config import Config, load_config
    from silofl.data.ehr import ehr_silos
    from silofl.data.federation import Federation, Silo
    from silofl.data.heart import load_heart_disease
    from silofl.data.schema import Schema, load_schema
    from silofl.data.splitters import split_table
    from silofl.data.tabular import federation_from_frame, load_table
    from silofl.errors import (
        BudgetExceeded,
        CalibrationError,
        ConfigError,
        DataError,
        PrivacyError,
        SiloflError,
    )
    from silofl.experiments.artifacts import Predictor, SavedRun, load_run
    from silofl.experiments.report import write_report
    from silofl.experiments.resume import resume_run
    from silofl.experiments.run import run
    from silofl.experiments.run_report import RunReport
    from silofl.experiments.sweep import run_sweep
    from silofl.experiments.sweep_config import load_sweep_config
    from silofl.models import make_model
    from silofl.models.base import Model
    from silofl.privacy.accounting import (
        calibrate,
        calibrate_dpsgd,
        dpsgd_event,
        epsilon,
        epsilons,
    )
    from silofl.privacy.budget import BudgetStore, BudgetStoreError
    from silofl.privacy.group import example_level_person_epsilon, group_bound
    from silofl.privacy.person_composition import person_composition
    from silofl.privacy.targets import PrivacyTarget
    from silofl.runtime.plan import TrainingConfig
    from silofl.runtime.simulator import RunResult, simulate


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562) and keep it in the module namespace."""
    try:
        module, attr = _API[name]
    except KeyError:
        raise AttributeError(f"module 'silofl' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

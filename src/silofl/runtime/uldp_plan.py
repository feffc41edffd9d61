"""Plans for a consortium-wide mechanism (ULDP-FL weighting, `algorithms.uldp`): one σ for
every silo, calibrated so that the aggregate's R Gaussian rounds meet every silo's target
(the strictest decides), and each plan's report of both figures (`privacy.uldp`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from silofl.errors import ConfigError, PrivacyError
from silofl.privacy import uldp
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.job import accountant_kind

if TYPE_CHECKING:
    from silofl.algorithms.base import Algorithm


class _Plan(Protocol):
    """What this module fills in a `runtime.plan.SiloPlan` (plan imports this module)."""

    name: str
    q: float
    steps_per_pass: int
    target: PrivacyTarget | None
    noise_multiplier: float | None
    declared: object
    calibrated_for: str
    consortium: dict | None


class _Config(Protocol):
    """The `runtime.plan.TrainingConfig` settings a consortium plan reads."""

    @property
    def rounds(self) -> int: ...

    @property
    def private(self) -> bool: ...

    @property
    def privacy_unit(self) -> str: ...

    @property
    def accountant(self) -> str: ...

    @property
    def noise_multiplier(self) -> float | None: ...

    @property
    def clip(self) -> float | str: ...


def plan_consortium(algorithms: list[Algorithm], plans: Sequence[_Plan], cfg: _Config,
                    extra: dict | None) -> None:
    """Fill the plans of a consortium-wide method: one step per round over its persons
    (q: the method's `sample_rate`, 1 = all), σ for the aggregate, each silo's declared
    event the aggregate's R rounds.

    Parameters
    ----------
    algorithms : list of Algorithm
        Exactly one, with ``consortium = True``.
    plans : sequence of SiloPlan
        Its base plans (`plan._base_plans`), filled in here.
    cfg : TrainingConfig
    extra : dict or None
        Preprocessing events (refused: the method runs as a job of its own).

    Raises
    ------
    ConfigError
        Other methods or preprocessing in the job, a unit other than "person", clip = "auto".
    """
    alg = algorithms[0]
    if len(algorithms) > 1 or extra:
        raise ConfigError(f"{alg.name}: one σ serves the whole consortium, so it runs as a "
                          "job of its own, without other methods or private preprocessing "
                          f"(training.methods = ['{alg.name}'])")
    if cfg.privacy_unit != "person":
        raise ConfigError(f"{alg.name} weights persons across silos: set [privacy] unit = "
                          "\"person\" and [data] person_column")
    if cfg.clip == "auto":
        raise ConfigError(f"{alg.name}: clip = \"auto\" is not available (the aggregate's "
                          "sensitivity is the fixed clip C); set [training] clip to a number")
    q = float(getattr(alg, "sample_rate", 1.0))  # persons, the same in every silo
    for p in plans:  # one gradient step per round (FedSGD)
        p.q, p.steps_per_pass = q, 1
    if not cfg.private:
        return
    targets = []
    for p in plans:
        if p.target is None:
            raise PrivacyError(f"silo {p.name!r} has no privacy target")
        targets.append(p.target)
    sigma = cfg.noise_multiplier or uldp.calibrate_sigma(targets, cfg.rounds,
                                                         accountant_kind(cfg.accountant), q)
    for p, target in zip(plans, targets):
        p.noise_multiplier = sigma
        p.declared = alg.privacy_events(uldp.round_event(sigma, q), cfg.rounds,
                                        target=p.target)
        p.calibrated_for = (f"{alg.name}: one σ for the consortium's aggregate (the strictest "
                            "silo target), SecAgg+ sum")
        p.consortium = uldp.consortium_report(sigma, len(plans), cfg.rounds, target, q)

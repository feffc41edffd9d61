"""The audit engine: one-run and multi-run audits of any training mechanism, with the
mechanism and its canaries as a plug-in (`Mechanism`).

* one run: m canaries per audited unit (a silo, a region), each included with probability
  ½ (the auditor's own coin flips), one training job with every audited unit's canaries;
  each canary is scored on the released models and the guesses turn into a bound by
  `silofl.audit.bounds.one_run_audit`.
* many runs: neighbouring datasets D and D′ (D with one canary in), `runs` jobs each,
  interleaved so a drift in time cannot pose as a signal; statistics of the released
  models feed `bounds.multi_run_epsilon`.

With several audited units each bound is taken at 1 − (1 − confidence)/K (Bonferroni), so
`confidence` is family-wise. The plug-ins: `silofl.audit.tabular` (a `silofl run` job over
a table, example-level) and `silofl.pandemic.audit` (the pandemic pipeline, node-level).
This module knows neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from silofl.audit.bounds import multi_run_epsilon, one_run_audit
from silofl.errors import ConfigError

KINDS = ("one-run", "multi-run")
AUDIT_NOTE = ("audit: canary runs measure the guarantee empirically; their models are not "
              "a release and are not saved")
LOWER_BOUND_NOTE = ("an empirical lower bound: a bound above the claimed ε proves a "
                    "violation (at the stated confidence); a bound below it proves nothing "
                    "about the guarantee — it only says this attack did not refute it")
#: the smallest multi-run audit: half the runs choose the test, half bound it
MIN_RUNS = 8

Progress = Callable[[int, int], None]


@dataclass
class SiloAudit:
    """One silo's audit: the job's claimed ε for it (all methods composed, what its privacy
    report states), the rigorous empirical lower bound at `confidence`, and (server view)
    the lower end of the estimate's interval — an estimate, labelled as such."""

    silo: str
    claimed_epsilon: float
    target_epsilon: float
    delta: float
    lower_bound: float
    details: dict = field(default_factory=dict)
    estimate_lower: float | None = None

    @property
    def violation(self) -> bool:
        """A rigorous bound, or the estimate's lower end, above the claim."""
        return self.lower_bound > self.claimed_epsilon or (
            self.estimate_lower is not None and self.estimate_lower > self.claimed_epsilon)

    def to_dict(self) -> dict:
        return {"silo": self.silo, "claimed_epsilon": self.claimed_epsilon,
                "target_epsilon": self.target_epsilon, "delta": self.delta,
                "lower_bound": self.lower_bound, "estimate_lower": self.estimate_lower,
                "violation": self.violation, "details": self.details}


@dataclass
class AuditReport:
    """What `run_audit` returns.

    Attributes
    ----------
    kind : str
        "one-run" or "multi-run".
    rows : list of SiloAudit
        Per silo: claimed ε, target, δ, the empirical lower bound, details.
    methods : list of str
        The job's methods.
    notes : list of str
        What every reader must be told (seeded noise, scratch store, ...).
    store : str or None
        The budget store charged.
    scratch : bool
        Charged to a scratch store.
    run_ids : list of str
        The store's ids of the audit's runs.
    seconds : float
        Wall-clock time.
    confidence : float
        Confidence of the lower bounds.
    noise : str
        The noise mode.
    neighbouring : str
        The neighbouring relation the claim is for (the accountant's, made concrete).
    """

    kind: str
    rows: list[SiloAudit]
    methods: list[str]
    notes: list[str]
    store: str | None
    scratch: bool
    run_ids: list[str]
    seconds: float
    confidence: float
    noise: str
    #: the neighbouring relation the claim is for (the accountant's, made concrete)
    neighbouring: str = ""
    #: what the attacker sees: "server" (white box) or "model" (black box)
    view: str = "model"

    @property
    def violations(self) -> list[str]:
        return [r.silo for r in self.rows if r.violation]

    def to_dict(self) -> dict:
        """The report as audit.json records it.

        Returns
        -------
        dict
            Kind, confidence, notes, budget store, violations, and one entry per silo.
        """
        return {"kind": self.kind, "view": self.view, "confidence": self.confidence,
                "methods": self.methods,
                "noise": self.noise, "notes": self.notes, "budget_store": self.store,
                "scratch_store": self.scratch, "run_ids": self.run_ids,
                "seconds": self.seconds, "violations": self.violations,
                "what_it_means": LOWER_BOUND_NOTE,
                "neighbouring_relation": self.neighbouring,
                "silos": [r.to_dict() for r in self.rows]}


@dataclass(frozen=True)
class Claim:
    """What a job's privacy report claims for one unit: ε spent (all methods composed),
    the target ε it was planned for, and δ."""

    epsilon: float
    target_epsilon: float
    delta: float


class OneRunJob(Protocol):
    """A finished one-run job: each audited unit's canary scores and claim."""

    def scores(self, unit: str) -> dict[str, np.ndarray]:
        """Score name -> (m,) scores of the unit's canaries (higher: guessed "in")."""

    def claim(self, unit: str) -> Claim:
        """The job's claim for `unit`."""


class Mechanism(Protocol):
    """The plug-in: a training mechanism under audit and its canaries.

    `draw` makes (and validates) a unit's canaries; `run_one` trains once on the data
    with every chosen canary "in" per its coin flip; `neighbours` prepares D and D′ for a
    multi-run audit and `run_neighbour` trains one of them on a scratch store.
    Everything that can fail on bad input must fail in `draw`, `prepare_one` or
    `neighbours`, before any budget is reserved.
    """

    def draw(self, unit: str, canaries: Any, rng: np.random.Generator) -> Any:
        """The unit's canaries (anything with an `m`, the number of canaries)."""

    def prepare_one(self, chosen: dict[str, tuple[Any, np.ndarray]]) -> Any:
        """The one-run job for the chosen canaries and coin flips (unit -> (c, included))."""

    def run_one(self, prepared: Any) -> OneRunJob:
        """Run the prepared one-run job (charged as the plug-in decides)."""

    def neighbours(self, unit: str, canary: Any) -> tuple[Any, Any]:
        """(D, D′) for `unit` and its one canary, planned and validated."""

    def run_neighbour(self, unit: str, pair: tuple[Any, Any],
                      which: int) -> tuple[dict[str, float], Claim]:
        """Train on pair[which] (0: D, 1: D′) on a scratch store; (statistics, claim)."""


def check_kind(kind: str) -> None:
    """Refuse an unknown audit kind (ConfigError)."""
    if kind not in KINDS:
        raise ConfigError(f"unknown audit kind {kind!r}; choose one of {', '.join(KINDS)}")


def check_confidence(confidence: float) -> None:
    """Refuse a confidence outside [0.5, 1) (ConfigError)."""
    if not 0.5 <= confidence < 1:
        raise ConfigError(f"confidence must be in [0.5, 1), got {confidence}")


def check_runs(runs: int) -> None:
    """Refuse a multi-run audit with fewer than `MIN_RUNS` runs per dataset."""
    if runs < MIN_RUNS:
        raise ConfigError(f"a multi-run audit needs at least {MIN_RUNS} runs per dataset (half "
                          f"choose the test, half bound it), got {runs}")


def canary_count(canaries: int | None, default: int) -> int:
    """A one-run audit's number of canaries m (`default` when not given); at least 2."""
    m = int(canaries) if canaries is not None else default
    if m < 2:
        raise ConfigError(f"a one-run audit needs at least 2 canaries (--canaries), got {m}")
    return m


def per_unit(confidence: float, k: int) -> float:
    """Each of k audited units' bound at 1 − (1 − confidence)/k (Bonferroni), so that the
    chance of flagging *any* unit whose claim holds stays below 1 − confidence (exactly
    `confidence` for k = 1 and confidence in [0.5, 1))."""
    return 1 - (1 - confidence) / k


def one_run(mech: Mechanism, units: list[str], canaries: Any, confidence: float,
            rng: np.random.Generator, on_progress: Progress | None = None
            ) -> tuple[list[SiloAudit], Any, OneRunJob]:
    """A one-run audit of `units` through `mech`.

    Parameters
    ----------
    mech : the plug-in.
    units : the audited units, in output order.
    canaries : what `mech.draw` takes (a count, explicit canaries, or None).
    confidence : family-wise confidence in [0.5, 1).
    rng : the canaries and coin flips (drawn unit by unit: canaries, then flips).
    on_progress : called with (0, 1) before the job and (1, 1) after it.

    Returns
    -------
    (rows, the prepared job, the finished job); each row's details are
    `bounds.one_run_audit`'s.
    """
    chosen = {}
    for unit in units:
        c = mech.draw(unit, canaries, rng)
        chosen[unit] = (c, rng.random(c.m) < 0.5)
    prepared = mech.prepare_one(chosen)
    if on_progress:
        on_progress(0, 1)
    job = mech.run_one(prepared)
    if on_progress:
        on_progress(1, 1)
    rows = []
    for unit, (_c, inc) in chosen.items():
        claim = job.claim(unit)
        res = one_run_audit(job.scores(unit), inc, claim.delta,
                                   per_unit(confidence, len(chosen)))
        rows.append(SiloAudit(unit, claim.epsilon, claim.target_epsilon, claim.delta,
                              res["epsilon"], res))
    return rows, prepared, job


def multi_run(mech: Mechanism, units: list[str], canary: Any, runs: int,
              confidence: float, on_progress: Progress | None = None) -> list[SiloAudit]:
    """A multi-run audit of each of `units` with one `canary` through `mech`.

    Parameters
    ----------
    mech : the plug-in.
    units : the audited units; each gets its own D and D′ (all planned before any job).
    canary : the one canary, as `mech.neighbours` takes it.
    runs : jobs on each of D and D′ per unit (at least `MIN_RUNS`).
    confidence : family-wise confidence in [0.5, 1).
    on_progress : called with (jobs done, 2 · runs · len(units)) after each job.

    Returns
    -------
    One row per unit: claimed ε the largest over its jobs, details
    `bounds.multi_run_epsilon`'s with "runs".
    """
    pairs = {unit: mech.neighbours(unit, canary) for unit in units}
    total, done = 2 * runs * len(units), 0
    rows = []
    for unit, pair in pairs.items():
        stats: tuple[dict, dict] = ({}, {})
        eps, claim = 0.0, None
        for i in range(2 * runs):
            which = i % 2  # interleaved, so a drift in time cannot pose as a signal
            out, claim = mech.run_neighbour(unit, pair, which)
            eps = max(eps, claim.epsilon)
            for key, v in out.items():
                stats[which].setdefault(key, []).append(v)
            done += 1
            if on_progress:
                on_progress(done, total)
        assert claim is not None  # runs ≥ MIN_RUNS
        res = multi_run_epsilon({k: np.array(v) for k, v in stats[0].items()},
                                       {k: np.array(v) for k, v in stats[1].items()},
                                       claim.delta, per_unit(confidence, len(units)))
        res["runs"] = runs
        # the threshold is a value of a released statistic (a model coordinate, the canary's
        # loss) from runs on the unit's data on scratch stores, uncharged: not reported
        res.pop("threshold", None)
        rows.append(SiloAudit(unit, eps, claim.target_epsilon, claim.delta,
                              res["epsilon"], res))
    return rows

"""Person-level audits: canary *persons*, several rows each, put in or taken out whole.

The server-view audit (`audit.server`, `audit.whitebox`) with its canaries made persons:
canary i of an audited silo owns r_i rows (default 3 to 8, the auditor's draw), every row
a Dirac gradient of norm 8·C along the canary's own auditing-only coordinate (the rows of
one person pointing the same way: the worst case for a group). The auditor's coin flip
puts *all* of a canary's rows in, or none. What a canary adds to a step depends on the
privacy unit of the audited run:

* person level: the canary person joins the step with the persons' rate q = b/n_persons;
  its rows are read and weighed by the run's own data source (`PersonSource.expand`, on an
  index of the canary persons: the same code that weighs the silo's persons) and each
  row is clipped by the run's rule, so a person adds Σ_i w_i·clip_C(g_i) — C when the
  weights are 1/r, r·C when a broken source weighs every row 1 (`UnitWeights`).
* example level: every row of the canary person joins on its own with the rows' rate
  q = b/n_rows and adds clip_C(g_i) = C: the person is protected only row by row (group
  privacy), and the same attack sees up to r·C.

The verdict compares the rigorous lower bound (`server.assess`) with the run's claim for
its own unit: a person-level run's ε per person, an example-level run's ε per row — which
a person with r rows exceeds (`test_audit_person`: the demonstration that example-level
DP under-protects persons).

`weighting_check` is the person-level twin of `whitebox.clipping_check`: synthetic
persons (public random features, one row repeated r times) go through the run's source
and the *model's* weighted clipped sum, so a model that ignores the float row weights —
a fault the canaries cannot see, since their rows never reach the model — is caught too.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np

import silofl.audit.server as server
from silofl.audit.engine import AUDIT_NOTE, AuditReport, check_confidence
from silofl.audit.jobs import claim_of
from silofl.audit.whitebox import NORM_FACTOR, AuditedModel, DiracCanaries
from silofl.errors import ConfigError
from silofl.privacy.budget import BudgetStore
from silofl.privacy.targets import ADJACENCY, PERSON_ADJACENCY
from silofl.runtime.plan import plan_silos
from silofl.runtime.simulator import simulate
from silofl.runtime.sources import training_source
from silofl.training.persons import PersonIndex, PersonSource
from silofl.training.silo_data import SiloArrays

#: rows per canary person when not given: each canary draws r uniformly in [3, 8]
DEFAULT_ROWS = (3, 8)
#: the most rows of one canary person (the probe's per-step work grows with them)
MAX_ROWS = 1000
UNITS = ("person", "example")

PERSON_NOTE = ("person-level attack: m canary persons per audited silo, r rows each, every "
               "row a Dirac gradient (8·C) along the person's own auditing-only coordinate; "
               "all of a person's rows in or out by the auditor's coin flip. Person level: "
               "the person joins with the persons' q and its rows are weighed by the run's "
               "own data source and clipped by its rule; example level: each row joins with "
               "the rows' q and adds C")


def canary_rows(rows: int | tuple[int, int], m: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of each of m canary persons.

    Parameters
    ----------
    rows : int or (int, int)
        Every canary r rows, or r uniform in [lo, hi] (the auditor's draw, public).
    m : int
        Canary persons.
    rng : numpy.random.Generator
        The auditor's coins.

    Returns
    -------
    numpy.ndarray
        (m,) int64, each in [1, MAX_ROWS].

    Raises
    ------
    ConfigError
        Rows outside [1, MAX_ROWS] or lo > hi.
    """
    lo, hi = (rows, rows) if isinstance(rows, (int, np.integer)) else tuple(rows)
    if not (isinstance(lo, (int, np.integer)) and isinstance(hi, (int, np.integer))
            and 1 <= lo <= hi <= MAX_ROWS):
        raise ConfigError(f"rows per canary person must be an integer or a range (lo, hi) "
                          f"with 1 ≤ lo ≤ hi ≤ {MAX_ROWS}, got {rows!r}")
    return rng.integers(int(lo), int(hi) + 1, size=m).astype(np.int64)


class UnitWeights(PersonSource):
    """A deliberately broken person source (the self-test only, never shipped for
    training): every read row of a sampled person weighs 1 instead of 1/r, so a person
    adds up to r·C while the accounting still assumes C."""

    def expand(self, silos: np.ndarray, persons: np.ndarray,
               mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx, w = super().expand(silos, persons, mask)
        return idx, (w > 0).astype(float)


class CanaryPersons(DiracCanaries):
    """The step probe with canary persons (see the module docstring).

    Parameters
    ----------
    P, included, q, pass_steps, rng, weaken
        As `whitebox.DiracCanaries`; q (K,) is the run's per-step rate of its unit
        (persons at person level, rows at example level).
    rows : numpy.ndarray
        (m,) rows of each canary person (`canary_rows`).
    unit : {"person", "example"}
        The audited run's privacy unit.
    source_class : type, default PersonSource
        Person level: the run's data source class; the canaries' rows are weighed by its
        `expand` over an index of the canary persons.
    cap : int, default 0
        The run's `max_rows_per_person` (0: every row of a sampled person).
    """

    def __init__(self, P: int, included: dict[int, np.ndarray], q: np.ndarray,
                 pass_steps: np.ndarray, rng: np.random.Generator, rows: np.ndarray,
                 unit: str, source_class: type = PersonSource, cap: int = 0,
                 weaken=None):
        super().__init__(P, included, q, pass_steps, rng, weaken=weaken)
        if unit not in UNITS:
            raise ConfigError(f"canary persons audit a run at person or example level, "
                              f"got privacy unit {unit!r}")
        self.rows, self.unit = np.asarray(rows, dtype=np.int64), unit
        if self.rows.shape != (self.m,):
            raise ValueError(f"rows must be ({self.m},), got {self.rows.shape}")
        self.owner = np.repeat(np.arange(self.m), self.rows)  # canary of each canary row
        index, _ = PersonIndex.group([self.owner], cap)  # already sorted by person
        self.source = source_class(None, index, int(rng.integers(2**31)))

    def add(self, rule, silos: np.ndarray, clipped: np.ndarray) -> None:
        size = float(rule.clipped_norm(NORM_FACTOR * rule.clip))
        for j, k in enumerate(np.atleast_1d(silos)):
            inc = self.included.get(int(k))
            if inc is not None:
                clipped[j, self.P:] += size * self.weight(int(k), inc)

    def weight(self, k: int, inc: np.ndarray) -> np.ndarray:
        """(m,) each canary's total row weight at one step of silo k (0 when it is out or
        not sampled): what multiplies the clipped row norm."""
        if self.unit == "example":  # each row sampled on its own
            joined = self.rng.random(self.owner.size, dtype=np.float32) < self.q[k]
            return np.bincount(self.owner, weights=joined, minlength=self.m) * inc
        persons = np.flatnonzero((self.rng.random(self.m, dtype=np.float32) < self.q[k]) & inc)
        if not persons.size:
            return np.zeros(self.m)
        idx, w = self.source.expand(np.zeros(1, dtype=np.int64), persons[None, :],
                                    np.ones((1, persons.size), dtype=bool))
        return np.bincount(self.owner[idx[0]], weights=w[0], minlength=self.m)


def weighting_check(source_class: type, rule, model, shape: tuple, task: str, classes: int,
                    rng: np.random.Generator, rows: int = 8, cap: int = 0) -> dict:
    """Does a person's weighted contribution stay within C through the model's own code?

    Synthetic persons with 1 … `rows` identical rows (public random features at scales
    0.1 … 1000, random labels: every row's gradient the same, the worst case for a group)
    are weighed by `source_class` and summed by `rule.clipped_sum` (the model's weighted
    clipped sum) one person at a time, at the model's start and at a random point.

    Parameters
    ----------
    source_class : type
        The run's person source class (`PersonSource` or a weakened copy).
    rule : GradientRule
        The run's rule (its clip C and clipped sum).
    model : Model
        The run's model (not the audited wrapper).
    shape : tuple
        One row's feature shape.
    task : str
        The federation's task.
    classes : int
        Its number of classes.
    rng : numpy.random.Generator
        The synthetic persons' features and labels.
    rows : int, default 8
        The most rows of a synthetic person.
    cap : int, default 0
        The run's `max_rows_per_person`.

    Returns
    -------
    dict
        "persons" checked, "largest_norm", "clip", "ratio" (largest norm / C) and "ok".
    """
    counts = np.repeat(np.arange(1, rows + 1), 3)
    n = counts.size
    scales = np.logspace(-1, 3, n)
    X1 = rng.normal(size=(n,) + tuple(shape)) * scales.reshape((-1,) + (1,) * len(shape))
    y1 = (rng.normal(size=n) if task == "regression"
          else rng.integers(0, max(classes, 2), size=n).astype(float))
    owner = np.repeat(np.arange(n), counts)
    index, _ = PersonIndex.group([owner], cap)
    src = source_class(SiloArrays.stack([X1[owner]], [y1[owner]]), index, 0)
    worst = 0.0
    for w in (model.init_params(), rng.normal(size=model.num_params)):
        for p in range(n):
            idx, wt = src.expand(np.zeros(1, dtype=np.int64), np.array([[p]]),
                                 np.ones((1, 1), dtype=bool))
            X, y, _sq = src.gather(np.zeros(1, dtype=np.int64), idx)
            g = rule.clipped_sum(model, w[None], X, y, wt)
            worst = max(worst, float(np.linalg.norm(g)))
    return {"persons": 2 * n, "largest_norm": worst, "clip": rule.clip,
            "ratio": worst / rule.clip, "ok": worst <= rule.clip * (1 + 1e-9)}


def _targets(fed, silo: str | None) -> list[str]:
    """The audited silos' names (`silo`, else all); ConfigError without an ε claim."""
    names = [fed.silo(silo).name] if silo is not None else list(fed.names)
    for s in fed.silos:
        if s.target is None:
            raise ConfigError(f"silo {s.name!r} has no ε claim; give every silo a "
                              "PrivacyTarget (Federation.with_targets)")
    return names


def _check(fed, tcfg, store: BudgetStore | None, experiment: bool, source_class) -> str:
    """Everything refused before any budget is reserved; returns the unit."""
    if not tcfg.private:
        raise ConfigError("an audit compares a claimed ε with an empirical lower bound; "
                          "this training config is not private (no claim)")
    if tcfg.adaptive_clip:
        raise ConfigError("clip = \"auto\" cannot be audited: the white-box audit assumes "
                          "a fixed clip C; set clip to a number for an audit")
    unit = tcfg.privacy_unit
    if unit not in UNITS:
        raise ConfigError(f"the person-level audit runs at privacy unit 'person' (or "
                          f"'example', to show what a person gets there), got {unit!r}")
    if unit == "person" and not fed.has_persons:
        raise ConfigError("privacy unit 'person' needs the person of every training row: "
                          "build the silos with Silo(..., person_train=ids)")
    if source_class is not None and unit != "person":
        raise ConfigError("a person source (source_class) only exists at person level")
    if experiment and store is not None and not store.scratch:
        raise ConfigError("a weakened mechanism is an experiment with broken privacy: run "
                          "it on a scratch store (BudgetStore(None)), not a real one")
    return unit


def audit_persons(fed, model, algorithm, tcfg, *, silo: str | None = None,
                  canaries: int | None = None, rows: int | tuple[int, int] = DEFAULT_ROWS,
                  confidence: float = 0.95, seed: int | None = None,
                  store: BudgetStore | None = None, weaken=None,
                  source_class: type | None = None) -> AuditReport:
    """The server-view one-run audit of one training run with canary persons.

    Parameters
    ----------
    fed : Federation
        Preprocessed silos with their privacy targets; at person level every silo names
        the person of each training row (`Silo.person_train`).
    model : Model
        The run's model (wrapped here with m auditing-only coordinates).
    algorithm : Algorithm
        The run's method.
    tcfg : TrainingConfig
        The run; `privacy_unit` "person" (the claim is per person) or "example" (the
        claim is per row; the same attack on persons shows what group privacy leaves).
    silo : str, optional
        The audited silo (default: every silo).
    canaries : int, optional
        Canary persons per audited silo (default as the server view, `server.canary_count`).
    rows : int or (int, int), default (3, 8)
        Rows per canary person (`canary_rows`).
    confidence : float, default 0.95
        Family-wise confidence of the bounds, in [0.5, 1).
    seed : int, optional
        The auditor's coins (canaries, flips, sampling); default OS entropy.
    store : BudgetStore, optional
        Where the run is charged (default: a scratch store).
    weaken : callable, optional
        rule → rule, a deliberately weakened DP-SGD step (`whitebox.WEAKENINGS`).
    source_class : type, optional
        Person level: another person source class than `PersonSource` (the self-test's
        `UnitWeights`), used by the trainer and the canaries alike.

    Returns
    -------
    AuditReport
        One row per audited silo: the claim for the run's unit, the rigorous bound, the
        estimate; details add "unit", "canary_rows" and "epsilon_at_sensitivity" (the
        claimed mechanism's ε were one unit to add r·C, r = the most canary rows).
    """
    t0 = time.perf_counter()
    check_confidence(confidence)
    experiment = weaken is not None or source_class is not None
    unit = _check(fed, tcfg, store, experiment, source_class)
    names = _targets(fed, silo)
    m = server.canary_count(canaries, len(names), tcfg.rounds)
    rng = np.random.default_rng(seed)
    r = canary_rows(rows, m, rng)
    plans = plan_silos(fed, algorithm, tcfg)  # ConfigError (method, unit) before any budget
    order = list(fed.names)
    included = {order.index(n): rng.random(m) < 0.5 for n in names}
    cls = PersonSource if source_class is None else source_class
    base = AuditedModel(model, m)
    probe = CanaryPersons(base.P, included, np.array([p.q for p in plans]),
                          np.array([p.steps_per_pass for p in plans]), rng, r, unit, cls,
                          tcfg.max_rows_per_person, weaken)
    src = (training_source(fed.silos, unit, tcfg.max_rows_per_person, tcfg.seed)
           if source_class is None else person_source(fed, tcfg, source_class))
    st = BudgetStore(None) if store is None else store
    res = simulate(fed, base, algorithm, tcfg, plans=plans, store=st, probe=probe,
                   source=src, method=algorithm.name)
    job = SimpleNamespace(raw=fed, plans=[plans], extra={})
    claims = {n: claim_of([res], job, n) for n in names}
    obs = server.observe(job, probe, [res], claims, tcfg.clip, {})
    cross = server.cross_scores(obs)
    check = check_job(probe, model, fed, rng, tcfg.max_rows_per_person)
    out = [with_person_details(server.assess(n, obs[n], confidence, len(names), cross.get(n), check),
                    obs[n], unit, r, tcfg.max_rows_per_person) for n in names]
    notes = [server.SERVER_NOTE, PERSON_NOTE, AUDIT_NOTE,
             "the claim is per person" if unit == "person" else
             "the claim is per row (example level): a canary person's rows are each "
             "protected on their own, and a bound above the claim shows what that leaves "
             "a person with several rows"]
    return AuditReport("one-run", out, [algorithm.name], notes,
                       None if st.path is None else str(st.path), st.scratch,
                       [res.run_id] if res.run_id else [], time.perf_counter() - t0,
                       confidence, tcfg.noise, view="server",
                       neighbouring=PERSON_ADJACENCY if unit == "person" else ADJACENCY)


def person_source(fed, tcfg, source_class: type):
    """The trainer's person source for `fed`, rebuilt as `source_class`.

    Parameters
    ----------
    fed : Federation
        The audited silos (with person ids).
    tcfg : TrainingConfig
        The job's training settings (row cap, seed).
    source_class : type
        A `PersonSource` subclass (the self-test's `UnitWeights`).

    Returns
    -------
    PersonSource
        Of `source_class`, on the rows and index `training_source` builds.
    """
    src = training_source(fed.silos, "person", tcfg.max_rows_per_person, tcfg.seed)
    return source_class(src.rows, src.index, tcfg.seed)


def with_person_details(row, o, unit: str, rows: np.ndarray, cap: int = 0):
    """Add the person-level details to an audit row.

    Parameters
    ----------
    row : SiloAudit
        A `server.assess` row (its ``details`` are updated in place).
    o : Observed
        The silo's observations.
    unit : str
        The audited unit ("person" or "example").
    rows : numpy.ndarray of int, shape (m,)
        Rows per canary person.
    cap : int, default 0
        [privacy] max_rows_per_person (0: all rows).

    Returns
    -------
    SiloAudit
        `row`, with "unit", "canary_rows" (min, max, mean) and "epsilon_at_sensitivity":
        the claimed mechanism's ε were one unit to add r·C, r the most rows a canary
        person contributes (after the cap).
    """
    top = int(rows.max()) if not cap else min(int(rows.max()), cap)
    row.details.update(unit=unit, canary_rows={"min": int(rows.min()), "max": int(rows.max()),
                                               "mean": float(rows.mean())},
                       epsilon_at_sensitivity={str(top): server.true_epsilon_fn(o)(1.0 / top)})
    return row


def _worst(checks: list[dict]) -> dict:
    """The check with the largest norm over C."""
    return max(checks, key=lambda c: c["ratio"])


def plan_probe(p, names: list[str], m: int, rng: np.random.Generator, seed: int | None,
               weaken=None, rows: int | tuple[int, int] = DEFAULT_ROWS,
               source_class: type = PersonSource) -> tuple[AuditedModel, CanaryPersons]:
    """`server.plan_probe` for a prepared person-level job.

    Parameters
    ----------
    p : _Prepared
        The job (`experiments.run._prepare` with [privacy] unit = "person").
    names : list of str
        The audited silos.
    m : int
        Canary persons per audited silo.
    rng : numpy.random.Generator
        Draws which canaries are included.
    seed : int or None
        Seeds the auditor's own coins (None: OS entropy).
    weaken : optional
        The self-test's weakening of the mechanism (None: the claimed one).
    rows : int or (int, int), default DEFAULT_ROWS
        Rows per canary person (a range: drawn per canary).
    source_class : type, default PersonSource
        How the canaries' rows are weighed (the trainer's class).

    Returns
    -------
    (AuditedModel, CanaryPersons)
        The wrapped model and the probe.
    """
    order = list(p.raw.names)
    plans = p.plans[0]
    included = {order.index(n): rng.random(m) < 0.5 for n in names}
    stream = np.random.default_rng(seed)  # the auditor's own coins (None: OS entropy)
    model = AuditedModel(p.model, m)
    probe = CanaryPersons(model.P, included, np.array([pl.q for pl in plans]),
                          np.array([pl.steps_per_pass for pl in plans]), stream,
                          canary_rows(rows, m, stream), "person", source_class,
                          cap=p.tcfg.max_rows_per_person, weaken=weaken)
    return model, probe


def check_job(probe: DiracCanaries, model, fed, rng: np.random.Generator, cap: int = 0) -> dict:
    """Check that the audited job bounds each canary's contribution as claimed.

    Parameters
    ----------
    probe : DiracCanaries
        The probe (`CanaryPersons` at person level).
    model : AuditedModel
        The wrapped model.
    fed : Federation
        The audited silos.
    rng : numpy.random.Generator
        The checks' draws.
    cap : int, default 0
        [privacy] max_rows_per_person (0: all rows).

    Returns
    -------
    dict
        The worse of `server.check_clipping` and, for canary persons at person level,
        `weighting_check` with the probe's source class (the one `server.assess` reads).
    """
    checks = [server.check_clipping(probe, model, fed, rng)]
    if isinstance(probe, CanaryPersons) and probe.unit == "person":
        checks += [weighting_check(type(probe.source), r, model, fed.silos[0].X_train.shape[1:],
                                   fed.task, fed.num_classes, rng, int(probe.rows.max()), cap)
                   for r in {id(r): r for r in probe.rules}.values()]
    return _worst(checks)


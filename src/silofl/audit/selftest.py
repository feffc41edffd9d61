"""`silofl audit --self-test`: does the audit have teeth *for this job*?

The same server-view audit runs against the job's mechanism as run and against
deliberately weakened copies of it (`whitebox.WEAKENINGS`: noise × ½, noise × ¼, clipping
off, replayed noise), and the release audit (`audit.release`) against the private
preprocessing release without its noise (an uncharged standardization), each on a scratch
store (they are experiments, four of them with
broken privacy; their models are discarded, and what the audit reads of them — the
canaries' coordinates — depends on the noise and the coin flips only). Every copy keeps
the claim and the accounting of the real job; only what the DP-SGD step does changes.

At privacy unit "person" (`self_test_persons`, the API route) the audit's canaries are
persons of several rows (`audit.persons`) and the weakened copies add one that weighs every
row of a sampled person 1 instead of 1/r (a person then adds up to r·C).

DP federated trees (`self_test_gbdt`, the API route: `audit.gbdt`) are tested against
`GBDT_WEAKENINGS`: "noise off" releases every histogram and leaf sum without noise while
the ledgers charge the target σ (`train_dp_gbdt`'s auditing-only ``noise_scale`` = 0).

A row passes when the verdict is what it must be: the mechanism as run is not flagged, and
every weakened copy whose true ε is at least twice the claim is (clipping off and replayed
noise have no finite ε). Copies with a smaller true ε are shown with the audit's power
(`detectable`) beside them: the audit is not required to see a leak it says it cannot.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import silofl.audit.persons as persons
from silofl.audit.engine import SiloAudit
from silofl.audit.whitebox import WEAKENINGS
from silofl.errors import ConfigError
from silofl.privacy.budget import BudgetStore

#: a weakened copy must be flagged when its true ε is at least this many times the claim
MUST_FLAG = 2.0
AS_RUN = "as run"


@dataclass
class SelfTestRow:
    """One (mechanism, silo): its true ε and what the audit said."""

    mechanism: str
    what: str
    silo: str
    claimed_epsilon: float
    true_epsilon: float
    lower_bound: float
    estimate_lower: float | None
    flagged: bool
    detectable_epsilon: float | None

    @property
    def must_flag(self) -> bool:
        return self.mechanism != AS_RUN and self.true_epsilon >= MUST_FLAG * self.claimed_epsilon

    @property
    def passed(self) -> bool:
        """As run: not flagged; must-flag copies: flagged; others: either."""
        if self.mechanism == AS_RUN:
            return not self.flagged
        return self.flagged or not self.must_flag

    def to_dict(self) -> dict:
        return {"mechanism": self.mechanism, "what": self.what, "silo": self.silo,
                "claimed_epsilon": self.claimed_epsilon, "true_epsilon": self.true_epsilon,
                "lower_bound": self.lower_bound, "estimate_lower": self.estimate_lower,
                "flagged": self.flagged, "must_flag": self.must_flag, "passed": self.passed,
                "detectable_epsilon": self.detectable_epsilon}


@dataclass
class SelfTestReport:
    """What `self_test` returns: a row per (mechanism, silo), and the audits behind them."""

    rows: list[SelfTestRow]
    confidence: float
    canaries: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def to_dict(self) -> dict:
        return {"kind": "self-test", "view": "server", "confidence": self.confidence,
                "canaries_per_silo": self.canaries, "seconds": self.seconds,
                "must_flag_at": f"true ε ≥ {MUST_FLAG:g} × claim", "passed": self.passed,
                "notes": self.notes, "rows": [r.to_dict() for r in self.rows]}


SHARED = "shared noise"


def _shared_truth(new: list[SelfTestRow], audited: list[SiloAudit]) -> None:
    """Shared noise is unbounded in a server's view only for a silo whose local pass has
    as many steps as another audited silo's (their per-round updates then carry the same
    noise and subtract to none); otherwise the overlap is partial and its ε is not
    computed here (shown as unknown, not required to be flagged)."""
    length = [a.details["steps"] / max(a.details["passes"], 1) for a in audited]
    for row, L in zip(new, length):
        if sum(math.isclose(L, x) for x in length) < 2:
            row.true_epsilon = math.nan


def _row(name: str, what: str, scale: float | None, r: SiloAudit, flagged: bool
         ) -> SelfTestRow:
    at = r.details.get("epsilon_at_noise_scale", {})
    true = math.inf if scale is None else (r.claimed_epsilon if scale == 1.0 else
                                          float(at.get(f"{scale:g}", math.nan)))
    return SelfTestRow(name, what, r.silo, r.claimed_epsilon, true, r.lower_bound,
                       r.estimate_lower, flagged, r.details.get("detectable_epsilon"))


def self_test(cfg, *, silo: str | None = None, canaries: int | None = None,
              confidence: float = 0.95, seed: int | None = None,
              only: list[str] | None = None,
              on_progress: Callable[[int, int], None] | None = None) -> SelfTestReport:
    """Run the server-view one-run audit of `cfg` against the mechanism as run and each
    weakened copy, and the release audit against the preprocessing release without noise
    (a job of method dp_gbdt: `self_test_gbdt` on its federation, noise off).

    Parameters
    ----------
    cfg : Config
        The job (`load_config`); it must allow a scratch store ([budget] scratch, or
        ``--scratch``): every audit here is an experiment, four with broken privacy.
    silo : str, optional
        Audit one silo (default: every silo).
    canaries : int, optional
        Dirac canaries per silo (default: the server view's, 50,000 or fewer).
    confidence : float
        Family-wise confidence of each audit, in [0.5, 1).
    seed : int, optional
        Seeds the canaries and coins (default: OS entropy).
    only : list of str, optional
        A subset of `whitebox.WEAKENINGS`' names (default: all).
    on_progress : callable, optional
        ``on_progress(done, total)`` after each mechanism.

    Returns
    -------
    SelfTestReport
        One row per (mechanism, silo): claim, true ε, rigorous bound, estimate's lower end,
        flagged, must flag, passed; its notes; wall time in seconds.
    """
    from silofl.audit.tabular import audit

    if "dp_gbdt" in list(cfg.training.methods):  # the trees' broken variants
        from silofl.audit.jobs import trees_job
        fed, _names, bounds, trees = trees_job(cfg, silo)
        if seed is None and cfg.privacy.noise == "seeded":  # a seeded experiment
            seed = int(cfg.training.seed)
        return self_test_gbdt(fed, silo=silo, canaries=canaries, confidence=confidence,
                              seed=seed, bounds=bounds, **trees)
    t0 = time.perf_counter()
    person = getattr(cfg.privacy, "unit", "example") == "person"
    names = [AS_RUN] + [n for n in WEAKENINGS if only is None or n in only] + (
        [ROWS_ONE] if person and (only is None or ROWS_ONE in only) else [])
    rows: list[SelfTestRow] = []
    m = 0
    for i, name in enumerate(names):
        if on_progress:
            on_progress(i, len(names))
        cls = None
        if name == ROWS_ONE:  # the trainer's and the canaries' person source, broken
            what, _w, cls = PERSON_WEAKENINGS[name]
            weaken, scale = (lambda r: r), None
        else:
            what, weaken, scale = (("the job's DP-SGD, unchanged", lambda r: r, 1.0)
                                   if name == AS_RUN else WEAKENINGS[name])
        rep = audit(cfg, view="server", kind="one-run", silo=silo, canaries=canaries,
                    confidence=confidence, seed=None if seed is None else seed + 1000 * i,
                    weaken=weaken, source_class=cls)
        new = [_row(name, what, scale, r, r.violation) for r in rep.rows]
        if name == ROWS_ONE:
            for row, r in zip(new, rep.rows):
                row.true_epsilon = _true_epsilon(name, r)
        if name == SHARED:
            _shared_truth(new, rep.rows)
        rows += new
        m = rep.rows[0].details["canaries"]
    if on_progress:
        on_progress(len(names), len(names))
    notes = (["the preprocessing release is not audited at [privacy] unit = \"person\" "
              "(its white-box audit inserts canary rows, not persons)"] if person
             else _release_rows(cfg, silo, confidence, seed, rows))
    return SelfTestReport(rows, confidence, m, time.perf_counter() - t0, [
        "each mechanism: one server-view audit job on a scratch store; the weakened copies "
        "keep the job's claim and accounting, only the DP-SGD step changes",
        f"a weakened copy must be flagged when its true ε ≥ {MUST_FLAG:g} × the claim; "
        "clipping off and replayed noise have no finite ε", *notes])


UNCHARGED = "uncharged standardization"


def _release_rows(cfg, silo: str | None, confidence: float, seed: int | None,
                  rows: list[SelfTestRow]) -> list[str]:
    """The preprocessing release's rows, by the white-box release audit
    (`audit.release_server`, one release each): as run (when the job has a private
    release), its noise × ¼, and without its noise (an uncharged standardization) — with
    the job's private spec, else standardize = impute = "private" made up for the test.
    Returns notes."""
    from silofl.audit.bounds import gdp_epsilon
    from silofl.audit.release_server import audit_job
    from silofl.data.preprocess import PreprocessSpec
    from silofl.errors import SiloflError
    from silofl.experiments import build

    spec = build.preprocess_spec(cfg.data)
    private = "private" in (spec.standardize, spec.impute)
    if not private:
        spec = PreprocessSpec("private", "private", spec.share)
    cases = ([(AS_RUN, None, "the private preprocessing release, unchanged")]
             if private else []) + [
        (RELEASE_QUARTER, 0.25, "the private preprocessing release with its noise × 1/4"),
        (UNCHARGED, 0.0, "the private preprocessing release without its noise")]
    try:
        for i, (name, factor, what) in enumerate(cases):
            for r in audit_job(cfg, silo=silo, confidence=confidence, spec=spec,
                               noise_factor=factor, seed=None if seed is None else seed + i):
                sigma = r.details["claimed_noise_multiplier"]
                true = (r.claimed_epsilon if factor is None else math.inf if factor == 0
                        else gdp_epsilon(1 / (sigma * factor), r.delta))
                rows.append(SelfTestRow(name, what, r.silo, r.claimed_epsilon, true,
                                        r.lower_bound, r.estimate_lower, r.violation, None))
    except SiloflError as e:  # no bounded column to release privately, ...
        return [f"{UNCHARGED}: not tested ({e})"]
    made_up = "" if private else (" (the job's preprocessing is declared, so the test "
                                  "makes standardize/impute private for this check)")
    return [f"preprocessing release rows: the white-box release audit, one release each "
            f"with canary rows{made_up}; their claim is the release's own ε"]


RELEASE_QUARTER = "release noise x1/4"


#: the person-level self-test's weakened copies: name → (what it does, rule → weakened
#: rule or None, person source class or None); each keeps the claim and the accounting
ROWS_ONE = "rows weighted 1"
PERSON_WEAKENINGS = {
    ROWS_ONE: ("every read row of a sampled person weighs 1, not 1/r (a person "
                        "adds up to r·C)", None, persons.UnitWeights),
    "noise x1/4": ("DP-SGD noise quartered", WEAKENINGS["noise x1/4"][1], None),
}


def _true_epsilon(name: str, row) -> float:
    """A self-test row's true ε: the claim as run; `rows weighted 1`: the claimed
    mechanism at sensitivity r·C; noise × ¼: at noise σ/4."""
    d = row.details
    if name == AS_RUN:
        return row.claimed_epsilon
    if name == ROWS_ONE:
        return float(next(iter(d["epsilon_at_sensitivity"].values())))
    return float(d["epsilon_at_noise_scale"]["0.25"])


def self_test_persons(fed, model, algorithm, tcfg, *, silo: str | None = None,
                      canaries: int | None = None,
                      rows: int | tuple[int, int] = persons.DEFAULT_ROWS,
                      confidence: float = 0.95, seed: int | None = None) -> SelfTestReport:
    """Does the person-level audit have teeth for this run? `persons.audit_persons`
    against the run as it is and against each of `PERSON_WEAKENINGS`, each on a scratch
    store.

    Parameters
    ----------
    fed, model, algorithm, tcfg, silo, canaries, rows, confidence
        As `persons.audit_persons` (tcfg at privacy unit "person").
    seed : int, optional
        Seeds each audit's coins (seed + 1000·i); default OS entropy.

    Returns
    -------
    SelfTestReport
        One row per (mechanism, silo): claim, true ε, rigorous bound, flagged, passed (as
        run: not flagged; a copy whose true ε ≥ 2 × the claim: flagged).
    """
    t0 = time.perf_counter()
    if tcfg.privacy_unit != "person":
        raise ConfigError("the person-level self-test needs privacy unit 'person'")
    cases = [(AS_RUN, ("the run's person-level DP-SGD, unchanged", None, None)),
             *PERSON_WEAKENINGS.items()]
    out: list[SelfTestRow] = []
    m = 0
    for i, (name, (what, weaken, cls)) in enumerate(cases):
        rep = persons.audit_persons(
            fed, model, algorithm, tcfg, silo=silo, canaries=canaries, rows=rows,
            confidence=confidence, store=BudgetStore(None),
            seed=None if seed is None else seed + 1000 * i, weaken=weaken, source_class=cls)
        m = rep.rows[0].details["canaries"]
        out += [SelfTestRow(name, what, r.silo, r.claimed_epsilon, _true_epsilon(name, r),
                            r.lower_bound, r.estimate_lower, r.violation,
                            r.details.get("detectable_epsilon")) for r in rep.rows]
    return SelfTestReport(out, confidence, m, time.perf_counter() - t0, [
        "person level: each mechanism one server-view audit with canary persons on a "
        "scratch store; the weakened copies keep the run's claim and accounting",
        f"a weakened copy must be flagged when its true ε ≥ {MUST_FLAG:g} × the claim"])


#: the trees' broken variants (`self_test_gbdt`): name → (what it does, the released noise
#: scale; the ledgers keep charging the target σ, so the claim is unchanged)
NOISE_OFF = "noise off"
GBDT_WEAKENINGS: dict[str, tuple[str, float]] = {
    NOISE_OFF: ("DP-GBDT histograms, leaf sums and private bins' counts released without "
                "noise (σ = 0) while the ledgers charge the target σ", 0.0),
}


def self_test_gbdt(fed, *, silo: str | None = None, canaries: int | None = None,
                   confidence: float = 0.95, seed: int | None = None,
                   bounds=(-1.0, 1.0), **trees) -> SelfTestReport:
    """Does the trees' membership audit (`audit.gbdt`) have teeth? The one-run audit of
    `train_dp_gbdt` as run and of each of `GBDT_WEAKENINGS`, each on fresh in-memory
    ledgers.

    Parameters
    ----------
    fed : Federation
        Tabular binary or regression, every silo with its privacy target.
    silo, canaries, confidence, bounds, **trees
        As `audit.gbdt.audit_gbdt` (``ledgers`` is refused: these are experiments).
    seed : int, optional
        Seeds each audit (seed + 1000·i); default OS entropy.

    Returns
    -------
    SelfTestReport
        One row per (mechanism, silo): claim, true ε (the claim as run; ∞ with the noise
        off), the rigorous bound, flagged, passed (as run: not flagged; noise off: flagged).
    """
    from silofl.audit.gbdt import _audit

    t0 = time.perf_counter()
    if trees.get("ledgers") is not None:
        raise ConfigError("the trees' self-test trains with deliberately broken privacy on "
                          "fresh in-memory ledgers; leave ledgers out")
    cases = [(AS_RUN, ("the job's DP-GBDT, unchanged", 1.0)), *GBDT_WEAKENINGS.items()]
    out: list[SelfTestRow] = []
    m = 0
    for i, (name, (what, scale)) in enumerate(cases):
        rep = _audit(fed, silo=silo, canaries=canaries, kind="one-run", runs=None,
                     confidence=confidence, seed=None if seed is None else seed + 1000 * i,
                     bounds=bounds, noise_scale=scale, trees=trees)
        m = rep.rows[0].details["canaries"]
        out += [SelfTestRow(name, what, r.silo, r.claimed_epsilon,
                            r.claimed_epsilon if scale == 1.0 else
                            math.inf if scale == 0 else math.nan,
                            r.lower_bound, r.estimate_lower, r.violation, None)
                for r in rep.rows]
    return SelfTestReport(out, confidence, m, time.perf_counter() - t0, [
        "trees: each mechanism one one-run membership audit (white box: the cells only "
        "canaries populate in the noisy histograms and leaf sums; black box: the "
        "ensemble's loss) on in-memory ledgers; the broken variants keep the claim and the "
        "accounting",
        f"a broken variant must be flagged when its true ε ≥ {MUST_FLAG:g} × the claim"])

"""`silofl audit --self-test`: does the audit have teeth *for this job*?

The same server-view audit runs against the job's mechanism as run and against
deliberately weakened copies of it (`whitebox.WEAKENINGS`: noise × ½, noise × ¼, clipping
off, replayed noise), and the release audit (`audit.release`) against the private
preprocessing release without its noise (an uncharged standardization), each on a scratch
store (they are experiments, four of them with
broken privacy; their models are discarded, and what the audit reads of them — the
canaries' coordinates — depends on the noise and the coin flips only). Every copy keeps
the claim and the accounting of the real job; only what the DP-SGD step does changes.

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

from silofl.audit.engine import SiloAudit
from silofl.audit.whitebox import WEAKENINGS

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
    weakened copy (on scratch stores; `cfg` must allow scratch: [budget] scratch or
    --scratch). `only`: a subset of `whitebox.WEAKENINGS`' names. Returns the table."""
    from silofl.audit.tabular import audit

    t0 = time.perf_counter()
    names = [AS_RUN] + [n for n in WEAKENINGS if only is None or n in only]
    rows: list[SelfTestRow] = []
    m = 0
    for i, name in enumerate(names):
        if on_progress:
            on_progress(i, len(names))
        what, weaken, scale = (("the job's DP-SGD, unchanged", lambda r: r, 1.0)
                               if name == AS_RUN else WEAKENINGS[name])
        rep = audit(cfg, view="server", kind="one-run", silo=silo, canaries=canaries,
                    confidence=confidence, seed=None if seed is None else seed + 1000 * i,
                    weaken=weaken)
        rows += [_row(name, what, scale, r, r.violation) for r in rep.rows]
        m = rep.rows[0].details["canaries"]
    if on_progress:
        on_progress(len(names), len(names))
    notes = _release_rows(cfg, silo, confidence, seed, rows)
    return SelfTestReport(rows, confidence, m, time.perf_counter() - t0, [
        "each mechanism: one server-view audit job on a scratch store; the weakened copies "
        "keep the job's claim and accounting, only the DP-SGD step changes",
        f"a weakened copy must be flagged when its true ε ≥ {MUST_FLAG:g} × the claim; "
        "clipping off and replayed noise have no finite ε", *notes])


UNCHARGED = "uncharged standardization"


def _release_rows(cfg, silo: str | None, confidence: float, seed: int | None,
                  rows: list[SelfTestRow]) -> list[str]:
    """The preprocessing release's rows: as run (when the job has a private release) and
    without its noise (the job's private spec, else standardize = "private" made up for the
    test). Returns notes."""
    from silofl.audit.release import audit_job_release
    from silofl.data.preprocess import PreprocessSpec
    from silofl.errors import SiloflError
    from silofl.experiments import build

    spec = build.preprocess_spec(cfg.data)
    private = "private" in (spec.standardize, spec.impute)
    if not private:
        spec = PreprocessSpec("private", "private", spec.share)
    cases = ([(AS_RUN + " (release)", False)] if private else []) + [(UNCHARGED, True)]
    try:
        for name, weaken in cases:
            for r in audit_job_release(cfg, silo=silo, runs=RELEASE_RUNS, confidence=confidence,
                                       spec=spec, weaken=weaken, seed=seed):
                rows.append(SelfTestRow(
                    AS_RUN if not weaken else name,
                    "the private preprocessing release, unchanged" if not weaken else
                    "the private preprocessing release without its noise",
                    r.silo, r.claimed_epsilon, math.inf if weaken else r.claimed_epsilon,
                    r.lower_bound, None, r.violation, None))
    except SiloflError as e:  # no bounded column to release privately, ...
        return [f"{UNCHARGED}: not tested ({e})"]
    made_up = "" if private else (" (the job's preprocessing is declared, so the test "
                                  "makes standardize/impute private for this check)")
    return [f"{UNCHARGED}: the release audit on {RELEASE_RUNS} + {RELEASE_RUNS} releases "
            f"of the preprocessing statistics{made_up}; its claim is the release's own ε"]


#: releases on each of D and D′ for the preprocessing rows (no training: cheap)
RELEASE_RUNS = 200

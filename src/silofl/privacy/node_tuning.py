"""Accounting events of private tuning at the node level (thesis appendix E on graph data):
the Gaussian release of a validation score and Papernot & Steinke's RepeatAndSelect of one
node-level trial: `DpEvent`s with their own RDP curve (`curves.RdpCurveDpEvent`).

* **The score's noise multiplier** (`node_score_sigma`): a public function of the run,
  σ_s = ratio · σ / (2 √(T · E[ρ²])), ρ ~ Hypergeometric(n, A, b), T a trial's steps:
  one node-level step's RDP is ≈ 2α E[ρ²]/σ² to first order, so σ/(2√(T E[ρ²])) is the
  Gaussian with about a trial's RDP and ratio 2 gives the score about a quarter of it.
* **The accounting** (`NodeRepeatAndSelectEvent`).  dp_accounting's RepeatAndSelect
  cannot wrap node-level events (it has no type for them), so this event brings its own
  RDP curve: dp_accounting's RepeatAndSelect formula (through `privacy._dpa_adapter`;
  Papernot & Steinke 2022, Theorem 2 for TNB, Theorem 6 for Poisson) applied to one
  trial's curve
  (rounds × the node-level pass + the Gaussian score) at `node_level.DEFAULT_ORDERS`.  The
  whole tuned run of a region is  Compose(pivot passes, NodeRepeatAndSelect(trial)),
  calibrated by the planner to the region's target and reserved before the first read.

The tuning path itself is `silofl.tuning.private.TunedPersonalization` (any unit); the
graph domain's validation score is `silofl.pandemic.tuning.NodeValidation`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np
import numpy.typing as npt

from silofl.errors import PrivacyError
from silofl.privacy import _dpa_adapter as adapter
from silofl.privacy import events
from silofl.privacy.curves import RdpCurveDpEvent, is_curve_event
from silofl.privacy.tnb_select import tnb_select_rdp

SCORE_EVENT = "gaussian_score"
SELECT_EVENT = "node_repeat_and_select"


def is_node_event(event: dpa.DpEvent) -> bool:
    """A pass event that brings its own RDP curve (node level), not a dp_accounting one."""
    return is_curve_event(event)


# --- events on a curve ----------------------------------------------------------------------

@dataclass(frozen=True)
class GaussianScoreEvent(RdpCurveDpEvent):
    """One Gaussian release of a scalar score with noise std σ · Δ (Δ its sensitivity
    under the node-level adjacency): RDP α / (2σ²).  A curve event, so it composes with
    node-level DP-SGD events in one ledger."""

    sigma: float

    def __post_init__(self) -> None:
        s = float(self.sigma)
        if not (math.isfinite(s) and s > 0):
            raise PrivacyError(f"score noise multiplier must be positive, got {self.sigma!r}")
        object.__setattr__(self, "sigma", s)

    def rdp(self, orders: npt.ArrayLike) -> np.ndarray:
        return np.asarray(orders, dtype=float) / (2.0 * self.sigma ** 2)

    def to_dict(self) -> dict:
        return {"event": SCORE_EVENT, "mechanism": "Gaussian release of one validation "
                "score, std = sigma * node-level sensitivity", "sigma": self.sigma}

    @classmethod
    def from_dict(cls, d: dict) -> GaussianScoreEvent:
        if d.get("event") != SCORE_EVENT:
            raise PrivacyError(f"not a {SCORE_EVENT} event: {d.get('event')!r}")
        return cls(d["sigma"])


@dataclass(frozen=True)
class NodeRepeatAndSelectEvent(RdpCurveDpEvent):
    """Papernot & Steinke's RepeatAndSelect of one node-level trial: ``rounds`` passes of
    ``round_event`` (a `NodeLevelDpEvent`) and one `GaussianScoreEvent(score_sigma)`,
    repeated h ~ D times (``mean`` = E[h], ``shape`` = η for TNB, ∞ for Poisson), only
    the best released."""

    round_event: RdpCurveDpEvent
    rounds: int
    score_sigma: float
    mean: float
    shape: float

    @property
    def event(self) -> dpa.DpEvent:
        """One trial, as the composition its sub-ledger may spend (tuple: hashable)."""
        # `selection.trial_event` of a node-level pass, built here (selection imports this
        # module): its passes, then the score release
        return dpa.ComposedDpEvent((events.hashable(dpa.SelfComposedDpEvent(
            self.round_event, int(self.rounds))), GaussianScoreEvent(float(self.score_sigma))))

    def trial_rdp(self, orders: npt.ArrayLike) -> np.ndarray:
        """RDP of one trial at ``orders``: rounds × the pass + the score."""
        return (self.rounds * np.asarray(self.round_event.rdp(orders), dtype=np.float64)
                + GaussianScoreEvent(self.score_sigma).rdp(orders))

    def rdp(self, orders: npt.ArrayLike) -> np.ndarray:
        """dp_accounting's RepeatAndSelect formula on the trial's curve at ``orders``."""
        orders = np.asarray(orders, dtype=float)
        if self.shape < 0:  # η ∈ (−1, 0): dp_accounting's formula refuses it (`tnb_select`)
            return tnb_select_rdp(orders, self.trial_rdp(orders), float(self.mean),
                                  float(self.shape))
        return adapter.repeat_and_select_rdp(orders, self.trial_rdp(orders),
                                             float(self.mean), float(self.shape))

    def to_dict(self) -> dict:
        return {"event": SELECT_EVENT,
                "mechanism": "RepeatAndSelect (Papernot & Steinke 2022) of one trial: "
                             "rounds x node-level pass + Gaussian validation score",
                "round_event": self.round_event.to_dict(), "rounds": int(self.rounds),
                "score_sigma": float(self.score_sigma), "mean": float(self.mean),
                "shape": "inf" if math.isinf(self.shape) else float(self.shape)}

    @classmethod
    def from_dict(cls, d: dict) -> NodeRepeatAndSelectEvent:
        if d.get("event") != SELECT_EVENT:
            raise PrivacyError(f"not a {SELECT_EVENT} event: {d.get('event')!r}")
        return cls(events.from_dict(d["round_event"]), int(d["rounds"]),
                   float(d["score_sigma"]), float(d["mean"]), float(d["shape"]))


def node_score_sigma(round_event: dpa.DpEvent, rounds: int, ratio: float) -> float:
    """σ_s of the score release for node-level passes (module docstring):
    ratio · σ / (2 √(T · E[ρ²])), T = rounds × the pass's steps, ρ ~ Hyp(n, A, b): one
    node-level step's RDP is ≈ 2α E[ρ²]/σ², so ratio 2 gives the score about a quarter
    of a trial's RDP."""
    e = round_event
    n, A, b = int(e.n), int(e.affected), int(e.b)
    mean = b * A / n
    var = mean * (1 - A / n) * (n - b) / (n - 1) if n > 1 else 0.0
    T = int(rounds) * int(e.steps)
    return float(ratio) * float(e.sigma) / (2.0 * math.sqrt(T * (var + mean * mean)))


__all__ = [
    "SCORE_EVENT",
    "SELECT_EVENT",
    "GaussianScoreEvent",
    "NodeRepeatAndSelectEvent",
    "is_node_event",
    "node_score_sigma",
]

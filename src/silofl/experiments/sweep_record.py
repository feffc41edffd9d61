"""One sweep run's record: what it reports beyond the training history (the cost of a
privately tuned run, non-finite metrics flagged) and its strict-JSON form."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np

from silofl.experiments.sweep_config import SweepConfig
from silofl.privacy import accounting as acc
from silofl.privacy import selection as TA
from silofl.tuning.private import score_sigma


def tuning_summary(sc: SweepConfig, epsilon: float | None, alg, res, base: list | None
                   ) -> dict:
    """What a privately tuned run released and what it cost: its settings, the λ each silo
    released (part of the RepeatAndSelect output; h_k is not: it stays in the silo), and
    for comparison the ε (max over silos, at the same σ_k) of a naive grid of E[h] trials
    and of the uncounted choice over the whole sweep grid, both by composition (`epsilon`:
    the run's target, None if non-private; `base`: the untuned method's plans at this ε,
    if calibrated)."""
    out = {**alg.describe(), "released": getattr(alg, "last_release", None)}
    if epsilon is None or alg.select != "random":
        return out
    delta = sc.base.privacy.delta
    trials = max(1, int(round(alg.dist.mean)))
    naive = []
    for p in res.plans:
        rev = _round_event(p)
        naive.append(TA.epsilon_of(TA.naive_event(
            rev, sc.base.training.rounds, trials,
            score_sigma(rev, sc.base.training.rounds, alg.score_ratio)), delta))
    out["naive_grid_trials"] = trials
    out["naive_grid_epsilon"] = max(naive)
    out["honest_epsilon"] = epsilon
    grid = len(sc.sweep.lam) * len(sc.sweep.lr)
    if base:  # the uncounted choice: `grid` runs of the untuned method, composed
        out["uncounted_grid_size"] = grid
        out["uncounted_grid_epsilon"] = max(
            TA.epsilon_of(dpa.SelfComposedDpEvent(p.declared, grid), delta) for p in base)
    return out


def _round_event(p):
    return acc.dpsgd_event(p.q, p.noise_multiplier, p.steps_per_pass)


def _nonfinite(res, val) -> list[str]:
    """Which final metrics were not finite (stored as null: strict JSON): divergence or an
    undefined metric is flagged, never hidden."""
    out = []
    if not math.isfinite(res.final_pooled):
        out.append("final_test")
    if not math.isfinite(val["pooled"][-1]):
        out.append("final_validation")
    out += [f"final_test_per_silo[{s}]" for s, v in zip(res.silos, res.final_per_silo)
            if not math.isfinite(v)]
    return out


def _clean(o):
    """JSON-safe: numpy scalars → Python, non-finite floats → None (strict JSON)."""
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, np.ndarray):
        return _clean(o.tolist())
    if isinstance(o, (np.floating, float)):
        return float(o) if math.isfinite(o) else None
    if isinstance(o, np.integer):
        return int(o)
    return o


__all__ = ["tuning_summary"]

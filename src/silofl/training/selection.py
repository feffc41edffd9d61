"""Private model selection for clustering methods (IFCA): the exponential mechanism.

A silo scores G candidate models on its own training data and reports the index of the best
one through the exponential mechanism, implemented as report-noisy-min with Gumbel noise
(thesis §1.2, appendix B.3):

    ĝ = argmin_g  s_g − (2Δ/ε)·Gumbel_g,   so   P[ĝ = g] = exp(−ε s_g/(2Δ)) / Σ_h exp(−ε s_h/(2Δ)).

Scores (lower is better, units: a rate or a mean loss, no per-example sums):
- classification: the training error rate 1 − accuracy. Its sensitivity is Δ = 1/(n − 1)
  under add/remove and replace-one neighbours (thesis eq. B.1);
- regression: the mean per-example loss with each example's loss clipped to [0, B]. The same
  case analysis as for the error rate (which is the B = 1 case of a 0-1 loss) gives
  Δ = B/(n − 1). The thesis only says the loss "must be clipped to a reasonable value (e.g.
  ≤ 1)"; clipping each example rather than the mean keeps Δ at B/(n − 1) instead of B.

As everywhere in silofl, a silo's size n is treated as public (it also sets q = b/n).
ε-EM satisfies ε²/8-zCDP (Rogers & Steinke's bounded-range analysis, thesis §1.2), which
`selection_event` declares for the RDP accountant. dp_accounting's PLD accountant has no
zCDP support, so runs with private selection are accounted under RDP only.
"""

from __future__ import annotations

import dp_accounting as dpa
import numpy as np

from silofl.models import metrics as M
from silofl.models.base import Model
from silofl.privacy.randomness import Randomness

#: default clip bound B for per-example losses in regression selection
DEFAULT_LOSS_BOUND = 1.0


def selection_event(epsilon: float) -> dpa.DpEvent:
    """The cost of one ε-exponential-mechanism selection: ε²/8-zCDP."""
    return dpa.ZCDpEvent(float(epsilon) ** 2 / 8.0)


def uses_loss(model: Model) -> bool:
    """Regression models are scored by clipped loss; classifiers by error rate."""
    return "regression" in model.tasks


def sensitivity(model: Model, n: int, loss_bound: float = DEFAULT_LOSS_BOUND) -> float:
    """Δ of the score on a silo with n ≥ 2 training examples (see the module docstring)."""
    return (loss_bound if uses_loss(model) else 1.0) / (n - 1)


def scores(model: Model, candidates: np.ndarray, X: np.ndarray, y: np.ndarray,
           loss_bound: float = DEFAULT_LOSS_BOUND) -> np.ndarray:
    """(G,) score of each candidate (G, P) on one silo's data X (n, ...), y (n,)."""
    if uses_loss(model):
        return np.array([np.clip(model.loss(w, X, y), 0.0, loss_bound).mean()
                         for w in candidates])
    acc = M.metric_fn("accuracy", model.name)
    return np.array([1.0 - acc(y, model.predict(w, X)) for w in candidates])


def noisy_argmin(score: np.ndarray, epsilon: float, delta_s: float, rng: Randomness) -> int:
    """Report-noisy-min: the ε-exponential mechanism over `score` (lower is better) with
    sensitivity `delta_s`."""
    noisy = np.asarray(score, float) - rng.gumbel(len(score)) * (2.0 * delta_s / epsilon)
    return int(np.argmin(noisy))


def em_probabilities(score: np.ndarray, epsilon: float, delta_s: float) -> np.ndarray:
    """(G,) the exponential mechanism's selection probabilities (for checks and plots)."""
    logits = -epsilon * np.asarray(score, float) / (2.0 * delta_s)
    p = np.exp(logits - logits.max())
    return p / p.sum()

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

Node level (graph data, `node_sensitivity`, `LocalTrainer.select_cluster` with a
`NodeUnit`). A region of n persons has n examples, one per person: its neighbourhood
vector at the round's training window (public: a function of the seed and the round) and
its label. The score is the same mean, over all n of them. Neighbouring regions differ by
*replacing* one person v (n stays fixed and public, as in `privacy.node_level`). Which
examples can change: v's own (attributes, states, label); the ≤ S − 1 examples that hold
v in a neighbour slot (pruning bounds every person's appearances by S); and under
"node+edges" (v's contacts are private too) the ≤ S − 1 examples of v's new contacts. So
at most A = `privacy.node_level.affected_examples(n, S, adjacency)` = S ("node") or 2S − 1
("node+edges") examples change, never more than n; every other example — its features,
window and label — is identical. Each changed example's term moves within [0, B] (its
clipped loss) or {0, 1} (its error), so the sum of the n terms moves by at most A·B and
the mean by

    Δ_node = A·B / n        (B = 1 for the error rate).

There is no add/remove case (n is fixed), hence n, not n − 1. The event is unchanged: the
ε-exponential mechanism run at the sensitivity of the neighbouring relation is ε-DP and
ε²/8-zCDP for that relation, here node-level replacement, so `selection_event(ε)` is what
each node-level selection costs; it composes with the node-level DP-SGD steps in RDP
(ρ-zCDP is (α, ρα)-RDP). As every node-level bound here it counts only the examples that
contain the replaced person (`privacy.node_level.PRUNING_ASSUMPTION`), and the model's input scaling
must be public (declared or a charged release), as for DP-SGD.
"""

from __future__ import annotations

import dp_accounting as dpa
import numpy as np

from silofl.models import metrics as M
from silofl.models.base import Model
from silofl.privacy.node_level import affected_examples
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


def node_sensitivity(model: Model, n: int, S: int, adjacency: str,
                     loss_bound: float = DEFAULT_LOSS_BOUND) -> float:
    """Δ of the mean score over all n examples of a region under node-level replacement
    adjacency: A·B/n, A = `privacy.node_level.affected_examples(n, S, adjacency)` (module
    docstring)."""
    bound = loss_bound if uses_loss(model) else 1.0
    return affected_examples(int(n), int(S), adjacency) * bound / int(n)


def scores(model: Model, candidates: np.ndarray, X: np.ndarray, y: np.ndarray,
           loss_bound: float = DEFAULT_LOSS_BOUND,
           weights: np.ndarray | None = None) -> np.ndarray:
    """(G,) score of each candidate (G, P) on one silo's data X (n, ...), y (n,).

    `weights` (n,): person level, 1/r on each of a person's r rows: the score is the mean
    over persons of each person's mean term, so one person moves it as one example does at
    example level (Δ = `sensitivity` with n = persons)."""
    if weights is None:
        weights = np.ones(len(y))
    w = np.asarray(weights, dtype=float)
    if uses_loss(model):
        return np.array([np.clip(model.loss(c, X, y), 0.0, loss_bound) @ w / w.sum()
                         for c in candidates])
    return np.array([float((M.predicted_classes(model.predict(c, X), model.name) != y) @ w)
                     / w.sum() for c in candidates])


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

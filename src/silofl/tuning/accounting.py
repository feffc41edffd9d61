"""What private tuning costs, as dp_accounting events, and fast σ guesses for them.

A tuned release (thesis appendix E.3, MR-MTL): each silo trains a *pivot* model with a
public λ̄ whose updates it sends every round (an ordinary DP-SGD run), and h ~ D trial
models with settings drawn from the grid; at the end it releases only the best trial by a
noisy validation score. One trial (the base mechanism M of Papernot & Steinke) is its
DP-SGD steps composed with one Gaussian release of its validation score, so

    tuned = Compose(pivot run,  RepeatAndSelect(Compose(trial run, Gaussian score), E[h], η))

(`RepeatAndSelectDpEvent`, Theorem 2 of Papernot & Steinke 2022 — thesis Theorem E.1.2 — as
dp_accounting's RDP accountant implements it; its PLD accountant has no such event, so tuned
runs are accounted under RDP, through `privacy.accounting`'s fallback). The naive
alternative — a fixed grid of h settings, all trained, best one released — is bounded by
composition: Compose(pivot, h × trial).
"""

from __future__ import annotations

import math
from functools import lru_cache

import dp_accounting as dpa
from dp_accounting.dp_event import RepeatAndSelectDpEvent
import numpy as np
from dp_accounting.rdp.rdp_privacy_accountant import (
    _compute_rdp_repeat_and_select, _gamma_truncated_negative_binomial)

from silofl.errors import ConfigError
from silofl.privacy import accounting as acc
from silofl.privacy import events
from silofl.tuning.distributions import TrialDistribution


def check_accountable(dist: TrialDistribution) -> None:
    """dp_accounting's RepeatAndSelect takes η ≥ 0 (or Poisson) and E[h] ≥ 1 only."""
    if dist.shape < 0:
        raise ConfigError(f"tuning eta = {dist.eta:g}: TNB with −1 < η < 0 is a valid "
                          "distribution but dp_accounting's RepeatAndSelectDpEvent accounts only "
                          "for η ≥ 0 (0: logarithmic, 1: geometric) or Poisson; use eta ≥ 0")
    if dist.mean < 1:
        raise ConfigError(f"tuning needs a mean number of trials ≥ 1, got {dist.mean:g}; "
                          "raise mu (Poisson) or lower gamma (TNB)")


def noise_of(round_event) -> float:
    """σ of the (Poisson-subsampled) Gaussian inside a DP-SGD event."""
    e = round_event
    if _node(e):  # node level: the event carries its σ
        return float(e.sigma)
    while not isinstance(e, dpa.GaussianDpEvent):
        e = e.event
    return float(e.noise_multiplier)


def _node(event) -> bool:
    """A node-level pass event (own RDP curve): tuned through `privacy.node_tuning`'s events."""
    from silofl.privacy.node_tuning import is_node_event
    return is_node_event(event)


def trial_event(round_event, rounds: int, score_sigma: float):
    """One trial: `rounds` local passes (each `round_event`) and one Gaussian score release
    with noise multiplier `score_sigma` (std = σ · sensitivity)."""
    # a tuple, not a list: the event is a base event (hashed) of ledgers and the store
    if _node(round_event):  # node level: a score event with its own curve (privacy.node_tuning)
        from silofl.privacy.node_tuning import GaussianScoreEvent
        score = GaussianScoreEvent(float(score_sigma))
    else:
        score = dpa.GaussianDpEvent(float(score_sigma))
    return dpa.ComposedDpEvent((events.hashable(dpa.SelfComposedDpEvent(round_event, rounds)),
                                score))


def select_event(round_event, rounds: int, dist: TrialDistribution, score_sigma: float):
    """The random-h, best-only release of the trials."""
    check_accountable(dist)
    if _node(round_event):  # dp_accounting's RepeatAndSelect cannot wrap node-level events
        from silofl.privacy.node_tuning import NodeRepeatAndSelectEvent
        return NodeRepeatAndSelectEvent(round_event, int(rounds), float(score_sigma),
                                        float(dist.mean), float(dist.shape))
    return RepeatAndSelectDpEvent(trial_event(round_event, rounds, score_sigma),
                                      float(dist.mean), float(dist.shape))


def tuned_event(round_event, rounds: int, dist: TrialDistribution,
                score_sigma: float | None = None):
    """The whole tuned run of one silo: pivot run + RepeatAndSelect(trials)."""
    sigma = noise_of(round_event) if score_sigma is None else score_sigma
    return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(round_event, rounds),
                                select_event(round_event, rounds, dist, sigma)])


def naive_event(round_event, rounds: int, trials: int, score_sigma: float | None = None):
    """A fixed grid of `trials` settings released best-only, bounded by composition (the
    bound is tight for some mechanisms: Papernot & Steinke, Proposition 17)."""
    sigma = noise_of(round_event) if score_sigma is None else score_sigma
    return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(round_event, rounds),
                                dpa.SelfComposedDpEvent(trial_event(round_event, rounds, sigma),
                                                        int(trials))])


# --- fast σ search (an aid: every σ is re-checked with dp_accounting before use) ----------

def fast_rdp(event) -> np.ndarray | None:
    """RDP at `accounting.RDP_ORDERS` from closed forms, also through RepeatAndSelect
    (dp_accounting's own formula applied to the closed-form inner curve); None if some base
    event has no closed form."""
    total = np.zeros(len(acc.RDP_ORDERS))
    for e, c in acc._counts(event).items():
        if isinstance(e, RepeatAndSelectDpEvent):
            inner = fast_rdp(e.event)
            if inner is None:
                return None
            total += c * _repeat_and_select_rdp(inner, e.mean, e.shape)
        elif _node(e):  # node level (privacy.node_tuning): curves of their own at RDP_ORDERS
            part = _node_rdp(e)
            if part is None:
                return None
            total += c * part
        else:
            part = acc._fast_rdp_of_items([(e, c)])
            if part is None:
                return None
            total += part
    return total


_A = np.asarray(acc.RDP_ORDERS, dtype=float)


def _node_rdp(e) -> np.ndarray | None:
    """A node-level event's RDP at RDP_ORDERS; a `NodeRepeatAndSelectEvent` through the
    vectorized TNB formula (None for Poisson: the library's bound is the slow part, so
    there is no faster aid than the search itself)."""
    from silofl.privacy.node_tuning import NodeRepeatAndSelectEvent
    if isinstance(e, NodeRepeatAndSelectEvent):
        if math.isinf(e.shape):
            return None
        return _repeat_and_select_rdp(e.trial_rdp(_A), e.mean, e.shape)
    return np.asarray(e.rdp(_A), dtype=float)


@lru_cache(maxsize=256)
def _gamma(shape: float, mean: float) -> float:
    return float(_gamma_truncated_negative_binomial(shape, mean))


def _repeat_and_select_rdp(inner: np.ndarray, mean: float, shape: float) -> np.ndarray:
    """dp_accounting's `_compute_rdp_repeat_and_select` at RDP_ORDERS, vectorized for TNB
    (its order-by-order loops dominate a σ search); the library's own for Poisson."""
    if math.isinf(shape):
        return np.asarray(_compute_rdp_repeat_and_select(acc.RDP_ORDERS, inner, mean, shape))
    c = (1 + shape) * np.min((1 - 1 / _A) * inner - math.log(_gamma(shape, mean)) / _A)
    out = np.where(_A > 1, inner + math.log(mean) / np.maximum(_A - 1, 1e-300) + c, np.inf)
    # monotonicity of RDP in the order (orders are sorted ascending)
    return np.minimum.accumulate(out[::-1])[::-1]


def sigma_guess(make_event, target: float, delta: float) -> float | None:
    """Smallest σ whose closed-form RDP ε of make_event(σ) meets `target` (None without a
    closed form). Aims 1e-5 below the target so that dp_accounting's check passes first."""
    probe = make_event(1.0)
    if fast_rdp(probe) is None:
        return None
    key = (events.to_json(probe), float(target), float(delta))
    hit = _GUESSES.get(key)  # silos of equal size (and target) share σ
    if hit is not None:
        return hit

    def eps(s: float) -> float:
        return acc.rdp_to_epsilon(acc.RDP_ORDERS, fast_rdp(make_event(s)), delta)[0]
    out = _GUESSES[key] = acc._smallest_sigma(eps, target * (1 - 1e-5))
    return out


_GUESSES: dict = {}


def epsilon_of(event, delta: float) -> float:
    """ε of an event under RDP (the accountant that supports RepeatAndSelect)."""
    return acc.epsilon(event, delta, "rdp")


def is_tuned(event) -> bool:
    from silofl.privacy.node_tuning import NodeRepeatAndSelectEvent
    return any(isinstance(e, (RepeatAndSelectDpEvent, NodeRepeatAndSelectEvent))
               for e in acc._counts(event))


__all__ = ["check_accountable", "epsilon_of", "fast_rdp", "naive_event", "noise_of",
           "select_event", "sigma_guess", "trial_event", "tuned_event"]

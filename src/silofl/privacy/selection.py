"""What private selection (tuning) costs, as dp_accounting events, and fast σ guesses.

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

At node level (a pass is a `node_level.NodeLevelDpEvent`, an `RdpCurveDpEvent`)
dp_accounting's RepeatAndSelect cannot wrap the trial, so `node_tuning.
NodeRepeatAndSelectEvent` is RepeatAndSelect on a curve: a `DpEvent` whose RDP is
Papernot & Steinke's bound applied to one trial's curve (rounds × the pass + a
`node_tuning.GaussianScoreEvent`); the score's sensitivity is the graph domain's
(`silofl.pandemic.tuning`). This module lives in `privacy/`
so the runtime's planner prices tuned runs without importing the tuning layer; trial
distributions are duck-typed (`TrialDistributionLike`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import Protocol

import dp_accounting as dpa
import numpy as np
from dp_accounting.dp_event import RepeatAndSelectDpEvent

from silofl.errors import ConfigError
from silofl.privacy import _dpa_adapter as adapter
from silofl.privacy import events
from silofl.privacy.calibration import closed_form_sigma
from silofl.privacy.curves import is_curve_event
from silofl.privacy.evaluate import _counts, epsilon
from silofl.privacy.node_tuning import (
    GaussianScoreEvent,
    NodeRepeatAndSelectEvent,
    is_node_event,
    node_score_sigma,
)
from silofl.privacy.rdp_curves import RDP_ORDERS, _fast_rdp_of_items
from silofl.privacy.tnb_select import TnbRepeatAndSelectDpEvent, tnb_gamma


class TrialDistributionLike(Protocol):
    """What accounting needs of a distribution of the number of trials h
    (`silofl.tuning.distributions.TrialDistribution`)."""

    eta: float | None

    @property
    def mean(self) -> float: ...

    @property
    def shape(self) -> float: ...



# --- the charges ------------------------------------------------------------------------

def check_accountable(dist: TrialDistributionLike) -> None:
    """Refuse a trial distribution repeat-and-select cannot account for.

    Parameters
    ----------
    dist : TrialDistributionLike
        Distribution of the number of trials h.

    Raises
    ------
    ConfigError
        Unless η > −1 (TNB; η < 0 through `tnb_select`, η ≥ 0 dp_accounting's
        RepeatAndSelect) or Poisson, and E[h] ≥ 1.
    """
    if not dist.shape > -1:
        raise ConfigError(f"tuning eta = {dist.eta:g}: the truncated negative binomial needs "
                          "η > −1 (−0.5: the cheap default, 0: logarithmic, 1: geometric)")
    if dist.mean < 1:
        raise ConfigError(f"tuning needs a mean number of trials ≥ 1, got {dist.mean:g}; "
                          "raise mu (Poisson) or lower gamma (TNB)")


def noise_of(round_event: dpa.DpEvent) -> float:
    """σ of the Gaussian inside a pass event.

    Parameters
    ----------
    round_event : dp_accounting.DpEvent
        A (Poisson-subsampled) Gaussian DP-SGD event, or a node-level pass.

    Returns
    -------
    float
        Its noise multiplier σ.
    """
    e = round_event
    if _node(e):  # node level: the event carries its σ
        return float(e.sigma)
    while not isinstance(e, dpa.GaussianDpEvent):
        e = e.event
    return float(e.noise_multiplier)


def _node(event: dpa.DpEvent) -> bool:
    """A node-level pass event (own RDP curve): tuned through the curve events above."""
    return is_curve_event(event)


def trial_event(round_event: dpa.DpEvent, rounds: int, score_sigma: float) -> dpa.DpEvent:
    """One trial: `rounds` local passes and one Gaussian score release.

    Parameters
    ----------
    round_event : dp_accounting.DpEvent
        One local pass (a DP-SGD event, or a `NodeLevelDpEvent`).
    rounds : int
        Passes per trial.
    score_sigma : float
        Noise multiplier of the score (std = σ · sensitivity).

    Returns
    -------
    dp_accounting.ComposedDpEvent
        Hashable (tuples): a base event of ledgers and the store.
    """
    # a tuple, not a list: the event is a base event (hashed) of ledgers and the store
    if _node(round_event):  # node level: a score event with its own curve
        score = GaussianScoreEvent(float(score_sigma))
    else:
        score = dpa.GaussianDpEvent(float(score_sigma))
    return dpa.ComposedDpEvent((events.hashable(dpa.SelfComposedDpEvent(round_event, rounds)),
                                score))


def select_event(round_event: dpa.DpEvent, rounds: int, dist: TrialDistributionLike,
                 score_sigma: float) -> dpa.DpEvent:
    """The random-h, best-only release of the trials (RepeatAndSelect).

    Parameters
    ----------
    round_event, rounds, score_sigma
        As in `trial_event`.
    dist : TrialDistributionLike
        Distribution of the number of trials h (E[h] = ``dist.mean``, η = ``dist.shape``).

    Returns
    -------
    dp_accounting.DpEvent
        dp_accounting's `RepeatAndSelectDpEvent` (η ≥ 0 or Poisson), a
        `TnbRepeatAndSelectDpEvent` (η ∈ (−1, 0)), or a `NodeRepeatAndSelectEvent` (on a
        curve) for node-level passes.
    """
    check_accountable(dist)
    if _node(round_event):  # dp_accounting's RepeatAndSelect cannot wrap node-level events
        return NodeRepeatAndSelectEvent(round_event, int(rounds), float(score_sigma),
                                        float(dist.mean), float(dist.shape))
    trial = trial_event(round_event, rounds, score_sigma)
    if dist.shape < 0:  # dp_accounting's RepeatAndSelect refuses η < 0 (`tnb_select`)
        return TnbRepeatAndSelectDpEvent(trial, float(dist.mean), float(dist.shape))
    return RepeatAndSelectDpEvent(trial, float(dist.mean), float(dist.shape))


def tuned_event(round_event: dpa.DpEvent, rounds: int, dist: TrialDistributionLike,
                score_sigma: float | None = None) -> dpa.DpEvent:
    """The whole tuned run of one silo: pivot run + RepeatAndSelect(trials).

    Parameters
    ----------
    round_event, rounds, dist
        As in `select_event`.
    score_sigma : float, optional
        Defaults to the pass's own σ (`noise_of`).

    Returns
    -------
    dp_accounting.ComposedDpEvent
    """
    sigma = noise_of(round_event) if score_sigma is None else score_sigma
    return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(round_event, rounds),
                                select_event(round_event, rounds, dist, sigma)])


def naive_event(round_event: dpa.DpEvent, rounds: int, trials: int,
                score_sigma: float | None = None) -> dpa.DpEvent:
    """A fixed grid of `trials` settings released best-only, bounded by composition
    (the bound is tight for some mechanisms: Papernot & Steinke, Proposition 17).

    Parameters
    ----------
    round_event, rounds
        As in `trial_event`.
    trials : int
        Grid size (every setting is trained).
    score_sigma : float, optional
        Defaults to the pass's own σ (`noise_of`).

    Returns
    -------
    dp_accounting.ComposedDpEvent
        Pivot run + `trials` × trial.
    """
    sigma = noise_of(round_event) if score_sigma is None else score_sigma
    return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(round_event, rounds),
                                dpa.SelfComposedDpEvent(trial_event(round_event, rounds, sigma),
                                                        int(trials))])


def subsample_event(round_event: dpa.DpEvent, fraction: float) -> dpa.DpEvent:
    """A local pass at Poisson rate γ·q instead of q, same σ and steps (a subsample trial).

    Parameters
    ----------
    round_event : dp_accounting.DpEvent
        One example-level pass: `steps` × PoissonSampled(q, Gaussian(σ)).
    fraction : float
        γ in (0, 1], public.

    Returns
    -------
    dp_accounting.DpEvent
        `steps` × PoissonSampled(γ·q, Gaussian(σ)) (`events.dpsgd_event`).

    Raises
    ------
    ConfigError
        A node-level pass (its batches are exactly b persons; no Poisson rate to thin), or
        an adaptive-clipping pass (clip = "auto").
    """
    if _node(round_event):
        raise ConfigError("tuning select = 'subsample' thins the Poisson sampling rate of "
                          "example-level DP-SGD; node-level passes sample exactly b persons. "
                          "Use select = 'random' at node level")
    (base, steps), = events.flatten(round_event).items()
    if getattr(base, "count_noise", None) is not None:
        # clip = "auto": each step also releases a noisy count; the subsample trials and
        # the pivot would run at a full-rate tracker (or a fixed C₀) and be charged events
        # the plan did not declare — refuse before anything is reserved or read
        raise ConfigError("tuning select = 'subsample' needs a fixed clip: with [training] "
                          "clip = \"auto\" set tuning.select = 'random' or 'em', or set "
                          "[training] clip to a number")
    q, sigma = float(base.sampling_probability), float(base.event.noise_multiplier)
    return events.dpsgd_event(float(fraction) * q, sigma, int(steps))


def subsample_tuned_event(round_event: dpa.DpEvent, rounds: int, dist: TrialDistributionLike,
                          score_sigma: float, fraction: float) -> dpa.DpEvent:
    """Tuning on a subsample (Koskela & Kulkarni 2023), then one full run:

        Compose(pivot at γ·q,  RepeatAndSelect(trial at γ·q + score),  final run at q)

    Every part is a DP-SGD run of `rounds` passes with the same σ; the trials' and the
    pivot's passes sample each row with probability γ·q per step (independently per step,
    so the subsampled Gaussian's RDP at rate γ·q holds step by step).

    Parameters
    ----------
    round_event : dp_accounting.DpEvent
        One full-rate local pass (example level).
    rounds : int
        Passes of each phase.
    dist : TrialDistributionLike
        Distribution of the number of trials h.
    score_sigma : float
        Noise multiplier of each trial's validation score.
    fraction : float
        γ in (0, 1].

    Returns
    -------
    dp_accounting.ComposedDpEvent
    """
    sub = subsample_event(round_event, fraction)
    return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(sub, rounds),
                                select_event(sub, rounds, dist, score_sigma),
                                dpa.SelfComposedDpEvent(round_event, rounds)])


# --- fast σ search (an aid: every σ is re-checked with dp_accounting before use) ----------

def fast_rdp(event: dpa.DpEvent) -> np.ndarray | None:
    """RDP at `RDP_ORDERS` from closed forms, also through RepeatAndSelect
    (dp_accounting's own formula applied to the closed-form inner curve).

    Parameters
    ----------
    event : dp_accounting.DpEvent

    Returns
    -------
    numpy.ndarray of shape (len(RDP_ORDERS),), or None
        RDP (nats), or None if some base event has no closed form.
    """
    total = np.zeros(len(RDP_ORDERS))
    for e, c in _counts(event).items():
        if isinstance(e, (RepeatAndSelectDpEvent, TnbRepeatAndSelectDpEvent)):
            inner = fast_rdp(e.event)
            if inner is None:
                return None
            total += c * _repeat_and_select_rdp(inner, e.mean, e.shape)
        elif _node(e):  # node level (node_tuning): curves of their own at RDP_ORDERS
            part = _node_rdp(e)
            if part is None:
                return None
            total += c * part
        else:
            part = _fast_rdp_of_items([(e, c)])
            if part is None:
                return None
            total += part
    return total


_A = np.asarray(RDP_ORDERS, dtype=float)


def _node_rdp(e: dpa.DpEvent) -> np.ndarray | None:
    """A node-level event's RDP at RDP_ORDERS; a `NodeRepeatAndSelectEvent` through the
    vectorized TNB formula (None for Poisson: the library's bound is the slow part, so
    there is no faster aid than the search itself)."""
    if isinstance(e, NodeRepeatAndSelectEvent):
        if math.isinf(e.shape):
            return None
        return _repeat_and_select_rdp(e.trial_rdp(_A), e.mean, e.shape)
    return np.asarray(e.rdp(_A), dtype=float)


@lru_cache(maxsize=256)
def _gamma(shape: float, mean: float) -> float:
    # dp_accounting's γ where it has one (so the aid agrees with its figures); η < 0: ours
    return adapter.tnb_gamma(shape, mean) if shape >= 0 else tnb_gamma(shape, mean)


def _repeat_and_select_rdp(inner: np.ndarray, mean: float, shape: float) -> np.ndarray:
    """dp_accounting's RepeatAndSelect formula (`_dpa_adapter`) at RDP_ORDERS, vectorized
    for TNB (its order-by-order loops dominate a σ search); the library's own for Poisson."""
    if math.isinf(shape):
        return adapter.repeat_and_select_rdp(RDP_ORDERS, inner, mean, shape)
    c = (1 + shape) * np.min((1 - 1 / _A) * inner - math.log(_gamma(shape, mean)) / _A)
    out = np.where(_A > 1, inner + math.log(mean) / np.maximum(_A - 1, 1e-300) + c, np.inf)
    # monotonicity of RDP in the order (orders are sorted ascending)
    return np.minimum.accumulate(out[::-1])[::-1]


def sigma_guess(make_event: Callable[[float], dpa.DpEvent], target: float,
                delta: float) -> float | None:
    """Smallest σ whose closed-form RDP ε of make_event(σ) meets `target` (an aid:
    the caller re-checks it with the reporting accountant). Aims 1e-5 below the target so
    that dp_accounting's check passes first.

    Parameters
    ----------
    make_event : callable float -> dp_accounting.DpEvent
        The tuned run as a function of σ.
    target, delta : float
        The target (ε, δ).

    Returns
    -------
    float or None
        σ, or None when some base event has no closed form (`fast_rdp`).
    """
    probe = make_event(1.0)
    if fast_rdp(probe) is None:
        return None
    key = (events.to_json(probe), float(target), float(delta))
    hit = _GUESSES.get(key)  # silos of equal size (and target) share σ
    if hit is not None:
        return hit
    out = _GUESSES[key] = closed_form_sigma(make_event, target * (1 - 1e-5), delta, fast_rdp)
    return out


_GUESSES: dict = {}


def epsilon_of(event: dpa.DpEvent, delta: float) -> float:
    """ε of an event under RDP (the accountant that supports RepeatAndSelect).

    Parameters
    ----------
    event : dp_accounting.DpEvent
    delta : float

    Returns
    -------
    float
        ε under the "rdp" accountant.
    """
    return epsilon(event, delta, "rdp")


def is_tuned(event: dpa.DpEvent) -> bool:
    """Whether `event` holds a repeat-and-select charge (dp_accounting's or on a curve)."""
    return any(isinstance(e, (RepeatAndSelectDpEvent, NodeRepeatAndSelectEvent,
                              TnbRepeatAndSelectDpEvent))
               for e in _counts(event))


__all__ = ["GaussianScoreEvent", "NodeRepeatAndSelectEvent", "TnbRepeatAndSelectDpEvent",
           "TrialDistributionLike",
           "check_accountable", "epsilon_of", "fast_rdp", "is_node_event", "is_tuned",
           "naive_event", "node_score_sigma", "noise_of", "select_event", "sigma_guess", "subsample_event",
           "subsample_tuned_event",
           "trial_event", "tuned_event"]

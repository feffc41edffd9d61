"""Local DP mechanisms for what a client uploads once per round: k-ary randomized response
on predicted labels (PrivateKT, seed 001 Eqs. 2, 3, 6) and the Gaussian / Laplace mechanism
on a clipped model update (the FedAvg-with-local-DP baseline).

Adjacency. These are *local* guarantees: the output is ε-DP with respect to the client's
whole local dataset (any two datasets), hence also for add/remove or replacement of one of
its records. Every event is a dp_accounting event, composed by the same accountants,
ledgers and budget store as DP-SGD:

* randomized response keeps its input with probability β and otherwise outputs a uniform
  label (which may equal the input), so P[out = y] = β + (1 − β)/C and P[out = y'] =
  (1 − β)/C: the likelihood ratio is 1 + Cβ/(1 − β). With β of Eq. 6,
  β = (e^{ε/K} − 1)/(e^{ε/K} − 1 + C), that ratio is exactly e^{ε/K}. dp_accounting's
  `RandomizedResponseDpEvent(noise_parameter=p, num_buckets=C)` outputs a uniform bucket
  with probability p, so p = 1 − β. K such labels per round compose to ε.
* a clipped update has ‖Δ‖ ≤ C for every dataset, so two datasets' updates differ by at
  most 2C (L2 for Gaussian, L1 for Laplace): sensitivity 2C, noise std σ·2C where
  `GaussianDpEvent(σ)` meets (ε, δ) (calibrated under PLD), Laplace scale 2C/ε.

Randomness comes from the run's `Randomness` (secure by default).
"""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np

from silofl.errors import ConfigError, PrivacyError
from silofl.privacy import accounting
from silofl.privacy.clipping import clip_bound
from silofl.privacy.randomness import Randomness

MECHANISMS = ("gaussian", "laplace")


def check_epsilon(name: str, epsilon: float) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.floating)) \
            or not math.isfinite(epsilon) or epsilon <= 0:
        raise ConfigError(f"{name} must be a positive finite number (the per-round local ε of "
                          f"a client's upload), got {epsilon!r}; e.g. {name} = 5")
    return float(epsilon)


# --- randomized response (PrivateKT) -------------------------------------------------------

def rr_keep_probability(epsilon: float, samples: int, num_classes: int) -> float:
    """β of Eq. 6: the probability of uploading the true label when K = `samples` labels
    share ε; β → 1 as ε → ∞ (then the uploads are the true predictions)."""
    if epsilon / samples > 700:  # e^{ε/K} overflows; β = 1 − C/(e^{ε/K} − 1 + C) rounds to 1
        return 1.0
    x = math.expm1(epsilon / samples)
    return x / (x + num_classes)


def rr_event(epsilon: float, samples: int, num_classes: int) -> dpa.DpEvent:
    """One label's randomized response at ε/K: `RandomizedResponseDpEvent(1 − β, C)`.
    When β rounds to 1 (ε/K ≳ 37) `randomized_response` keeps every label, so the upload
    is the true prediction: `NonPrivateDpEvent` (ε = ∞), never an RR event with p = 0."""
    beta = rr_keep_probability(epsilon, samples, num_classes)
    if beta >= 1.0:  # privacy review: p = 0 crashed dp_accounting; it is no privacy at all
        return dpa.NonPrivateDpEvent()
    return dpa.RandomizedResponseDpEvent(noise_parameter=1.0 - beta, num_buckets=num_classes)


def rr_round_event(epsilon: float, samples: int, num_classes: int) -> dpa.DpEvent:
    """A client's upload in one round: K labels, each RR at ε/K (ε-LDP in all)."""
    return dpa.SelfComposedDpEvent(rr_event(epsilon, samples, num_classes), samples)


def randomized_response(labels: np.ndarray, beta: float, num_classes: int,
                        rng: Randomness) -> np.ndarray:
    """Eq. 2 on integer labels (any shape): keep each w.p. β, else a uniform label."""
    labels = np.asarray(labels, dtype=np.int64)
    u = rng.uniform((2,) + labels.shape)
    fake = np.minimum((u[1] * num_classes).astype(np.int64), num_classes - 1)
    return np.where(u[0] < beta, labels, fake)


def debias(counts: np.ndarray, reports: int, beta: float) -> np.ndarray:
    """Eq. 3: the unbiased estimate of the mean one-hot prediction from `counts` (..., C) of
    perturbed labels over `reports` clients: (counts/reports − (1 − β)/C) / β."""
    counts = np.asarray(counts, dtype=float)
    C = counts.shape[-1]
    if reports <= 0:
        raise ValueError("debias needs at least one report")
    return (counts / reports - (1.0 - beta) / C) / beta


# --- Gaussian / Laplace on a clipped update (the LDP-on-updates baseline) ------------------

def update_event(mechanism: str, epsilon: float, delta: float | None) -> dpa.DpEvent:
    """The event of one noisy upload, noise multiplier relative to the sensitivity 2C:
    Gaussian calibrated so that one release is (ε, δ) under PLD; Laplace ε-DP."""
    if mechanism == "laplace":
        return dpa.LaplaceDpEvent(1.0 / epsilon)
    if mechanism != "gaussian":
        raise ConfigError(f"unknown local DP mechanism {mechanism!r}; choose one of "
                          f"{', '.join(MECHANISMS)}")
    if delta is None or not 0 < delta < 1:
        raise PrivacyError(f"the Gaussian mechanism needs 0 < δ < 1, got {delta}")
    sigma = accounting.calibrate(lambda s: dpa.GaussianDpEvent(s), epsilon, delta, "pld")
    return dpa.GaussianDpEvent(sigma)


def clip_updates(update: np.ndarray, clip: float, norm: int) -> np.ndarray:
    """Scale each row of (k, P) so its L`norm` norm is ≤ clip (slightly inside, see
    `privacy.clipping.clip_bound`)."""
    # a diverged client's row (NaN/∞, or a norm that overflows) becomes 0, a valid input:
    # a NaN upload would reveal the divergence outside the mechanism (privacy review)
    with np.errstate(over="ignore", invalid="ignore"):
        n = np.linalg.norm(update, ord=norm, axis=1)
    bad = ~np.isfinite(n)
    update = np.where(bad[:, None], 0.0, update)
    n = np.where(bad, 0.0, n)
    return update * np.minimum(1.0, clip_bound(clip) / np.maximum(n, 1e-300))[:, None]


def noisy_updates(update: np.ndarray, event: dpa.DpEvent, clip: float,
                  rng: Randomness) -> np.ndarray:
    """Clip (k, P) rows and add the mechanism's noise at sensitivity 2·clip."""
    sens = 2.0 * clip
    if isinstance(event, dpa.GaussianDpEvent):
        return clip_updates(update, clip, 2) + rng.normal(update.shape) * \
            (event.noise_multiplier * sens)
    if isinstance(event, dpa.LaplaceDpEvent):
        u = rng.uniform(update.shape) - 0.5  # inverse CDF of Laplace(0, b)
        lap = -np.sign(u) * np.log1p(-np.minimum(2.0 * np.abs(u), 1.0 - 2.0**-53))
        return clip_updates(update, clip, 1) + lap * (event.noise_multiplier * sens)
    raise PrivacyError(f"no local mechanism for {event!r}")

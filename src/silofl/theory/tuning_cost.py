"""The privacy cost of tuning λ with a random number of trials (thesis §1.7, App. E.1–E.2).

A silo runs its mechanism h times (one λ per trial) and releases only the best result,
with h ~ TNB(η, γ) (η = 0: logarithmic, η = 1: geometric) or Poisson(μ). Papernot &
Steinke (2022, Theorem 2 = thesis Theorem E.1.2; Theorem 6 for Poisson) bound the RDP of
the whole tuned release; dp_accounting implements both as `RepeatAndSelectDpEvent(event,
mean, shape)` (shape = η, shape = inf for Poisson), under RDP only. Fig. 1.7 pays that
cost in noise: the noise multiplier z of each trial is raised until the tuned release
meets the silo's (ε, δ).

dp_accounting supports η ≥ 0; Papernot & Steinke also allow η ∈ (−1, 0), which is refused
here (the thesis notes it "performs very poorly utility-wise"). The distribution itself is
`silofl.tuning.distributions` (the one private tuning draws from); this module prices Fig. 1.7.
"""

from __future__ import annotations

import math

import numpy as np

from silofl.errors import ConfigError, PrivacyError
from silofl.privacy import accounting
from silofl.tuning.distributions import (
    TrialDistribution,
    tnb,
    tnb_mean,  # noqa: F401  (silofl.theory.tnb_mean)
)


def _check_eta(eta: float) -> None:
    if not (isinstance(eta, (int, float)) and (eta >= 0)):
        raise PrivacyError(f"TNB shape η must be ≥ 0 here (dp_accounting's "
                           f"RepeatAndSelectDpEvent supports η ≥ 0; η = 0 logarithmic, 1 "
                           f"geometric, inf Poisson), got {eta!r}")


def _check_mean(mean: float) -> None:
    if not (isinstance(mean, (int, float)) and math.isfinite(mean) and mean > 1):
        raise ConfigError(f"the expected number of trials E[h] must be a finite number > 1, "
                          f"got {mean!r}")


def tnb_gamma(eta: float, mean: float) -> float:
    """γ with E[h] = mean under TNB(η, γ)."""
    _check_eta(eta)
    _check_mean(mean)
    if math.isinf(eta):
        raise ConfigError("η = inf is the Poisson distribution; it has no γ")
    return _tnb(eta, mean=mean).gamma


def tnb_pmf(eta: float, gamma: float, h_max: int) -> np.ndarray:
    """P(h) for h = 1 … h_max (thesis App. E.1), as (h_max,): index i ↔ h = i + 1."""
    return _tnb(eta, gamma=gamma).pmf(np.arange(1, h_max + 1))


def _tnb(eta, gamma=None, mean=None):
    if gamma is not None:
        if not 0 < gamma < 1:
            raise ConfigError(f"TNB γ must lie strictly between 0 and 1, got {gamma}")
        return TrialDistribution("tnb", eta=float(eta), gamma=float(gamma))
    return tnb(eta, mean=mean)


def repeat_and_select_event(noise_multiplier: float, mean_trials: float, eta: float):
    """dp_accounting's `RepeatAndSelectDpEvent` of GaussianDpEvent(z) with E[h] =
    mean_trials and shape η (inf: Poisson(mean_trials))."""
    import dp_accounting as dpa
    _check_eta(eta)
    _check_mean(mean_trials)
    return dpa.dp_event.RepeatAndSelectDpEvent(dpa.GaussianDpEvent(float(noise_multiplier)),
                                               float(mean_trials), float(eta))


def tuned_noise_multiplier(epsilon: float, delta: float, mean_trials: float,
                           eta: float) -> float:
    """Smallest z such that the randomized tuning of a Gaussian release with noise z
    (`repeat_and_select_event`) is (ε, δ)-DP — calibrated with the library's
    `accounting.calibrate`, which uses RDP for this event (no PLD exists for it)."""
    repeat_and_select_event(1.0, mean_trials, eta)  # validate before calibrating
    return accounting.calibrate(lambda z: repeat_and_select_event(z, mean_trials, eta),
                                float(epsilon), float(delta))


def naive_grid_epsilon(noise_multiplier: float, trials: int, delta: float) -> float:
    """ε of releasing every one of `trials` runs (composition), what a fixed grid of that
    size costs in the worst case (Proposition E.1.1), under the library's accountant."""
    import dp_accounting as dpa

    ev = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(float(noise_multiplier)), int(trials))
    return accounting.guarantee(ev, float(delta))[0]

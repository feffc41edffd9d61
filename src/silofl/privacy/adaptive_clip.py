"""The privacy of DP-SGD with private adaptive clipping (Andrew et al. 2021).

With ``[training] clip = "auto"`` each silo tracks a quantile γ of its per-example gradient
norms: every step it releases, besides the noisy clipped gradient sum (sensitivity C, noise
N(0, σ_Δ²C²)), a noisy count of the batch's examples whose gradient norm is ≤ C, with each
indicator centred to b_i − ½ (sensitivity ½ under add/remove of one example, noise
N(0, σ_b²)). Andrew et al. (2021, Theorem 1) show that the pair is one Gaussian mechanism
with noise multiplier

    z = (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2),

so a Poisson-subsampled step with both releases costs exactly what a Poisson-subsampled
Gaussian step at noise multiplier z costs. silofl calibrates σ for a silo's target as for a
fixed clip (z = σ), picks σ_b as a public function of the run (`count_noise`), and runs the
gradient noise at σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2) (`gradient_noise`, rounded up so the
combination never falls below σ). `AdaptiveClipDpEvent` declares one such step; the
accountants evaluate it as ``PoissonSampled(q, Gaussian(z))`` (`equivalent`).

Two changes to the paper's update, both public functions of public quantities (free of
privacy cost):

- `clip_step`: a silo's geometric step is η_k = min(η_C, STEP_NOISE·(m_k/σ_b,k)²), so a
  silo whose noisy fraction is mostly noise (small silos taking full-batch steps at large
  σ) moves its clip slowly instead of letting it random-walk.
- `auto_quantile` (``clip_quantile = "auto"``, opt-in): the target γ_k comes from the
  clipped sum's bias-variance trade-off instead of a fixed quantile. The mean gradient
  estimate's squared error is ≈ B(C)² + r²C² (bias B(C) = E(‖g‖ − C)₊ per example at
  worst aligned; noise r·C with r = σ_Δ√P/m, P the number of noised coordinates); it is
  least where B(C)(1 − F(C)) = r²C. For exponentially distributed norms (scale s) this is
  e^(−2x) = r²x at x = C/s, i.e. x = W₀(2/r²)/2 (Lambert W), and the C that solves it is
  the quantile γ = 1 − e^(−x) of the norms: a noisy silo (r ≳ 1) aims low, a quiet one
  (r → 0) high, clamped to [QUANTILE_MIN, QUANTILE_MAX].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np

from silofl.errors import ConfigError, PrivacyError

EVENT_NAME = "adaptive_clip"
#: σ_b = max(expected batch / 20 (Andrew et al.'s choice), σ/(2·√COUNT_SHARE)): the count
#: takes at most this share of the step's Gaussian precision z⁻² (the gradient noise grows by
#: at most 1/√(1 − COUNT_SHARE) − 1 ≈ 2.6 %)
COUNT_SHARE = 0.05
#: a silo's clip step is η_k = min(η_C, STEP_NOISE / s²), s = σ_b/m the noise std of its
#: estimated fraction: the clip's stationary spread in log C is ≈ √(η/(2ρ))·s (ρ ≈ 0.4, the
#: density of log-norms at the quantile), so this keeps it near √(STEP_NOISE/0.8) ≈ 0.25
#: where the count is noisy (small full-batch silos), and leaves η_C where it is not
STEP_NOISE = 0.05
#: defaults of [training] clip_quantile (γ), clip_lr (η_C), clip_init (C₀). Andrew et al.
#: use γ = 0.5, η_C = 0.2, C₀ = 0.1; γ = 0.7 and C₀ = 0.3 came out of the README's heart
#: and School comparison with hand-set clips. γ = "auto" (`auto_quantile`) tied with 0.7 on
#: heart and the Vehicle-like task (within seed noise) but missed on held-out School (its
#: clips ≈ 0.2 against a best 0.3–1: +0.4 to +8.5 % MSE), so it is not the default
DEFAULT_QUANTILE = 0.7
#: the range `auto_quantile` keeps γ_k in (a target of 0 or 1 is never reached)
QUANTILE_MIN, QUANTILE_MAX = 0.3, 0.9
DEFAULT_CLIP_LR = 0.2
DEFAULT_CLIP_INIT = 0.3
#: the public ceiling of C_k ([training] clip_max): the top of the hand-set grid {0.1, …, 10}
DEFAULT_CLIP_MAX = 10.0


#: what clip = "auto" releases, in a plan's privacy entry (for a reader of the report)
RELEASE_TEXT = (
    "clip = auto (Andrew et al. 2021): besides the noisy clipped gradient sum (noise std "
    "gradient_noise_multiplier × C_k), every DP-SGD step released the count of the batch's "
    "examples whose gradient norm was ≤ C_k, centred (Σ(1[‖g_i‖ ≤ C_k] − ½), sensitivity ½) "
    "plus N(0, count_noise²); the pair is one Gaussian mechanism of noise multiplier "
    "noise_multiplier, charged as such in every event of this entry. C_k moved only by "
    "those noisy counts and public settings, from [training] clip_init: final_clip and "
    "clip_target_quantile are post-processing and cost nothing more")


@dataclass(frozen=True)
class AdaptiveClipDpEvent(dpa.DpEvent):
    """One DP-SGD step with a private adaptive-clipping count (a hashable base event).

    Parameters
    ----------
    q : float
        Poisson sampling rate in (0, 1].
    noise_multiplier : float
        z > 0, the noise multiplier of the equivalent Gaussian mechanism (the calibrated σ).
    count_noise : float
        σ_b > z/2: the std of the noise on the centred count (sensitivity ½).
    """

    q: float
    noise_multiplier: float
    count_noise: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "q", float(self.q))
        object.__setattr__(self, "noise_multiplier", float(self.noise_multiplier))
        object.__setattr__(self, "count_noise", float(self.count_noise))
        if not 0 < self.q <= 1:
            raise PrivacyError(f"sampling rate q must be in (0, 1], got {self.q}")
        gradient_noise(self.noise_multiplier, self.count_noise)  # refuses σ_b ≤ z/2

    @property
    def gradient_noise(self) -> float:
        """σ_Δ: the gradient sum's noise multiplier (noise std σ_Δ·C)."""
        return gradient_noise(self.noise_multiplier, self.count_noise)

    # PoissonSampledDpEvent's attributes, for code that reads q and σ off a DP-SGD step
    @property
    def sampling_probability(self) -> float:
        """q, as `dp_accounting.PoissonSampledDpEvent` names it."""
        return self.q

    @property
    def event(self) -> dpa.GaussianDpEvent:
        """The equivalent Gaussian(z), as `PoissonSampledDpEvent.event`."""
        return dpa.GaussianDpEvent(self.noise_multiplier)

    def equivalent(self) -> dpa.DpEvent:
        """What the accountants evaluate: ``PoissonSampled(q, Gaussian(z))``."""
        return dpa.PoissonSampledDpEvent(self.q, dpa.GaussianDpEvent(self.noise_multiplier))

    def to_dict(self) -> dict:
        """JSON-ready description (`events.CUSTOM_EVENTS`: ledgers and the budget store)."""
        return {"event": EVENT_NAME, "q": self.q, "noise_multiplier": self.noise_multiplier,
                "count_noise": self.count_noise,
                "gradient_noise": self.gradient_noise}  # for readers; recomputed on load

    @classmethod
    def from_dict(cls, d: dict) -> AdaptiveClipDpEvent:
        """The inverse of `to_dict`."""
        try:
            return cls(d["q"], d["noise_multiplier"], d["count_noise"])
        except (KeyError, TypeError, ValueError) as e:
            raise PrivacyError(f"malformed adaptive-clipping event {d!r}: {e}") from None


def adaptive_event(q: float, noise_multiplier: float, count_noise: float,
                   steps: int = 1) -> dpa.DpEvent:
    """`steps` DP-SGD steps with the adaptive-clipping count.

    Parameters
    ----------
    q : float
        Poisson sampling rate.
    noise_multiplier : float
        z, the calibrated σ of the equivalent Gaussian.
    count_noise : float
        σ_b, the count's noise std.
    steps : int, default 1

    Returns
    -------
    dp_accounting.DpEvent
        One `AdaptiveClipDpEvent`, self-composed `steps` times when steps > 1.
    """
    base = AdaptiveClipDpEvent(q, noise_multiplier, count_noise)
    return base if steps == 1 else dpa.SelfComposedDpEvent(base, int(steps))


def gradient_noise(sigma: float, count_noise: float) -> float:
    """σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2), rounded up.

    Parameters
    ----------
    sigma : float
        z, the noise multiplier calibrated for the silo's target.
    count_noise : float
        σ_b, the count's noise std.

    Returns
    -------
    float
        σ_Δ ≥ σ such that (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2) ≥ σ in floating point.

    Raises
    ------
    ConfigError
        σ_b ≤ σ/2: the count alone would spend the whole step's privacy.
    """
    sigma, sb = float(sigma), float(count_noise)
    rest = sigma ** -2 - (2.0 * sb) ** -2 if sb > 0 else -1.0
    if not (sigma > 0 and rest > 0):
        raise ConfigError(
            f"[training] clip_count_noise = {sb:g} is too small for the noise multiplier "
            f"σ = {sigma:.4g}: the noisy count needs σ_b > σ/2 = {sigma / 2:.4g} to leave "
            "noise for the gradient; raise clip_count_noise or use clip_count_noise = \"auto\"")
    out = rest ** -0.5
    # nudge up until the combination, as computed, is no smaller than σ (more noise is safe)
    while (out ** -2 + (2.0 * sb) ** -2) ** -0.5 < sigma:
        out = math.nextafter(out, math.inf)
    return out


def count_noise(setting: float | str, sigma: float, expected_batch: float) -> float:
    """σ_b for a silo: `setting` itself, or "auto" = max(m/20, σ/(2√COUNT_SHARE)).

    Parameters
    ----------
    setting : float or "auto"
        [training] clip_count_noise.
    sigma : float
        The silo's calibrated σ (public: from its public target and size).
    expected_batch : float
        m = q·n, the silo's expected batch size (public).

    Returns
    -------
    float
        σ_b (std of the noise on the centred count, in examples).
    """
    if setting == "auto":
        return max(expected_batch / 20.0, float(sigma) / (2.0 * math.sqrt(COUNT_SHARE)))
    return float(setting)


def equivalent(event: dpa.DpEvent) -> dpa.DpEvent:
    """`event` with every adaptive-clipping step replaced by its equivalent Gaussian (inside
    compositions and RepeatAndSelect too): what an accountant evaluates."""
    if isinstance(event, AdaptiveClipDpEvent):
        return event.equivalent()
    if isinstance(event, dpa.SelfComposedDpEvent):
        inner = equivalent(event.event)
        return event if inner is event.event else dpa.SelfComposedDpEvent(inner, event.count)
    if isinstance(event, dpa.ComposedDpEvent):
        parts = [equivalent(e) for e in event.events]
        if all(a is b for a, b in zip(parts, event.events)):
            return event
        return dpa.ComposedDpEvent(type(event.events)(parts) if isinstance(
            event.events, tuple) else parts)
    from dp_accounting.dp_event import RepeatAndSelectDpEvent
    if isinstance(event, RepeatAndSelectDpEvent):
        inner = equivalent(event.event)
        return event if inner is event.event else RepeatAndSelectDpEvent(
            inner, event.mean, event.shape)
    from silofl.privacy.tnb_select import TnbRepeatAndSelectDpEvent
    if isinstance(event, TnbRepeatAndSelectDpEvent):
        inner = equivalent(event.event)
        return event if inner is event.event else TnbRepeatAndSelectDpEvent(
            inner, event.mean, event.shape)
    return event


def auto_quantile(gradient_noise: np.ndarray | float, num_params: int,
                  expected_batch: np.ndarray | float) -> np.ndarray:
    """γ_k from the clipped sum's bias-variance trade-off (see the module docstring).

    Parameters
    ----------
    gradient_noise : float or numpy.ndarray, shape (K,)
        σ_Δ,k, the gradient sum's noise multiplier.
    num_params : int
        P, the number of coordinates the noise is added to (the model's size, or a partial
        pass's coordinates).
    expected_batch : float or numpy.ndarray, shape (K,)
        m_k = q_k·n_k.

    Returns
    -------
    numpy.ndarray, shape (K,)
        γ_k = 1 − exp(−W₀(2/r_k²)/2), r_k = σ_Δ,k·√P/m_k, clamped to
        [QUANTILE_MIN, QUANTILE_MAX].
    """
    from scipy.special import lambertw

    r = np.asarray(gradient_noise, dtype=float) * math.sqrt(max(int(num_params), 1)) \
        / np.asarray(expected_batch, dtype=float)
    x = 0.5 * np.real(lambertw(2.0 / np.maximum(r, 1e-12) ** 2))
    return np.clip(1.0 - np.exp(-x), QUANTILE_MIN, QUANTILE_MAX)


def clip_step(lr: float, count_noise: float, expected_batch: float) -> float:
    """η_k = min(η_C, STEP_NOISE·(m/σ_b)²): a silo whose noisy fraction is unreliable
    moves its clip slowly (a public function of public quantities).

    Parameters
    ----------
    lr : float
        η_C, [training] clip_lr.
    count_noise : float
        σ_b of the silo.
    expected_batch : float
        m = q·n of the silo.

    Returns
    -------
    float
        The silo's geometric step.
    """
    s = float(count_noise) / float(expected_batch)
    return min(float(lr), STEP_NOISE / (s * s))

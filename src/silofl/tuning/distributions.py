"""The random number of trials h of private hyperparameter tuning (Papernot & Steinke 2022;
thesis appendix E.1).

- TNB(η, γ), the truncated negative binomial on h ∈ {1, 2, …}, η > −1, γ ∈ (0, 1):
      f(h) ∝ (1−γ)^h · Π_{ℓ<h} (ℓ+η)/(ℓ+1)      (η = 1: geometric — Liu & Talwar's random
                                                   stopping; η = 0: logarithmic)
  with E[h] = η(1−γ) / (γ(1−γ^η))  (η ≠ 0),  (1/γ − 1)/log(1/γ)  (η = 0).
- Poisson(μ) on h ∈ {0, 1, …}: h = 0 releases no tuned result.

Draws use a silo's own `Randomness` (secure by default) by inversion of the CDF. Pure
functions over a frozen spec; every bad parameter is a ConfigError.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln

from silofl.errors import ConfigError
from silofl.privacy.randomness import Randomness

KINDS = ("tnb", "poisson")
_TAIL = 1e-13  # the pmf table ends where this little mass is left (then extended on demand)


@dataclass(frozen=True)
class TrialDistribution:
    """kind "tnb" (eta, gamma) or "poisson" (mu). Build with `tnb` / `poisson`."""

    kind: str
    eta: float | None = None
    gamma: float | None = None
    mu: float | None = None

    def __post_init__(self):
        if self.kind == "tnb":
            _check_eta(self.eta)
            if not (isinstance(self.gamma, (int, float)) and 0 < self.gamma < 1):
                raise ConfigError(f"tuning gamma must be in (0, 1) for the truncated negative "
                                  f"binomial, got {self.gamma!r}")
        elif self.kind == "poisson":
            if not (isinstance(self.mu, (int, float)) and math.isfinite(self.mu)
                    and self.mu > 0):
                raise ConfigError(f"tuning mu (the Poisson mean number of trials) must be "
                                  f"positive, got {self.mu!r}")
        else:
            raise ConfigError(f"tuning distribution must be one of {', '.join(KINDS)}, got "
                              f"{self.kind!r}")

    # -- parameters dp_accounting's RepeatAndSelectDpEvent takes -------------------------
    @property
    def mean(self) -> float:
        """E[h]."""
        if self.kind == "poisson":
            return float(self.mu)
        return _tnb_mean(self.eta, self.gamma)

    @property
    def shape(self) -> float:
        """dp_accounting's shape: η for TNB, ∞ for Poisson."""
        return math.inf if self.kind == "poisson" else float(self.eta)

    @property
    def support_min(self) -> int:
        return 0 if self.kind == "poisson" else 1

    def describe(self) -> dict:
        d = {"distribution": self.kind, "mean_trials": self.mean}
        if self.kind == "tnb":
            d.update(eta=self.eta, gamma=self.gamma)
        else:
            d.update(mu=self.mu)
        return d

    # -- pmf and draws -------------------------------------------------------------------
    def logpmf(self, h: np.ndarray) -> np.ndarray:
        """log P[h] for integer h (−∞ outside the support)."""
        h = np.asarray(h, dtype=float)
        out = np.full(h.shape, -np.inf)
        ok = h >= self.support_min
        hk = h[ok]
        if self.kind == "poisson":
            out[ok] = hk * math.log(self.mu) - self.mu - gammaln(hk + 1)
            return out
        g, eta = self.gamma, self.eta
        if eta == 0:
            out[ok] = hk * math.log1p(-g) - np.log(hk) - math.log(math.log(1 / g))
        else:
            # Π_{ℓ<h} (ℓ+η)/(ℓ+1) = Γ(h+η) / (Γ(η) Γ(h+1)), signed for η < 0 (then negative
            # and the normalizer γ^−η − 1 is negative too)
            log_prod = gammaln(hk + eta) - gammaln(eta) - gammaln(hk + 1) if eta > 0 else \
                gammaln(hk + eta) - gammaln(eta + 1) + math.log(-eta) - gammaln(hk + 1)
            norm = g ** (-eta) - 1.0
            out[ok] = hk * math.log1p(-g) + log_prod - math.log(abs(norm))
        return out

    def pmf(self, h) -> np.ndarray:
        return np.exp(self.logpmf(h))

    def table(self, upto: int | None = None) -> np.ndarray:
        """P[h] for h = 0 … H, with H where at most 1e-13 of the mass lies beyond (or `upto`)."""
        H = upto or max(16, int(4 * self.mean) + 16)
        while True:
            p = self.pmf(np.arange(H + 1))
            if upto or 1.0 - p.sum() < _TAIL or H > 10_000_000:
                return p
            H *= 2

    def draw(self, rng: Randomness, size: int) -> np.ndarray:
        """`size` independent draws (one per silo), by inverting the CDF at uniforms of
        `rng`. Returns (size,) int64."""
        p = self.table()
        cdf = np.cumsum(p)
        u = np.asarray(rng.uniform(size), dtype=float)
        h = np.searchsorted(cdf, u * cdf[-1], side="left")
        return np.minimum(h, len(p) - 1).astype(np.int64)


def _check_eta(eta) -> None:
    if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not math.isfinite(eta) \
            or not eta > -1:
        raise ConfigError(f"tuning eta (the TNB shape η) must be a number > −1 (1: geometric, "
                          f"0: logarithmic), got {eta!r}")


def tnb_mean(eta: float, gamma: float) -> float:
    """E[h] of TNB(η, γ) (thesis appendix E.1), the one formula tuning and theory share.

    Parameters
    ----------
    eta : float
        Shape η > −1 (0: logarithmic, 1: geometric).
    gamma : float
        γ in (0, 1).

    Returns
    -------
    float
        The expected number of trials E[h] > 1.

    Raises
    ------
    ConfigError
        γ outside (0, 1) or η not accepted.
    """
    if not (isinstance(gamma, (int, float)) and 0 < gamma < 1):
        raise ConfigError(f"TNB γ must lie strictly between 0 and 1, got {gamma}")
    _check_eta(eta)
    return _tnb_mean(float(eta), float(gamma))


def _tnb_mean(eta: float, gamma: float) -> float:
    if eta == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    return eta * (1 - gamma) / (gamma * (1 - gamma ** eta))


def tnb(eta: float, gamma: float | None = None, mean: float | None = None
        ) -> TrialDistribution:
    """TNB(η, γ); give γ, or the mean number of trials E[h] > 1 and γ is solved for."""
    _check_eta(eta)
    if (gamma is None) == (mean is None):
        raise ConfigError("give exactly one of tuning gamma and tuning mean_trials for the "
                          "truncated negative binomial")
    if gamma is None:
        if isinstance(mean, bool) or not isinstance(mean, (int, float)) or \
                not math.isfinite(mean) or not mean > 1:
            raise ConfigError(f"tuning mean_trials must be a number > 1, got {mean!r}")
        gamma = _solve_gamma(float(eta), float(mean))
    return TrialDistribution("tnb", eta=float(eta), gamma=float(gamma))


def poisson(mu: float) -> TrialDistribution:
    return TrialDistribution("poisson", mu=mu)


def _solve_gamma(eta: float, mean: float) -> float:
    """γ with E[h] = mean (E[h] falls from ∞ at γ → 0 to 1 at γ → 1): bisection in log γ."""
    lo, hi = 1e-300, 1 - 1e-15
    if _tnb_mean(eta, hi) > mean:  # pragma: no cover - mean > 1 always bracketed
        return hi
    for _ in range(400):
        mid = math.sqrt(lo * hi) if hi / lo > 1.5 else 0.5 * (lo + hi)
        if _tnb_mean(eta, mid) > mean:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-15 * hi:
            break
    return hi

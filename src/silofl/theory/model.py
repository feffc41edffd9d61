"""MR-MTL on private mean estimation: the model and closed forms of thesis §1.6 / App. D.

The model (thesis §1.6, "Setup"; App. D.1–D.3). K ≥ 2 silos. Silo centres
w_k = θ + N(0, τ²) (τ²: heterogeneity); silo k holds n_k points x_{k,i} = w_k + N(0, σ_k²).
Silo k releases the private local mean ŵ_k = (ξ_k + Σ_i clip_c(x_{k,i})) / n_k with
ξ_k ~ N(0, σ_DP,k²), σ_DP,k = z_k·c: the Gaussian mechanism on a sum of values clipped
to [−c, c], whose sensitivity is c under add/remove-one-example adjacency when n_k is
public (declared, never read from the data). z_k is calibrated by the library
(`silofl.privacy.accounting.calibrate` on `GaussianDpEvent(z)`) to silo k's own
(ε_k, δ_k) — the tight accountant figure, not the thesis's classic
c·√(2 ln(1.25/δ))/ε, which is looser and only valid for ε ≤ 1. Assumption D.3.2: c bounds
the data w.h.p., so clipping adds no error (`clip_mass` says how much mass lies beyond c).

Units: every error is the mean squared error E[(w_k − estimate)²] of the silo centre, in
squared data units (the thesis's "generalization error"; a fresh test point adds σ_k²).

Estimators (Lemma 1.6.1): Local ŵ_k; FedAvg w̄ = (1/K) Σ_j ŵ_j; MR-MTL
ŵ_k(λ) = α ŵ_k + (1 − α) ŵ_\\k with α = (K + λ)/((1 + λ)K) and ŵ_\\k the mean of the
other silos' ŵ_j (λ = 0: Local; λ → ∞: FedAvg). All three are post-processing of the
silos' releases, so each is (ε_k, δ_k)-DP for silo k's data (the other silos' releases do
not depend on it) — for one λ fixed in advance; choosing λ on the data costs more (§1.7).

With the local variance s_k = σ_k²/n_k + σ_DP,k²/n_k² (Eq. 1.9, D.22) the error of silo k
at α is α²·s_k + (1 − α)²·v_k, v_k = (K(K−1)τ² + Σ_{j≠k} s_j)/(K − 1)² the variance of
ŵ_\\k around w_k (D.26). Homogeneous silos give Lemma 1.6.7 / Eq. D.20–D.21. The thesis
writes these errors as conditional expectations; the expression it derives (α² s +
(1 − α)² v, D.21) is the mean squared error over centres, data and noise, which is what
`simulate` measures.

Notation read from the thesis: D.22 writes σ_k²/n and σ_DP,k²/n²; with silo-specific
sizes n_k (the point of App. D.5) we read n as n_k. D.30 can give λ_k* < 0 (silo k much
noisier than the rest); the error is then smallest as λ → ∞ (FedAvg), as the thesis says,
and `silo_optimal_lambdas` returns inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from silofl.errors import ConfigError, PrivacyError
from silofl.privacy import accounting

#: the λ grid of the thesis's sweeps (App. B.2)
THESIS_LAMBDAS = (0.0001, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)


@dataclass(frozen=True)
class MeanEstimation:
    """One instance of the model. Per-silo fields are tuples of length K.

    n: samples per silo (public); sigma2: data variance σ_k² (squared units);
    tau2: heterogeneity τ²; clip: clipping bound c (data units, public);
    noise_multiplier: z_k, so σ_DP,k = z_k·c (0: non-private); epsilon / delta: the
    (ε_k, δ_k) z_k was calibrated to (None: non-private or set directly); theta: the
    meta-centre θ (only clipping depends on it)."""

    n: tuple[int, ...]
    sigma2: tuple[float, ...]
    tau2: float
    clip: float
    noise_multiplier: tuple[float, ...]
    epsilon: tuple[float, ...] | None = None
    delta: tuple[float, ...] | None = None
    accountant: str | None = None
    theta: float = 0.0

    @property
    def K(self) -> int:
        return len(self.n)

    @property
    def private(self) -> bool:
        return any(z > 0 for z in self.noise_multiplier)

    @property
    def sigma_dp(self) -> np.ndarray:
        """σ_DP,k = z_k·c (K,), the std of the noise on silo k's clipped sum."""
        return np.asarray(self.noise_multiplier, dtype=float) * self.clip

    @property
    def local_var(self) -> np.ndarray:
        """s_k = σ_k²/n_k + σ_DP,k²/n_k² (K,) (Eq. 1.9, D.22)."""
        n = np.asarray(self.n, dtype=float)
        return np.asarray(self.sigma2, dtype=float) / n + self.sigma_dp ** 2 / n ** 2

    @property
    def homogeneous(self) -> bool:
        s = self.local_var
        return bool(np.allclose(s, s[0], rtol=1e-12, atol=0.0))

    def with_noise_multiplier(self, z) -> MeanEstimation:
        """The same silos with noise multipliers z (scalar or (K,)); (ε, δ) are kept as the
        targets the caller calibrated z to (e.g. the whole tuned release)."""
        z = _per_silo(z, self.K, "noise_multiplier")
        if np.any(z < 0) or not np.all(np.isfinite(z)):
            raise PrivacyError(f"noise multipliers must be finite and ≥ 0, got {z.tolist()}")
        return replace(self, noise_multiplier=tuple(float(v) for v in z))

    def non_private(self) -> MeanEstimation:
        return replace(self, noise_multiplier=(0.0,) * self.K, epsilon=None, delta=None,
                       accountant=None)

    def clip_mass(self) -> float:
        """Largest, over silos, probability that one point lies outside [−c, c]
        (marginally, x ~ N(θ, τ² + σ_k²)); the closed forms assume it is negligible."""
        from scipy.stats import norm
        sd = np.sqrt(self.tau2 + np.asarray(self.sigma2, dtype=float))
        return float(np.max(norm.sf((self.clip - self.theta) / sd)
                            + norm.cdf((-self.clip - self.theta) / sd)))


def _per_silo(value, K: int, name: str) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(value, dtype=float))
    if arr.ndim != 1 or arr.size not in (1, K):
        raise ConfigError(f"{name} must be one value or one per silo ({K} values), got "
                          f"{arr.size} values")
    return np.broadcast_to(arr, (K,)).copy()


def mean_estimation(K: int, n, sigma2, tau2: float, clip: float, epsilon=None, delta=1e-5,
                    *, accountant: str | None = None, theta: float = 0.0) -> MeanEstimation:
    """Validate the model's parameters and calibrate each silo's Gaussian mechanism.

    n, sigma2, epsilon, delta: one value for all silos or K values (silo-specific privacy,
    App. D.5). epsilon None: non-private. accountant: the library's (default PLD).
    Raises ConfigError / PrivacyError naming the bad value."""
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 2:
        raise ConfigError(f"the model needs K ≥ 2 silos (an integer), got {K!r}: with one "
                          "silo there is nothing to federate")
    K = int(K)
    n_arr = _per_silo(n, K, "n")
    if np.any(n_arr < 1) or np.any(n_arr != np.round(n_arr)):
        raise ConfigError(f"n (samples per silo) must be integers ≥ 1, got {n_arr.tolist()}")
    s2 = _per_silo(sigma2, K, "sigma2")
    if np.any(~np.isfinite(s2)) or np.any(s2 < 0):
        raise ConfigError(f"sigma2 (data variance) must be finite and ≥ 0, got {s2.tolist()}")
    if not (math.isfinite(tau2) and tau2 >= 0):
        raise ConfigError(f"tau2 (heterogeneity τ²) must be finite and ≥ 0, got {tau2}")
    if not (math.isfinite(clip) and clip > 0):
        raise ConfigError(f"clip (the clipping bound c) must be finite and > 0, got {clip}")
    if not math.isfinite(theta):
        raise ConfigError(f"theta must be finite, got {theta}")
    base = MeanEstimation(n=tuple(int(v) for v in n_arr), sigma2=tuple(float(v) for v in s2),
                          tau2=float(tau2), clip=float(clip), noise_multiplier=(0.0,) * K,
                          theta=float(theta))
    if epsilon is None:
        return base
    eps = _per_silo(epsilon, K, "epsilon")
    dl = _per_silo(delta, K, "delta")
    if np.any(~(eps > 0)) or np.any(~np.isfinite(eps)):
        raise PrivacyError(f"epsilon must be finite and > 0 for every silo, got "
                           f"{eps.tolist()} (omit it for the non-private model)")
    if np.any(~((dl > 0) & (dl < 1))):
        raise PrivacyError(f"delta must lie strictly between 0 and 1, got {dl.tolist()}")
    kind = accountant or accounting.DEFAULT_ACCOUNTANT
    z = [gaussian_noise_multiplier(float(e), float(d), kind) for e, d in zip(eps, dl)]
    return replace(base, noise_multiplier=tuple(z), epsilon=tuple(float(e) for e in eps),
                   delta=tuple(float(d) for d in dl), accountant=kind)


def gaussian_noise_multiplier(epsilon: float, delta: float, accountant: str | None = None
                              ) -> float:
    """z with GaussianDpEvent(z) meeting (ε, δ) under the library's accountant (one
    release of a sensitivity-1 sum; σ_DP = z·c for sensitivity c)."""
    import dp_accounting as dpa

    return accounting.calibrate(lambda z: dpa.GaussianDpEvent(z), float(epsilon),
                                float(delta), accountant or accounting.DEFAULT_ACCOUNTANT)


# --- closed forms, homogeneous silos (s = σ_loc², Eq. 1.9) ------------------------------

def _check_s_tau(s, tau2, K) -> None:
    if isinstance(K, bool) or int(K) != K or K < 2:
        raise ConfigError(f"K must be an integer ≥ 2, got {K!r}")
    if np.any(np.asarray(s) < 0) or np.any(~np.isfinite(np.asarray(s, dtype=float))):
        raise ConfigError(f"local variance σ_loc² must be finite and ≥ 0, got {s}")
    if not (math.isfinite(tau2) and tau2 >= 0):
        raise ConfigError(f"tau2 must be finite and ≥ 0, got {tau2}")


def alpha(lam, K: int) -> np.ndarray:
    """α = (K + λ)/((1 + λ)K), the weight of ŵ_k in ŵ_k(λ) (Lemma 1.6.1); λ = inf → 1/K."""
    lam = np.asarray(lam, dtype=float)
    if np.any(lam < 0) or np.any(np.isnan(lam)):
        raise ConfigError(f"λ must be ≥ 0 (inf: FedAvg), got {lam.tolist()}")
    with np.errstate(invalid="ignore"):
        a = (K + lam) / ((1 + lam) * K)
    return np.where(np.isinf(lam), 1.0 / K, a)


def mrmtl_error(s: float, tau2: float, K: int, lam) -> np.ndarray:
    """E(λ) = (1 − 1/K)(s + λ²τ²)/(λ + 1)² + s/K (Lemma 1.6.7, Eq. 1.15 / D.20), for any
    array of λ ≥ 0 (inf: FedAvg)."""
    _check_s_tau(s, tau2, K)
    lam = np.asarray(lam, dtype=float)
    alpha(lam, K)  # validates λ
    with np.errstate(invalid="ignore"):
        e = (1 - 1 / K) * (s + lam ** 2 * tau2) / (lam + 1) ** 2 + s / K
    return np.where(np.isinf(lam), fedavg_error(s, tau2, K), e)


def local_error(s: float) -> float:
    """E_loc = s (Prop. 1.6.5)."""
    return float(s)


def fedavg_error(s: float, tau2: float, K: int) -> float:
    """E_fed = (s + (K − 1)τ²)/K (proof of Props. 1.6.5–1.6.6)."""
    return float((s + (K - 1) * tau2) / K)


def optimal_lambda(s: float, tau2: float) -> float:
    """λ* = s/τ² (Theorem 1.6.3, Eq. 1.11 / D.14); inf when τ² = 0 (FedAvg is optimal)."""
    return math.inf if tau2 == 0 else float(s / tau2)


def optimal_error(s: float, tau2: float, K: int) -> float:
    """E* = s(s + Kτ²)/(K(s + τ²)) (Corollary 1.6.4, Eq. 1.12); 0 when s = τ² = 0."""
    _check_s_tau(s, tau2, K)
    return 0.0 if s + tau2 == 0 else float(s * (s + K * tau2) / (K * (s + tau2)))


def gap_to_local(s: float, tau2: float, K: int) -> float:
    """Δ_loc = E_loc − E* = (1 − 1/K) s²/(s + τ²) (Prop. 1.6.5, Eq. 1.13)."""
    return 0.0 if s + tau2 == 0 else float((1 - 1 / K) * s * s / (s + tau2))


def gap_to_fedavg(s: float, tau2: float, K: int) -> float:
    """Δ_fed = E_fed − E* = (1 − 1/K) τ⁴/(s + τ²) (Prop. 1.6.6, Eq. 1.14)."""
    return 0.0 if s + tau2 == 0 else float((1 - 1 / K) * tau2 * tau2 / (s + tau2))


def privacy_gap(sigma_dp2: float, n: int, K: int, lam) -> np.ndarray:
    """Δ_DP(λ) = (1 − 1/K) σ_DP²/((λ + 1)² n²) + σ_DP²/(K n²) (Theorem 1.6.8, Eq. 1.16)."""
    lam = np.asarray(lam, dtype=float)
    alpha(lam, K)
    with np.errstate(invalid="ignore", divide="ignore"):
        first = np.where(np.isinf(lam), 0.0, (1 - 1 / K) / (lam + 1) ** 2)
    return (first + 1 / K) * sigma_dp2 / n ** 2


def beating_interval(s: float, tau2: float) -> tuple[float, float] | None:
    """The λ for which MR-MTL(λ) is strictly better than both Local and FedAvg, as the open
    interval (lo, hi) (hi may be inf); None when no λ is.

    From Eq. 1.15: E(λ) < E_loc ⇔ λ(τ² − s) < 2s (λ > 0), i.e. λ < 2s/(τ² − s) when
    τ² > s and every λ > 0 otherwise; E(λ) < E_fed ⇔ s < τ²(1 + 2λ), i.e.
    λ > (s − τ²)/(2τ²). Both hold on a non-empty interval iff s > 0 and τ² > 0, which is
    also exactly when MR-MTL(λ*) beats both endpoints (Δ_loc, Δ_fed > 0)."""
    if s <= 0 or tau2 <= 0:
        return None
    lo = max(0.0, (s - tau2) / (2 * tau2))
    hi = math.inf if tau2 <= s else 2 * s / (tau2 - s)
    return (lo, hi) if lo < hi else None


def optimum_beats_both(s: float, tau2: float) -> bool:
    """MR-MTL(λ*) strictly beats Local and FedAvg ⇔ Δ_loc > 0 and Δ_fed > 0 ⇔ s > 0 and
    τ² > 0 (Props. 1.6.5–1.6.6)."""
    return s > 0 and tau2 > 0


def tuned_beats_both(s_untuned: float, s_tuned: float, tau2: float, K: int) -> dict:
    """Does MR-MTL at its best λ, run with the larger noise a private tuning of λ costs
    (local variance s_tuned), still beat untuned Local and FedAvg (local variance
    s_untuned)? The question of thesis §1.7 / Fig. 1.7. Optimistic for MR-MTL: it assumes
    the tuning finds λ*(s_tuned)."""
    e_tuned = optimal_error(s_tuned, tau2, K)
    e_loc, e_fed = local_error(s_untuned), fedavg_error(s_untuned, tau2, K)
    return {"tuned_error": e_tuned, "local_error": e_loc, "fedavg_error": e_fed,
            "beats_local": e_tuned < e_loc, "beats_fedavg": e_tuned < e_fed,
            "beats_both": e_tuned < min(e_loc, e_fed)}


# --- closed forms, silo-specific (App. D.5) ----------------------------------------------

def _others(s: np.ndarray) -> np.ndarray:
    return s.sum() - s  # Σ_{j≠k} s_j, (K,)


def nonlocal_var(s, tau2: float) -> np.ndarray:
    """v_k = Var(ŵ_\\k − w_k) = Kτ²/(K − 1) + Σ_{j≠k} s_j/(K − 1)² (Eq. D.26), (K,)."""
    s = np.asarray(s, dtype=float)
    K = s.size
    _check_s_tau(s, tau2, K)
    return K * tau2 / (K - 1) + _others(s) / (K - 1) ** 2


def silo_errors(s, tau2: float, lam) -> np.ndarray:
    """Error of each silo's MR-MTL estimate: α_k² s_k + (1 − α_k)² v_k, α_k = α(λ_k)
    (D.21 with silo-specific variances). lam: scalar or (K,) or (L, K) → (K,) or (L, K)."""
    s = np.asarray(s, dtype=float)
    a = alpha(lam, s.size)
    return a ** 2 * s + (1 - a) ** 2 * nonlocal_var(s, tau2)


def silo_optimal_lambdas(s, tau2: float) -> np.ndarray:
    """λ_k* = s_k / (τ² + (1/K)(Σ_{j≠k} s_j/(K − 1) − s_k)) (Theorem D.5.2, Eq. D.30); inf
    where the denominator is ≤ 0 (FedAvg is then best, see module docstring)."""
    s = np.asarray(s, dtype=float)
    K = s.size
    _check_s_tau(s, tau2, K)
    den = tau2 + (_others(s) / (K - 1) - s) / K
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = np.where(den > 0, s / np.where(den > 0, den, 1.0), np.inf)
    return np.where(s == 0, 0.0, lam)


def silo_optimal_errors(s, tau2: float) -> np.ndarray:
    """Each silo's smallest error over λ ≥ 0: σ̄_k² = (1/s_k + 1/v_k)⁻¹ (Eq. D.28) where
    λ_k* is finite, else the FedAvg error."""
    s = np.asarray(s, dtype=float)
    return silo_errors(s, tau2, silo_optimal_lambdas(s, tau2))


def silo_fedavg_errors(s, tau2: float) -> np.ndarray:
    """Each silo's FedAvg error Σ_j s_j/K² + (K − 1)τ²/K (α = 1/K)."""
    return silo_errors(s, tau2, np.inf)


def summary(m: MeanEstimation, lambdas=THESIS_LAMBDAS) -> dict:
    """Every closed form for `m` as plain data (per silo; the homogeneous statements of
    §1.6 too when all silos share one local variance)."""
    s = m.local_var
    lam_k = silo_optimal_lambdas(s, m.tau2)
    out = {
        "model": {"K": m.K, "n": list(m.n), "sigma2": list(m.sigma2), "tau2": m.tau2,
                  "clip": m.clip, "theta": m.theta, "epsilon": m.epsilon, "delta": m.delta,
                  "accountant": m.accountant,
                  "noise_multiplier": list(m.noise_multiplier),
                  "sigma_dp": m.sigma_dp.tolist(), "clip_mass": m.clip_mass()},
        "silos": {"local_var": s.tolist(), "lambda_star": lam_k.tolist(),
                  "local_error": s.tolist(),
                  "fedavg_error": silo_fedavg_errors(s, m.tau2).tolist(),
                  "optimal_error": silo_optimal_errors(s, m.tau2).tolist(),
                  "beats_local": (silo_optimal_errors(s, m.tau2) < s).tolist(),
                  "beats_fedavg": (silo_optimal_errors(s, m.tau2)
                                   < silo_fedavg_errors(s, m.tau2)).tolist()},
        "lambdas": list(lambdas),
        "silo_error_at_lambda": silo_errors(s, m.tau2,
                                            np.asarray(lambdas, float)[:, None]).tolist(),
        "homogeneous": None,
    }
    if m.homogeneous:
        s0, K, t2 = float(s[0]), m.K, m.tau2
        out["homogeneous"] = {
            "local_var": s0, "lambda_star": optimal_lambda(s0, t2),
            "local_error": local_error(s0), "fedavg_error": fedavg_error(s0, t2, K),
            "optimal_error": optimal_error(s0, t2, K), "gap_to_local": gap_to_local(s0, t2, K),
            "gap_to_fedavg": gap_to_fedavg(s0, t2, K),
            "optimum_beats_both": optimum_beats_both(s0, t2),
            "beating_interval": beating_interval(s0, t2),
            "error_at_lambda": mrmtl_error(s0, t2, K, lambdas).tolist(),
            "privacy_gap_at_lambda": privacy_gap(float(m.sigma_dp[0]) ** 2, m.n[0], K,
                                                 lambdas).tolist()}
    return out

"""Scores and estimates for the white-box (server-view) audit of DP-SGD.

A Dirac gradient canary lives in an auditing-only coordinate that no record's gradient
touches, so what the server sees in that coordinate over a local pass of L steps is

    u = Σ_t (σ·z_t + Δ·b_t),   z_t ~ N(0, 1),  b_t ~ Bernoulli(q) if the canary is in, else 0,

in units of the clip norm C (Δ = 1 when clipping works). Everything here takes these
per-pass sums as an (m, B) array per silo — m canaries, B passes — with the steps of
each pass (B,).

* `llr_scores`: the log-likelihood ratio of "in" vs "out" summed over the passes, with the
  claimed (q, σ): the optimal score when the mechanism is as claimed (Neyman–Pearson).
* `qda_scores`: a Gaussian quadratic discriminant over the B passes, fitted on half of the
  canaries: it sees structure the claim rules out (noise that repeats across passes).
* `estimate`: μ̂ = (mean "in" − mean "out")/pooled sd of the LLR score and the lower end
  of its one-sided confidence interval (as Nasr et al. 2023 audit from score
  distributions), read through the claimed mechanism family: the noise scale c at which
  the analytic mechanism (Poisson-subsampled Gaussian, the claimed q and steps, noise σ·c)
  gives that μ, and the accountant's ε at that noise. An *estimate*, not proof (see
  `ESTIMATE_ASSUMES`); for the mechanism as claimed it is ≈ the claim, and its lower end
  exceeds the claim with probability ≈ 1 − confidence.
* `detectable`: the power of the estimate at these settings — the smallest true ε it
  flags with the stated confidence, from the score's exact moments against the analytic
  mechanism at scaled noise (Gauss–Hermite quadrature) and the normal law of μ̂.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special, stats

from silofl.errors import ConfigError

#: what the estimate assumes, stated wherever it is reported
ESTIMATE_ASSUMES = ("an estimate, not proof: assumes the mechanism is a Poisson-subsampled "
                    "Gaussian with the claimed sampling rate and steps; the audit measures its "
                    "effective noise (noise std / clipped canary norm) from the canaries' "
                    "scores and reports the accountant's ε at that noise; the interval is "
                    "normal theory for μ̂ (one-sided)")


def _pass_weights(steps: np.ndarray, q: float) -> tuple[np.ndarray, np.ndarray]:
    """ks (L+1,) and log Binomial(k; L_b, q) (B, L+1) (−inf beyond each pass's L_b)."""
    steps = np.asarray(steps, dtype=int)
    ks = np.arange(int(steps.max()) + 1)
    with np.errstate(divide="ignore"):
        logw = stats.binom.logpmf(ks[None, :], steps[:, None], q)
    return ks, logw


def llr_scores(u: np.ndarray, steps: np.ndarray, q: float, sigma: float) -> np.ndarray:
    """(m,) Σ_b log p_in(u_b)/p_out(u_b) for per-pass sums u (m, B) (units of C).

    p_out = N(0, L_b σ²); p_in = Σ_k Binomial(k; L_b, q)·N(k, L_b σ²)."""
    u = np.asarray(u, dtype=float)
    steps = np.asarray(steps)
    if u.ndim != 2 or u.shape[1] != steps.size:
        raise ConfigError(f"per-pass sums must be (m, {steps.size}), got {u.shape}")
    ks, logw = _pass_weights(steps, q)
    var = steps * sigma ** 2  # (B,)
    out = np.zeros(u.shape[0])
    for b in range(u.shape[1]):  # (m, L+1) at a time keeps memory flat
        t = logw[b][None, :] + (ks[None, :] * u[:, b:b + 1] - ks[None, :] ** 2 / 2) / var[b]
        out += special.logsumexp(t, axis=1)
    return out


def _shrunk_cov(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and Ledoit–Wolf covariance of rows x (n, B)."""
    from sklearn.covariance import LedoitWolf  # scikit-learn: only the audit needs it

    lw = LedoitWolf().fit(x)
    return x.mean(0), lw.covariance_


def qda_scores(u: np.ndarray, included: np.ndarray, fit: np.ndarray) -> np.ndarray:
    """(m,) Gaussian log-likelihood ratio "in" vs "out" with each class's mean and
    (shrunk) covariance over the B passes, fitted on the canaries where `fit` (m,) is True.

    Under the claimed mechanism this is close to the plain sum; when the noise repeats
    across passes, the out-canaries' covariance is nearly singular and the score separates
    the two classes almost perfectly."""
    u = np.asarray(u, dtype=float)
    inc, fit = np.asarray(included, bool), np.asarray(fit, bool)
    if min(np.sum(fit & inc), np.sum(fit & ~inc)) < 3:
        return np.zeros(u.shape[0])
    logp = []
    for cls in (~inc, inc):
        mean, cov = _shrunk_cov(u[fit & cls])
        logp.append(stats.multivariate_normal(mean, cov, allow_singular=True).logpdf(u))
    return np.atleast_1d(logp[1] - logp[0])



def simulate_sums(m: int, steps: np.ndarray, q: float, sigma: float, delta_norm: float,
                  included: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per-pass sums (m, B) of the analytic mechanism: N(0, L_b σ²) noise plus
    `delta_norm` × Binomial(L_b, q) for the included canaries (tests and benchmarks)."""
    steps = np.asarray(steps)
    u = rng.normal(size=(m, steps.size)) * np.sqrt(steps)[None, :] * sigma
    k = rng.binomial(np.broadcast_to(steps, (m, steps.size)), q)
    return u + delta_norm * k * np.asarray(included, bool)[:, None]


#: Gauss–Hermite nodes for the score's moments (probabilists' form: E f(Z), Z ~ N(0, 1))
_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(96)
_GH_W = _GH_W / _GH_W.sum()


def _pass_llr(u: np.ndarray, L: int, q: float, sigma: float) -> np.ndarray:
    ks = np.arange(L + 1)
    logw = stats.binom.logpmf(ks, L, q)
    t = logw[None, :] + (ks[None, :] * u[:, None] - ks[None, :] ** 2 / 2) / (L * sigma ** 2)
    return special.logsumexp(t, axis=1)


def score_moments(steps: np.ndarray, q: float, sigma: float,
                  scale: float = 1.0) -> tuple[float, float, float, float]:
    """Exact mean and variance of `llr_scores` (claimed q, σ) without and with the canary
    when the mechanism's noise is σ·`scale`: (mean₀, var₀, mean₁, var₁), by quadrature per
    pass length (passes are independent, so moments add)."""
    out = np.zeros(4)
    lengths, counts = np.unique(np.asarray(steps, dtype=int), return_counts=True)
    for L, n in zip(lengths, counts):
        sd = math.sqrt(L) * sigma * scale
        w = stats.binom.pmf(np.arange(L + 1), L, q)
        f0 = _pass_llr(sd * _GH_X, L, q, sigma)
        m0, s0 = _GH_W @ f0, _GH_W @ f0 ** 2
        m1 = s1 = 0.0
        for k in range(L + 1):
            if w[k] < 1e-300:
                continue
            fk = _pass_llr(k + sd * _GH_X, L, q, sigma)
            m1, s1 = m1 + w[k] * (_GH_W @ fk), s1 + w[k] * (_GH_W @ fk ** 2)
        out += n * np.array([m0, s0 - m0 ** 2, m1, s1 - m1 ** 2])
    return tuple(float(v) for v in out)  # type: ignore[return-value]


def expected_mu(steps: np.ndarray, q: float, sigma: float, scale: float = 1.0) -> float:
    """μ the LLR score separates "in" from "out" by when the noise is σ·`scale`."""
    m0, v0, m1, v1 = score_moments(steps, q, sigma, scale)
    return (m1 - m0) / math.sqrt((v0 + v1) / 2)


def mu_hat(out: np.ndarray, inn: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """(μ̂, its one-sided lower confidence limit, SE): the standardized mean difference of
    two samples, Var μ̂ ≈ 1/n₀ + 1/n₁ + μ²/(2(n₀ + n₁)) (normal theory)."""
    a, b = np.asarray(out, float), np.asarray(inn, float)
    n0, n1 = a.size, b.size
    if min(n0, n1) < 2:
        raise ConfigError("an estimate needs at least 2 canaries with and 2 without")
    pooled = math.sqrt(((n0 - 1) * a.var(ddof=1) + (n1 - 1) * b.var(ddof=1)) / (n0 + n1 - 2))
    diff = float(b.mean() - a.mean())
    if pooled == 0:
        return (math.inf, math.inf, 0.0) if diff > 0 else (0.0, 0.0, 0.0)
    mu = diff / pooled
    se = math.sqrt(1 / n0 + 1 / n1 + mu ** 2 / (2 * (n0 + n1)))
    return mu, mu - float(stats.norm.ppf(confidence)) * se, se


#: the noise scales an estimate can resolve: below the smallest the noise is "none"
SCALE_RANGE = (1e-3, 1e3)


def noise_scale_for(mu: float, steps: np.ndarray, q: float, sigma: float) -> float:
    """The noise scale c at which the analytic mechanism's expected μ equals `mu` (μ falls
    as c grows); 0 for μ beyond what the smallest scale gives, inf for μ ≤ 0."""
    lo, hi = SCALE_RANGE
    if not mu > 0 or mu <= expected_mu(steps, q, sigma, hi):
        return math.inf
    if math.isinf(mu) or mu >= expected_mu(steps, q, sigma, lo):
        return 0.0
    for _ in range(50):  # bisection in log scale
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if expected_mu(steps, q, sigma, mid) > mu else (lo, mid)
    return math.sqrt(lo * hi)


def estimate(out: np.ndarray, inn: np.ndarray, steps: np.ndarray, q: float, sigma: float,
             true_epsilon, confidence: float) -> dict:
    """The ε estimate from LLR scores without (`out`) and with (`inn`) the canary.

    `true_epsilon(c)` is the accountant's ε of the job's mechanism with its noise × c
    (inf at c = 0, 0 at c = inf). Returns μ̂ and its lower limit, the noise scales they
    imply, and ε for both: "epsilon" (point) and "epsilon_lower" (the verdict's)."""
    mu, lower, se = mu_hat(out, inn, confidence)
    c, c_lo = noise_scale_for(mu, steps, q, sigma), noise_scale_for(lower, steps, q, sigma)
    return {"mu": mu, "mu_lower": lower, "se": se, "noise_scale": c,
            "noise_scale_at_lower": c_lo, "epsilon": _eps_at(true_epsilon, c),
            "epsilon_lower": _eps_at(true_epsilon, c_lo), "confidence": confidence,
            "canaries": [int(np.size(out)), int(np.size(inn))], "assumes": ESTIMATE_ASSUMES}


def _eps_at(true_epsilon, c: float) -> float:
    if c == 0:
        return math.inf
    return 0.0 if math.isinf(c) else float(true_epsilon(c))


def scale_at(true_epsilon, epsilon: float, tol: float = 1e-3) -> float:
    """The noise scale c at which `true_epsilon(c)` = `epsilon` (ε falls as c grows;
    bisection in log scale to relative `tol`)."""
    a, b = SCALE_RANGE
    while math.log(b / a) > tol:
        mid = math.sqrt(a * b)
        a, b = (mid, b) if float(true_epsilon(mid)) > epsilon else (a, mid)
    return math.sqrt(a * b)


def detectable(steps: np.ndarray, q: float, sigma: float, claim: float, n_out: int,
               n_in: int, confidence: float, true_epsilon) -> dict:
    """The smallest true ε that `estimate` flags (ε lower end above `claim`) with
    probability ≥ `confidence` when n_out and n_in canaries are scored, and what it expects
    for the mechanism as run.

    A mechanism with noise σ·c gives μ_c (`expected_mu`); μ̂ ≈ N(μ_c, SE_c), and it is
    flagged when μ̂ − z·SE > μ_claim, μ_claim the μ at the scale where the family's ε is
    the claim: P(flag) = Φ((μ_c − μ_claim − z·SE_c)/SE_c). The answer is the c where that
    probability reaches `confidence` (bisection), and the accountant's ε there."""
    z = float(stats.norm.ppf(confidence))
    mu_claim = expected_mu(steps, q, sigma, scale_at(true_epsilon, claim))

    def se(mu: float) -> float:
        return math.sqrt(1 / n_out + 1 / n_in + mu ** 2 / (2 * (n_out + n_in)))

    def p_flag(c: float) -> float:
        mu_c = expected_mu(steps, q, sigma, c)
        return float(stats.norm.cdf((mu_c - mu_claim - z * se(mu_c)) / se(mu_c)))

    a, b = SCALE_RANGE[0], 1.0
    while math.log(b / a) > 1e-3:
        mid = math.sqrt(a * b)
        a, b = (mid, b) if p_flag(mid) >= confidence else (a, mid)
    mu1 = expected_mu(steps, q, sigma, 1.0)
    return {"detectable_epsilon": float(true_epsilon(a)), "detectable_noise_scale": a,
            "mu_claim": mu_claim, "expected_mu": mu1,
            "expected_epsilon_lower": _eps_at(true_epsilon, noise_scale_for(
                mu1 - z * se(mu1), steps, q, sigma)),
            "false_flag_probability": p_flag(1.0)}

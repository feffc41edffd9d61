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
from collections.abc import Callable
from functools import lru_cache

import numpy as np
from scipy import stats

from silofl.errors import ConfigError

#: what the estimate assumes, stated wherever it is reported
ESTIMATE_ASSUMES = ("an estimate, not proof: assumes the mechanism is a Poisson-subsampled "
                    "Gaussian with the claimed sampling rate and steps; the audit measures its "
                    "effective noise (noise std / clipped canary norm) from the canaries' "
                    "scores and reports the accountant's ε at that noise; the interval is "
                    "normal theory for μ̂ (one-sided)")


#: binomial terms below this mass are dropped from the mixture (they cannot move a score)
_TINY = 1e-15


def _terms(L: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """The canary counts k worth keeping in a pass of L steps and their log Binomial(k; L, q)."""
    ks = np.arange(L + 1)
    logw = stats.binom.logpmf(ks, L, q)
    keep = logw > math.log(_TINY)
    keep[0] = True
    return ks[keep], logw[keep]


def _lse(t: np.ndarray) -> np.ndarray:
    """log Σ exp over the last axis (max-shifted)."""
    mx = t.max(axis=-1)
    return mx + np.log(np.exp(t - mx[..., None]).sum(axis=-1))


def llr_scores(u: np.ndarray, steps: np.ndarray, q: float, sigma: float) -> np.ndarray:
    """Each canary's log-likelihood ratio "in" vs "out", Σ_b log p_in(u_b)/p_out(u_b).

    p_out = N(0, L_b σ²); p_in = Σ_k Binomial(k; L_b, q)·N(k, L_b σ²). The per-pass term is
    a smooth function of u_b; it is evaluated exactly on `GRID` points spanning the data and
    interpolated (error far below 1e-6 per pass: any score gives valid bounds, and the
    estimate's moments use the exact function).

    Parameters
    ----------
    u : ndarray, shape (m, B)
        Per-pass sums of m canaries' coordinates over B passes, in units of the clip norm C.
    steps : ndarray of int, shape (B,)
        DP-SGD steps L_b in each pass.
    q : float
        The claimed per-step sampling rate, in (0, 1].
    sigma : float
        The claimed noise multiplier (noise std / C).

    Returns
    -------
    ndarray, shape (m,)
        The scores (nats); larger means "in" is more likely.

    Raises
    ------
    ConfigError
        `u` is not (m, B) for B = ``steps.size``.
    """
    u = np.asarray(u, dtype=float)
    steps = np.asarray(steps, dtype=int)
    if u.ndim != 2 or u.shape[1] != steps.size:
        raise ConfigError(f"per-pass sums must be (m, {steps.size}), got {u.shape}")
    out = np.zeros(u.shape[0])
    for L in np.unique(steps):
        ks, logw = _terms(int(L), q)
        cols = u[:, steps == L]
        if not cols.size:
            continue
        lo, hi = float(cols.min()), float(cols.max())
        h = (hi - lo) / (GRID - 1) or 1.0
        grid = lo + h * np.arange(GRID + 1)
        f = _lse(logw + (ks * grid[:, None] - ks ** 2 / 2) / (L * sigma ** 2))
        pos = (cols - lo) / h  # uniform grid: the cell is a division away, no search
        i = np.minimum(pos.astype(np.int64), GRID - 1)
        t = pos - i
        out += (f[i] * (1 - t) + f[i + 1] * t).sum(axis=1)
    return out


#: points at which the per-pass LLR is evaluated exactly (`llr_scores`)
GRID = 1 << 14


def _shrunk_cov(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and Ledoit–Wolf (2004) shrunk covariance of rows x (n, B): the sample
    covariance pulled towards a multiple of the identity by the estimated optimal weight."""
    n, p = x.shape
    mean = x.mean(0)
    xc = x - mean
    S = xc.T @ xc / n
    mu = np.trace(S) / p
    d2 = float(np.sum((S - mu * np.eye(p)) ** 2))
    b2 = float(np.sum(np.sum(xc ** 2, axis=1) ** 2) / n ** 2 - np.sum(S ** 2) / n)
    shrink = 0.0 if d2 == 0 else min(max(b2, 0.0), d2) / d2
    return mean, (1 - shrink) * S + shrink * mu * np.eye(p)


def qda_scores(u: np.ndarray, included: np.ndarray, fit: np.ndarray) -> np.ndarray:
    """Gaussian log-likelihood ratio "in" vs "out" with each class's mean and (Ledoit–Wolf
    shrunk) covariance over the B passes, fitted on the canaries where `fit` is True.

    Under the claimed mechanism this is close to the plain sum; when the noise repeats
    across passes, the out-canaries' covariance is nearly singular and the score separates
    the two classes almost perfectly.

    Parameters
    ----------
    u : ndarray, shape (m, B)
        Per-pass sums (units of C), as `llr_scores`.
    included : ndarray of bool, shape (m,)
        The auditor's coin: the canary was "in".
    fit : ndarray of bool, shape (m,)
        The canaries the class means and covariances are fitted on (score the others for
        a valid bound).

    Returns
    -------
    ndarray, shape (m,)
        The scores (nats); all zero when either class has fewer than 3 fitted canaries.
    """
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


def score_moments(steps: np.ndarray, q: float, sigma: float,
                  scale: float = 1.0) -> tuple[float, float, float, float]:
    """Exact mean and variance of `llr_scores` (claimed q, σ) without and with the canary
    when the mechanism's noise is σ·`scale`: (mean₀, var₀, mean₁, var₁), by quadrature per
    pass length (passes are independent, so moments add)."""
    lengths, counts = np.unique(np.asarray(steps, dtype=int), return_counts=True)
    return _moments(tuple(zip(lengths.tolist(), counts.tolist())), float(q), float(sigma),
                    float(scale))


@lru_cache(maxsize=4096)
def _moments(passes: tuple, q: float, sigma: float, scale: float) -> tuple:
    out = np.zeros(4)
    for L, n in passes:
        ks, logw = _terms(L, q)
        sd = math.sqrt(L) * sigma * scale
        # rows: the canary's count j (0 = out), columns: quadrature nodes; the score's terms k
        x = np.concatenate([[0.0], ks])[:, None] + sd * _GH_X[None, :]
        f = _lse(logw + (ks * x[..., None] - ks ** 2 / 2) / (L * sigma ** 2))
        m, s2 = f @ _GH_W, (f ** 2) @ _GH_W
        w = np.exp(logw)
        m1, s1 = float(w @ m[1:]), float(w @ s2[1:])
        out += n * np.array([m[0], s2[0] - m[0] ** 2, m1, s1 - m1 ** 2])
    return tuple(float(v) for v in out)


def expected_mu(steps: np.ndarray, q: float, sigma: float, scale: float = 1.0) -> float:
    """The μ by which the LLR score separates "in" from "out" when the noise is σ·`scale`.

    Parameters
    ----------
    steps : ndarray of int, shape (B,)
        DP-SGD steps per pass.
    q, sigma : float
        The claimed sampling rate and noise multiplier (the score's parameters).
    scale : float
        The mechanism's noise is σ·scale (1: as claimed).

    Returns
    -------
    float
        (mean₁ − mean₀) / √((var₀ + var₁)/2) of the score (dimensionless), from its exact
        moments (`score_moments`).
    """
    m0, v0, m1, v1 = score_moments(steps, q, sigma, scale)
    return (m1 - m0) / math.sqrt((v0 + v1) / 2)


def mu_hat(out: np.ndarray, inn: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """The standardized mean difference of two samples of scores, with its one-sided
    lower confidence limit: Var μ̂ ≈ 1/n₀ + 1/n₁ + μ²/(2(n₀ + n₁)) (normal theory).

    Parameters
    ----------
    out, inn : ndarray, shape (n₀,) and (n₁,)
        Scores of the canaries without and with the canary's contribution (n ≥ 2 each).
    confidence : float
        Of the one-sided lower limit, in (0, 1).

    Returns
    -------
    tuple of float
        (μ̂, its lower limit, its standard error), dimensionless; (inf, inf, 0) when the
        samples are separated with no spread.

    Raises
    ------
    ConfigError
        Fewer than 2 scores in either sample.
    """
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


def scale_for_mu(mu: float, mu_at: Callable[[float], float]) -> float:
    """The noise scale c at which a mechanism family's expected μ, `mu_at(c)`, equals `mu`
    (μ falls as c grows; bisection in log scale); 0 for μ beyond what the smallest scale
    gives, inf for μ ≤ 0 or below the largest scale's."""
    lo, hi = SCALE_RANGE
    if not mu > 0 or mu <= mu_at(hi):
        return math.inf
    if math.isinf(mu) or mu >= mu_at(lo):
        return 0.0
    while math.log(hi / lo) > 1e-5:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if mu_at(mid) > mu else (lo, mid)
    return math.sqrt(lo * hi)


def noise_scale_for(mu: float, steps: np.ndarray, q: float, sigma: float) -> float:
    """`scale_for_mu` for the Poisson-subsampled Gaussian (`expected_mu`)."""
    return scale_for_mu(mu, lambda c: expected_mu(steps, q, sigma, c))


def estimate_through(out: np.ndarray, inn: np.ndarray, mu_at: Callable[[float], float],
                     true_epsilon, confidence: float, assumes: str) -> dict:
    """μ̂ of the scores `out` / `inn` and its one-sided lower limit (`mu_hat`), read
    through a mechanism family: the noise scales c where `mu_at(c)` equals them
    (`scale_for_mu`) and `true_epsilon(c)` there (see `estimate`)."""
    mu, lower, se = mu_hat(out, inn, confidence)
    c, c_lo = scale_for_mu(mu, mu_at), scale_for_mu(lower, mu_at)
    return {"mu": mu, "mu_lower": lower, "se": se, "noise_scale": c,
            "noise_scale_at_lower": c_lo, "epsilon": _eps_at(true_epsilon, c),
            "epsilon_lower": _eps_at(true_epsilon, c_lo), "confidence": confidence,
            "canaries": [int(np.size(out)), int(np.size(inn))], "assumes": assumes}


def estimate(out: np.ndarray, inn: np.ndarray, steps: np.ndarray, q: float, sigma: float,
             true_epsilon, confidence: float) -> dict:
    """The ε estimate from LLR scores without (`out`) and with (`inn`) the canary, read
    through the claimed mechanism family. An estimate, not proof (`ESTIMATE_ASSUMES`).

    Parameters
    ----------
    out, inn : ndarray, shape (n₀,) and (n₁,)
        `llr_scores` of the "out" and "in" canaries.
    steps : ndarray of int, shape (B,)
        DP-SGD steps per pass.
    q, sigma : float
        The claimed sampling rate and noise multiplier.
    true_epsilon : callable
        ``true_epsilon(c)``: the accountant's ε of the job's mechanism with its noise × c
        (inf at c = 0, 0 at c = inf), at the claim's δ.
    confidence : float
        Of the one-sided lower limit, in (0, 1).

    Returns
    -------
    dict
        "mu", "mu_lower", "se" (dimensionless); "noise_scale" and "noise_scale_at_lower"
        (the c they imply; 1 = the claimed noise); "epsilon" (point) and "epsilon_lower"
        (the verdict's), in the claim's unit; "confidence", "canaries" [n₀, n₁] and
        "assumes".
    """
    return estimate_through(out, inn, lambda c: expected_mu(steps, q, sigma, c),
                            true_epsilon, confidence, ESTIMATE_ASSUMES)


def _eps_at(true_epsilon, c: float) -> float:
    if c == 0:
        return math.inf
    return 0.0 if math.isinf(c) else float(true_epsilon(c))


def scale_at(true_epsilon, epsilon: float, tol: float = 1e-3) -> float:
    """The noise scale c at which `true_epsilon(c)` = `epsilon` (ε falls as c grows;
    bisection in log scale to relative `tol`). 1 when the mechanism as run is at `epsilon`
    (a job's claim is its accountant's ε)."""
    if math.isclose(float(true_epsilon(1.0)), epsilon, rel_tol=1e-9):
        return 1.0
    a, b = SCALE_RANGE
    while math.log(b / a) > tol:
        mid = math.sqrt(a * b)
        a, b = (mid, b) if float(true_epsilon(mid)) > epsilon else (a, mid)
    return math.sqrt(a * b)


def detectable(steps: np.ndarray, q: float, sigma: float, claim: float, n_out: int,
               n_in: int, confidence: float, true_epsilon) -> dict:
    """The power of `estimate`: the smallest true ε it flags (ε lower end above `claim`)
    with probability ≥ `confidence` when n_out and n_in canaries are scored, and what it
    expects for the mechanism as run.

    A mechanism with noise σ·c gives μ_c (`expected_mu`); μ̂ ≈ N(μ_c, SE_c), and it is
    flagged when μ̂ − z·SE > μ_claim, μ_claim the μ at the scale where the family's ε is
    the claim: P(flag) = Φ((μ_c − μ_claim − z·SE_c)/SE_c). The answer is the c where that
    probability reaches `confidence` (bisection), and the accountant's ε there — inf
    (noise scale 0) when even the smallest noise scale is not flagged that often.

    Parameters
    ----------
    steps : ndarray of int, shape (B,)
        DP-SGD steps per pass.
    q, sigma : float
        The claimed sampling rate and noise multiplier.
    claim : float
        The claimed ε.
    n_out, n_in : int
        Canaries scored without and with the canary.
    confidence : float
        Both the estimate's one-sided confidence and the required flagging probability.
    true_epsilon : callable
        ``true_epsilon(c)``, as `estimate`.

    Returns
    -------
    dict
        "detectable_epsilon" (same unit as the claim) and "detectable_noise_scale";
        "mu_claim" and "expected_mu" (dimensionless); "expected_epsilon_lower" (the lower
        end expected for the mechanism as run); "false_flag_probability" (of the mechanism
        as run).
    """
    return detectable_through(lambda c: expected_mu(steps, q, sigma, c), claim, n_out, n_in,
                              confidence, true_epsilon)


def detectable_through(mu_at: Callable[[float], float], claim: float, n_out: int,
                       n_in: int, confidence: float, true_epsilon) -> dict:
    """`detectable` for any mechanism family whose expected μ at noise scale c is
    `mu_at(c)`."""
    z = float(stats.norm.ppf(confidence))
    mu_claim = mu_at(scale_at(true_epsilon, claim))

    def se(mu: float) -> float:
        return math.sqrt(1 / n_out + 1 / n_in + mu ** 2 / (2 * (n_out + n_in)))

    def p_flag(c: float) -> float:
        mu_c = mu_at(c)
        return float(stats.norm.cdf((mu_c - mu_claim - z * se(mu_c)) / se(mu_c)))

    a, b = SCALE_RANGE[0], 1.0
    if p_flag(a) < confidence:  # not even (almost) no noise is flagged reliably: no ε is
        a, found = 0.0, math.inf  # (and the accountant is not asked at a vanishing noise)
    else:
        while math.log(b / a) > 1e-3:
            mid = math.sqrt(a * b)
            a, b = (mid, b) if p_flag(mid) >= confidence else (a, mid)
        found = float(true_epsilon(a))
    mu1 = mu_at(1.0)
    return {"detectable_epsilon": found, "detectable_noise_scale": a,
            "mu_claim": mu_claim, "expected_mu": mu1,
            "expected_epsilon_lower": _eps_at(true_epsilon, scale_for_mu(
                mu1 - z * se(mu1), mu_at)),
            "false_flag_probability": p_flag(1.0)}

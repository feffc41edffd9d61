"""Empirical ε lower bounds from membership guesses.

* One run (Steinke, Nasr & Jagielski 2023, "Privacy auditing with one (1) training run",
  Theorem 3.1/3.3 and Appendix D): m canaries, each included independently with
  probability ½; an auditor guesses the membership of r of them and is right v times. If the
  mechanism is (ε, δ)-DP, the number of correct guesses is stochastically dominated (up to the
  δ term) by Binomial(r, e^ε/(1 + e^ε)), so a v that would be improbable under that null
  refutes ε. `one_run_epsilon` returns the largest ε refuted at confidence 1 − β.
* One run under an f-DP claim (the f-DP refinement of the one-run analysis, in the form of
  Mahloujifar, Melis & Chaudhuri 2024, "Auditing f-Differential Privacy in One Run",
  arXiv:2410.22235): if the mechanism is f-DP for a tradeoff curve f, the count of correct
  guesses is bounded by a recursion over the curve (`fdp_rejects`), much tighter than the
  (ε, δ) binomial when f is the Gaussian curve G_μ. `one_run_gdp` refutes μ-GDP and reports
  it as the ε that the Gaussian mechanism with that μ has at the claimed δ — a bound that
  assumes the mechanism's tradeoff curve is Gaussian, so it is reported beside the (ε, δ)
  bound, never in place of it. With the (ε, 0) curve the recursion reproduces Theorem 3.1's
  binomial bound exactly when every guess is right, and is at most ~0.02 below it otherwise
  (tests/test_audit.py).
* Many runs: a threshold test on a scalar statistic from runs on neighbouring datasets D
  and D′. (ε, δ)-DP implies TPR ≤ e^ε·FPR + δ (and the same with the roles swapped), so
  ε ≥ ln((TPR − δ)/FPR) with TPR bounded below and FPR above (Clopper–Pearson).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import optimize, special, stats

from silofl.errors import ConfigError


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[≥ v correct of r guesses] under the null "the mechanism is (ε, δ)-DP", with m
    canaries (Steinke et al. 2023, Theorem 3.3 as computed in their Appendix D): the
    Binomial(r, e^ε/(1+e^ε)) tail plus 2mδ times the largest average pmf mass just below v."""
    if not (0 <= v <= r <= m):
        raise ConfigError(f"one-run audit needs 0 <= correct ({v}) <= guesses ({r}) <= "
                          f"canaries ({m})")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ConfigError(f"one-run audit needs ε >= 0 and δ in [0, 1], got {epsilon}, {delta}")
    q = 1.0 / (1.0 + math.exp(-epsilon))  # accuracy of ε-DP randomized response
    tail = float(stats.binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    # α = max_i P[v > Binomial(r, q) >= v − i] / i
    pmf = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # v−1, v−2, ..., 0
    alpha = float(np.max(np.cumsum(pmf) / np.arange(1, v + 1)))
    return min(tail + alpha * delta * 2 * m, 1.0)


def _largest_refuted(refuted: Callable[[float], bool], tol: float, cap: float) -> float:
    """The largest x in [0, cap] with refuted(x), for a `refuted` that holds on an interval
    [0, x*) (monotone); 0 when refuted(0) fails. Doubling, then bisection to `tol`."""
    if not refuted(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while refuted(hi):
        lo, hi = hi, 2 * hi
        if hi > cap:
            return lo
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if refuted(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _check_beta(beta: float) -> None:
    if not 0 < beta < 1:
        raise ConfigError(f"beta (1 − confidence) must be in (0, 1), got {beta}")


def one_run_epsilon(m: int, r: int, v: int, delta: float = 0.0, beta: float = 0.05,
                    tol: float = 1e-6) -> float:
    """The largest ε such that (ε, δ)-DP is rejected at level β (confidence 1 − β) by v
    correct guesses out of r with m canaries; 0 when nothing is rejected. Bisection on the
    p-value, which rises monotonically in ε."""
    _check_beta(beta)
    return _largest_refuted(lambda e: one_run_p_value(m, r, v, e, delta) < beta, tol, 1e3)


# --- the f-DP refinement ----------------------------------------------------------------

def gaussian_curve(mu: float) -> Callable[[float], float]:
    """x ↦ f(1 − x) for the μ-GDP tradeoff curve f(α) = Φ(Φ⁻¹(1 − α) − μ): the least
    probability an event can have on one neighbour when it has probability x on the other."""
    return lambda x: float(special.ndtr(special.ndtri(x) - mu))


def dp_curve(epsilon: float, delta: float) -> Callable[[float], float]:
    """x ↦ f(1 − x) for the (ε, δ)-DP tradeoff curve
    f(α) = max(0, 1 − δ − e^ε α, e^−ε (1 − δ − α))."""
    e = math.exp(epsilon)
    return lambda x: max(0.0, 1 - delta - e * (1 - x), (x - delta) / e)


def fdp_rejects(m: int, r: int, v: int, beta: float,
                curve: Callable[[float], float]) -> bool:
    """True when v or more correct guesses out of r (m canaries) have probability below β
    under *every* mechanism with the tradeoff curve behind `curve` (x ↦ f(1 − x)).

    The recursion of Mahloujifar et al. (2024) ("audit_rh_with_cap"; the paper's text was not
    reachable here — the recursion follows its public implementation in Google's
    jax_privacy auditing module, re-written, and is checked in tests/test_audit.py against
    Theorem 3.1 and against exactly-Gaussian canaries). Reading: suppose P[≥ v correct] ≥ β.
    Then the expected mass (per canary) of correct guesses is at least β·v/m and that of
    wrong ones β·(r − v)/m; going down one correct guess at a time (i = v − 1, …, 0), f-DP
    forces the wrong mass up to at least curve(correct mass), and each unit of wrong mass
    added at level i brings i/(r − i) units of correct mass with it. If the masses this
    forces exceed the r/m that r guesses can carry, the supposition is impossible: reject."""
    if not (0 <= v <= r <= m) or r == 0:
        raise ConfigError(f"f-DP audit needs 0 <= correct ({v}) <= guesses ({r}) <= "
                          f"canaries ({m}) and at least one guess")
    right, wrong = beta * v / m, beta * (r - v) / m
    for i in range(v - 1, -1, -1):
        forced = max(wrong, curve(right))
        if forced == wrong:  # a fixed point: nothing changes below this level
            break
        right = min(right + i / (r - i) * (forced - wrong), 1.0)
        wrong = forced
    return right + wrong > r / m


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP (the Gaussian mechanism with sensitivity/σ = μ; Dong, Roth & Su 2022,
    Cor. 2.13): Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
    if mu <= 0:
        return 0.0
    return float(stats.norm.cdf(-epsilon / mu + mu / 2)
                 - math.exp(epsilon + stats.norm.logcdf(-epsilon / mu - mu / 2)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε with μ-GDP ⇒ (ε, δ)-DP (δ(ε) falls in ε); 0 when δ(0) ≤ δ (every
    μ ≤ 0), ∞ for μ = ∞ (no noise)."""
    if not 0 < delta < 1:
        raise ConfigError(f"the Gaussian (f-DP) bound needs δ in (0, 1), got {delta}")
    if math.isinf(mu) and mu > 0:
        return math.inf
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2
    return float(optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-10))


def one_run_gdp(m: int, r: int, v: int, delta: float, beta: float = 0.05,
                tol: float = 1e-5) -> dict:
    """The largest μ such that μ-GDP is rejected at level β by v correct guesses of r (m
    canaries), and the ε the Gaussian mechanism with that μ has at `delta`:
    {"mu": μ̂, "epsilon": ε(μ̂, δ)}. Valid as a bound on ε only if the mechanism's tradeoff
    curve is Gaussian (see the module docstring); 0 when nothing is rejected."""
    _check_beta(beta)
    if not 0 < delta < 1:
        raise ConfigError(f"the Gaussian (f-DP) bound needs δ in (0, 1), got {delta}")
    mu = _largest_refuted(lambda u: fdp_rejects(m, r, v, beta, gaussian_curve(u)), tol, 64.0)
    return {"mu": mu, "epsilon": gdp_epsilon(mu, delta)}


#: what the f-DP (Gaussian) bound assumes, stated wherever it is reported
GDP_ASSUMPTION = ("valid only if the mechanism's tradeoff curve is Gaussian (μ-GDP, e.g. "
                  "full-batch DP-SGD); for Poisson-subsampled DP-SGD it is an estimate, not "
                  "proof — the verdict uses the (ε, δ) bound")


def guesses(scores: np.ndarray, k_pos: int, k_neg: int) -> np.ndarray:
    """Guess "in" (+1) for the k_pos highest scores, "out" (−1) for the k_neg lowest,
    abstain (0) on the rest. Ties are broken by position (a fixed, data-independent rule)."""
    s = np.asarray(scores, float)
    if k_pos + k_neg > len(s):
        raise ConfigError(f"{k_pos} + {k_neg} guesses exceed the {len(s)} canaries")
    order = np.argsort(-s, kind="stable")
    g = np.zeros(len(s), dtype=int)
    g[order[:k_pos]] = 1
    if k_neg:
        g[order[len(s) - k_neg:]] = -1
    return g


def guess_grid(m: int) -> list[int]:
    """Guesses per side tried by `one_run_audit`: fixed shares of m, chosen before the data
    is seen (m/50, m/20, m/10, m/4, m/2), so that the Bonferroni correction over them keeps
    the bound valid."""
    return sorted({max(1, int(m * f)) for f in (0.02, 0.05, 0.1, 0.25, 0.5)})


def one_run_audit(scores: dict[str, np.ndarray], included: np.ndarray, delta: float,
                  confidence: float = 0.95) -> dict:
    """The one-run bound from canary `scores` (name → (m,) score, higher = "more likely
    included") and the true inclusion (m,) bool. Every (score, k) pair in the fixed grid is
    tried with k guesses on each side; the family-wise level 1 − confidence is split evenly
    between them (Bonferroni), so the reported maximum is a valid lower bound.

    "gdp" holds the f-DP refinement from the same tries at the same per-try level: the best
    ε refuted *for a Gaussian tradeoff curve* (`one_run_gdp`). It is a separate statement
    (valid at `confidence` on its own, under its assumption); the verdict uses "epsilon"."""
    inc = np.asarray(included, bool)
    m = len(inc)
    grid = [k for k in guess_grid(m) if 2 * k <= m]
    tries = [(name, k) for name in scores for k in grid]
    beta = (1 - confidence) / max(len(tries), 1)
    best = {"epsilon": 0.0, "score": None, "guesses": 0, "correct": 0, "k": 0}
    gdp = {"epsilon": 0.0, "mu": 0.0, "score": None, "guesses": 0, "correct": 0}
    table = []
    for name, k in tries:
        g = guesses(scores[name], k, k)
        r = int(np.sum(g != 0))
        v = int(np.sum((g == 1) & inc) + np.sum((g == -1) & ~inc))
        eps = one_run_epsilon(m, r, v, delta, beta)
        g = one_run_gdp(m, r, v, delta, beta) if delta > 0 else {"mu": 0.0, "epsilon": 0.0}
        table.append({"score": name, "k": k, "guesses": r, "correct": v, "epsilon": eps,
                      "gdp_epsilon": g["epsilon"], "gdp_mu": g["mu"]})
        if eps > best["epsilon"] or best["score"] is None:
            best = {"epsilon": eps, "score": name, "guesses": r, "correct": v, "k": k}
        if g["mu"] > gdp["mu"] or gdp["score"] is None:
            gdp = dict(g, score=name, guesses=r, correct=v)
    return dict(best, canaries=m, included=int(inc.sum()), beta_per_try=beta,
                confidence=confidence, tries=table,
                gdp=dict(gdp, assumes=GDP_ASSUMPTION))


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """One-sided (lower at level alpha, upper at level alpha) bounds of a binomial rate."""
    lo = float(stats.beta.ppf(alpha, k, n - k + 1)) if k > 0 else 0.0
    hi = float(stats.beta.ppf(1 - alpha, k + 1, n - k)) if k < n else 1.0
    return lo, hi


def _cp_bound(k1, n1, k0, n0, delta: float, alpha: float) -> np.ndarray:
    """Vectorized max(ln((TPR⁻ − δ)/FPR⁺), ln((TNR⁻ − δ)/FNR⁺), 0) from counts: k1 of n1
    D′ runs and k0 of n0 D runs above the threshold."""
    k1, k0 = np.asarray(k1, float), np.asarray(k0, float)
    tpr_lo = np.where(k1 > 0, stats.beta.ppf(alpha, np.maximum(k1, 1), n1 - k1 + 1), 0.0)
    fpr_hi = np.where(k0 < n0, stats.beta.ppf(1 - alpha, k0 + 1, np.maximum(n0 - k0, 1)), 1.0)
    tnr_lo = np.where(n0 - k0 > 0, stats.beta.ppf(alpha, np.maximum(n0 - k0, 1), k0 + 1), 0.0)
    fnr_hi = np.where(k1 > 0, stats.beta.ppf(1 - alpha, n1 - k1 + 1, np.maximum(k1, 1)), 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(tpr_lo > delta, np.log(np.maximum(tpr_lo - delta, 1e-300) / fpr_hi), 0.0)
        b = np.where(tnr_lo > delta, np.log(np.maximum(tnr_lo - delta, 1e-300) / fnr_hi), 0.0)
    return np.maximum(np.maximum(a, b), 0.0)


#: thresholds tried per statistic: every distinct value up to this many, else this many
#: evenly spaced order statistics (the choice uses the first halves only either way)
MAX_THRESHOLDS = 4000


def _candidates(x: np.ndarray) -> np.ndarray:
    """The thresholds a multi-run test tries on the first halves' values x."""
    cand = np.unique(x)
    if cand.size > MAX_THRESHOLDS:
        cand = cand[np.linspace(0, cand.size - 1, MAX_THRESHOLDS).round().astype(int)]
    return cand


def multi_run_epsilon(on_d: dict[str, np.ndarray], on_d1: dict[str, np.ndarray],
                      delta: float, confidence: float = 0.95) -> dict:
    """ε lower bound from statistics of runs on D (without the canary) and D′ (with it).

    on_d, on_d1: name → (N,) / (N′,) one value per run. The statistic, direction and
    threshold are chosen on the first half of each sample only (the one maximizing the same
    bound computed on that half); the second half gives Clopper–Pearson bounds (the error
    1 − confidence split between the two rates) on TPR/FPR and TNR/FNR, and
    ε ≥ max(ln((TPR⁻ − δ)/FPR⁺), ln((TNR⁻ − δ)/FNR⁺))."""
    alpha = (1 - confidence) / 2
    best = (-1.0, None, 1, 0.0)
    for name in on_d:
        a, b = np.asarray(on_d[name], float), np.asarray(on_d1[name], float)
        ha, hb = len(a) // 2, len(b) // 2
        cand = _candidates(np.concatenate([a[:ha], b[:hb]]))
        sa, sb = np.sort(a[:ha]), np.sort(b[:hb])
        for sign in (1, -1):
            # how many of each first half lie strictly beyond each candidate (sign · x > sign · t)
            if sign == 1:
                k1 = hb - np.searchsorted(sb, cand, side="right")
                k0 = ha - np.searchsorted(sa, cand, side="right")
            else:
                k1 = np.searchsorted(sb, cand, side="left")
                k0 = np.searchsorted(sa, cand, side="left")
            score = _cp_bound(k1, hb, k0, ha, delta, alpha)
            i = int(np.argmax(score))
            if score[i] > best[0]:
                best = (float(score[i]), name, sign, float(cand[i]))
    _, name, sign, t = best
    a, b = np.asarray(on_d[name], float), np.asarray(on_d1[name], float)
    ha, hb = len(a) // 2, len(b) // 2
    k1, n1 = int(np.sum(sign * b[hb:] > sign * t)), len(b) - hb
    k0, n0 = int(np.sum(sign * a[ha:] > sign * t)), len(a) - ha
    tpr_lo, fpr_hi = clopper_pearson(k1, n1, alpha)[0], clopper_pearson(k0, n0, alpha)[1]
    tnr_lo, fnr_hi = clopper_pearson(n0 - k0, n0, alpha)[0], \
        clopper_pearson(n1 - k1, n1, alpha)[1]
    eps = float(_cp_bound(k1, n1, k0, n0, delta, alpha))
    return {"epsilon": eps, "statistic": name, "threshold": t,
            "direction": int(sign), "runs_d": len(a), "runs_d1": len(b),
            "held_out": [n0, n1], "tpr_lower": tpr_lo, "fpr_upper": fpr_hi,
            "tnr_lower": tnr_lo, "fnr_upper": fnr_hi, "confidence": confidence}

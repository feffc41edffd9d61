"""Empirical ε lower bounds from membership guesses.

* One run (Steinke, Nasr & Jagielski 2023, "Privacy auditing with one (1) training run",
  Theorem 3.1/3.3 and Appendix D): m canaries, each included independently with
  probability ½; an auditor guesses the membership of r of them and is right v times. If the
  mechanism is (ε, δ)-DP, the number of correct guesses is stochastically dominated (up to the
  δ term) by Binomial(r, e^ε/(1 + e^ε)), so a v that would be improbable under that null
  refutes ε. `one_run_epsilon` returns the largest ε refuted at confidence 1 − β.
* Many runs: a threshold test on a scalar statistic from runs on neighbouring datasets D
  and D′. (ε, δ)-DP implies TPR ≤ e^ε·FPR + δ (and the same with the roles swapped), so
  ε ≥ ln((TPR − δ)/FPR) with TPR bounded below and FPR above (Clopper–Pearson).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

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


def one_run_epsilon(m: int, r: int, v: int, delta: float = 0.0, beta: float = 0.05,
                    tol: float = 1e-6) -> float:
    """The largest ε such that (ε, δ)-DP is rejected at level β (confidence 1 − β) by v
    correct guesses out of r with m canaries; 0 when nothing is rejected. Bisection on the
    p-value, which falls monotonically in ε's complement."""
    if not 0 < beta < 1:
        raise ConfigError(f"beta (1 − confidence) must be in (0, 1), got {beta}")
    if one_run_p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) < beta:  # p(hi) < β: hi still refuted
        lo, hi = hi, 2 * hi
        if hi > 1e3:
            return lo
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if one_run_p_value(m, r, v, mid, delta) < beta:
            lo = mid
        else:
            hi = mid
    return lo


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
    between them (Bonferroni), so the reported maximum is a valid lower bound."""
    inc = np.asarray(included, bool)
    m = len(inc)
    grid = [k for k in guess_grid(m) if 2 * k <= m]
    tries = [(name, k) for name in scores for k in grid]
    beta = (1 - confidence) / max(len(tries), 1)
    best = {"epsilon": 0.0, "score": None, "guesses": 0, "correct": 0, "k": 0}
    table = []
    for name, k in tries:
        g = guesses(scores[name], k, k)
        r = int(np.sum(g != 0))
        v = int(np.sum((g == 1) & inc) + np.sum((g == -1) & ~inc))
        eps = one_run_epsilon(m, r, v, delta, beta)
        table.append({"score": name, "k": k, "guesses": r, "correct": v, "epsilon": eps})
        if eps > best["epsilon"] or best["score"] is None:
            best = {"epsilon": eps, "score": name, "guesses": r, "correct": v, "k": k}
    return dict(best, canaries=m, included=int(inc.sum()), beta_per_try=beta,
                confidence=confidence, tries=table)


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
        cand = np.unique(np.concatenate([a[:ha], b[:hb]]))
        for sign in (1, -1):
            k1 = (sign * b[:hb][None, :] > sign * cand[:, None]).sum(1)
            k0 = (sign * a[:ha][None, :] > sign * cand[:, None]).sum(1)
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

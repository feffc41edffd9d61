"""λ without spending: each silo's λ_k from the silos' released updates (``lam = "auto"``).

MR-MTL and Ditto pull a personal model towards the shared one with strength λ. The thesis
gives the best λ in closed form for mean estimation (App. D.5, Theorem D.5.2, Eq. D.30):

    λ_k* = s_k / (τ² + (1/K)(Σ_{j≠k} s_j/(K − 1) − s_k))       (∞ where the bracket ≤ 0)

from each silo's local variance s_k and the heterogeneity τ² between the silos' optima.
The server holds every silo's released (noised) update; everything below is computed from
those updates and from public settings only, so it is post-processing: it reads no data,
is charged nothing (ε cost 0), and the ledgers of an auto-λ run equal those of the same
run at a fixed λ.

Model (the assumptions, per coordinate — isotropic): near its optimum w_k* silo k's
objective (loss + l2) is h/2‖w − w_k*‖²; the w_k* spread around their mean with variance
τ² per coordinate; silo k's DP-SGD step adds N(0, V_k) per coordinate to its gradient,
V_k = (σ_k·C / B_k)², B_k = q_k·n_k the expected batch.

Public inputs. σ_k is calibrated from silo k's declared target (ε_k, δ_k) and its steps;
C, lr, l2, the batch size b and the rounds R are job settings; q_k = b/n_k, B_k = q_k·n_k
and the steps per pass T_k follow from the silo's size n_k, public under the library's
stated assumption that silo sizes are public (the assumption that already lets weighted
averaging and the sampling rate be declared). Each silo sends [V_k, lr, T_k, q_k] with its
update (`noise_header`); the server checks lr against the job's.

Per round t, from the pass of silo k that started at S_k with pull λ'_k towards the
anchor w̄ and released Δ_k (T_k steps):

1. Implied gradient:  ĝ_k = −Δ_k/(lr·T_k) − λ'_k (S_k + Δ_k/2 − w̄); its DP noise has
   variance v_k = V_k·Σ_{i<T_k} ρ^{2i}/T_k² per coordinate (ρ = 1 − lr·h).
2. Curvature (secant over rounds): under the model a pass without pull gives
   ĝ_k = h_e (S_k − w_k*) + noise, h_e = (1 − ρ^T)/(lr·T), and the noise of round t is
   independent of S_k(t). So h_e is the slope of ĝ_k(t) on S_k(t) pooled over silos with a
   per-silo intercept (least squares over rounds), and h = (1 − (1 − lr·T·h_e)^{1/T})/lr.
3. Spread of the implied optima u_k = S_k − ĝ_k/h_e, per round over the m silos that
   answered: U_t = Σ_k‖u_k − ū‖²/((m − 1)·P), averaged over rounds. Its expectation is
   τ² + mean_k(stat_k) + mean_k(v_k + samp_k)/h_e²: the heterogeneity, the silos'
   empirical optima's own sampling error, and this round's noise.
3b. Sampling noise, from successive rounds: the deviation of ĝ_k from the round's silo
   mean, less h_e times that of S_k, varies between rounds by 2(v_k + samp_k) (a drift
   common to all silos cancels). An epoch of Poisson batches (T_k·q_k = local_epochs)
   gives samp_k = (1 − q_k)·ψ/T_k with ψ = Σ²/b (Σ² the per-example gradient variance);
   ψ is pooled over silos with weight (1 − q_k)² (a full-batch silo measures none). The
   empirical optimum of n_k examples then varies by stat_k = Σ²/(n_k h²) = ψ·q_k/h².
       τ̂² = max(0, U − (1 + κ)·mean_k(v_k + samp_k)/h_e² − mean_k(stat_k)),
   κ = `NOISE_MARGIN` = 5%: the noise variance is trusted to 5% (a real loss contracts the
   noise along a pass in directions of every curvature, not the model's one h), so under
   high noise a spread within 5% of the noise is read as none (λ → FedAvg).
4. Local variance: the DP noise a silo's Local model carries after its R·T_k steps plus
   its sampling error, s_k = lr²·V_k·(1 − ρ^{2RT_k})/(1 − ρ²) + stat_k per coordinate.
5. λ_k. The thesis's closed form (`RULE = "d30"`): λ_k = h·λ_k*(s, τ̂²) by D.30 (its λ is
   for curvature 1: the stationary point of h/2‖w − u‖² + λ/2‖w − w̄‖² is that of
   1/2‖w − u‖² + (λ/h)/2‖w − w̄‖²).
5b. The default (`RULE = "sgd"`) keeps the model and the estimates but not the estimator's
   error formula: under DP-SGD the pull shrinks a personal model's noise as 1/(1 + λ/h)
   (a stationary fluctuation), not as the released mean's 1/(1 + λ/h)² (D.21), so D.30
   overshoots. It takes the λ_k minimizing the deviation error after N = R·T_k steps,
       (1 − r)²·τ̂² + r²·stat_k + lr²·V_k·(1 − ρ_λ^{2N})/(1 − ρ_λ²),
   r = (1 − ρ_λ^N)·h/(h + λ) the share of the way to the personal optimum, ρ_λ =
   1 − lr(h + λ), over 0, a log grid h·10^[−3, 3] and ∞ (error τ̂²). Large N, small lr:
   λ/h = s'/(2τ² − s') (s' the Local noise), ∞ for s' ≥ 2τ² — D.30's s/τ² halved.
   Either rule: λ_k = ∞ where D.30's bracket is ≤ 0 or lr·λ_k ≥ `MAX_STEP_PULL` (an
   explicit pull that strong is unstable): that silo runs as FedAvg (starts from the
   broadcast model, no pull, its personal model is the shared one). λ_k = 0 is Local.

Burn-in: the first ⌈R/10⌉ rounds (at least 2) run as FedAvg (λ = ∞; round 1 at λ = 0,
where every model is the shared one anyway) and are not observed: early on every silo moves
along the same steep directions, which the one-curvature model reads as a large h; FedAvg
is also what the estimator falls back to until the slope is measurable (two observed
rounds). Checked against
the mean-estimation truth in tests/test_auto_lambda.py and benchmarks/bench_auto_lambda.py.
Known limits: one curvature for every direction (an anisotropic loss is summarized by the
slope the rounds' movements see); with few silos (heart: K = 4) τ̂² has few degrees of
freedom and λ_k can swing between rounds.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.base import ServerState, check_nonnegative
from silofl.config.base import did_you_mean
from silofl.errors import ConfigError

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer

#: the value of `lam` that asks for the estimator
AUTO = "auto"
#: where an auto λ comes from, as the outputs say
SOURCE = "auto: from released updates (post-processing), ε cost 0"
#: lr·λ at or above this is run as FedAvg (λ = ∞): an explicit pull that strong is unstable
MAX_STEP_PULL = 0.5
#: weight of past rounds in the running statistics (per round)
MEMORY = 1.0
#: relative error allowed for the noise variance of ĝ before a spread counts as τ² (the
#: contraction along a pass and the curvature of a real loss are not the model's)
NOISE_MARGIN = 0.05
#: λ before the estimate is measurable (∞: FedAvg)
START_LAM = math.inf
#: share of the rounds run as FedAvg before the estimator starts (at least 2 rounds)
BURN_IN = 0.1
#: weight of past rounds in the successive differences that measure sampling noise
DIFF_MEMORY = 0.8
#: how λ_k follows from the estimates: "sgd" (the DP-SGD error model, step 5b) or "d30"
RULE = "sgd"
#: columns of a silo's header: DP noise variance per coordinate per step, lr, steps, q
HEADER = 4


def check_lam(value: Any, name: str = "lambda (lam)") -> float | str:
    """A λ setting: a number ≥ 0, or exactly ``"auto"``.

    Parameters
    ----------
    value : float or str
        The setting as given.
    name : str
        How to name the setting in an error.

    Returns
    -------
    float or str
        The number as a float, or ``"auto"``.

    Raises
    ------
    ConfigError
        Anything else (a near miss such as ``"Auto "`` says how to write it).
    """
    if isinstance(value, str):
        if value == AUTO:
            return AUTO
        hint = ("did you mean \"auto\"? write it exactly as \"auto\" (lower case, no spaces)"
                if did_you_mean(value.strip().lower(), [AUTO], cutoff=0.7) else
                "give a number ≥ 0 (0: Local; larger federates more) or \"auto\" (λ from "
                "the released updates, no privacy cost)")
        raise ConfigError(f"{name} must be a number ≥ 0 or \"auto\", got {value!r}: {hint}")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{name} must be a number ≥ 0 or \"auto\", got {value!r}")
    return check_nonnegative(name, float(value))


def noise_header(trainer: LocalTrainer) -> np.ndarray:
    """What each hosted silo sends with its update: [V_k, lr, T_k, q_k] (K, 4).

    V_k = (σ_k·C / B_k)² is the DP noise variance per coordinate of one step's gradient
    (0 in the non-private mode), lr the step size, T_k the steps per pass, q_k = b/n_k the
    sampling rate — all public.
    """
    K = len(trainer.steps_per_round)
    var = np.zeros(K)
    if trainer.rule.private:
        var = (trainer.rule.noise_std() / trainer.expected_batch) ** 2
    return np.column_stack([var, np.full(K, float(trainer.lr)),
                            np.asarray(trainer.steps_per_round, float),
                            np.broadcast_to(np.asarray(trainer.q, float), (K,))])


def optimal_lambdas(s: np.ndarray, tau2: float) -> np.ndarray:
    """λ_k* of Eq. D.30 for curvature 1, (K,); ∞ where the bracket is ≤ 0, 0 where s_k = 0.

    Parameters
    ----------
    s : numpy.ndarray
        Local variances s_k ≥ 0, shape (K,), squared parameter units.
    tau2 : float
        Heterogeneity τ² ≥ 0 (same units).
    """
    s = np.asarray(s, dtype=float)
    K = s.size
    den = tau2 + ((s.sum() - s) / (K - 1) - s) / K
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = np.where(den > 0, s / np.where(den > 0, den, 1.0), np.inf)
    return np.where(s == 0, 0.0, lam)


def sgd_error(lam: np.ndarray, h: float, lr: float, var: float | np.ndarray,
              steps: float | np.ndarray, tau2: float,
              stat: float | np.ndarray = 0.0) -> np.ndarray:
    """A silo's error in the deviation from the silos' mean after `steps` DP-SGD steps with
    pull λ (any shape; ∞: FedAvg), per coordinate, up to the factor (1 − 1/K) and the
    mean's error, which λ does not change (step 5b of the module docstring)."""
    lam = np.asarray(lam, float)
    fin = np.isfinite(lam)
    lf = np.where(fin, lam, 0.0)
    rho = np.clip(1 - lr * (h + lf), -1 + 1e-9, 1.0)
    reach = (1 - rho ** steps) * h / (h + lf)  # share of the way to the personal optimum
    # the pull shrinks the silo's own sampling error (stat) as it shrinks its offset τ²
    bias = (1 - reach) ** 2 * tau2 + reach ** 2 * stat
    r2 = rho * rho
    noise = lr * lr * var * np.where(r2 < 1 - 1e-12, (1 - r2 ** steps) / np.maximum(1 - r2, 1e-300),
                                     steps)
    return np.where(fin, bias + noise, tau2)


def sgd_lambdas(h: float, lr: float, var: np.ndarray, steps: np.ndarray,
                tau2: float, stat: np.ndarray | float = 0.0) -> np.ndarray:
    """Each silo's λ_k minimizing `sgd_error` over 0, a log grid h·10^[−3, 3] and ∞, (K,)."""
    grid = np.concatenate([[0.0], h * np.logspace(-3, 3, 121), [np.inf]])
    grid = grid[~(lr * grid >= MAX_STEP_PULL) | np.isinf(grid)]
    err = sgd_error(grid[None, :], h, lr, np.asarray(var, float)[:, None],
                    np.asarray(steps, float)[:, None], tau2,
                    np.broadcast_to(np.asarray(stat, float), np.shape(var))[:, None])
    return grid[np.argmin(err, axis=1)]


def burn_in(rounds: int) -> int:
    """Rounds run as FedAvg, unobserved, before the estimate starts: ⌈BURN_IN·R⌉, ≥ 2 (the
    early rounds move every silo along the same steep directions, which the isotropic
    model would read as a large curvature)."""
    return max(2, math.ceil(BURN_IN * rounds))


def _sum_rho(rho: float, steps: np.ndarray) -> np.ndarray:
    """Σ_{i<steps} ρ^{2i} (elementwise over steps)."""
    r2 = rho * rho
    if r2 >= 1.0 - 1e-12:
        return np.asarray(steps, float)
    return (1 - r2 ** np.asarray(steps, float)) / (1 - r2)


@dataclass
class Estimate:
    """The estimator's running statistics (post-processing of released updates only).

    Per silo (K, P): sum_s, sum_g — weighted sums over rounds of the pass starts S_k and
    implied gradients ĝ_k; (K,): n (weights), sxx = Σ‖S_k‖², sxg = Σ⟨S_k, ĝ_k⟩; the
    successive-difference sums dgg, dsg, dss, dn and the last deviations (step 3b); (4, P):
    the round sums of the spread terms A, B, C, V (`round_spread`) and their weight."""

    sum_s: np.ndarray
    sum_g: np.ndarray
    n: np.ndarray
    sxx: np.ndarray
    sxg: np.ndarray
    dgg: np.ndarray
    dsg: np.ndarray
    dss: np.ndarray
    dn: np.ndarray
    last_s: np.ndarray
    last_g: np.ndarray
    seen: np.ndarray
    spread: np.ndarray = field(default_factory=lambda: np.zeros((4, 1)))  # A, B, C, V (4, P)
    spread_w: float = 0.0
    rounds: int = 0

    @classmethod
    def empty(cls, K: int, P: int) -> Estimate:
        z, zp = (lambda: np.zeros(K)), (lambda: np.zeros((K, P)))  # noqa: E731
        return cls(sum_s=zp(), sum_g=zp(), n=z(), sxx=z(), sxg=z(), dgg=z(),
                   dsg=z(), dss=z(), dn=z(), last_s=zp(), last_g=zp(),
                   seen=np.zeros(K, bool), spread=np.zeros((4, P)))

    def slope(self) -> float | None:
        """h_e: pooled least-squares slope of ĝ on S with a per-silo intercept (None: not
        measurable yet)."""
        ok = self.n > 1.5 * MEMORY ** self.rounds  # at least two rounds seen
        if not np.any(ok):
            return None
        n = self.n[ok]
        sxx = self.sxx[ok] - np.einsum("kp,kp->k", self.sum_s[ok], self.sum_s[ok]) / n
        sxg = self.sxg[ok] - np.einsum("kp,kp->k", self.sum_s[ok], self.sum_g[ok]) / n
        if sxx.sum() <= 0:
            return None
        b = float(sxg.sum() / sxx.sum())
        return b if b > 0 and math.isfinite(b) else None

    def residual_var(self, h_e: float) -> np.ndarray:
        """(K,) per coordinate, the variance of ĝ_k(t) around the fit h_e·S_k(t) + c_k, from
        successive rounds of the deviations from each round's silo mean (a drift common to
        all silos cancels): E‖(ĝ_t − ĝ_{t−1}) − h_e(S_t − S_{t−1})‖² = 2P·var; 0 before
        two differences are in."""
        P = self.sum_s.shape[1]
        d = self.dn > 0
        ss = self.dgg - 2 * h_e * self.dsg + h_e ** 2 * self.dss
        return np.where(d, np.maximum(ss, 0.0) / (2 * P * np.maximum(self.dn, 1e-300)), 0.0)

    def tau2(self, h_e: float, noise: float, stat: float = 0.0) -> float:
        """τ̂² ≥ 0 at slope h_e (step 3 of the module docstring), `noise` the variance of ĝ
        per coordinate that is not heterogeneity, averaged over silos."""
        if self.spread_w <= 0:
            return 0.0
        A, B, C, _ = self.spread / self.spread_w
        # the mean over coordinates (isotropic model): clipping each coordinate at 0 first
        # would add the positive parts of pure noise (measured: School ε = 1, +19% MSE)
        per = A - 2 * B / h_e + (C - (1 + NOISE_MARGIN) * noise) / h_e ** 2 - stat
        return max(0.0, float(np.mean(per)))


def implied_gradients(starts: np.ndarray, deltas: np.ndarray, pull: np.ndarray,
                      anchor: np.ndarray, header: np.ndarray) -> np.ndarray:
    """ĝ_k = −Δ_k/(lr·T_k) − λ'_k (S_k + Δ_k/2 − w̄), (K, P) (step 1).

    Parameters
    ----------
    starts, deltas : numpy.ndarray
        The passes' starting models S_k and released changes Δ_k, (K, P).
    pull : numpy.ndarray
        The pull λ'_k each pass used (0: none), (K,).
    anchor : numpy.ndarray
        The model the pull pointed to, (P,).
    header : numpy.ndarray
        `noise_header` rows (K, 3).
    """
    lr_t = header[:, 1] * header[:, 2]
    mid = starts + deltas / 2
    return -deltas / lr_t[:, None] - pull[:, None] * (mid - anchor[None, :])


class LambdaEstimator:
    """Running estimate of h, τ², s_k and λ_k from released updates (module docstring).

    Parameters
    ----------
    rounds : int
        R, the run's rounds (public), for the Local model's noise s_k.
    memory : float, default MEMORY
        Weight of past rounds in the running statistics.
    """

    def __init__(self, rounds: int, memory: float = MEMORY, rule: str | None = None) -> None:
        self.rounds = int(rounds)
        self.memory = float(memory)
        self.rule = RULE if rule is None else rule

    def observe(self, est: Estimate, starts: np.ndarray, deltas: np.ndarray,
                pull: np.ndarray, anchor: np.ndarray, header: np.ndarray,
                present: np.ndarray) -> Estimate:
        """`est` with one round's released updates folded in (a new Estimate).

        Parameters
        ----------
        est : Estimate
            The running statistics.
        starts, deltas : numpy.ndarray
            (K, P) pass starts and released changes; rows of absent silos are ignored.
        pull : numpy.ndarray
            (K,) the pull each pass used (0 for none).
        anchor : numpy.ndarray
            (P,) the pull's anchor.
        header : numpy.ndarray
            (K, 3) `noise_header` rows.
        present : numpy.ndarray
            (K,) bool, the silos whose update arrived.
        """
        est = copy.deepcopy(est)  # states are values: the previous round's stays as it was
        g = implied_gradients(starts, deltas, pull, anchor, header)
        m = self.memory
        for arr in (est.sum_s, est.sum_g, est.n, est.sxx, est.sxg):
            arr *= m
        for arr in (est.dgg, est.dsg, est.dss, est.dn):  # recent rounds: past the transient
            arr *= DIFF_MEMORY
        est.spread *= m
        est.spread_w *= m
        est.rounds += 1
        k = np.flatnonzero(present)
        S, G = starts[k], g[k]
        est.sum_s[k] += S
        est.sum_g[k] += G
        est.n[k] += 1
        if k.size >= 2:  # successive differences of the deviations from the round's mean
            Sc, Gc = S - S.mean(0), G - G.mean(0)  # (a common drift cancels)
            up = 1.0 / (1.0 - 1.0 / k.size)  # a deviation's noise is (1 − 1/m) of a silo's
            seen = est.seen[k]
            j = k[seen]
            dS, dG = Sc[seen] - est.last_s[j], Gc[seen] - est.last_g[j]
            est.dss[j] += up * np.einsum("kp,kp->k", dS, dS)
            est.dsg[j] += up * np.einsum("kp,kp->k", dS, dG)
            est.dgg[j] += up * np.einsum("kp,kp->k", dG, dG)
            est.dn[j] += 1
            est.last_s[k], est.last_g[k], est.seen[k] = Sc, Gc, True
        est.sxx[k] += np.einsum("kp,kp->k", S, S)
        est.sxg[k] += np.einsum("kp,kp->k", S, G)
        if k.size >= 2:
            est.spread += self.round_spread(S, G, header[k])
            est.spread_w += 1.0
        return est

    def round_spread(self, S: np.ndarray, G: np.ndarray, header: np.ndarray) -> np.ndarray:
        """(4, P) [A, B, C, V] of one round over its m ≥ 2 silos, per coordinate:
        A = Σ_k(S_k − S̄)²/(m−1), B = Σ_k(S_k − S̄)(ĝ_k − ḡ)/(m−1), C = Σ_k(ĝ_k − ḡ)²/(m−1)
        and V = Σ_k V_k/(m T_k) (the DP noise variance of ĝ_k, before the contraction)."""
        m = S.shape[0]
        dS, dG = S - S.mean(0), G - G.mean(0)
        V = float(np.mean(header[:, 0] / header[:, 2]))
        return np.stack([(dS * dS).sum(0), (dS * dG).sum(0), (dG * dG).sum(0),
                         np.full(S.shape[1], V * (m - 1))]) / (m - 1)

    def lambdas(self, est: Estimate, header: np.ndarray) -> tuple[np.ndarray, dict]:
        """λ_k (K,) for the next round (∞: FedAvg), and the estimates behind them.

        Parameters
        ----------
        est : Estimate
            The running statistics.
        header : numpy.ndarray
            (K, 3) the silos' latest `noise_header` rows.

        Returns
        -------
        tuple of (numpy.ndarray, dict)
            λ_k in the training objective's units, and {"h", "h_e", "tau2", "s"} (None
            where not measurable yet).
        """
        K = header.shape[0]
        var, lr, steps, q = header[:, 0], float(np.median(header[:, 1])), header[:, 2], \
            header[:, 3]
        h_e = est.slope()
        if h_e is None:  # not measurable yet: FedAvg, the start every silo shares
            return np.full(K, START_LAM), {"h": None, "h_e": h_e, "tau2": None, "s": None,
                                           "s_stat": None}
        lrT = float(np.median(lr * steps))
        T = float(np.median(steps))
        rho_T = max(1.0 - lrT * h_e, 1e-6)  # the pass's contraction ρ^T
        rho = rho_T ** (1.0 / T)
        h = (1.0 - rho) / lr
        # the noise in ĝ is contracted along the pass: v_k = V_k Σρ^{2i}/T², stored as V/T
        shrink = float(np.mean(_sum_rho(rho, steps) / steps))
        # 3b. sampling noise: what ĝ_k varies by beyond its DP noise; an epoch of Poisson
        # batches varies like the silo's mean gradient over its n_k examples, times (1 − q)
        # ψ = Σ²/B (per-example gradient variance over the batch), pooled over silos with
        # weight (1 − q_k)²: a full-batch silo (q = 1) has no sampling noise to measure
        dp_g = shrink * var / steps  # DP noise variance of ĝ_k
        excess = est.residual_var(h_e) - dp_g  # unclipped: the pooled mean stays unbiased
        w = (1.0 - q) ** 2
        psi = max(0.0, float(np.sum(w * excess * steps / np.maximum(1.0 - q, 1e-12))
                             / max(float(np.sum(w)), 1e-300)))
        samp = psi * (1.0 - q) / steps  # sampling noise variance of ĝ_k
        stat = psi * q / h ** 2  # Σ²/n_k: the empirical optimum's, parameter units
        V_round = float(est.spread[3].mean()) / est.spread_w if est.spread_w > 0 else 0.0
        tau2 = est.tau2(h_e, shrink * V_round + float(np.mean(samp)), float(np.mean(stat)))
        s_dp = lr * lr * var * _sum_rho(rho, self.rounds * steps)
        s = s_dp + stat
        if self.rule == "d30":
            lam = h * optimal_lambdas(s, tau2)
        else:
            lam = sgd_lambdas(h, lr, var, self.rounds * steps, tau2, stat)
        lam = np.where(np.isfinite(lam) & (lr * lam < MAX_STEP_PULL), lam, np.inf)
        return lam, {"h": h, "h_e": h_e, "tau2": tau2, "s": s.tolist(),
                     "s_stat": stat.tolist()}


@dataclass
class AutoServer(ServerState):
    """The server of an auto-λ method: the shared model `params` (P,), the λ_k of the next
    round `lam` (K,) and of the round just run `used` (K,) (∞: FedAvg), each silo's personal
    model as its releases define it `W` (K, P) (MR-MTL; Ditto: unused), the running
    statistics `est`, and the λ path and estimates per round."""

    lam: np.ndarray = field(default_factory=lambda: np.zeros(0))
    used: np.ndarray = field(default_factory=lambda: np.zeros(0))
    W: np.ndarray | None = None
    est: Estimate | None = None
    header: np.ndarray | None = None
    path: list = field(default_factory=list)
    estimates: dict = field(default_factory=dict)
    total_rounds: int = 0


@dataclass
class AutoMessage:
    """The broadcast: the shared model (P,) and each silo's λ_k (K,), ∞ for FedAvg (silo
    k's cut carries its own λ_k only, shape (1,))."""

    params: np.ndarray
    lam: np.ndarray


@dataclass
class AutoUpdate:
    """What silos send: their released changes `delta` (K, P) (NaN rows: absent) and the
    public `header` (K, 3) of `noise_header`."""

    delta: np.ndarray
    header: np.ndarray


def start_points(W: np.ndarray, shared: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """Each silo's pass start (K, P): the shared model where λ_k = ∞ (FedAvg), else W_k."""
    fed = np.isinf(np.asarray(lam, float))
    return np.where(fed[:, None], shared[None, :], W)


def finite_pull(lam: np.ndarray) -> np.ndarray:
    """The pull a pass uses: λ_k, or 0 where λ_k = ∞ (a FedAvg pass has no pull)."""
    lam = np.asarray(lam, float)
    return np.where(np.isinf(lam), 0.0, lam)


def wire_lam(lam: np.ndarray) -> np.ndarray:
    """λ for the wire (finite float64 only): ∞ → −1."""
    lam = np.asarray(lam, float)
    return np.where(np.isinf(lam), -1.0, lam)


def unwire_lam(code: np.ndarray) -> np.ndarray:
    """Inverse of `wire_lam`; any negative code is ∞ (FedAvg)."""
    code = np.asarray(code, float)
    return np.where(code < 0, np.inf, code)


def json_lam(lam: np.ndarray) -> list:
    """λ values for JSON outputs: ∞ written as the string "inf" (FedAvg)."""
    return [float(v) if math.isfinite(v) else "inf" for v in np.asarray(lam, float)]


def auto_describe(server_path: list, estimates: dict) -> dict[str, Any]:
    """The describe() fields of an auto-λ run: source, λ path per round, final λ_k."""
    return {"lam": AUTO, "lam_source": SOURCE,
            "lam_path": server_path,
            "lam_final": server_path[-1] if server_path else None,
            "lam_estimates": estimates}


class AutoLambda:
    """The server side shared by MR-MTL and Ditto with ``lam = "auto"`` (a mixin on top of
    their Algorithm): the broadcast carries λ_k, the server step folds the released
    updates into the estimate and sets the next round's λ_k. Subclasses say where each
    pass started (`pass_starts`) and which pull the released pass used (`released_pull`).
    """

    weighted: bool
    tracks_models: bool = True  # MR-MTL: the server follows each personal model

    def auto_init(self, params0: np.ndarray, num_silos: int,
                  rounds: int | None) -> AutoServer:
        """The initial server: λ = 0 until the estimate is measurable."""
        if rounds is None:
            raise ConfigError(f"{getattr(self, 'name', 'method')} with lam = \"auto\" needs "
                              "the number of rounds: call init(params0, num_silos, rounds=...)")
        self.path: list = []
        self.estimates: dict = {}
        K, P = num_silos, params0.shape[0]
        return AutoServer(params0.copy(), lam=np.zeros(K), used=np.zeros(K),
                          W=np.tile(params0, (K, 1)) if self.tracks_models else None,
                          est=Estimate.empty(K, P), header=np.zeros((K, HEADER)),
                          total_rounds=int(rounds))

    def broadcast(self, server: Any) -> Any:
        """The shared model and every silo's λ_k (`AutoMessage`)."""
        return AutoMessage(server.params, server.lam)

    def pass_starts(self, server: AutoServer) -> np.ndarray:
        """(K, P) where the released passes of this round started."""
        assert server.W is not None
        return start_points(server.W, server.params, server.lam)

    def released_pull(self, server: AutoServer) -> np.ndarray:
        """(K,) the pull the released passes used."""
        return finite_pull(server.lam)

    def server_step(self, server: Any, update: Any, weights: np.ndarray) -> Any:
        """Fold the round's released updates (`AutoUpdate`) into the estimate, move the
        shared model by their weighted mean and set the next round's λ_k (`AutoServer`)."""
        if update is None:
            return server
        assert server.est is not None and server.header is not None
        delta = np.asarray(update.delta, float)
        present = np.all(np.isfinite(delta), axis=1)
        starts = self.pass_starts(server)
        header = server.header.copy()
        header[present] = update.header[present]
        estimator = LambdaEstimator(server.total_rounds)
        est = server.est
        if len(server.path) >= burn_in(server.total_rounds):  # past the common transient
            est = estimator.observe(est, starts, np.where(present[:, None], delta, 0),
                                    self.released_pull(server), server.params, header,
                                    present)
        w = np.where(present, np.asarray(weights, float), 0.0)
        shared = server.params + (w[:, None] * np.where(present[:, None], delta, 0)).sum(0) \
            / max(w.sum(), 1e-300)
        W = server.W
        if W is not None:
            W = W.copy()
            W[present] = starts[present] + delta[present]
        lam, info = estimator.lambdas(est, header)
        # mirrored on the algorithm for describe(); the server state keeps its own copy
        self.path = [*server.path, json_lam(server.lam)]
        self.estimates = {"h": info["h"], "tau2": info["tau2"], "s": info["s"],
                          "s_stat": info["s_stat"], "next_lam": json_lam(lam)}
        return AutoServer(shared, lam=lam, used=server.lam, W=W, est=est, header=header,
                          path=self.path, estimates=self.estimates,
                          total_rounds=server.total_rounds)

    def auto_personal(self, silos_params: np.ndarray, server: AutoServer) -> np.ndarray:
        """Personal models: the shared model for the silos that ran as FedAvg (λ = ∞)."""
        used = np.asarray(getattr(server, "used", np.zeros(len(silos_params))), float)
        if used.shape != (silos_params.shape[0],):  # a silo's view: its own λ only
            used = np.broadcast_to(used[-1:] if used.size else np.zeros(1),
                                   (silos_params.shape[0],))
        return np.where(np.isinf(used)[:, None], server.params[None, :], silos_params)

    def describe_auto(self) -> dict[str, Any]:
        return auto_describe(getattr(self, "path", []), getattr(self, "estimates", {}))

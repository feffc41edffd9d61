"""The statistics of ``lam = "auto"``: h, τ², s_k and λ_k from the silos' released updates.

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
3. Spread of the implied optima u_k = S_k − ĝ_k/h_e, averaged over rounds first: each
   silo's deviation from the round's silo mean (a common drift cancels), summed over its
   n_k rounds, D_k = mean_t(u_k − ū). Per silo, E‖D_k − D̄‖²/P·K/(K − 1) = τ² + stat_k +
   (v_k + samp_k)/(h_e² n_k): the heterogeneity, the silo's empirical optimum's own
   sampling error, and the noise, divided by the rounds (a spread per round, averaged
   after, keeps the whole noise: on School at ε = 8 it is 400× τ², and the 5% margin
   below swallowed τ² whole).
3b. Sampling noise, from successive rounds: the deviation of ĝ_k from the round's silo
   mean, less h_e times that of S_k, varies between rounds by 2(v_k + samp_k) (a drift
   common to all silos cancels). An epoch of Poisson batches (T_k·q_k = local_epochs)
   gives samp_k = (1 − q_k)·ψ/T_k with ψ = Σ²/b (Σ² the per-example gradient variance);
   ψ is pooled over silos with weight (1 − q_k)² (a full-batch silo measures none). The
   empirical optimum of n_k examples then varies by stat_k = Σ²/(n_k h²) = ψ·q_k/h².
   This ψ is a small excess over the DP noise when DP dominates (School, ε = 4: 0.3%), so
   where silo sizes vary (≥ `MIN_SIZE_FIT` silos, q_k spread ≥ `SIZE_SPREAD`) ψ is also
   read from how the spread of step 3 grows with q_k/h² across silos (least squares), and
   the two are weighed by their standard errors (the regression's; the residuals' as
   κ·the DP noise in ψ units). Then, d_k the per-silo spread of step 3 less its noise,
       τ̂² = max(0, mean_k(d_k − stat_k)),  noise counted (1 + κ)-fold,
   κ = `NOISE_MARGIN` = 5%: the noise variance is trusted to 5% (a real loss contracts the
   noise along a pass in directions of every curvature, not the model's one h).
3c. Networks (models of more than `ROUND_SPREAD_MIN_P` coordinates): a network's
   gradient heterogeneity turns with the model, so step 3's average over rounds cancels it
   (Rotated & Masked MNIST, a 25k-parameter MLP: τ̂² = 0 and FedAvg at every ε, Local 1.4×
   as accurate). There τ̂² is each round's spread in gradient space, h_e·(u_k − ū) =
   ĝ_k − ḡ − h_e(S_k − S̄), averaged over rounds, less the DP noise v_k (×(1 + κ)), over
   h_e²; ψ and stat_k are not separated from it (what varies between rounds beyond the DP
   noise counts as heterogeneity, which leans towards Local).
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
rounds). The algorithm side
(broadcast, server step, wire) is `silofl.algorithms.auto_lambda`. Checked against
the mean-estimation truth in tests/test_auto_lambda.py and benchmarks/bench_auto_lambda.py.
The noise subtracted in step 3 is each silo's measured scatter of u_k over the rounds,
floored by the model's (1 + κ)·(v_k + samp_k)/h_e²: noise that persists over rounds (a pull,
the shared model's slow excursions on an anisotropic loss) escapes the scatter (on School
the scatter alone reads DP noise as τ²).

Per direction (`silofl.algorithms.lambda_aniso`, models of 2 to `ANISO_MAX_P` coordinates
and ≥ `MIN_SIZE_FIT` silos): the same steps along each eigendirection of a matrix secant,
heterogeneity read from FedAvg rounds only, and λ_k minimizing the summed per-direction
error of step 5b; it replaces the isotropic λ where it applies (School: the heterogeneity
sits in one steep direction, which one curvature cannot aim at).

Known limits: with few silos (heart: K = 4) τ̂² has few degrees of freedom and λ_k can
swing between rounds, and the isotropic model runs there; per direction, a silo's
heterogeneity stops updating once it leaves FedAvg; step 3c counts a network's sampling
noise as heterogeneity.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np

from silofl.algorithms.lambda_aniso import aniso_empty, aniso_lambdas, observe_aniso

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
#: ψ from the silo sizes (step 3) needs this many silos that answered ...
MIN_SIZE_FIT = 10
#: ... and q_k whose standard deviation is at least this share of their mean
SIZE_SPREAD = 0.25
#: weight of past rounds in the successive differences that measure sampling noise
DIFF_MEMORY = 0.8
#: how λ_k follows from the estimates: "sgd" (the DP-SGD error model, step 5b) or "d30"
RULE = "sgd"
#: step 3 subtracts each silo's measured round-to-round scatter, not the modelled noise
MEASURED_NOISE = True
#: step 3's ψ: "fit" the size regression alone where it applies, "pool" weighed with 3b's
PSI_FROM = "pool"
#: the per-direction model (lambda_aniso) runs for models of at most this many coordinates
ANISO_MAX_P = 64
#: λ_k from the per-direction model where it applies
ANISO = True
#: models of more than this many coordinates (networks; the GLM tables' models, School,
#: heart and Vehicle, have at most 101) read τ² per round in gradient space (step 3c)
ROUND_SPREAD_MIN_P = 500


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


def lam_grid(h: float, lr: float) -> np.ndarray:
    """The candidate λ: 0, a log grid h·10^[−3, 3] below `MAX_STEP_PULL`/lr, and ∞."""
    grid = np.concatenate([[0.0], h * np.logspace(-3, 3, 121), [np.inf]])
    return grid[~(lr * grid >= MAX_STEP_PULL) | np.isinf(grid)]


def sgd_lambdas(h: float, lr: float, var: np.ndarray, steps: np.ndarray,
                tau2: float, stat: np.ndarray | float = 0.0) -> np.ndarray:
    """Each silo's λ_k minimizing `sgd_error` over 0, a log grid h·10^[−3, 3] and ∞, (K,)."""
    grid = lam_grid(h, lr)
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
    successive-difference sums dgg, dsg, dss, dn and the last deviations (step 3b); the
    sums over rounds of each silo's deviations from the round's silo mean, sum_cs, sum_cg
    (K, P), and their counts nc (K,) (step 3)."""

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
    sum_cs: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    sum_cg: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    nc: np.ndarray = field(default_factory=lambda: np.zeros(0))
    wss: np.ndarray = field(default_factory=lambda: np.zeros(0))
    wsg: np.ndarray = field(default_factory=lambda: np.zeros(0))
    wgg: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mat: dict = field(default_factory=dict)
    rounds: int = 0

    @classmethod
    def empty(cls, K: int, P: int) -> Estimate:
        z, zp = (lambda: np.zeros(K)), (lambda: np.zeros((K, P)))  # noqa: E731
        return cls(sum_s=zp(), sum_g=zp(), n=z(), sxx=z(), sxg=z(), dgg=z(),
                   dsg=z(), dss=z(), dn=z(), last_s=zp(), last_g=zp(),
                   seen=np.zeros(K, bool), sum_cs=zp(), sum_cg=zp(), nc=z(),
                   wss=z(), wsg=z(), wgg=z(),
                   mat=aniso_empty(K, P) if 2 <= P <= ANISO_MAX_P and K >= MIN_SIZE_FIT else {})

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

    def round_tau2(self, h_e: float, dp_g: np.ndarray) -> float:
        """τ̂² per round in gradient space (step 3c): each round's spread of h_e·(u_k − ū)
        = ĝ_k − ḡ − h_e(S_k − S̄), less its DP noise (trusted to `NOISE_MARGIN`), over h_e².

        Parameters
        ----------
        h_e : float
            The pass's secant slope.
        dp_g : numpy.ndarray
            (K,) the DP noise variance per coordinate of one round's ĝ_k.

        Returns
        -------
        float
            τ̂² ≥ 0 per coordinate, squared parameter units (0 before two silos answered).
        """
        ok = self.nc > 0
        K = int(ok.sum())
        if K < 2:
            return 0.0
        P = self.sum_s.shape[1]
        spread = (h_e ** 2 * self.wss - 2 * h_e * self.wsg + self.wgg)[ok] \
            / (P * self.nc[ok]) * K / (K - 1)
        excess = float(np.mean(spread - (1 + NOISE_MARGIN) * dp_g[ok]))
        return max(0.0, excess) / h_e ** 2

    def tau2(self, h_e: float, noise: np.ndarray, x: np.ndarray,
             psi_res: float, psi_se: float = math.inf) -> tuple[float, float]:
        """(τ̂², ψ̂) at slope h_e (step 3 of the module docstring).

        Parameters
        ----------
        h_e : float
            The pass's secant slope.
        noise : numpy.ndarray
            (K,) the variance per coordinate of one round's ĝ_k that is not heterogeneity
            (DP and sampling noise).
        x : numpy.ndarray
            (K,) q_k/h², so that a silo's sampling error of its optimum is ψ·x_k.
        psi_res, psi_se : float
            ψ measured from the rounds' residuals (step 3b) and its standard error, alone
            where the silo sizes do not vary enough to separate ψ from τ².
        """
        ok = self.nc > 0
        K = int(ok.sum())
        if K < 2:
            return 0.0, psi_res
        nc = self.nc[ok]
        D = (self.sum_cs[ok] - self.sum_cg[ok] / h_e) / nc[:, None]  # mean implied optimum
        P = D.shape[1]
        if MEASURED_NOISE and np.all(nc > 1.5) and self.wss.size:
            # the rounds' own scatter of u_k − ū around D_k (no DP-noise model): one-way
            # random effects, between-silo spread less within-silo scatter over nc_k
            uu = self.wss[ok] - 2 * self.wsg[ok] / h_e + self.wgg[ok] / h_e ** 2
            within = np.maximum(uu - nc * np.sum(D * D, axis=1), 0.0) / (P * (nc - 1))
            # never below the noise model's: noise that persists over rounds (a pull, or
            # the shared model's slow excursions on an anisotropic loss) escapes the scatter
            within = np.maximum(within * K / (K - 1),
                                (1 + NOISE_MARGIN) * noise[ok] / h_e ** 2)
            D = D - D.mean(0)
            d = np.mean(D * D, axis=1) * K / (K - 1) - within / nc
        else:
            D = D - D.mean(0)
            # per silo: ‖D_k‖²/P ≈ (1 − 1/K)(τ² + ψ·x_k) + its noise over nc_k rounds
            d = np.mean(D * D, axis=1) * K / (K - 1) \
                - (1 + NOISE_MARGIN) * noise[ok] / (nc * h_e ** 2)
        x = x[ok]
        psi = psi_res
        if K >= MIN_SIZE_FIT and np.std(x) >= SIZE_SPREAD * np.mean(x):
            # ψ from how the spread grows with q_k/h² = b/(n_k h²), weighed against the
            # residuals' ψ by their standard errors (OLS; the residuals' from trusting
            # the DP noise to NOISE_MARGIN)
            xc = x - x.mean()
            fit = float((xc * d).sum() / (xc * xc).sum())
            r = d - d.mean() - fit * xc
            se2 = float((r * r).sum() / (K - 2) / (xc * xc).sum())
            w_fit, w_res = 1.0 / max(se2, 1e-300), 1.0 / max(psi_se ** 2, 1e-300)
            if PSI_FROM == "fit":
                w_res = 0.0
            psi = max((w_fit * fit + w_res * psi_res) / (w_fit + w_res), 0.0)
        return max(0.0, float(np.mean(d - psi * x))), psi


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
        `noise_header` rows (K, 4).
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
            (K, 4) `noise_header` rows.
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
        for arr in (est.sum_cs, est.sum_cg, est.nc, est.wss, est.wsg, est.wgg,
                    *est.mat.values()):
            arr *= m
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
            est.sum_cs[k] += Sc
            est.sum_cg[k] += Gc
            est.nc[k] += 1
            est.wss[k] += np.einsum("kp,kp->k", Sc, Sc)
            est.wsg[k] += np.einsum("kp,kp->k", Sc, Gc)
            est.wgg[k] += np.einsum("kp,kp->k", Gc, Gc)
        est.sxx[k] += np.einsum("kp,kp->k", S, S)
        if est.mat:  # the per-direction model's statistics
            observe_aniso(est.mat, S, G, k, (pull[k] == 0)
                          & np.all(starts[k] == anchor[None, :], axis=1))
        est.sxg[k] += np.einsum("kp,kp->k", S, G)
        return est

    def lambdas(self, est: Estimate, header: np.ndarray) -> tuple[np.ndarray, dict]:
        """λ_k (K,) for the next round (∞: FedAvg), and the estimates behind them.

        Parameters
        ----------
        est : Estimate
            The running statistics.
        header : numpy.ndarray
            (K, 4) the silos' latest `noise_header` rows.

        Returns
        -------
        tuple of (numpy.ndarray, dict)
            λ_k in the training objective's units, and {"h", "h_e", "tau2", "s"} (None
            where not measurable yet), "psi" the per-example gradient variance over the
            batch.
        """
        K = header.shape[0]
        var, lr, steps, q = header[:, 0], float(np.median(header[:, 1])), header[:, 2], \
            header[:, 3]
        h_e = est.slope()
        if h_e is None:  # not measurable yet: FedAvg, the start every silo shares
            return np.full(K, START_LAM), {"h": None, "h_e": h_e, "tau2": None, "s": None,
                                           "s_stat": None, "psi": None}
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
        to_psi = w * steps / np.maximum(1.0 - q, 1e-12) / max(float(np.sum(w)), 1e-300)
        psi = max(0.0, float(np.sum(to_psi * excess)))
        samp = psi * (1.0 - q) / steps  # sampling noise variance of ĝ_k
        # in parameter units (ψ·q/h²): the residuals' ψ is as good as the DP noise's model
        se = NOISE_MARGIN * float(np.sum(to_psi * dp_g)) + 1e-300
        psi_res = psi
        tau2, psi_x = est.tau2(h_e, dp_g + samp, q / h ** 2, psi, se)
        psi = psi_x
        stat = psi * q / h ** 2  # Σ²/n_k: the empirical optimum's, parameter units
        if est.sum_s.shape[1] > ROUND_SPREAD_MIN_P:  # a network: step 3c
            tau2, psi, stat = est.round_tau2(h_e, dp_g), 0.0, np.zeros(K)
        s_dp = lr * lr * var * _sum_rho(rho, self.rounds * steps)
        s = s_dp + stat
        aniso: tuple[np.ndarray, dict] | None = None
        info: dict = {}
        if ANISO and est.mat and self.rule == "sgd":  # the per-direction model
            aniso = aniso_lambdas(est, h_e, lr, T, var, self.rounds * steps, q, psi_res,
                                  lam_grid(h, lr), sgd_error, SIZE_SPREAD, dp_g)
        if aniso is not None:
            lam, info = aniso
        elif self.rule == "d30":
            lam = h * optimal_lambdas(s, tau2)
        else:
            lam = sgd_lambdas(h, lr, var, self.rounds * steps, tau2, stat)
        lam = np.where(np.isfinite(lam) & (lr * lam < MAX_STEP_PULL), lam, np.inf)
        return lam, {"h": h, "h_e": h_e, "tau2": tau2, "s": s.tolist(),
                     "s_stat": stat.tolist(), "psi": psi,
                     "model": "per-direction" if aniso is not None else "isotropic",
                     "tau2_dir": info.get("tau2_dir"), "h_dir": info.get("h_dir")}



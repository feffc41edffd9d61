"""λ_k for an anisotropic loss: the `lambda_estimate` model per curvature direction.

The isotropic model of `silofl.algorithms.lambda_estimate` gives every direction one
curvature h. A real loss is steep in a few directions and flat in the rest, and one λ acts
differently on each: λ/h_j is small where h_j is large (the personal model follows its own
optimum there, where its DP noise is contracted most) and large where h_j is small (the
shared model's low noise wins there). On School (139 schools) most of the heterogeneity
between the schools' optima sits in one steep direction, so a fixed λ of 1–10 beats FedAvg
while the isotropic estimate, averaging over directions, picks λ = ∞.

Same released quantities, pooled P×P (models of at most `ANISO_MAX_P` coordinates):

1. Matrix secant: ĝ_k(t) ≈ H_e S_k(t) + c_k, H_e from the pooled least squares over rounds
   with a per-silo intercept, symmetrized; its eigenpairs (h_e,j, e_j), each a pass secant,
   give per-step curvatures h_j as in step 2 of the isotropic model.
2. Per direction, each silo's implied optimum u_kj = S_kj − ĝ_kj/h_e,j averaged over rounds
   (deviation from the round's silo mean), less the rounds' own scatter of u_kj around it
   (pooled over silos, scaled per silo by its measured scatter), gives d_kj = τ_j² + stat_kj.
   stat_kj = ψ·q_k/h_j² (ψ the per-example gradient variance over the batch, gradient units,
   from the isotropic model's step 3b) and τ_j² = max(0, mean_k(d_kj − stat_kj)).
3. λ_k minimizes Σ_j `sgd_error`(λ; h_j, τ_j², stat_kj, the silo's DP noise) over the same
   grid as the isotropic rule.

Post-processing of released updates and public settings only, as the isotropic model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np


class Estimate(Protocol):
    """What this module reads of `lambda_estimate.Estimate` (declared here, so the two
    modules do not import each other)."""

    mat: dict
    n: np.ndarray
    sum_s: np.ndarray
    sum_g: np.ndarray

#: a direction's pass secant is floored at this share of the isotropic one (noise in the
#: flat directions can make the fitted secant ≤ 0)
FLOOR = 0.05


def aniso_empty(K: int, P: int) -> dict:
    """The per-direction statistics of K silos, P coordinates: pooled P×P second moments
    (xx, xg over every round; wss, wsg, wgg over FedAvg rounds) and per silo the FedAvg
    rounds' deviation sums cs, cg (K, P), their count nc and squared norms ws, wsg1, wg."""
    m: dict[str, np.ndarray] = {n: np.zeros((P, P)) for n in ("xx", "xg", "wss", "wsg", "wgg")}
    m.update({n: np.zeros((K, P)) for n in ("cs", "cg")})
    m.update({n: np.zeros(K) for n in ("nc", "ws", "wsg1", "wg")})
    return m


def observe_aniso(m: dict, S: np.ndarray, G: np.ndarray, k: np.ndarray,
                  fedavg: np.ndarray) -> None:
    """Fold one round into `m` in place: S, G (len(k), P) the pass starts and implied
    gradients of the silos k that answered; `fedavg` (len(k),) those that started from the
    broadcast without a pull. Heterogeneity is read only from those: their rounds' noise
    is independent of the past (a personal model's persists and would read as τ²)."""
    m["xx"] += S.T @ S
    m["xg"] += S.T @ G
    kf = k[fedavg]
    if kf.size < 2:
        return
    Sc, Gc = S[fedavg] - S[fedavg].mean(0), G[fedavg] - G[fedavg].mean(0)
    m["wss"] += Sc.T @ Sc
    m["wsg"] += Sc.T @ Gc
    m["wgg"] += Gc.T @ Gc
    m["cs"][kf] += Sc
    m["cg"][kf] += Gc
    m["nc"][kf] += 1
    m["ws"][kf] += np.einsum("kp,kp->k", Sc, Sc)
    m["wsg1"][kf] += np.einsum("kp,kp->k", Sc, Gc)
    m["wg"][kf] += np.einsum("kp,kp->k", Gc, Gc)


def curvatures(est: Estimate, h_e: float, lrT: float, T: float, lr: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(h_e,j, h_j, E): the pass secants, per-step curvatures (P,) and eigenvectors (P, P)
    of the pooled matrix secant (step 1); None where not measurable.

    Parameters
    ----------
    est : Estimate
        Running statistics (n, sum_s, sum_g and est.mat's xx, xg).
    h_e : float
        The isotropic pass secant (the floor's scale).
    lrT, T, lr : float
        lr·T, steps per pass and the learning rate (public settings).
    """
    ok = est.n > 1.5
    if not est.mat or ok.sum() < 1:
        return None
    n = est.n[ok]
    ss, sg = est.sum_s[ok], est.sum_g[ok]
    XX = est.mat["xx"] - (ss / n[:, None]).T @ ss
    XG = est.mat["xg"] - (ss / n[:, None]).T @ sg
    P = XX.shape[0]
    ridge = 1e-9 * max(float(np.trace(XX)) / P, 1e-300)
    try:
        He = np.linalg.solve(XX + ridge * np.eye(P), XG).T
    except np.linalg.LinAlgError:
        return None
    hej, E = np.linalg.eigh((He + He.T) / 2)
    hej = np.clip(hej, FLOOR * h_e, (1 - 1e-6) / lrT)
    rho = (1.0 - lrT * hej) ** (1.0 / T)
    return hej, (1.0 - rho) / lr, E


def heterogeneity(est: Estimate, hej: np.ndarray, E: np.ndarray, h_e: float,
                  noise: np.ndarray | None = None) -> np.ndarray | None:
    """d_kj (K', P): per silo seen in FedAvg rounds and direction, τ_j² + stat_kj (step 2),
    parameter units squared.

    Parameters
    ----------
    est : Estimate
        Running statistics (est.mat from `observe_aniso`).
    hej, E : numpy.ndarray
        Pass secants (P,) and eigenvectors (P, P) from `curvatures`.
    h_e : float
        The isotropic pass secant (each silo's scatter scale).
    noise : numpy.ndarray, optional
        (K,) DP noise variance of one round's ĝ_k per coordinate: the scatter's floor.
    """
    m = est.mat
    ok = m["nc"] > 1.5
    K = int(ok.sum())
    if K < 2:
        return None
    nc = m["nc"][ok]
    cs, cg = m["cs"][ok] @ E, m["cg"][ok] @ E
    D = (cs - cg / hej) / nc[:, None]
    a = np.einsum("pj,pq,qj->j", E, m["wss"], E)
    b = np.einsum("pj,pq,qj->j", E, m["wsg"], E)
    c = np.einsum("pj,pq,qj->j", E, m["wgg"], E)
    uu = a - 2 * b / hej + c / hej ** 2  # Σ_k Σ_t u_kj² pooled
    within = np.maximum(uu - (nc[:, None] * D * D).sum(0), 0.0) / max(float((nc - 1).sum()), 1e-300)
    # per silo: its own scatter (isotropic, measured) against the silos' mean
    us = m["ws"][ok] - 2 * m["wsg1"][ok] / h_e + m["wg"][ok] / h_e ** 2
    P = D.shape[1]
    ws = np.maximum(us - nc * np.sum(D * D, axis=1), 0.0) / (P * (nc - 1))
    scale = ws / max(float(ws.mean()), 1e-300)
    D = D - D.mean(0)
    sub = scale[:, None] * within[None, :]
    if noise is not None:  # never less than the DP noise model's (a pull makes the rounds'
        # noise persist, which their scatter does not see)
        sub = np.maximum(sub, (1 - 1 / K) * noise[ok][:, None] / hej[None, :] ** 2)
    return (D * D - sub / nc[:, None]) * K / (K - 1)


def psi_from_sizes(d: np.ndarray, x: np.ndarray, psi: float, spread: float) -> float:
    """ψ from how d_kj grows with x_kj = q_k/h_j² across silos within each direction
    (per-direction intercept τ_j²), capped by `psi` and by τ_j² ≥ 0 on average; the fit only
    where the q_k's standard deviation is at least `spread` of their mean."""
    cap = float(np.min(d.mean(0) / x.mean(0)))
    q = x[:, 0]
    if np.std(q) < spread * np.mean(q):
        return max(0.0, min(cap, psi))
    xc = x - x.mean(0)
    fit = float((xc * (d - d.mean(0))).sum() / (xc * xc).sum())
    return max(0.0, min(fit, cap, psi))


def aniso_lambdas(est: Estimate, h_e: float, lr: float, T: float, var: np.ndarray,
                  steps: np.ndarray, q: np.ndarray, psi: float, grid: np.ndarray,
                  error: Callable[..., np.ndarray], spread: float, noise: np.ndarray | None = None
                  ) -> tuple[np.ndarray, dict] | None:
    """λ_k (K,) from the per-direction model (module docstring), and its estimates
    {"h_dir", "tau2_dir", "psi"}; None where the model does not apply (then the isotropic λ).

    Parameters
    ----------
    est : lambda_estimate.Estimate
        The running statistics, with `aniso_empty` statistics in est.mat.
    h_e, lr, T : float
        The isotropic pass secant, the learning rate and the median steps per pass.
    var, steps, q : numpy.ndarray
        (K,) DP noise variance per coordinate of a step's gradient, steps of the run
        (R·T_k), sampling rates.
    psi : float
        Per-example gradient variance over the batch (gradient units, per coordinate).
    grid : numpy.ndarray
        Candidate λ values (∞ included).
    error : callable
        `lambda_estimate.sgd_error`, the per-coordinate error of a λ.
    spread : float
        Least relative spread of q_k for the size fit of ψ.
    noise : numpy.ndarray, optional
        (K,) the DP noise variance of one round's ĝ_k, a floor for the measured scatter.
    """
    cur = curvatures(est, h_e, lr * T, T, lr)
    if cur is None:
        return None
    hej, hj, E = cur
    d = heterogeneity(est, hej, E, h_e, noise)
    if d is None:
        return None
    ok = est.mat["nc"] > 1.5
    x = q[ok][:, None] / hj[None, :] ** 2  # (K', P): stat_kj = ψ·x_kj
    psi = psi_from_sizes(d, x, psi, spread)
    stat = psi * q[:, None] / hj[None, :] ** 2  # (K, P)
    tau2 = np.maximum(0.0, (d - stat[ok]).mean(0))
    err = np.zeros((var.size, grid.size))
    for j in range(hj.size):
        err += error(grid[None, :], float(hj[j]), lr, var[:, None], steps[:, None],
                         float(tau2[j]), stat[:, j:j + 1])
    lam = grid[np.argmin(err, axis=1)]
    return lam, {"h_dir": hj.tolist(), "tau2_dir": tau2.tolist(), "psi": psi}

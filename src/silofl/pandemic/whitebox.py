"""The server's view of the node-level pipeline, white box: Dirac *node* canaries.

A federated server sees every region model released after every round. The node-level
accountant (`privacy.node_level`) assumes still more — every DP-SGD step's noisy sum —
for the replacement of one person: ρ of the b examples of a step's batch are affected
(ρ ~ Hypergeometric(n, K, b), K = S or 2S − 1 affected examples, `affected_examples`),
each moving by up to 2C. This module puts m such persons into that view without touching
the real records:

* `silofl.audit.whitebox.AuditedModel` appends m *auditing-only* coordinates to the
  model's parameters: no record's gradient touches them and predictions ignore them, but
  the node-level step adds its N(0, σ²C²) noise to all P + m coordinates, exactly as to the model's own.
* `NodeCanaries` is the step probe (`training.dpsgd.StepProbe`, called by
  `LocalTrainer._node_grad`). Canary i is a person whose K affected examples contribute
  ±(its gradient, `NORM_FACTOR`·C, clipped by the run's rule: C) along coordinate P + i:
  + when the auditor's coin says "in", − when "out" — the two neighbours differ by 2C per
  affected example, the accountant's sensitivity. At every step of the audited region
  it draws the canary's ρ from the law the batch sampler realises (exactly b of n without
  replacement: Hypergeometric(n, K, b) affected examples per step, independent across
  steps) and after the noise records what each coordinate received.
* `node_llr_scores`: per local pass of L steps (one round's release of the region), the
  canary coordinate holds u = ±R + N(0, Lσ²) in units of C, R = Σ_t ρ_t, whose law is the
  L-fold convolution of the hypergeometric (exact, no Bernoulli approximation). The score
  is the exact log-likelihood ratio "in" vs "out" summed over the passes.
* `node_estimate`: μ̂ of the scores read through the claimed mechanism family (the same
  mechanism with noise σ·c), as `silofl.audit.estimate.estimate` does for Poisson
  sampling; the accountant's ε at the noise scale the scores imply.

The canaries are not records: they change neither n, b, σ nor any record's batch; since
the node-level guarantee holds for every person whatever the others are, each canary is
exactly as protected as a person. With MR-MTL's pull (λ > 0) a released region model
shows a known re-weighting of the pass's steps rather than their plain sum; the per-pass
sums scored here are what the accountant's view (every step released) gives per round.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats

from silofl.audit.estimate import detectable_through, estimate_through, scale_for_mu
from silofl.audit.whitebox import AuditedModel
from silofl.errors import ConfigError
from silofl.models.base import Model
from silofl.training.dpsgd import GradientRule

#: a canary's per-example gradient norm before clipping, in units of C: clipping cuts it to C
NORM_FACTOR = 8.0
#: what the node-level estimate assumes, stated wherever it is reported
NODE_ESTIMATE_ASSUMES = (
    "an estimate, not proof: assumes the mechanism is the node-level Gaussian as claimed "
    "(exactly b of n persons per step, Hypergeometric(n, K, b) affected examples each "
    "moving ±C, the claimed steps); the audit measures its effective noise (noise std / "
    "clipped canary norm) from the canaries' scores and reports the accountant's ε at that "
    "noise; the interval is normal theory for μ̂ (one-sided)")


class NodeCanaries:
    """The node-level step probe: m canary persons of one region (module docstring).

    Parameters
    ----------
    silo : int
        The audited region's index in the trainer (the order of `region_groups`).
    included : numpy.ndarray
        (m,) bool, the auditor's coin flips ("in": +, "out": −).
    n, affected, b : int
        The region's persons, the examples one replaced person affects (K), batch size.
    rng : numpy.random.Generator
        The auditor's draws of each canary's ρ per step.
    weaken : callable, optional
        rule → rule: a deliberately weakened copy (an audit's self-test or test); the
        accounting keeps the claimed σ.
    """

    def __init__(self, silo: int, included: np.ndarray, n: int, affected: int, b: int,
                 rng: np.random.Generator, weaken=None):
        self.silo, self.included = int(silo), np.asarray(included, bool)
        self.m = self.included.size
        self.n, self.affected, self.b = int(n), int(affected), int(b)
        if not 1 <= self.affected <= self.n or not 1 <= self.b <= self.n:
            raise ConfigError(f"node canaries need 1 ≤ K ({affected}) ≤ n ({n}) and "
                              f"1 ≤ b ({b}) ≤ n")
        self.rng, self.weaken = rng, weaken
        self.P: int | None = None
        self.sign = np.where(self.included, 1.0, -1.0)
        self.observed: list[np.ndarray] = []  # (m,) noisy canary coordinates per step

    def widen(self, model: Model, params0: np.ndarray) -> tuple[Model, np.ndarray]:
        """The model and starting point a run trains: m coordinates appended (zeros)."""
        self.P = int(model.num_params)
        return AuditedModel(model, self.m), np.concatenate([params0, np.zeros(self.m)])

    def attach(self, rule: GradientRule) -> GradientRule:
        """The rule a run trains with: `rule` (or its weakened copy) with this probe."""
        rule = self.weaken(rule) if self.weaken is not None else rule
        return dataclasses.replace(rule, probe=self)

    def _columns(self) -> slice:
        if self.P is None:
            raise ConfigError("node canaries need the widened model (`widen`) first")
        return slice(self.P, self.P + self.m)

    def add(self, rule: GradientRule, silos: np.ndarray, clipped: np.ndarray) -> None:
        """± ρ_i · (the canary's clipped per-example norm) in canary i's coordinate."""
        size = float(rule.clipped_norm(NORM_FACTOR * rule.clip))
        for j, k in enumerate(np.atleast_1d(silos)):
            if int(k) == self.silo:
                rho = self.rng.hypergeometric(self.affected, self.n - self.affected, self.b,
                                              size=self.m)
                clipped[j, self._columns()] += self.sign * rho * size

    def observe(self, silos: np.ndarray, noisy: np.ndarray) -> None:
        """Record the noisy canary coordinates of the audited region's step."""
        for j, k in enumerate(np.atleast_1d(silos)):
            if int(k) == self.silo:
                self.observed.append(np.array(noisy[j, self._columns()], dtype=float))

    def per_pass(self, pass_steps: int, clip: float) -> tuple[np.ndarray, np.ndarray]:
        """(m, B) per-pass sums in units of C — consecutive `pass_steps` steps each (a
        last, shorter pass included) — and (B,) the steps of each pass."""
        T, L = len(self.observed), int(pass_steps)
        if L < 1:
            raise ConfigError(f"a pass has at least one step, got {pass_steps}")
        if not T:
            return np.zeros((self.m, 0)), np.zeros(0, dtype=int)
        steps = np.stack(self.observed, axis=1) / clip  # (m, T)
        cuts = list(range(0, T, L))
        sums = np.stack([steps[:, a:a + L].sum(1) for a in cuts], axis=1)
        return sums, np.array([min(L, T - a) for a in cuts])


# --- the exact LLR of the per-pass sums --------------------------------------------------

#: counts R less likely than e^-TRIM times the likeliest are left out of the mixtures
TRIM = 30.0


def pass_count_log_pmf(n: int, affected: int, b: int, L: int) -> np.ndarray:
    """log P(R = r), r = 0 … L·min(K, b): R the canary's affected examples over L steps,
    each step's count Hypergeometric(n, K, b), independent across steps. Values below
    e^-`TRIM` times the largest are -inf (a negligible tail; keeps the mixtures short)."""
    h = stats.hypergeom.pmf(np.arange(min(affected, b) + 1), n, affected, b)
    out = np.array([1.0])
    for _ in range(int(L)):
        out = np.convolve(out, h)
    with np.errstate(divide="ignore"):
        logp = np.log(np.clip(out, 0.0, None))
    return np.where(logp >= logp.max() - TRIM, logp, -np.inf)


def _lse(x: np.ndarray) -> np.ndarray:
    mx = x.max(axis=-1, keepdims=True)
    return np.log(np.exp(x - mx).sum(axis=-1)) + mx[..., 0]


def _llr(u: np.ndarray, logh: np.ndarray, var: float) -> np.ndarray:
    """log p_in(u)/p_out(u) for u (...,): p_in = Σ_r h(r)N(r, var), p_out = Σ_r h(r)N(−r, var)."""
    r = np.flatnonzero(np.isfinite(logh))
    a = logh[r] - r ** 2 / (2 * var)
    t = u[..., None] * (r / var)
    return _lse(a + t) - _lse(a - t)


def node_llr_scores(u: np.ndarray, steps: np.ndarray, n: int, affected: int, b: int,
                    sigma: float) -> np.ndarray:
    """(m,) Σ_b log p_in(u_b)/p_out(u_b) of per-pass sums u (m, B) in units of C, under
    the claimed mechanism (noise multiplier σ, passes of steps (B,))."""
    u, steps = np.asarray(u, float), np.asarray(steps, int)
    if u.ndim != 2 or u.shape[1] != steps.size:
        raise ConfigError(f"per-pass sums must be (m, {steps.size}), got {u.shape}")
    out = np.zeros(u.shape[0])
    cache: dict[int, np.ndarray] = {}
    for j, L in enumerate(steps):
        L = int(L)
        if L not in cache:
            cache[L] = pass_count_log_pmf(n, affected, b, L)
        out += _llr(u[:, j], cache[L], L * sigma ** 2)
    return out


_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(48)  # converged: 96 nodes agree to 1e-14
_GH_W = _GH_W / _GH_W.sum()


def node_expected_mu(steps: np.ndarray, n: int, affected: int, b: int, sigma: float,
                     scale: float = 1.0) -> float:
    """μ by which `node_llr_scores` (claimed σ) separates "in" from "out" when the
    mechanism's noise is σ·`scale`: 2·E_in/√Var_in (the score is odd in u, so its "out"
    law mirrors its "in" law); exact moments by Gauss–Hermite quadrature per pass."""
    mean = var = 0.0
    lengths, counts = np.unique(np.asarray(steps, int), return_counts=True)
    for L, c in zip(lengths, counts):
        logh = pass_count_log_pmf(n, affected, b, int(L))
        r = np.flatnonzero(np.isfinite(logh))
        h = np.exp(logh[r])
        sd = math.sqrt(L) * sigma * scale
        f = _llr(r[:, None] + sd * _GH_X[None, :], logh, L * sigma ** 2)  # (R, G)
        m1 = float(h @ (f @ _GH_W)) / h.sum()
        s1 = float(h @ ((f ** 2) @ _GH_W)) / h.sum()
        mean, var = mean + c * m1, var + c * (s1 - m1 ** 2)
    return 2 * mean / math.sqrt(var) if var > 0 else math.inf


def node_noise_scale_for(mu: float, steps: np.ndarray, n: int, affected: int, b: int,
                         sigma: float) -> float:
    """The noise scale c at which `node_expected_mu` equals `mu` (`estimate.scale_for_mu`)."""
    return scale_for_mu(mu, lambda c: node_expected_mu(steps, n, affected, b, sigma, c))


def node_estimate(out: np.ndarray, inn: np.ndarray, steps: np.ndarray, n: int,
                  affected: int, b: int, sigma: float, true_epsilon,
                  confidence: float) -> dict:
    """The ε estimate from the LLR scores of the canaries without (`out`) and with (`inn`),
    read through the node-level family (`estimate.estimate_through`).

    `true_epsilon(c)`: the accountant's ε of the audited steps with noise σ·c. Returns μ̂,
    its one-sided lower limit, the noise scales they imply and ε at both ("epsilon",
    "epsilon_lower": the estimate's verdict), with what it assumes."""
    def mu_at(c: float) -> float:
        return node_expected_mu(steps, n, affected, b, sigma, c)
    return dict(estimate_through(out, inn, mu_at, true_epsilon, confidence,
                                 NODE_ESTIMATE_ASSUMES), expected_mu=mu_at(1.0))


def node_detectable(steps: np.ndarray, n: int, affected: int, b: int, sigma: float,
                    claim: float, n_out: int, n_in: int, confidence: float,
                    true_epsilon) -> dict:
    """The power of `node_estimate` at these settings (`estimate.detectable_through` with
    the node-level family): the smallest true ε it flags — lower end above `claim` — with
    probability ≥ `confidence`; inf when even the smallest noise scale is not flagged that
    often."""
    return detectable_through(lambda c: node_expected_mu(steps, n, affected, b, sigma, c),
                              claim, n_out, n_in, confidence, true_epsilon)


__all__ = ["NodeCanaries", "NORM_FACTOR", "node_llr_scores",
           "node_expected_mu", "node_noise_scale_for", "node_estimate", "node_detectable",
           "pass_count_log_pmf"]

"""Thesis Fig. 1.7: the privacy cost of tuning λ on mean estimation, as numbers and a PNG.

For each panel (a model instance of `mean_estimation`) and each way of tuning λ with a
random number of trials (E[h] = `mean_trials`, h ~ TNB(η, γ) or Poisson), the noise
multiplier is raised until the tuned release meets the silo's (ε, δ)
(`tuning_cost.tuned_noise_multiplier`), and MR-MTL's error E(λ) (Lemma 1.6.7) is drawn
with that noise — against untuned Local and FedAvg at the same (ε, δ) (green lines) and
untuned, uncounted MR-MTL ("Private": the tuning cost not paid; "Non-private": no DP).
As in the thesis, each trial is priced as a fresh run of the mechanism (the stand-in for a
training run); in one-shot mean estimation λ could be changed after the release for free,
and only the selection would need privacy. The tuned curves' minima are optimistic for
MR-MTL: they assume the tuning finds the best λ. Simulated means (± 99.9% CI, `reps`
repetitions, seeded) at each curve's minimum and at the endpoints check the closed forms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from silofl.errors import ConfigError
from silofl.experiments.figures import _plt, check_out_dir
from silofl.io import savefig_atomic, write_json_atomic
from silofl.theory import model as me
from silofl.theory import tuning_cost as tc
from silofl.theory.montecarlo import simulate


@dataclass(frozen=True)
class Panel:
    """One panel: the model's parameters (homogeneous silos) and what it illustrates."""

    title: str
    K: int
    n: int
    sigma2: float
    tau2: float
    clip: float
    epsilon: float
    delta: float


#: three regimes of the thesis's Fig. 1.7 (its exact parameters are not published): (a)
#: strong privacy, little heterogeneity — tuned MR-MTL falls behind untuned FedAvg;
#: (b) balanced — the tuning cost eats most of MR-MTL's advantage; (c) weak privacy, large
#: heterogeneity — tuned MR-MTL falls behind untuned Local. Data x ~ N(w_k, 1), |x| ≤ 5
#: w.h.p. (c ≥ 4.9 standard deviations of the marginal N(θ, τ² + σ²) in every panel).
FIG17_PANELS = (
    Panel("(a) ε = 1, τ² = 0.005", K=10, n=50, sigma2=1.0, tau2=0.005, clip=5.0,
          epsilon=1.0, delta=1e-5),
    Panel("(b) ε = 4, τ² = 0.03", K=10, n=50, sigma2=1.0, tau2=0.03, clip=5.0,
          epsilon=4.0, delta=1e-5),
    Panel("(c) ε = 4, τ² = 0.5", K=10, n=50, sigma2=1.0, tau2=0.5, clip=6.0,
          epsilon=4.0, delta=1e-5),
)
DEFAULT_ETAS = (0.0, 0.5, 1.0, 2.0)
_LAMBDAS = np.logspace(-3, 3, 121)


def tuning_label(eta: float, mean_trials: float, gamma: float | None) -> str:
    if math.isinf(eta):
        return f"Private, Poisson (μ = {mean_trials:g})"
    return f"Private, TNB (η = {eta:g}, γ = {gamma:.3g})"


def fig17_numbers(panels=FIG17_PANELS, mean_trials: float = 10.0, etas=DEFAULT_ETAS,
                  poisson: bool = True, reps: int = 500, seed: int = 0,
                  naive_trials: int | None = None) -> dict:
    """Every number of Fig. 1.7 as plain data: per panel, the untuned noise (the library's
    default accountant, and RDP for comparison), one entry per tuning distribution with
    its γ, noise multiplier, local variance, λ*, E*, the verdicts against untuned Local
    and FedAvg, the ε a fixed grid of `naive_trials` (default round(mean_trials)) runs at
    that noise would cost, and (reps > 0) simulated errors. Raises ConfigError/PrivacyError
    before computing anything on bad input."""
    if not panels:
        raise ConfigError("fig17 needs at least one panel")
    etas = tuple(float(e) for e in etas)
    if not etas and not poisson:
        raise ConfigError("choose at least one tuning distribution (an η or Poisson)")
    for e in etas:
        tc._check_eta(e)
        if math.isinf(e):
            raise ConfigError("η = inf is the Poisson distribution: drop it from the TNB "
                              "shapes and use poisson=True (--poisson)")
    tc._check_mean(mean_trials)
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 0 or reps == 1:
        raise ConfigError(f"reps must be 0 (no simulation) or an integer ≥ 2, got {reps!r}")
    trials = int(round(mean_trials)) if naive_trials is None else int(naive_trials)
    dists = [(e, tc.tnb_gamma(e, mean_trials)) for e in etas]
    if poisson:
        dists.append((math.inf, None))
    out = {"mean_trials": mean_trials, "naive_trials": trials, "reps": reps, "seed": seed,
           "noise": "seeded (simulation only)", "lambdas": _LAMBDAS.tolist(), "panels": []}
    for p_i, p in enumerate(panels):
        m = me.mean_estimation(p.K, p.n, p.sigma2, p.tau2, p.clip, p.epsilon, p.delta)
        s, K, t2 = float(m.local_var[0]), p.K, p.tau2
        z_rdp = me.gaussian_noise_multiplier(p.epsilon, p.delta, "rdp")
        curves = [_curve("Non-private", m.non_private(), None, None, s, t2, K),
                  _curve("Private", m, None, None, s, t2, K)]
        for eta, gamma in dists:
            z = tc.tuned_noise_multiplier(p.epsilon, p.delta, mean_trials, eta)
            c = _curve(tuning_label(eta, mean_trials, gamma), m.with_noise_multiplier(z),
                       eta, gamma, s, t2, K)
            c["naive_grid_epsilon"] = tc.naive_grid_epsilon(z, trials, p.delta)
            c["noise_ratio_vs_untuned"] = z / m.noise_multiplier[0]
            curves.append(c)
        if reps:
            for c_i, c in enumerate(curves):
                mm = m.with_noise_multiplier(c["noise_multiplier"])
                lam = c["lambda_star"]
                sim = simulate(mm, [lam] if math.isfinite(lam) else [], reps=reps,
                               seed=[seed, p_i, c_i])
                mean, ci = sim.mean(), sim.ci()
                c["simulated"] = {"local": [mean[0], ci[0]], "fedavg": [mean[1], ci[1]],
                                  "optimum": ([mean[2], ci[2]] if math.isfinite(lam)
                                              else [mean[1], ci[1]])}
        out["panels"].append({
            "title": p.title, "K": K, "n": p.n, "sigma2": p.sigma2, "tau2": t2,
            "clip": p.clip, "epsilon": p.epsilon, "delta": p.delta,
            "clip_mass": m.clip_mass(), "accountant": m.accountant,
            "noise_multiplier": m.noise_multiplier[0], "noise_multiplier_rdp": z_rdp,
            "local_var": s, "local_error": me.local_error(s),
            "fedavg_error": me.fedavg_error(s, t2, K), "curves": curves})
    return out


def _curve(label, m: me.MeanEstimation, eta, gamma, s_untuned: float, tau2: float,
           K: int) -> dict:
    s = float(m.local_var[0])
    v = me.tuned_beats_both(s_untuned, s, tau2, K)
    tuning = None if eta is None else ("poisson" if math.isinf(eta) else "tnb")
    return {"label": label, "tuning": tuning, "eta": None if tuning == "poisson" else eta,
            "gamma": gamma,
            "noise_multiplier": m.noise_multiplier[0], "local_var": s,
            "lambda_star": me.optimal_lambda(s, tau2),
            "optimal_error": v["tuned_error"], "beats_local": v["beats_local"],
            "beats_fedavg": v["beats_fedavg"], "beats_both": v["beats_both"],
            "error": me.mrmtl_error(s, tau2, K, _LAMBDAS).tolist()}


def draw_fig17(numbers: dict, path: Path) -> None:
    """The PNG of `fig17_numbers`: one panel per model, error vs λ (log-log)."""
    plt = _plt()
    panels = numbers["panels"]
    lam = np.asarray(numbers["lambdas"])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 5.4), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, p in zip(axes[0], panels):
        tuned = [c for c in p["curves"] if c["tuning"] is not None]
        for c in p["curves"]:
            if c["label"] == "Non-private":
                style = dict(color="0.55", ls=":", lw=1.5)
            elif c["label"] == "Private":
                style = dict(color="black", lw=2)
            else:
                i = tuned.index(c)
                style = dict(color=cmap(0.1 + 0.8 * i / max(1, len(tuned) - 1)), lw=1.3,
                             ls="--" if c["tuning"] == "poisson" else "-")
            ax.plot(lam, c["error"], label=c["label"], **style)
            ls = c["lambda_star"]
            x = ls if math.isfinite(ls) else lam[-1]
            ax.plot([x], [c["optimal_error"]], "o", ms=4, color=style["color"])
            if "simulated" in c:
                mu, ci = c["simulated"]["optimum"]
                ax.errorbar([x], [mu], yerr=[ci], fmt="x", ms=5, color=style["color"],
                            capsize=2)
        ax.axhline(p["local_error"], color="tab:green", lw=1.5, ls="-.",
                   label="Local (private, untuned)")
        ax.axhline(p["fedavg_error"], color="tab:green", lw=1.5, ls="--",
                   label="FedAvg (private, untuned)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("λ (MR-MTL regularization)")
        ax.set_ylabel("E[(w_k − ŵ_k(λ))²]")
        ax.set_title(f"{p['title']}, K = {p['K']}, n = {p['n']}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7.5, frameon=False)
    fig.suptitle(f"Privacy cost of tuning λ (E[h] = {numbers['mean_trials']:g}) on mean "
                 "estimation; dots: closed-form minima, ×: simulated (99.9% CI)", fontsize=9)
    rows = math.ceil(len(handles) / 4)
    fig.tight_layout(rect=(0, 0.045 * rows + 0.02, 1, 1))
    savefig_atomic(fig, path, dpi=130)
    plt.close(fig)


def fig17(out_dir: Path, **kw) -> tuple[dict, dict]:
    """Compute Fig. 1.7 and write fig17.png and fig17.json into out_dir (created).
    Returns (numbers, {"png": path, "json": path}). Nothing is written on bad input."""
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    numbers = fig17_numbers(**kw)
    out_dir.mkdir(parents=True, exist_ok=True)
    png, js = out_dir / "fig17.png", out_dir / "fig17.json"
    draw_fig17(numbers, png)
    write_json_atomic(js, numbers, indent=1)
    return numbers, {"png": png, "json": js}

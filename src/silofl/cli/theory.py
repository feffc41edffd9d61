"""`silofl theory …`: the mean-estimation theory of MR-MTL from the command line.

Parsing and printing over `silofl.theory` (which never imports the CLI); heavy imports stay
inside the commands."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from silofl.cli.root import _fail, app, console, err
from silofl.errors import ConfigError, SiloflError

theory_app = typer.Typer(help=(
    "MR-MTL on private mean estimation (thesis §1.6, App. D): closed forms, λ*, a "
    "simulation check, and Fig. 1.7 (the privacy cost of tuning λ). Reads no data and "
    "spends no budget."))
app.add_typer(theory_app, name="theory")

ASSUMPTIONS = ("Model: w_k ~ N(θ, τ²), x ~ N(w_k, σ_k²), ŵ_k = (Σ clip_c(x) + N(0, (z_k c)²))"
               "/n_k. Adjacency: add/remove one example; n_k public; c bounds the data "
               "w.h.p. (no clipping error assumed). Errors: E[(w_k − estimate)²].")

# shared options
K_OPT = typer.Option(10, "--silos", "-K", help="number of silos K (≥ 2)")
N_OPT = typer.Option("50", "--n", help="samples per silo: one value or K comma-separated")
SIGMA2_OPT = typer.Option("1", "--sigma2", help="data variance σ_k²: one value or K values")
TAU2_OPT = typer.Option(0.03, "--tau2", help="heterogeneity τ² (variance of silo centres)")
CLIP_OPT = typer.Option(5.0, "--clip", help="clipping bound c (data units, public)")
EPS_OPT = typer.Option("4", "--epsilon", help="ε_k: one value or K comma-separated values")
DELTA_OPT = typer.Option("1e-5", "--delta", help="δ_k: one value or K values")
NOPRIV_OPT = typer.Option(False, "--no-privacy", help="the non-private model (no noise)")
ACC_OPT = typer.Option("pld", "--accountant", help="calibrate σ with pld or rdp")


def _floats(text: str, name: str) -> list[float]:
    try:
        vals = [float(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{name} must be a number or comma-separated numbers, got "
                          f"{text!r}") from None
    if not vals:
        raise ConfigError(f"{name} is empty; give a number or K comma-separated numbers")
    return vals


def _model(K, n, sigma2, tau2, clip, epsilon, delta, no_privacy, accountant):
    from silofl.privacy.accounting import ACCOUNTANTS
    from silofl.theory.model import mean_estimation
    if accountant not in ACCOUNTANTS:
        raise ConfigError(f"--accountant must be one of {', '.join(ACCOUNTANTS)}, got "
                          f"{accountant!r}")
    return mean_estimation(K, _floats(n, "--n"), _floats(sigma2, "--sigma2"), tau2, clip,
                           None if no_privacy else _floats(epsilon, "--epsilon"),
                           _floats(delta, "--delta"), accountant=accountant)


def _g(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.3g}"


def _silo_table(summ: dict, m) -> Table:
    si = summ["silos"]
    # n and δ get a column only where silos differ (keeps the table within 80 columns)
    same_n, same_d = len(set(m.n)) == 1, m.delta is None or len(set(m.delta)) == 1
    common = ([f"n = {m.n[0]}"] if same_n else []) + (
        [f"δ = {m.delta[0]:g}"] if same_d and m.delta else [])
    t = Table(title="MR-MTL on mean estimation, per silo (thesis Eq. 1.9–1.14, D.28–D.30)"
                    f"{'; ' + ', '.join(common) if common else ''}. E_loc, E_fed, E*: "
                    "errors of Local, FedAvg, MR-MTL(λ*)")
    cols = (["silo"] + ([] if same_n else ["n"]) + ["ε"] + ([] if same_d else ["δ"])
            + ["z", "σ_loc²", "λ*", "E_loc", "E_fed", "E*", "E* < both"])
    for c in cols:
        t.add_column(c, justify="right")
    for k in ([0] if m.homogeneous else range(m.K)):
        both = si["beats_local"][k] and si["beats_fedavg"][k]
        row = ["all" if m.homogeneous else str(k)] + ([] if same_n else [str(m.n[k])])
        row += ["—" if m.epsilon is None else f"{m.epsilon[k]:g}"]
        row += [] if same_d else [f"{m.delta[k]:g}"]
        row += [f"{m.noise_multiplier[k]:.3g}", _g(si["local_var"][k]),
                _g(si["lambda_star"][k]), _g(si["local_error"][k]),
                _g(si["fedavg_error"][k]), _g(si["optimal_error"][k]),
                "yes" if both else "no"]
        t.add_row(*row)
    return t


@theory_app.command("show")
def theory_show(K: int = K_OPT, n: str = N_OPT, sigma2: str = SIGMA2_OPT,
                tau2: float = TAU2_OPT, clip: float = CLIP_OPT, epsilon: str = EPS_OPT,
                delta: str = DELTA_OPT, no_privacy: bool = NOPRIV_OPT,
                accountant: str = ACC_OPT,
                json_out: Path | None = typer.Option(None, "--json",
                                                        help="also write the numbers here")):
    """Closed forms: each silo's σ_loc², λ*, the errors of Local, FedAvg and MR-MTL(λ*), the
    λ range where MR-MTL beats both endpoints, and E(λ) over the thesis's λ grid."""
    from silofl.io import write_json_atomic
    from silofl.theory.model import summary
    try:
        m = _model(K, n, sigma2, tau2, clip, epsilon, delta, no_privacy, accountant)
        summ = summary(m)
        if json_out is not None:
            if json_out.is_dir() or not json_out.parent.is_dir():
                raise ConfigError(f"--json {str(json_out)!r}: name a file in an existing "
                                  "folder")
            write_json_atomic(json_out, summ, indent=1)
    except SiloflError as e:
        _fail(e)
    console.print(_silo_table(summ, m))
    h = summ["homogeneous"]
    if h is not None:
        iv = h["beating_interval"]
        where = ("no λ (needs σ_loc² > 0 and τ² > 0)" if iv is None
                 else f"λ ∈ ({_g(iv[0])}, {_g(iv[1])})")
        console.print(f"MR-MTL(λ) beats both Local and FedAvg for {where}; at λ* = "
                      f"{_g(h['lambda_star'])} it gains Δ_loc = {_g(h['gap_to_local'])} over "
                      f"Local and Δ_fed = {_g(h['gap_to_fedavg'])} over FedAvg.")
        t = Table(title="E(λ) (Lemma 1.6.7) and the part due to DP, Δ_DP(λ) (Thm 1.6.8)")
        for c in ("λ", "E(λ)", "Δ_DP(λ)"):
            t.add_column(c, justify="right")
        for lam, error, d in zip(summ["lambdas"], h["error_at_lambda"],
                                 h["privacy_gap_at_lambda"]):
            t.add_row(f"{lam:g}", _g(error), _g(d))
        console.print(t)
    if summ["model"]["clip_mass"] > 1e-4:
        err.print(f"[bold yellow]note:[/] {summ['model']['clip_mass']:.2g} of the data "
                  "lies beyond the clipping bound: the closed forms ignore clipping; raise "
                  "--clip")
    console.print(escape(ASSUMPTIONS))


@theory_app.command("check")
def theory_check(K: int = K_OPT, n: str = N_OPT, sigma2: str = SIGMA2_OPT,
                 tau2: float = TAU2_OPT, clip: float = CLIP_OPT, epsilon: str = EPS_OPT,
                 delta: str = DELTA_OPT, no_privacy: bool = NOPRIV_OPT,
                 accountant: str = ACC_OPT,
                 reps: int = typer.Option(4000, "--reps", help="simulated repetitions"),
                 seed: int = typer.Option(0, "--seed")):
    """Closed forms vs a Monte-Carlo simulation of the same model with the library's
    Gaussian mechanism (seeded): one row per estimator, exit 1 if any closed form lies
    outside the simulation's 99.9% CI."""
    import numpy as np

    from silofl.theory.model import THESIS_LAMBDAS, silo_errors, silo_optimal_lambdas
    from silofl.theory.montecarlo import simulate
    try:
        m = _model(K, n, sigma2, tau2, clip, epsilon, delta, no_privacy, accountant)
        s = m.local_var
        lam_star = silo_optimal_lambdas(s, m.tau2)
        lams = np.vstack([lam_star[None, :],
                          np.repeat(np.asarray(THESIS_LAMBDAS)[:, None], m.K, axis=1)])
        with console.status(f"simulating {reps} repetitions…"):
            sim = simulate(m, lams, reps=reps, seed=seed)
    except SiloflError as e:
        _fail(e)
    closed = silo_errors(s, m.tau2, sim.lambdas).mean(axis=1)
    mean, ci = sim.mean(), sim.ci()
    t = Table(title=f"closed form vs simulation ({reps} repetitions, 99.9% CI, seeded)")
    for c in ("estimator", "closed form", "simulated", "± CI", "agrees"):
        t.add_column(c, justify="right")
    bad = 0
    for i, name in enumerate(sim.estimates):
        label = "mrmtl(λ*)" if i == 2 else name
        ok = abs(closed[i] - mean[i]) <= ci[i]
        bad += not ok
        t.add_row(label, _g(closed[i]), _g(mean[i]), _g(ci[i]),
                  "yes" if ok else "[red]NO[/]")
    console.print(t)
    console.print(escape(ASSUMPTIONS))
    if bad:
        err.print(f"[bold red]{bad} closed form(s) outside the simulation's 99.9% CI[/] "
                  "(at 99.9% about 1 row in 1000 misses by chance; rerun with another "
                  "--seed or more --reps)")
        raise typer.Exit(1)


@theory_app.command("fig17")
def theory_fig17(out: Path = typer.Option(..., "--out", help="folder for fig17.png/json"),
                 mean_trials: float = typer.Option(10.0, "--mean-trials",
                                                   help="mean number of trials h"),
                 etas: str = typer.Option("0,0.5,1,2", "--etas",
                                          help="TNB shapes η ≥ 0, comma-separated"),
                 poisson: bool = typer.Option(True, "--poisson/--no-poisson",
                                              help="also Poisson(μ = E[h])"),
                 reps: int = typer.Option(500, "--reps",
                                          help="simulated repetitions per point (0: none)"),
                 seed: int = typer.Option(0, "--seed")):
    """Thesis Fig. 1.7: MR-MTL's error after paying for tuning λ with a random number h of
    trials, h ~ TNB(η, γ) or Poisson, against untuned Local and FedAvg, in three regimes."""
    from silofl.theory.figures import fig17
    try:
        eta_list = [] if not etas.strip() else _floats(etas, "--etas")
        with console.status("calibrating and simulating…"):
            num, paths = fig17(out, mean_trials=mean_trials, etas=eta_list, poisson=poisson,
                               reps=reps, seed=seed)
    except SiloflError as e:
        _fail(e)
    for p in num["panels"]:
        t = Table(title=f"{p['title']}: untuned Local {_g(p['local_error'])}, FedAvg "
                        f"{_g(p['fedavg_error'])} (z = {p['noise_multiplier']:.3g}, "
                        f"{p['accountant']})")
        for c in ("curve", "z", "σ_loc²", "λ*", "error at λ*", "simulated", "beats Local",
                  "beats FedAvg", f"ε of {num['naive_trials']} fixed trials"):
            t.add_column(c, justify="right")
        for c in p["curves"]:
            sim = c.get("simulated", {}).get("optimum")
            t.add_row(escape(c["label"]), f"{c['noise_multiplier']:.3g}", _g(c["local_var"]),
                      _g(c["lambda_star"]), _g(c["optimal_error"]),
                      "—" if sim is None else f"{sim[0]:.4g} ± {sim[1]:.2g}",
                      "yes" if c["beats_local"] else "[red]no[/]",
                      "yes" if c["beats_fedavg"] else "[red]no[/]",
                      _g(c["naive_grid_epsilon"]) if "naive_grid_epsilon" in c else "—")
        console.print(t)
    console.print(escape(
        f"Tuned rows: the noise multiplier that makes the best-of-h release (ε, δ)-DP "
        f"(dp_accounting RepeatAndSelectDpEvent, RDP), E[h] = {mean_trials:g}; the last "
        f"column is what releasing {num['naive_trials']} fixed trials at that noise would "
        "cost instead (composition). Minima assume the tuning finds λ* (optimistic for "
        "MR-MTL). " + ASSUMPTIONS))
    console.print(f"Wrote [bold]{escape(str(paths['png']))}[/] and "
                  f"[bold]{escape(str(paths['json']))}[/].")

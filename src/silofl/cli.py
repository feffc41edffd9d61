"""The `silofl` command line. Every command is a thin layer over the Python API."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from silofl.errors import SiloflError

app = typer.Typer(add_completion=False, no_args_is_help=False,
                  help="Private, personalized cross-silo federated learning.")
console = Console()
err = Console(stderr=True)


def _fail(e: Exception) -> None:
    err.print(f"[bold red]error:[/] {escape(str(e))}")
    raise typer.Exit(2)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    err.print(f"[yellow]warning:[/] {escape(str(message))}")


@app.command()
def run(config: Optional[Path] = typer.Option(None, "--config", "-c",
                                              help="TOML config (default: built-in heart data)"),
        out: Optional[Path] = typer.Option(None, "--out", help="directory for run folders"),
        no_privacy: bool = typer.Option(False, "--no-privacy",
                                        help="train without DP (comparison only)"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar")):
    """Train Local, FedAvg and MR-MTL (or the configured methods) at each silo's own
    privacy target and print a comparison table; writes a run directory."""
    from silofl.experiments.config import load_config
    from silofl.experiments.report import privacy_table, results_table
    from silofl.experiments.run import run as run_experiment
    warnings.showwarning = _show_warning
    try:
        cfg = load_config(config)
        if no_privacy:
            cfg.privacy.enabled = False
        with Progress(TextColumn("{task.description:<10}"), BarColumn(), TextColumn(
                "{task.completed}/{task.total} rounds  {task.fields[metric]}"),
                TimeElapsedColumn(), console=err, disable=quiet, transient=False) as prog:
            tasks = {}

            def on_progress(label, t, total, pooled):
                if label not in tasks:
                    tasks[label] = prog.add_task(label, total=total, metric="")
                prog.update(tasks[label], completed=t, metric=f"{pooled:.4f}")
            rep = run_experiment(cfg, out, on_progress)
    except SiloflError as e:
        _fail(e)
    console.print(results_table(rep))
    if (pt := privacy_table(rep)) is not None:
        console.print(pt)
    else:
        console.print("No differential privacy: this run is for comparison only.")
    if rep.combined_privacy:
        worst = max(rep.combined_privacy, key=lambda x: x["epsilon_rdp"])
        console.print(
            f"Each method meets every silo's target on its own. Releasing all "
            f"{len(rep.results)} methods' models composes their costs (worst silo "
            f"{worst['silo']}: ε = {worst['epsilon_rdp']:.3f} RDP / {worst['epsilon_pld']:.3f} PLD).")
    if rep.run_dir:
        console.print(f"Run directory: [bold]{rep.run_dir}[/] (config.toml, history.json, "
                      "ledgers/, privacy_report.json, summary.json, metric_over_rounds.png)")


@app.command()
def account(n: int = typer.Option(..., help="training examples in the silo"),
            batch: float = typer.Option(..., help="expected batch size b (q = b/n)"),
            delta: float = typer.Option(..., help="δ"),
            steps: Optional[int] = typer.Option(None, help="DP-SGD steps"),
            epochs: Optional[float] = typer.Option(None, help="epochs (steps = epochs·n/b)"),
            sigma: Optional[float] = typer.Option(None, help="noise multiplier → report ε"),
            epsilon: Optional[float] = typer.Option(None, help="target ε → calibrate σ"),
            as_json: bool = typer.Option(False, "--json", help="print JSON")):
    """ε for DP-SGD with (n, b, steps|epochs, σ, δ), or σ for a target ε, under RDP and PLD."""
    from silofl.privacy import accounting as A
    try:
        if (steps is None) == (epochs is None):
            raise SiloflError("give exactly one of --steps or --epochs")
        if (sigma is None) == (epsilon is None):
            raise SiloflError("give exactly one of --sigma (to get ε) or --epsilon (to get σ)")
        if n < 2 or not 0 < batch < n:
            raise SiloflError(f"need n ≥ 2 and 0 < batch < n, got n={n}, batch={batch}")
        if not 0 < delta < 1:
            raise SiloflError(f"delta must be in (0, 1), got {delta}")
        q = batch / n
        T = steps if steps is not None else A.steps_for_epochs(n, batch, epochs)
        if T < 1:
            raise SiloflError(f"steps must be ≥ 1, got {T}")
        out = {"n": n, "batch": batch, "q": q, "steps": T, "delta": delta}
        if sigma is not None:
            if sigma <= 0:
                raise SiloflError(f"sigma must be positive, got {sigma}")
            out.update(sigma=sigma, **{f"epsilon_{k}": v for k, v in
                                       A.epsilons(A.dpsgd_event(q, sigma, T), delta).items()})
        else:
            if epsilon <= 0:
                raise SiloflError(f"epsilon must be positive, got {epsilon}")
            out.update(target_epsilon=epsilon, **{
                f"sigma_{k}": A.calibrate_dpsgd(epsilon, delta, q, T, k) for k in A.ACCOUNTANTS})
    except SiloflError as e:
        _fail(e)
    if as_json:
        console.print_json(json.dumps(out))
        return
    t = Table(title="DP-SGD privacy accounting (Poisson-sampled Gaussian, add/remove one)")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    for k, v in out.items():
        t.add_row(k, f"{v:.6g}" if isinstance(v, float) else str(v))
    console.print(t)


def main() -> None:
    app()

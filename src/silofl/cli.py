"""The `silofl` command line. Every command is a thin layer over the Python API."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Annotated, Optional

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
            f"{worst['silo']}: ε = {worst['epsilon_rdp']:.3f} RDP / "
            + ("n/a" if worst["epsilon_pld"] is None else f"{worst['epsilon_pld']:.3f}")
            + " PLD).")
    if rep.run_dir:
        console.print(f"Run directory: [bold]{rep.run_dir}[/] (config.toml, history.json, "
                      "ledgers/, privacy_report.json, summary.json, metric_over_rounds.png)")


@app.command()
def account(n: int = typer.Option(..., help="training examples (persons) in the silo"),
            batch: float = typer.Option(..., help="(expected) batch size b"),
            delta: Optional[float] = typer.Option(None, help="δ (node-level default: 1/n)"),
            steps: Optional[int] = typer.Option(None, help="DP-SGD steps"),
            epochs: Optional[float] = typer.Option(None, help="epochs (steps = epochs·n/b)"),
            sigma: Optional[float] = typer.Option(None, help="noise multiplier → report ε"),
            epsilon: Optional[float] = typer.Option(None, help="target ε → calibrate σ"),
            node_level: bool = typer.Option(False, "--node-level", help=(
                "node-level DP for graph neighbourhoods (Theorem 2.4.4): fixed-size batches "
                "without replacement, each person in ≤ S examples")),
            S: int = typer.Option(20, "--S", help="node-level: appearances bound S"),
            as_json: bool = typer.Option(False, "--json", help="print JSON")):
    """ε for DP-SGD with (n, b, steps|epochs, σ, δ), or σ for a target ε: example-level
    under RDP and PLD, or node-level (--node-level) under RDP."""
    from silofl.privacy import accounting as A
    if node_level:
        return _account_node(n, int(batch), delta, steps, epochs, sigma, epsilon, S, as_json)
    try:
        if delta is None:
            raise SiloflError("give --delta (e.g. 1e-5, well below 1/n)")
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
    _print_quantities("DP-SGD privacy accounting (Poisson-sampled Gaussian, add/remove one)",
                      out, as_json)


def _print_quantities(title: str, out: dict, as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(out))
        return
    t = Table(title=title)
    t.add_column("quantity")
    t.add_column("value", justify="right")
    for k, v in out.items():
        t.add_row(k, f"{v:.6g}" if isinstance(v, float) else str(v))
    console.print(t)


def _account_node(n, b, delta, steps, epochs, sigma, epsilon, S, as_json):
    from silofl.pandemic import node_dp
    try:
        if (steps is None) == (epochs is None):
            raise SiloflError("give exactly one of --steps or --epochs")
        if (sigma is None) == (epsilon is None):
            raise SiloflError("give exactly one of --sigma (to get ε) or --epsilon (to get σ)")
        T = steps if steps is not None else node_dp.node_steps(n, b, epochs)
        d = delta if delta is not None else 1.0 / n
        out = {"n": n, "S": S, "batch": b, "steps": T, "delta": d}
        if sigma is not None:
            out.update(sigma=sigma, epsilon_node_rdp=node_dp.node_epsilon(n, S, b, sigma, T, d))
        else:
            out.update(target_epsilon=epsilon,
                       sigma_node_rdp=node_dp.calibrate_node_sigma(epsilon, n, S, b, T, d))
    except SiloflError as e:
        _fail(e)
    _print_quantities("node-level DP-SGD accounting (Theorem 2.4.4, replacement adjacency)",
                      out, as_json)


def _report_dir(results: Path, out: Optional[Path]) -> Path:
    return out if out is not None else results.with_name(results.stem + "-report")


@app.command()
def sweep(config: Path = typer.Argument(..., help="sweep TOML: run sections + [sweep] grid"),
          results: Optional[Path] = typer.Option(
              None, "--results", help="results file (default: sweep.results, relative to "
              "the config file)"),
          workers: Optional[int] = typer.Option(None, "--workers", "-j",
                                                help="processes (default: sweep.workers)"),
          quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar")):
    """Run (or resume) a privacy-utility sweep: methods × ε × λ × lr × seeds, one JSON line
    per finished run; then print the best settings chosen on validation data."""
    from rich.progress import MofNCompleteColumn, TimeRemainingColumn

    from silofl.experiments.report import selection_table
    from silofl.experiments.selection import select_best
    from silofl.experiments.sweep import NOT_COUNTED, read_results, run_sweep
    from silofl.experiments.sweep_config import load_sweep_config
    warnings.showwarning = _show_warning
    try:
        sc = load_sweep_config(config)
        with Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("runs"), TimeElapsedColumn(), TextColumn("ETA"),
                      TimeRemainingColumn(), console=err, disable=quiet) as prog:
            task = None

            def on_progress(done, total, record):
                nonlocal task
                if task is None:
                    task = prog.add_task("sweep", total=total, completed=done)
                else:
                    prog.update(task, completed=done)
            outcome = run_sweep(sc, results=results, workers=workers, on_progress=on_progress)
        head, records = read_results(outcome.results)
    except SiloflError as e:
        _fail(e)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted:[/] finished runs are saved; run the same command "
                  "again to resume")
        raise typer.Exit(130)
    console.print(selection_table(head, select_best(head, records)))
    console.print(f"{outcome.executed} runs executed, {outcome.skipped} already recorded "
                  f"({outcome.total} in the grid) in {outcome.seconds:.1f} s. Results: "
                  f"[bold]{escape(str(outcome.results))}[/]")
    console.print(escape(NOT_COUNTED))


# arguments shared by `plot` and `report`
SweepResults = Annotated[Path, typer.Argument(help="results file written by `silofl sweep`")]
ReportDir = Annotated[Optional[Path], typer.Option(
    "--out", help="directory (default: RESULTS-report/)")]
FigureEpsilon = Annotated[Optional[float], typer.Option(
    "--epsilon", help="ε of the λ and over-rounds figures (a swept value; "
    "default: \\[report] epsilon or the middle ε)")]


@app.command()
def plot(results: SweepResults, out: ReportDir = None, epsilon: FigureEpsilon = None):
    """Draw the sweep's figures as PNGs: ε vs test metric, MR-MTL vs λ, and metric over
    rounds (hyperparameters chosen on validation)."""
    from silofl.experiments.figures import make_figures
    from silofl.experiments.sweep import read_results
    try:
        head, records = read_results(results)
        made = make_figures(head, records, _report_dir(results, out), epsilon)
    except SiloflError as e:
        _fail(e)
    for name, path in made.figures.items():
        note = f" ({escape(made.notes[name])})" if name in made.notes else ""
        console.print(f"{name}: {escape(str(path)) if path else 'not drawn'}{note}")


@app.command()
def report(results: SweepResults, out: ReportDir = None, epsilon: FigureEpsilon = None):
    """Write an HTML report (figures, best hyperparameters, ε spent vs target per silo),
    the PNGs and summary.json; print the main table."""
    from silofl.experiments.report import selection_table, write_report
    from silofl.experiments.selection import select_best
    from silofl.experiments.sweep import read_results
    try:
        head, records = read_results(results)
        d = _report_dir(results, out)
        summary = write_report(results, d, epsilon)
    except SiloflError as e:
        _fail(e)
    console.print(selection_table(head, select_best(head, records)))
    if summary["over_target"]:
        err.print(f"[bold red]{len(summary['over_target'])} silo×ε entries spent more than "
                  "their target ε[/] (see the report)")
    console.print(escape(summary["not_counted"]))
    console.print(f"Report: [bold]{escape(str(d / 'report.html'))}[/] (+ PNGs, summary.json)")


def _need_pandemic_extra() -> None:
    try:
        import numba  # noqa: F401
        import sknetwork  # noqa: F401
    except ImportError:
        raise SiloflError("the pandemic pipeline needs the 'pandemic' extra (numba, "
                          "scikit-network); install it with: pip install -e '.[pandemic]'") from None


pandemic_app = typer.Typer(help="Pandemic forecasting (US/UK PETs challenge schema).")
app.add_typer(pandemic_app, name="pandemic")


@pandemic_app.command("synth")
def pandemic_synth(persons: int = typer.Option(10_000, help="number of persons"),
                   regions: int = typer.Option(5, help="number of regions (counties)"),
                   seed: int = typer.Option(0),
                   out: Path = typer.Option(..., "--out", help="output directory"),
                   fmt: str = typer.Option("csv", "--format", help="csv or parquet"),
                   overwrite: bool = typer.Option(False, help="replace a different dataset")):
    """Write a synthetic outbreak in the challenge's seven-file schema (+ target labels)."""
    from silofl.pandemic import synthesize
    try:
        with console.status("generating outbreak…"):
            s = synthesize(out, persons=persons, regions=regions, seed=seed,
                           overwrite=overwrite, format=fmt)
    except SiloflError as e:
        _fail(e)
    st = s.get("stats", {})
    console.print(f"Wrote {persons} persons in {regions} regions to [bold]{out}[/]: "
                  f"{st.get('contacts', '?')} contacts, ever infected "
                  f"{st.get('ever_infected_fraction', float('nan')):.2%}, newly infected in "
                  f"the final week {st.get('final_window_new_infection_fraction', float('nan')):.2%}")


def _pandemic_config(centralized, rounds, epsilon, batch, lam, lr, S, no_privacy, seed):
    from silofl.pandemic.pipeline import PandemicConfig
    return PandemicConfig(federated=not centralized, rounds=rounds, epsilon=epsilon,
                          batch_size=batch, lam=lam, lr=lr, S=S, private=not no_privacy,
                          seed=seed)


@pandemic_app.command("train")
def pandemic_train(data: Path = typer.Option(..., "--data", help="directory of the 7 inputs"),
                   model_dir: Path = typer.Option(Path("pandemic-model"), "--model"),
                   centralized: bool = typer.Option(False, help="one silo instead of regions"),
                   rounds: int = typer.Option(2), epsilon: float = typer.Option(5.0),
                   batch: int = typer.Option(512), lam: float = typer.Option(0.1),
                   lr: float = typer.Option(0.3), S: int = typer.Option(20, "--S"),
                   no_privacy: bool = typer.Option(False, "--no-privacy"),
                   seed: int = typer.Option(0)):
    """Train per-region risk models (MR-MTL, node-level DP) and save them."""
    try:
        _need_pandemic_extra()
        from silofl.pandemic import read_dataset
        from silofl.pandemic.pipeline import train
        cfg = _pandemic_config(centralized, rounds, epsilon, batch, lam, lr, S, no_privacy, seed)
        cfg.validate()
        with console.status("reading data…"):
            ds = read_dataset(data)
        with Progress(TextColumn("training"), BarColumn(), TextColumn("round {task.completed}/"
                      "{task.total}"), TimeElapsedColumn(), console=err) as prog:
            task = prog.add_task("train", total=rounds)
            pm = train(ds, cfg, on_round=lambda t, T: prog.update(task, completed=t))
        pm.save(model_dir)
    except SiloflError as e:
        _fail(e)
    t = Table(title="node-level privacy per region")
    for c in ["region", "persons", "S", "steps", "σ", "ε spent (RDP)", "δ"]:
        t.add_column(c, justify="left" if c == "region" else "right")
    for p in pm.privacy:
        t.add_row(p["region"], str(p["n"]), str(p["S"]), str(p["steps"]),
                  f"{p['noise_multiplier']:.3g}" if p["noise_multiplier"] else "-",
                  f"{p['epsilon_spent']:.3f}" if "epsilon_spent" in p else "non-private",
                  f"{p['delta']:.2g}" if "delta" in p else "-")
    console.print(t)
    console.print(f"Saved model to [bold]{model_dir}[/]")


@pandemic_app.command("predict")
def pandemic_predict(data: Path = typer.Option(..., "--data"),
                     model_dir: Path = typer.Option(Path("pandemic-model"), "--model"),
                     out: Path = typer.Option(Path("predictions.csv"), "--out")):
    """Score every person's risk of infection in the next 7 days; evaluate if labels exist."""
    import pandas as pd
    try:
        _need_pandemic_extra()
        from silofl.pandemic import read_dataset
        from silofl.pandemic.pipeline import PandemicModel, evaluate, predict
        from silofl.pandemic.readers import find_table_file
        from silofl.pandemic.schema import TARGET
        pm = PandemicModel.load(model_dir)
        try:
            find_table_file(data, TARGET)
            has_target = True
        except SiloflError:
            has_target = False
        ds = read_dataset(data, with_target=has_target)
        with console.status("predicting…"):
            scores = predict(ds, pm)
        pd.DataFrame({"pid": ds.pids, "score": scores}).to_csv(out, index=False)
        ev = evaluate(ds, scores) if has_target else None
    except SiloflError as e:
        _fail(e)
    console.print(f"Wrote {len(scores)} risk scores to [bold]{out}[/]")
    if ev:
        t = Table(title="evaluation (challenge score: AUPRC over all persons)")
        t.add_column("metric")
        t.add_column("value", justify="right")
        for k in ["auprc", "auprc_sir_baseline", "positive_rate", "recall_at_num_positives"]:
            t.add_row(k, f"{ev[k]:.4f}")
        for r, v in ev["per_region_auprc"].items():
            t.add_row(f"auprc region {r}", f"{v:.4f}")
        console.print(t)


def main() -> None:
    app()

"""Sweeps and their outputs: sweep, plot, report."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from silofl.cli.common import Quiet, SetItems
from silofl.cli.root import _fail, _show_warning, app, console, err
from silofl.errors import SiloflError

# rich.progress is imported inside the commands that draw a bar: `silofl --help` and
# the other commands do not load it.


def _report_dir(results: Path, out: Path | None) -> Path:
    return out if out is not None else results.with_name(results.stem + "-report")


@app.command()
def sweep(config: Path = typer.Argument(..., help="sweep TOML: run sections + [sweep] grid"),
          results: Path | None = typer.Option(
              None, "--results", help="results file (default: sweep.results, relative to "
              "the config file)"),
          workers: int | None = typer.Option(None, "--workers", "-j",
                                                help="processes; with --engine ray, runs in "
                                                "flight (default: sweep.workers)"),
          engine: str | None = typer.Option(
              None, "--engine", help="where runs execute: local (worker processes here) or "
              "ray (a Ray cluster; results, lock and budget store stay here) (default: "
              "sweep.engine)"),
          address: str | None = typer.Option(
              None, "--address", help="with --engine ray: the cluster's host:port or auto "
              "(default: sweep.address; empty starts a local cluster)"),
          quiet: Quiet = False, set_: SetItems = None):
    """Run (or resume) a privacy-utility sweep: methods × ε × λ × lr × seeds, one JSON line
    per finished run; then print the best settings chosen on validation data."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from silofl.experiments.report import selection_table
    from silofl.experiments.sweep import NOT_COUNTED, run_sweep
    from silofl.experiments.sweep_config import load_sweep_config
    from silofl.experiments.sweep_results import read_results
    from silofl.tuning.selection import select_best
    warnings.showwarning = _show_warning
    try:
        sc = load_sweep_config(config, set_ or ())
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
            outcome = run_sweep(sc, results=results, workers=workers, on_progress=on_progress,
                                engine=engine, address=address)
        head, records = read_results(outcome.results)
    except SiloflError as e:
        _fail(e)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted:[/] finished runs are saved; run the same command "
                  "again to resume")
        raise typer.Exit(130) from None
    console.print(selection_table(head, select_best(head, records)))
    console.print(f"{outcome.executed} runs executed, {outcome.skipped} already recorded "
                  f"({outcome.total} in the grid) in {outcome.seconds:.1f} s. Results: "
                  f"[bold]{escape(str(outcome.results))}[/]")
    # --- private tuning (silofl.tuning): what tuning costs, table + PNG + JSON
    if sc.sweep.tuning == "private":
        from silofl.tuning.report import write_comparison
        table, files = write_comparison(head, records, outcome.results)
        console.print(table)
        console.print(f"tuning comparison: {escape(', '.join(str(f) for f in files))}")
    if sc.sweep.tuning == "proxy":
        tc = sc.base.tuning
        console.print(escape(
            f"{tc.method}_proxy: λ chosen per ε and seed on the proxy "
            f"{tc.proxy_path or tc.proxy_source}, declared public by this config; the choice "
            "read no silo row and cost the silos ε = 0"))
    if sc.sweep.tuning == "none":
        console.print("sweep.tuning = 'none': one setting per method, fixed in advance; each "
                      "run meets its (ε, δ) on its own (runs are not composed with each other)")
    else:
        console.print(escape(NOT_COUNTED))


# arguments shared by `plot` and `report`
SweepResults = Annotated[Path, typer.Argument(help="results file written by `silofl sweep`")]
ReportDir = Annotated[Path | None, typer.Option(
    "--out", help="directory (default: RESULTS-report/)")]
FigureEpsilon = Annotated[float | None, typer.Option(
    "--epsilon", help="ε of the λ and over-rounds figures (a swept value; "
    "default: [report] epsilon or the middle ε)")]


@app.command()
def plot(results: SweepResults, out: ReportDir = None, epsilon: FigureEpsilon = None):
    """Draw the sweep's figures as PNGs: ε vs test metric, MR-MTL vs λ, and metric over
    rounds (hyperparameters chosen on validation)."""
    from silofl.experiments.figures import make_figures
    from silofl.experiments.sweep_results import read_results
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
    from silofl.experiments.sweep_results import read_results
    from silofl.tuning.selection import select_best
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
    if head["config"]["sweep"].get("tuning") == "private":  # silofl.tuning: its cost, shown
        from silofl.tuning.report import write_comparison
        table, files = write_comparison(head, records, d / "report.jsonl")
        console.print(table)
        console.print(f"tuning comparison: {escape(', '.join(str(f) for f in files))}")
    console.print(escape(summary["not_counted"]))

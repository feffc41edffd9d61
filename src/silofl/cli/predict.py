"""`silofl predict`: a silo's saved model applied to new rows (post-processing only)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from silofl.cli.common import _check_out_file
from silofl.cli.root import _fail, app, console, err
from silofl.errors import SiloflError


@app.command()
def predict(run_dir: Path = typer.Option(..., "--run", help="a run directory (runs/<time>)"),
            silo: str = typer.Option(..., "--silo", help="whose personal model to apply"),
            method: str | None = typer.Option(
                None, "--method", help="method label or name (needed when the run has several)"),
            data: Path = typer.Option(..., "--data", help="rows to score (CSV, CSV.gz, Parquet)"),
            out: Path = typer.Option(..., "--out", help="CSV to write: one row per input row"),
            sep: str = typer.Option("", "--sep", help="CSV column separator (default ,)"),
            encoding: str = typer.Option("", "--encoding",
                                         help="CSV text encoding (default utf-8)")):
    """Apply a silo's saved model, with the preprocessing it was trained with, to new rows.
    Post-processing of released models: reads no training data, spends no budget."""
    from silofl.data import read_table
    from silofl.errors import DataError
    from silofl.experiments.artifacts import POST_PROCESSING, load_run
    from silofl.io import write_bytes_atomic
    try:
        from silofl.experiments.integrity import check_out_not_input
        check_out_not_input(out, data, run_dir)
        _check_out_file(out)
        saved = load_run(run_dir)
        pred = saved.predictor(silo, method)
        rows = read_table(data, sep=sep, encoding=encoding,
                          settings=("--sep", "--encoding", "--drop"))
        try:
            frame = pred.predict_frame(rows)
        except DataError as e:  # say which file: the encoder only knows it as 'input'
            raise DataError(f"--data {str(data)!r}: {e}") from None
        write_bytes_atomic(out, frame.to_csv(index=False).encode())
    except SiloflError as e:
        _fail(e)
    console.print(f"Wrote {len(frame)} prediction(s) of silo {escape(silo)!r}'s "
                  f"{escape(pred.method)} model to [bold]{escape(str(out))}[/].")
    console.print(POST_PROCESSING)
    for note in pred.card["privacy"]["notes"]:
        err.print(f"[bold yellow]note:[/] {escape(note)}")

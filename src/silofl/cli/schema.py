"""`silofl schema …`: declared schemas (a draft read from the data, for a person to check)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from silofl.cli.common import _check_out_file, _write_atomic
from silofl.cli.root import _fail, app, console, err
from silofl.errors import SiloflError

schema_app = typer.Typer(help="Declared schemas: the public facts preprocessing may use.")
app.add_typer(schema_app, name="schema")


@schema_app.command("draft")
def schema_draft(data: Path = typer.Argument(..., help="the table (CSV, CSV.gz, Parquet)"),
                 label_column: str = typer.Option(..., "--label-column"),
                 silo_column: str | None = typer.Option(None, "--silo-column"),
                 person_column: str | None = typer.Option(
                     None, "--person-column", help="the column naming each row's person "
                     "(never drafted as a feature)"),
                 out: Path = typer.Option(..., "--out", help="TOML file to write"),
                 sep: str = typer.Option("", "--sep", help="CSV column separator (default ,)"),
                 encoding: str = typer.Option("", "--encoding",
                                              help="CSV text encoding (default utf-8)")):
    """Write a schema *draft* read from the data (feature kinds, observed ranges, levels,
    label classes) for a person to check against public documentation. It is marked
    `drafted = true` and refused until that line is deleted: values read from the data are
    only public once someone has confirmed them from public sources."""
    from silofl.data import read_table
    from silofl.data.schema_draft import draft_schema
    try:
        if out.exists():
            raise SiloflError(f"{str(out)!r} exists; choose another --out (a reviewed "
                              "schema is never overwritten)")
        _check_out_file(out)
        from silofl.data.column_roles import likely_non_features
        frame = read_table(data, sep=sep, encoding=encoding,
                           settings=("--sep", "--encoding", "--drop"))
        text = draft_schema(frame, silo_column, label_column, person_column=person_column)
        left_out = likely_non_features(frame, silo_column, label_column)
        if person_column:
            left_out = {person_column: "the person column: never a feature",
                        **{c: w for c, w in left_out.items() if c != person_column}}
        _write_atomic(out, text)
    except SiloflError as e:
        _fail(e)
    for col, why in left_out.items():
        err.print(f"[bold yellow]note:[/] column {escape(repr(col))} left out of the draft: "
                  f"{escape(why)} (see the end of the file)")
    console.print(f"Wrote a schema draft to [bold]{escape(str(out))}[/]. Check every bound, "
                  "level and class against public documentation (a data dictionary, a "
                  "registry's coding manual), then delete the line `drafted = true` and pass "
                  "it as \\[data] schema.")

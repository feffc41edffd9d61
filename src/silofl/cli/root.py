"""The root of the `silofl` command line: the Typer app, its two consoles, and the one error
and warning printers every command group uses (a command module imports `app` from here and
registers on it). Not named `app.py`: `silofl.cli.app` is the Typer app itself."""

from __future__ import annotations

import warnings

import typer
from rich.console import Console
from rich.markup import escape

# No pretty tracebacks: they print local variables, i.e. every silo's arrays (see `main`).
app = typer.Typer(add_completion=False, no_args_is_help=False, pretty_exceptions_enable=False,
                  help="Private, personalized cross-silo federated learning.")
console = Console()
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        from silofl._version import silofl_version
        console.print(f"silofl {silofl_version()}")
        raise typer.Exit()


@app.callback()
def _app_options(version: bool = typer.Option(False, "--version", callback=_version,
                                              is_eager=True, help="print the version")):
    """Private, personalized cross-silo federated learning."""
    # every command prints warnings as one `warning:` line, never Python's
    # "file.py:330: UserWarning ... <source line>" (predict, schema draft, deploy init …)
    warnings.showwarning = _show_warning


def _fail(e: Exception) -> None:
    # soft_wrap: the terminal wraps the line, so a path is never split by an inserted newline
    # (the message can be copied as it is)
    err.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
    raise typer.Exit(2)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    text = escape(str(message))
    if "budget store" in str(message):  # a new store, or data charged elsewhere: loudly
        err.print(f"[bold yellow]warning: {text}[/]", soft_wrap=True)
    else:  # soft_wrap as in _fail: paths in a warning are never split by a newline
        err.print(f"[yellow]warning:[/] {text}", soft_wrap=True)

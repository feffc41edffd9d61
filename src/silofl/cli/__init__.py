"""The `silofl` command line: one module per command group, parsing and printing only;
every command is a thin layer over the Python API.

`app` is the Typer app (`silofl.cli.root`); importing this package registers every command
on it, in the order `silofl --help` lists them, and `main` is the console entry point."""

from __future__ import annotations

import time
from pathlib import Path

from rich.markup import escape

from silofl.cli.help import escape_help
from silofl.cli.root import app, err

# Each module registers its commands on `app` when imported: this order is the order of
# `silofl --help` (commands first, then groups), so the import sorter must leave it alone.
# isort: off
from silofl.cli import jobs, audit, account, sweeps, schema, predict  # noqa: F401, E402
from silofl.cli import persons, stats, budget, pandemic, theory, deploy  # noqa: F401, E402
# isort: on

escape_help(app)  # "[budget] store" in a help text prints literally

__all__ = ["app", "crash_frames", "main", "write_crash_log"]


def main() -> None:
    """Entry point. An unexpected error (a bug, or input our checks missed) must not print
    private data: its message may quote record values and a traceback's local variables
    hold whole datasets, so the terminal gets the exception's type only, and a log file
    gets the traceback's frames (file, line, function, source line) without any message
    or variable."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        raise SystemExit(130) from None
    except Exception as e:  # noqa: BLE001 — the last line of defence
        path = write_crash_log(e)
        where = f"; frames (no data values) in {path}" if path else ""
        err.print(f"[bold red]error:[/] unexpected {type(e).__name__} inside silofl (a bug, "
                  f"or an input our checks missed). Its message is not shown because it "
                  f"may quote private records{escape(where)}. Please report it.")
        raise SystemExit(1) from None


def crash_frames(e: BaseException) -> str:
    """The traceback of `e` (and its causes) as frames only: no messages, no locals."""
    import traceback
    lines, seen = [], set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        lines.append(f"{type(cur).__module__}.{type(cur).__qualname__} (message withheld)")
        for fr in traceback.extract_tb(cur.__traceback__):
            lines.append(f"  {fr.filename}:{fr.lineno} in {fr.name}: {(fr.line or '').strip()}")
        cur = cur.__cause__ or cur.__context__
    return "\n".join(lines) + "\n"


def write_crash_log(e: BaseException) -> Path | None:
    """Write `crash_frames(e)` to $SILOFL_LOG_DIR (default ~/.cache/silofl), mode 0600."""
    import os
    try:
        d = Path(os.environ.get("SILOFL_LOG_DIR") or Path.home() / ".cache" / "silofl")
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(crash_frames(e))
        return path
    except OSError:
        return None

"""Helpers shared by several command groups: a job's config with its CLI overrides and its
output paths checked, and a file named by --out."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from silofl.errors import SiloflError

# Options several commands share (one declaration, one help text).
Scratch = Annotated[bool, typer.Option("--scratch", help=(
    "charge an in-memory scratch budget: an experiment, not a release"))]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")]
RunsOut = Annotated[Path | None, typer.Option("--out", help="directory for run folders")]
JobStore = Annotated[Path | None, typer.Option("--store", help="lifetime budget store")]
SetItems = Annotated[list[str] | None, typer.Option("--set", help=(
    "override a config key SECTION.KEY=VALUE (TOML value), e.g. training.rounds=5 or "
    "audit.runs=50 (repeat; the keys of the config file, silofl.config)"))]


def _job_config(config: Path | None, store: Path | None, scratch: bool,
                out: Path | None, *, no_privacy: bool = False,
                overrides: tuple[str, ...] | list[str] = ()):
    """The config of a job command (run, rank, erosion) with its CLI overrides, its output
    paths checked before anything is reserved or written."""
    from silofl.config import load_config
    cfg = load_config(config, overrides)
    if no_privacy:
        cfg.privacy.enabled = False
    if store is not None:
        cfg.budget.store = str(store)
    if scratch:
        cfg.budget.scratch = True
    _check_run_paths(cfg, out)
    return cfg


def _check_run_paths(cfg, out: Path | None) -> None:
    """Refuse output paths that cannot work before anything is reserved or written."""
    from silofl.experiments.figures import check_out_dir
    if out is not None:
        check_out_dir(out, "--out")
    elif cfg.output.dir:
        check_out_dir(Path(cfg.output.dir), "[output] dir")
    if cfg.budget.store and not cfg.budget.scratch and Path(cfg.budget.store).is_dir():
        raise SiloflError(f"budget store {cfg.budget.store!r} is a directory; name a file "
                          "(e.g. budget.sqlite) with --store or [budget] store")
    if cfg.budget.store and not cfg.budget.scratch:
        from silofl.config.input import check_writable_file
        check_writable_file(cfg.budget.store, "budget store (--store or [budget] store)")
    if not cfg.budget.store:
        from silofl.privacy.store_paths import check_deployment
        check_deployment(cfg.budget.deployment)


def _check_out_file(out: Path) -> None:
    """--out names a file to write: its folder must exist (nothing is created for it)."""
    from silofl.config.input import check_writable_file
    check_writable_file(out, "--out")
    if not out.parent.is_dir():
        raise SiloflError(f"the folder of --out does not exist: {str(out.parent)!r}; "
                          "create it first or choose another path")


def _write_atomic(path: Path, text: str) -> None:
    from silofl.io import write_text_atomic  # here: silofl.io loads numpy; --help must not
    write_text_atomic(path, text)

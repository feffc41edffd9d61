"""`silofl stats`: per silo and pooled private statistics of declared columns, charged to
every silo's lifetime budget store before any row is read (`silofl.experiments.stats`)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from silofl.cli.common import JobStore, Scratch, SetItems, _job_config
from silofl.cli.root import _fail, app, console
from silofl.errors import SiloflError


@app.command()
def stats(config: Path = typer.Option(..., "--config", "-c", help="TOML config of the job"),
          columns: str | None = typer.Option(None, "--columns", help=(
              "comma-separated schema columns (default: every numeric or binary column "
              "with declared bounds)")),
          epsilon: float | None = typer.Option(None, "--epsilon", help=(
              "each silo's ε for this release (default: 0.1 × the silo's [privacy] ε), at "
              "the silo's δ")),
          bins: int = typer.Option(20, "--bins", help="histogram bins per column"),
          store: JobStore = None, scratch: Scratch = False,
          as_json: bool = typer.Option(False, "--json", help="print JSON"),
          set_: SetItems = None):
    """A first look at the silos' data: per silo and pooled private counts, means,
    standard deviations, histograms and quantiles of declared columns. One Gaussian
    release per silo, charged to its lifetime budget store before any row is read; pooled
    figures are post-processing of the silos' releases (no extra charge). Silo sizes are
    public."""
    from silofl.experiments.stats import federated_stats
    try:
        cfg = _job_config(config, store, scratch, None, overrides=set_ or ())
        wanted = None if columns is None else [c.strip() for c in columns.split(",")
                                               if c.strip()]
        if wanted is not None and not wanted:
            raise SiloflError("--columns is empty; name schema columns, e.g. --columns age,sbp")
        rep = federated_stats(cfg, wanted, epsilon, bins)
    except SiloflError as e:
        _fail(e)
    if as_json:
        from silofl.io import dumps_strict, json_safe
        typer.echo(dumps_strict(json_safe(rep.to_dict())))
        return
    _print(rep)


def _print(rep) -> None:
    from rich.table import Table
    t = Table(title=f"private statistics ({escape(rep.unit)} level, noisy)")
    for c in ["silo", "column", "n (public)", "count", "mean", "std", "q25 / q50 / q75",
              "ε charged", "noise std"]:
        t.add_column(c, justify="left" if c in ("silo", "column") else "right")
    groups = [*rep.silos.items(), ("pooled", rep.pooled)]
    for name, g in groups:
        eps = (f"{g['epsilon']:.3g}" if name != "pooled"
               else "0 (post-proc.)")
        for col, v in g["columns"].items():
            qv = " / ".join(f"{x:.3g}" for x in v["quantiles"].values())
            t.add_row(escape(name), escape(col), str(g["n"]), f"{v['count']:.1f}",
                      f"{v['mean']:.3g}", f"{v['std']:.3g}", qv, eps, f"{g['noise_std']:.3g}")
    console.print(t)
    deltas = sorted({g["delta"] for g in rep.silos.values()})
    console.print(f"ε charged to each silo at δ = {', '.join(f'{d:g}' for d in deltas)}; "
                  "n (public): the silo's rows (persons at the person level).")
    console.print(f"Charged once per silo to {escape(rep.store or 'a scratch store (memory)')}, "
                  f"run {rep.run_id}. Noise std is per released coordinate (σ·Δ, Δ = "
                  f"{rep.plan.sensitivity:.3g}); quantiles: noisy histogram "
                  f"({rep.plan.bins} bins of the declared bounds) + linear interpolation.")

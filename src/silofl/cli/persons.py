"""`silofl persons`: what a person seen by m silos would be guaranteed under a job's plans,
and (with a linkage key) the privately released overlap of persons across silos."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from silofl.cli.common import JobStore, Scratch, SetItems, _job_config
from silofl.cli.root import _fail, app, console
from silofl.errors import SiloflError


@app.command()
def persons(config: Path = typer.Option(..., "--config", "-c",
                                        help="TOML config of a person-level job"),
            store: JobStore = None,
            scratch: Scratch = False,
            as_json: bool = typer.Option(False, "--json", help="print JSON"),
            set_: SetItems = None):
    """Before training: the table "a person seen by m hospitals" under the job's plans
    (declared M marked). With a linkage key ([privacy] linkage_key_file or
    SILOFL_LINKAGE_KEY) the noisy overlap histogram (persons in exactly m silos) is
    released once and charged to every silo's lifetime budget store; without one nothing
    is released and nothing is charged."""
    from silofl.experiments.person_look import first_look
    from silofl.experiments.person_report import person_table
    try:
        cfg = _job_config(config, store, scratch, None, overrides=set_ or ())
        look = first_look(cfg)
    except SiloflError as e:
        _fail(e)
    if as_json:
        from silofl.io import dumps_strict, json_safe
        console.print_json(dumps_strict(json_safe(look.to_dict())))
        return
    console.print(person_table(look.report))
    info = look.linkage or {}
    ov = info.get("overlap")
    if look.charged and ov:
        console.print(
            f"Charged: the overlap histogram, ε = {ov['epsilon']:.3g} at δ = {ov['delta']:g} "
            f"(Gaussian, noise std {ov['noise_std_persons']:.3g} persons per bin), to every "
            f"silo's lifetime budget store {escape(look.store or 'scratch (in memory)')}, "
            f"run {look.run_id}. A later `silofl run` with the key releases it again unless "
            "\\[privacy] overlap_epsilon = 0 (a uldp job releases none).")
    else:
        console.print("Nothing released, nothing charged: the table composes each silo's "
                      "planned events for the declared M (planning read only the silos' "
                      "numbers of persons). Set \\[privacy] linkage_key_file (or "
                      "SILOFL_LINKAGE_KEY) to release the actual overlap privately.")
    for note in info.get("notes", []):
        console.print(f"[bold yellow]note:[/] {escape(note)}")

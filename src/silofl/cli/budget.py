"""`silofl budget …`: the lifetime budget store (show, export, reset, set-target)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from silofl.cli.common import _write_atomic
from silofl.cli.root import _fail, app, console
from silofl.errors import SiloflError

budget_app = typer.Typer(help="Lifetime privacy budgets per silo (the budget store).")
app.add_typer(budget_app, name="budget")
StorePath = Annotated[Path | None, typer.Option("--store", help=(
    "the budget store (SQLite file; default: the deployment's store, "
    "<silofl home>/stores/<deployment>.sqlite)"))]
Deployment = Annotated[str, typer.Option("--deployment", help=(
    "the deployment whose default store to use ([budget] deployment)"))]


def _open_store(path: Path | None, deployment: str = "default"):
    from silofl.privacy import store_paths
    from silofl.privacy.budget import BudgetStore
    path = path if path is not None else store_paths.default_store_path(deployment)
    if not path.is_file():
        raise SiloflError(f"budget store {str(path)!r} does not exist; a private run creates "
                          f"it (default: <silofl home>/stores/<deployment>.sqlite, here "
                          f"{store_paths.default_store_path(deployment)}; the built-in heart "
                          f"data's demo store is {store_paths.demo_store_path()})")
    return BudgetStore(path, demo=store_paths.is_demo_store(path))


@budget_app.command("show")
def budget_show(store: StorePath = None, deployment: Deployment = "default",
                silo: str | None = typer.Option(None, help="one silo, with its charges"),
                as_json: bool = typer.Option(False, "--json", help="print JSON")):
    """Per silo: lifetime target, ε spent (composed, under the guarantee accountant and
    under RDP and PLD), what remains, and the charges by run."""
    from silofl.privacy.budget import BudgetStoreError
    try:
        with _open_store(store, deployment) as st:
            shown = st.describe()
            names = [silo] if silo else st.silos()
            rows = [st.spent(n) for n in names]
            charges = {n: st.charges(n) for n in names}
            log = st.log(silo)
    except (SiloflError, BudgetStoreError) as e:
        _fail(e)
    if as_json:
        from silofl.io import dumps_strict
        console.print_json(dumps_strict({"store": shown, "silos": rows, "charges": charges,
                                         "log": log}))
        return
    from silofl.privacy.units import SHORT as UNIT_SHORT  # keeps `silofl --help` cheap
    t = Table(title=f"lifetime budgets in {escape(shown)}")
    for c in ["silo", "unit", "target ε, δ", "spent ε", "RDP / PLD", "remaining", "runs",
              "unfinished"]:
        t.add_column(c, justify="left" if c == "silo" else "right")
    for r in rows:
        runs = len({c["run"] for c in charges[r["silo"]]})
        pld = "n/a" if r["epsilon_pld"] is None else f"{r['epsilon_pld']:.3f}"
        t.add_row(escape(r["silo"]), UNIT_SHORT.get(r.get("unit") or "", "-"),
                  f"{r['target_epsilon']:g}, {r['delta']:g}",
                  f"{r['epsilon']:.3f} ({r['accountant']})", f"{r['epsilon_rdp']:.3f} / {pld}",
                  f"{r['remaining']:.3f}", str(runs), str(r["unfinished_runs"]))
    console.print(t)
    if silo:
        ct = Table(title=f"charges of {escape(silo)} (current epoch)")
        for c in ["run", "command", "method", "label", "count", "status", "noise", "unit"]:
            ct.add_column(c)
        for c in charges[silo]:
            ct.add_row(c["run"], c["command"], c["method"], c["label"], str(c["count"]),
                       c["status"], c["noise"], UNIT_SHORT.get(c["unit"], c["unit"]))
        console.print(ct)
    for entry in log:
        console.print(f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(entry['time']))} "
                      f"{escape(str(entry['silo'] or '(whole store)'))}: {entry['action']} — "
                      f"{escape(entry['reason'])} ({escape(entry['detail'])})")
    console.print("'remaining' is target − spent; privacy costs compose, they do not add up, "
                  "so a new run may fit more or less than that. 'unit': what a silo's ε "
                  "protects -- per row (add/remove one record) or per person (add/remove "
                  "all rows of one person in the silo); a store composes one unit per silo.")


@budget_app.command("export")
def budget_export(store: StorePath = None, deployment: Deployment = "default",
                  out: Path | None = typer.Option(None, "--out", help="JSON file "
                                                     "(default: print)")):
    """Everything in the store (silos, every charge, runs, log) as JSON."""
    try:
        with _open_store(store, deployment) as st:
            data = st.export()
    except SiloflError as e:
        _fail(e)
    text = json.dumps(data, indent=1)
    if out is None:
        console.print_json(text)
    else:
        _write_atomic(out, text)
        console.print(f"Wrote {escape(str(out))}")


@budget_app.command("reset")
def budget_reset(silo: str = typer.Option(..., help="the silo whose budget restarts"),
                 reason: str = typer.Option(..., help="why (logged in the store)"),
                 store: StorePath = None, deployment: Deployment = "default",
                 new_cohort: bool = typer.Option(False, "--new-cohort", help=(
                     "the silo's data is a genuinely new cohort of people")),
                 yes: bool = typer.Option(False, "--yes", help="confirm")):
    """Start a fresh lifetime budget for one silo. Only honest for a genuinely new cohort
    of people (--new-cohort) or a store that never guarded a release: the old charges stay
    in the store for audit, and the reset is logged with its reason."""
    try:
        if not yes:
            raise SiloflError("a budget reset forgets what the silo has spent; repeat with "
                              "--yes to confirm (it is logged with your --reason)")
        with _open_store(store, deployment) as st:
            epoch = st.reset(silo, reason, new_cohort=new_cohort)
    except SiloflError as e:
        _fail(e)
    console.print(f"Silo {escape(silo)}: fresh budget (epoch {epoch}); logged: "
                  f"{escape(reason)}")


@budget_app.command("set-target")
def budget_set_target(silo: str = typer.Option(...), epsilon: float = typer.Option(...),
                      delta: float = typer.Option(...),
                      reason: str = typer.Option(..., help="why (logged in the store)"),
                      store: StorePath = None, deployment: Deployment = "default",
                      yes: bool = typer.Option(False, "--yes", help="confirm")):
    """Change a silo's lifetime target (logged with its reason)."""
    from silofl.privacy.targets import PrivacyTarget
    try:
        if not yes:
            raise SiloflError("changing a lifetime target changes the guarantee every person "
                              "in the silo gets; repeat with --yes to confirm (logged)")
        with _open_store(store, deployment) as st:
            st.set_target(silo, PrivacyTarget(epsilon, delta), reason)
    except SiloflError as e:
        _fail(e)
    console.print(f"Silo {escape(silo)}: lifetime target ε = {epsilon:g}, δ = {delta:g}")

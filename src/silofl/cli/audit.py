"""`silofl audit`: the empirical privacy audit of a job, and the audit table every audit
command prints."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import typer
from rich.markup import escape

from silofl.cli.common import JobStore, Quiet, Scratch, SetItems, _job_config
from silofl.cli.root import _fail, _show_warning, app, console, err
from silofl.errors import SiloflError

# rich.progress is imported inside the commands that draw a bar: `silofl --help` and
# the other commands do not load it.


@app.command()
def audit(config: Path | None = typer.Option(None, "--config", "-c",
                                                help=("TOML config of the job to audit "
                                                      "(default: the built-in heart job)")),
          silo: str | None = typer.Option(None, "--silo", help="audit one silo (default: all)"),
          view: str | None = typer.Option(None, "--view", help=(
              "server (white box: every round's update, gradient canaries) | model (black "
              "box: the released models, canary records) | release (the private "
              "preprocessing statistics; needs --scratch and [data] standardize or impute "
              "= \"private\") (default: [audit] view, server)")),
          kind: str | None = typer.Option(None, "--kind", help=(
              "one-run | multi-run (default: [audit] kind, one-run)")),
          canaries: int | None = typer.Option(None, "--canaries", help=(
              "per silo (default: server 50000, fewer for many silos or rounds; model "
              "one-run min(1000, the silo's training records))")),
          runs: int | None = typer.Option(None, "--runs", help=(
              "multi-run jobs, scratch store only (default: server 4 pooled; model 200 "
              "on each of D and D′; release 500 releases on each)")),
          init: str | None = typer.Option(None, "--init", help=(
              "model view of a torch model (multi-run): the start of every audited job, "
              "worst-case (pretrained on public digits so the canary stands out) | default "
              "(default: [audit] init, worst-case)")),
          self_test: bool = typer.Option(False, "--self-test", help=(
              "does the audit have teeth? Run the one-run server-view audit against the "
              "job's mechanism and deliberately weakened copies (noise ×½, ×¼, clipping "
              "off, replayed noise) and the release audit against the preprocessing "
              "release without noise (an uncharged standardization); a dp_gbdt job: the "
              "trees' audit against its noise off; show which it flags "
              "(exit 3 if it misses one it must flag). Needs --scratch; ignores --view, "
              "--kind and --runs; writes selftest.json and selftest.html")),
          confidence: float | None = typer.Option(None, "--confidence", help=(
              "family-wise, over the audited silos, of the rigorous bounds and the "
              "estimate's lower end (default: [audit] confidence, 0.95)")),
          out: Path | None = typer.Option(None, "--out", help=(
              "directory for audit.json and audit.html (default: [output] dir, else runs/, "
              "plus audit-<time>)")),
          store: JobStore = None,
          scratch: Scratch = False,
          quiet: Quiet = False, set_: SetItems = None):
    """Attack the job to test each silo's claimed ε: by default as the federated server
    (every round's update, gradient canaries; a dp_gbdt job: every noisy histogram, tree
    canaries, scratch store), printing a rigorous lower bound, an estimate and the
    smallest true ε the audit detects; exit 3 on a violation. The audit job uses
    the silos' data: it is charged to their budgets (or a scratch store, marked so)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from silofl.audit import audit as run_audit
    from silofl.audit import write_audit
    warnings.showwarning = _show_warning
    try:
        cfg = _job_config(config, store, scratch, out, overrides=set_ or ())
        dest = out if out is not None else Path(cfg.output.dir or "runs") / \
            time.strftime("audit-%Y%m%d-%H%M%S")
        _check_options(cfg, self_test, view, kind, runs, canaries)
        if self_test:
            return _self_test(cfg, dest, silo, canaries, confidence, quiet)
        with Progress(TextColumn("audit"), BarColumn(), MofNCompleteColumn(),  # "0/?" until known
                      TextColumn("jobs"), TimeElapsedColumn(), console=err,
                      disable=quiet, transient=False) as prog:
            task = prog.add_task("audit", total=None)

            def on_progress(done, total):
                prog.update(task, completed=done, total=total)
            given = {"view": view, "kind": kind, "silo": silo, "canaries": canaries,
                     "runs": runs, "confidence": confidence,
                     "init": init}  # the command line over [audit]
            a = cfg.audit.model_copy(update={k: v for k, v in given.items() if v is not None})
            rep = run_audit(cfg, view=a.view, kind=a.kind, silo=a.silo, canaries=a.canaries,
                            runs=a.runs, confidence=a.confidence, init=a.init,
                            on_progress=on_progress)
        files = write_audit(rep, dest)
    except SiloflError as e:
        _fail(e)
    _audit_footer(rep, files, f"Methods audited together: {', '.join(rep.methods)}. Noise: "
                              f"{rep.noise}. Neighbouring datasets: "
                              f"{rep.neighbouring or 'as the accountant states'}.")


def _check_options(cfg, self_test: bool, view, kind, runs, canaries) -> None:
    """ConfigError for an option the chosen mode would silently ignore (the command line
    only: [audit] keeps settings for other modes)."""
    from silofl.errors import ConfigError
    if self_test:
        if view not in (None, "server") or kind not in (None, "one-run") or runs is not None:
            raise ConfigError("--self-test runs the one-run server-view audit (and the "
                              "release audit) against weakened copies: leave out --view, "
                              "--kind and --runs")
        return
    v, k = view or cfg.audit.view, kind or cfg.audit.kind
    if v == "release" and k == "multi-run" and canaries is not None:
        raise ConfigError("--view release --kind multi-run audits `--runs` releases on each "
                          "of D and D′ with one canary record: leave out --canaries (or use "
                          "the one-run white-box release audit, --kind one-run)")
    if runs is not None and k == "one-run":
        raise ConfigError(f"--runs {runs} applies to --kind multi-run; a one-run audit "
                          "runs one job (or one release): leave --runs out or add --kind "
                          "multi-run")


def _self_test(cfg, dest: Path, silo, canaries, confidence, quiet: bool) -> None:
    """`--self-test`: the table of weakened copies; exit 3 when the audit missed a copy it
    must flag or flagged the mechanism as run."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from silofl.audit.report import selftest_table, write_selftest
    from silofl.audit.selftest import MUST_FLAG, self_test
    from silofl.audit.tabular import _require_scratch
    _require_scratch(cfg, None, "the self-test trains one job per weakened copy of the "
                     "mechanism (with deliberately broken privacy)")
    conf = confidence if confidence is not None else cfg.audit.confidence
    with Progress(TextColumn("self-test"), BarColumn(), TextColumn("{task.completed}/"
                  "{task.total} mechanisms"), TimeElapsedColumn(), console=err,
                  disable=quiet, transient=False) as prog:
        task = prog.add_task("self-test", total=None)
        m = canaries if canaries is not None else cfg.audit.canaries  # 0 is refused
        rep = self_test(cfg, silo=silo or cfg.audit.silo, canaries=m, confidence=conf,
                        on_progress=lambda d, t: prog.update(task, completed=d, total=t))
    files = write_selftest(rep, dest)
    console.print(selftest_table(rep))
    for note in rep.notes:
        err.print(f"[bold yellow]note:[/] {escape(note)}")
    console.print(f"{rep.seconds:.1f} s. Self-test: [bold]{escape(str(files[0]))}[/], "
                  f"{escape(str(files[1]))}")
    if not rep.passed:
        err.print("[bold red]SELF-TEST FAILED[/]: the audit missed a weakened copy it must "
                  "flag, or flagged the mechanism as run")
        raise typer.Exit(3)
    console.print("Self-test passed: the audit flagged every weakened copy it must flag "
                  f"(true ε ≥ {MUST_FLAG:g} × the claim) and not the mechanism as run.")


def _audit_footer(rep, files, what: str) -> None:
    """The audit table, what was audited, notes, files; exit 3 on a violation (2 is bad
    input)."""
    from silofl.audit.engine import LOWER_BOUND_NOTE
    from silofl.audit.report import audit_table
    console.print(audit_table(rep))
    console.print(f"{escape(what)} Budget store: {escape(rep.store or 'scratch (in memory)')}. "
                  f"{rep.seconds:.1f} s. Note: {escape(LOWER_BOUND_NOTE)}.")
    for note in rep.notes:
        err.print(f"[bold yellow]note:[/] {escape(note)}")
    if not rep.violations:
        console.print(_verdict_line(rep))
    console.print(f"Audit: [bold]{escape(str(files[0]))}[/], {escape(str(files[1]))}")
    if rep.violations:  # the audit ran and refuted a claim
        for r in (r for r in rep.rows if r.violation):
            how = ("proved: the rigorous lower bound" if r.lower_bound > r.claimed_epsilon
                   else "estimated (not proof): the estimate's lower end")
            err.print(f"[bold red]VIOLATION[/] {escape(r.silo)}: {how} exceeds the claimed "
                      f"ε = {r.claimed_epsilon:.3f}")
        raise typer.Exit(3)


def _verdict_line(rep) -> str:
    """The audit's verdict in one sentence, with the size of break it could have seen."""
    n = len(rep.rows)
    line = (f"Verdict: no violation found for {n} silo{'s' if n != 1 else ''} at "
            f"{rep.confidence:.0%} confidence: this attack did not refute any claim")
    from silofl.audit.report import detectable_epsilon
    det = [d for d in map(detectable_epsilon, rep.rows) if d is not None]
    if det:
        lo, hi = min(det), max(det)
        span = f"{lo:.2f}" if hi - lo < 0.005 else f"{lo:.2f}–{hi:.2f}"
        line += (f"; at these settings it flags, with {rep.confidence:.0%} confidence, a "
                 f"mechanism whose true ε is {span} or more")
    return line + "."

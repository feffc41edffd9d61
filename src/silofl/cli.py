"""The `silofl` command line. Every command is a thin layer over the Python API."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from silofl.errors import SiloflError

# No pretty tracebacks: they print local variables, i.e. every silo's arrays (see `main`).
app = typer.Typer(add_completion=False, no_args_is_help=False, pretty_exceptions_enable=False,
                  help="Private, personalized cross-silo federated learning.")
console = Console()
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        from silofl.experiments.artifacts import silofl_version
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


@app.command()
def run(config: Optional[Path] = typer.Option(None, "--config", "-c",
                                              help="TOML config (default: built-in heart data)"),
        out: Optional[Path] = typer.Option(None, "--out", help="directory for run folders"),
        no_privacy: bool = typer.Option(False, "--no-privacy",
                                        help="train without DP (comparison only)"),
        store: Optional[Path] = typer.Option(
            None, "--store", help="lifetime budget store (default: [budget] store, else "
            "the deployment's store <silofl home>/stores/<deployment>.sqlite)"),
        scratch: bool = typer.Option(False, "--scratch", help=(
            "charge an in-memory scratch budget: an experiment, not a release")),
        resume: Optional[Path] = typer.Option(None, "--resume", help=(
            "continue a killed run from its last checkpoint (its run directory; the config "
            "it started with is used)")),
        force_resume: bool = typer.Option(False, "--force-resume", help=(
            "resume although the run's owner is on another host (only when you know it is "
            "dead)")),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
        set_: Optional[list[str]] = typer.Option(
            None, "--set", help="override a config key SECTION.KEY=VALUE (TOML value), e.g. "
            "training.rounds=5 or privacy.epsilon=0.5 (repeat; paths relative to the "
            "working directory; paths in the config file are relative to that file)")):
    """Train Local, FedAvg and MR-MTL (or the configured methods) at each silo's own
    privacy target and print a comparison table; writes a run directory."""
    from silofl.experiments.report import (flamby_comparison, privacy_table, quality_lines,
                                           results_table)
    from silofl.experiments.run import ADJACENCY
    from silofl.experiments.run import resume_run
    from silofl.experiments.run import run as run_experiment
    from silofl.experiments.signals import describe, exit_code, terminate_as_interrupt
    warnings.showwarning = _show_warning
    # a new store / data charged elsewhere is said every time, even twice in one process
    warnings.filterwarnings("always", message=r".*budget store")
    try:
        if resume is not None and (config or out or no_privacy or scratch or set_):
            raise SiloflError("--resume continues a run with the config it started with; "
                              "give only --resume DIR (and optionally --store, -q)")
        if force_resume and resume is None:
            raise SiloflError("--force-resume only applies with --resume DIR")
        cfg = _job_config(config, store, scratch, out, no_privacy=no_privacy,
                          overrides=set_ or ())
        with Progress(TextColumn("{task.description:<10}"), BarColumn(), TextColumn(
                "{task.completed}/{task.total} rounds  {task.fields[metric]}"),
                TimeElapsedColumn(), console=err, disable=quiet, transient=False) as prog:
            tasks = {}

            def on_progress(label, t, total, pooled):
                if label not in tasks:
                    tasks[label] = prog.add_task(label, total=total, metric="")
                prog.update(tasks[label], completed=t, metric=f"{pooled:.4f}")
            with terminate_as_interrupt():
                if resume is not None:
                    from silofl.privacy.budget import BudgetStore
                    if store is not None and not Path(store).is_file():
                        raise SiloflError(f"--store {str(store)!r} does not exist; a resume "
                                          "continues a run in the store it was charged to")
                    rep = resume_run(resume, on_progress, force=force_resume,
                                     store=BudgetStore(store) if store is not None else None)
                else:
                    rep = run_experiment(cfg, out, on_progress)
    except SiloflError as e:
        _fail(e)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: settled; say what and how to go on
        for line in describe(e):
            err.print(f"[bold yellow]{escape(line)}[/]")
        raise typer.Exit(exit_code(e)) from None
    console.print(results_table(rep))
    for line in quality_lines(rep):  # a useless model never looks fine
        console.print(f"[bold yellow]warning:[/] {escape(line)}")
    if (fl := flamby_comparison(rep)) is not None:  # built-in heart data only
        console.print(escape(fl))
    if (pt := privacy_table(rep)) is not None:
        console.print(pt)
        console.print(f"Adjacency: {escape(ADJACENCY)}. Noise: {rep.noise}. Budget store: "
                      f"{escape(rep.store_text() or '')}, run {rep.run_id}. "
                      "Assumed: silo sizes are public; per-round test metrics are not "
                      "privatized (privacy_report.json states every assumption).")
    else:
        console.print("No differential privacy: this run is for comparison only.")
    _job_footer(rep, "config.toml, history.json, ledgers/, models/ with a model card per silo, "
                "privacy_report.json, summary.json, metric_over_rounds.png" + (
                    ", alpha_over_rounds.png (Weight Erosion's α)" if any(
                        "alpha" in r.history.extra for r in rep.results) else ""))


def _job_config(config: Optional[Path], store: Optional[Path], scratch: bool,
                out: Optional[Path], *, no_privacy: bool = False,
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


def _job_footer(rep, files: str) -> None:
    """What every job command prints last: its notes (stderr) and its run directory."""
    for note in rep.notes():
        err.print(f"[bold yellow]note:[/] {escape(note)}")
    if rep.run_dir:
        console.print(f"Run directory: [bold]{escape(str(rep.run_dir))}[/] ({files})")


def _check_run_paths(cfg, out: Optional[Path]) -> None:
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


@app.command()
def rank(config: Optional[Path] = typer.Option(None, "--config", "-c",
                                               help="TOML config: data, model, privacy"),
         user: str = typer.Option(..., "--user", help="the user silo u_0 (its name)"),
         top: Optional[int] = typer.Option(None, "--top", help="select the K best silos"),
         threshold: Optional[float] = typer.Option(
             None, "--threshold", help="select silos with transfer loss ≤ T"),
         out: Optional[Path] = typer.Option(None, "--out", help="directory for run folders"),
         store: Optional[Path] = typer.Option(None, "--store", help="lifetime budget store"),
         scratch: bool = typer.Option(False, "--scratch", help=(
             "charge an in-memory scratch budget: an experiment, not a release")),
         bound: float = typer.Option(1.0, "--bound", help="per-example loss bound B"),
         cv_share: float = typer.Option(0.1, "--cv-share", help=(
             "share of each silo's ε spent on its private CV loss"))):
    """Rank the other silos for USER by transfer loss (adapted Ndoye factor): each silo
    trains a local DP model and releases a private CV loss; the job is charged like any."""
    from silofl.experiments.ndoye import rank_silos
    warnings.showwarning = _show_warning
    try:
        cfg = _job_config(config, store, scratch, out)
        rep = rank_silos(cfg, user, top=top, threshold=threshold, out_dir=out,
                         bound=bound, cv_share=cv_share)
    except SiloflError as e:
        _fail(e)
    t = Table(title=f"silos ranked for user {escape(user)} (transfer loss = user loss − "
                    "private CV loss; smaller = more similar)")
    for c in ("rank", "silo", "user loss", "private CV loss", "transfer loss", "selected"):
        t.add_column(c, justify="left" if c == "silo" else "right")
    for r in rep.rows():
        t.add_row(str(r["rank"]), escape(r["silo"]), f"{r['user_loss']:.4f}",
                  f"{r['private_cv_loss']:.4f}", f"{r['transfer_loss']:.4f}",
                  "yes" if r["selected"] else "")
    console.print(t)
    if rep.private:
        console.print(f"Charged: every silo's local DP-SGD model and its CV-loss release "
                      f"(Gaussian, sensitivity B/n_cv, B = {rep.bound:g}). Adjacency: add/"
                      f"remove one record. Noise: {rep.noise}. Budget store: "
                      f"{escape(rep.store or 'scratch (in memory)')}, run {rep.run_id}.")
    _job_footer(rep, "ranking.json, transfer_heatmap.png, ledgers/, config.toml")


@app.command()
def erosion(config: Optional[Path] = typer.Option(None, "--config", "-c",
                                                  help="TOML config: data, model, privacy"),
            users: Optional[str] = typer.Option(None, "--users",
                                                help="'all': every silo as the user (default)"),
            user: Optional[list[str]] = typer.Option(None, "--user", help=(
                "a user silo (its name); repeat for several")),
            out: Optional[Path] = typer.Option(None, "--out", help="directory for run folders"),
            store: Optional[Path] = typer.Option(None, "--store", help="lifetime budget store"),
            scratch: bool = typer.Option(False, "--scratch", help=(
                "charge an in-memory scratch budget: an experiment, not a release")),
            contributions: Optional[bool] = typer.Option(
                None, "--contributions/--no-contributions", help=(
                    "make each user's contribution report now (else later: silofl contrib; "
                    "default: [erosion] contributions, true)")),
            set_: Optional[list[str]] = typer.Option(
                None, "--set", help="override a config key SECTION.KEY=VALUE (TOML value), e.g. "
                "erosion.users=['Hungary'] (repeat)")):
    """Weight Erosion with each user silo in turn, against Global (FedAvg), Local and the
    majority class on the user's test rows (seed Figure 1): one job, σ calibrated for all
    users' runs composed, charged like any job."""
    from silofl.experiments.erosion import erosion_for_users
    warnings.showwarning = _show_warning
    try:
        if users is not None and user:
            raise SiloflError("give either --users all or --user SILO (repeatable), not both")
        if users is not None and users != "all":
            raise SiloflError(f"--users takes 'all', got {users!r}; name single users with "
                              "--user SILO")
        cfg = _job_config(config, store, scratch, out, overrides=set_ or ())
        users_ = list(user) if user else None if users else cfg.erosion.users or None
        rep = erosion_for_users(cfg, users_, out_dir=out, contributions=cfg.erosion.contributions
                                if contributions is None else contributions)
    except SiloflError as e:
        _fail(e)
    t = Table(title=f"Weight Erosion per user: final {rep.metric} on the user's test rows")
    for c in ("user", "Global", "Weight Erosion", "Local", "majority", "final α (others)"):
        t.add_column(c, justify="left" if c in ("user", "final α (others)") else "right")
    for u in rep.users:
        c = rep.curves[u]
        alpha = ", ".join(f"{s} {c.alpha[-1][k]:.2f}" for k, s in enumerate(rep.silos)
                          if s != u)
        t.add_row(escape(u), f"{c.global_[-1]:.4f}", f"{c.erosion[-1]:.4f}",
                  f"{c.local[-1]:.4f}", f"{c.baseline:.4f}", escape(alpha))
    console.print(t)
    if rep.private:
        console.print(f"{escape(rep.calibration)}. Charged per silo: FedAvg's and Local's "
                      "DP-SGD steps and one DP-SGD gradient per round for each user's Weight "
                      f"Erosion run. Adjacency: add/remove one record. Noise: {rep.noise}. "
                      f"Budget store: {escape(rep.store or 'scratch (in memory)')}, run "
                      f"{rep.run_id}.")
    if 0 < len(rep.contributions) <= 3:  # contribution report (more users: see the HTML)
        from silofl.experiments.contribution import table as contribution_table
        for c in rep.contributions.values():
            console.print(contribution_table(c))
    _job_footer(rep, "erosion.json, erosion_<user>.png, contribution.html/.json, "
                "contribution_*_<user>.png, round_logs/, ledgers/, config.toml")


# --- PrivateKT vs local-DP baselines (silofl.experiments.ldp_compare) -----------------------
@app.command("ldp-compare")
def ldp_compare(config: Optional[Path] = typer.Option(None, "--config", "-c", help=(
                    "TOML config (e.g. examples/privatekt_mnist_cpu.toml)")),
                out: Path = typer.Option(Path("runs/ldp-compare"), "--out",
                                         help="directory for comparison.json/.png"),
                store: Optional[Path] = typer.Option(None, "--store", help=(
                    "lifetime budget store charged by all three jobs (default: a scratch "
                    "store per job: an experiment, not a release)"))):
    """PrivateKT, FedAvg with local DP on clipped updates and FedAvg with DP-SGD at the same
    per-round ε (training.ldp_epsilon): accuracy against rounds, cumulative ε per client."""
    from silofl.config import load_config
    from silofl.experiments.figures import check_out_dir
    from silofl.experiments.ldp_compare import METHODS, compare
    from silofl.privacy.budget import BudgetStore
    warnings.showwarning = _show_warning
    try:
        cfg = load_config(config)
        check_out_dir(out, "--out")
        with Progress(TextColumn("{task.description:<11}"), BarColumn(), TextColumn(
                "round {task.completed}/{task.total}"), TimeElapsedColumn(), console=err) as bar:
            tasks = {m: bar.add_task(m, total=cfg.training.rounds) for m in METHODS}
            res = compare(cfg, out, store=BudgetStore(store) if store else None,
                          on_round=lambda m, t, total, v: bar.update(tasks[m], completed=t))
    except SiloflError as e:
        _fail(e)
    t = Table(title=f"same per-round ε = {cfg.training.ldp_epsilon:g}: pooled test accuracy "
                    f"and cumulative ε per client (δ = {cfg.privacy.delta:g})")
    for c in ("method", "final accuracy", "rounds per client", "ε per client (max / mean)"):
        t.add_column(c, justify="left" if c == "method" else "right")
    for m, r in res.items():
        rpc = r["rounds_per_client"]
        t.add_row(m, f"{r['accuracy'][-1]:.4f}", f"{min(rpc)}–{max(rpc)}",
                  f"{r['max_epsilon']:.1f} / {r['mean_epsilon']:.1f}")
    console.print(t)
    err.print("[bold yellow]note:[/] privatekt, fedavg_ldp: ε-LDP per upload for the whole "
              "local dataset; fedavg: (ε, δ) example-level DP-SGD per round; every ε is "
              "composed over the rounds a client took part in (no shuffling assumed)"
              + ("" if store else "; scratch budget stores: an experiment, not a release"))
    console.print(f"Wrote {escape(str(out))}/comparison.json and comparison.png")


# --- contribution report (silofl.experiments.contribution) ---------------------------------
@app.command()
def contrib(run_dir: Path = typer.Argument(..., help="a `silofl erosion` run directory"),
            ranking: Optional[Path] = typer.Option(
                None, "--ranking", help="a `silofl rank` run directory (adds Ndoye ranks)"),
            out: Optional[Path] = typer.Option(
                None, "--out", help="where to write the report (default: RUN_DIR)"),
            permutations: int = typer.Option(
                200, "--permutations", help="Monte-Carlo orders beyond --max-exact silos"),
            max_exact: int = typer.Option(
                10, "--max-exact", help="exact Shapley up to this many other silos"),
            seed: int = typer.Option(0, "--seed", help="seed of the Monte-Carlo orders"),
            quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar")):
    """Contribution report of a Weight Erosion run (per user: α over rounds, Ndoye rank,
    leave-one-out, Shapley), rebuilt from its released round logs and the user's own
    held-out rows: no training, nothing charged."""
    from silofl.experiments import contribution as C
    from silofl.experiments.figures import check_out_dir
    warnings.showwarning = _show_warning
    try:
        if out is not None:
            check_out_dir(out, "--out")
        with Progress(TextColumn("{task.description:<12}"), BarColumn(), TextColumn(
                "{task.completed}/{task.total} {task.fields[unit]}"), TimeElapsedColumn(),
                console=err, disable=quiet, transient=False) as prog:
            tasks = {}

            def on_progress(user, done, total, unit):
                if user not in tasks:
                    tasks[user] = prog.add_task(user, total=total, unit=unit)
                prog.update(tasks[user], completed=done)
            reps = C.from_erosion_dir(run_dir, ranking=ranking, max_exact=max_exact,
                                      permutations=permutations, seed=seed,
                                      on_progress=on_progress)
        html_path = C.write_reports(out if out is not None else run_dir, reps)
    except SiloflError as e:
        _fail(e)
    for c in reps.values():
        console.print(C.table(c))
    for note in dict.fromkeys(n for c in reps.values() for n in c.notes):
        err.print(f"[bold yellow]note:[/] {escape(note)}")
    console.print(f"Report: [bold]{escape(str(html_path))}[/] (contribution.json, "
                  "contribution_alpha_<user>.png, contribution_values_<user>.png)")


# --- privacy audit (silofl.audit) -----------------------------------------------------------
@app.command()
def audit(config: Optional[Path] = typer.Option(None, "--config", "-c",
                                                help="TOML config of the job to audit"),
          silo: Optional[str] = typer.Option(None, "--silo", help="audit one silo (default: all)"),
          kind: Optional[str] = typer.Option(None, "--kind", help=(
              "one-run | multi-run (default: [audit] kind, one-run)")),
          canaries: Optional[int] = typer.Option(
              None, "--canaries", help="one-run: canaries per silo (default min(1000, n_k))"),
          runs: Optional[int] = typer.Option(None, "--runs", help=(
              "multi-run: jobs on each of D and D′ (default: [audit] runs, 200)")),
          confidence: Optional[float] = typer.Option(None, "--confidence", help=(
              "of the lower bound (default: [audit] confidence, 0.95)")),
          out: Optional[Path] = typer.Option(None, "--out", help=(
              "directory for audit.json and audit.html (default: [output] dir, else runs/, "
              "plus audit-<time>)")),
          store: Optional[Path] = typer.Option(None, "--store", help="lifetime budget store"),
          scratch: bool = typer.Option(False, "--scratch", help=(
              "charge an in-memory scratch budget: an experiment, not a release")),
          quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
          set_: Optional[list[str]] = typer.Option(
              None, "--set", help="override a config key SECTION.KEY=VALUE (TOML value), e.g. "
              "audit.runs=50 (repeat)")):
    """Measure empirically that each silo's guarantee holds: canary runs through the real
    job, the claimed ε beside an empirical lower bound, violations flagged. Canary runs use
    the silo's data: they are charged to its budget (or a scratch store, marked so)."""
    from silofl.audit import audit as run_audit
    from silofl.audit import write_audit
    warnings.showwarning = _show_warning
    try:
        cfg = _job_config(config, store, scratch, out, overrides=set_ or ())
        dest = out if out is not None else Path(cfg.output.dir or "runs") / \
            time.strftime("audit-%Y%m%d-%H%M%S")
        with Progress(TextColumn("audit"), BarColumn(), TextColumn("{task.completed}/"
                      "{task.total} jobs"), TimeElapsedColumn(), console=err,
                      disable=quiet, transient=False) as prog:
            task = prog.add_task("audit", total=None)

            def on_progress(done, total):
                prog.update(task, completed=done, total=total)
            given = dict(kind=kind, silo=silo, canaries=canaries, runs=runs,
                         confidence=confidence)  # the command line over [audit]
            a = cfg.audit.model_copy(update={k: v for k, v in given.items() if v is not None})
            rep = run_audit(cfg, kind=a.kind, silo=a.silo, canaries=a.canaries, runs=a.runs,
                            confidence=a.confidence, on_progress=on_progress)
        files = write_audit(rep, dest)
    except SiloflError as e:
        _fail(e)
    _audit_footer(rep, files, f"Methods audited together: {', '.join(rep.methods)}. Noise: "
                              f"{rep.noise}.")


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
    console.print(f"Audit: [bold]{escape(str(files[0]))}[/], {escape(str(files[1]))}")
    if rep.violations:  # the audit ran and refuted a claim
        err.print(f"[bold red]VIOLATION[/]: the lower bound exceeds the claimed ε for "
                  f"{escape(', '.join(rep.violations))}")
        raise typer.Exit(3)


@app.command()
def account(n: int = typer.Option(..., help="training examples (persons) in the silo"),
            batch: float = typer.Option(..., help="(expected) batch size b"),
            delta: Optional[float] = typer.Option(None, help="δ (node-level default: 1/n)"),
            steps: Optional[int] = typer.Option(None, help="DP-SGD steps"),
            epochs: Optional[float] = typer.Option(None, help="epochs (steps = epochs·n/b)"),
            sigma: Optional[float] = typer.Option(None, help="noise multiplier → report ε"),
            epsilon: Optional[float] = typer.Option(None, help="target ε → calibrate σ"),
            node_level: bool = typer.Option(False, "--node-level", help=(
                "node-level DP for graph neighbourhoods (Theorem 2.4.4): fixed-size batches "
                "without replacement, each person in ≤ S examples")),
            S: int = typer.Option(20, "--S", help="node-level: appearances bound S"),
            as_json: bool = typer.Option(False, "--json", help="print JSON")):
    """ε for DP-SGD with (n, b, steps|epochs, σ, δ), or σ for a target ε: example-level
    under RDP and PLD, or node-level (--node-level) under RDP."""
    from silofl.privacy import accounting as A
    if node_level:
        return _account_node(n, int(batch), delta, steps, epochs, sigma, epsilon, S, as_json)
    try:
        if delta is None:
            raise SiloflError("give --delta (e.g. 1e-5, well below 1/n)")
        if (steps is None) == (epochs is None):
            raise SiloflError("give exactly one of --steps or --epochs")
        if (sigma is None) == (epsilon is None):
            raise SiloflError("give exactly one of --sigma (to get ε) or --epsilon (to get σ)")
        if n < 2 or not 0 < batch < n:
            raise SiloflError(f"need n ≥ 2 and 0 < batch < n, got n={n}, batch={batch}")
        if not 0 < delta < 1:
            raise SiloflError(f"delta must be in (0, 1), got {delta}")
        T = _account_bounds(n, batch, delta, steps, epochs, sigma, epsilon,
                            lambda: A.steps_for_epochs(n, batch, epochs))
        q = batch / n
        out = {"n": n, "batch": batch, "q": q, "steps": T, "delta": delta}
        with _bounded_accounting():
            if sigma is not None:
                out.update(sigma=sigma, **{f"epsilon_{k}": v for k, v in A.epsilons(
                    A.dpsgd_event(q, sigma, T), delta).items()})
            else:
                out.update(target_epsilon=epsilon, **{
                    f"sigma_{k}": A.calibrate_dpsgd(epsilon, delta, q, T, k)
                    for k in A.ACCOUNTANTS})
    except SiloflError as e:
        _fail(e)
    _print_quantities("DP-SGD privacy accounting (Poisson-sampled Gaussian, add/remove one)",
                      out, as_json)


#: sane ranges for `silofl account`: beyond them the answer is meaningless (σ → 0, ε → ∞)
#: and the PLD grid or the σ search grows without bound
ACCOUNT_RANGES = {"n": (2, 10**9), "steps": (1, 10**6), "sigma": (0.3, 1e4),
                  "epsilon": (1e-3, 100.0), "delta": (1e-15, 0.5), "epochs": (1e-6, 1e5)}
#: the accounting itself is also capped: seconds and extra address space (bytes)
ACCOUNT_LIMITS = (60, 8 * 2**30)


def _in_range(name: str, value) -> None:
    import math
    lo, hi = ACCOUNT_RANGES[name]
    if value is None:
        return
    if not math.isfinite(value) or not lo <= value <= hi:
        raise SiloflError(f"--{name} must be a finite number in [{lo:g}, {hi:g}], got "
                          f"{value:g}")


def _account_bounds(n, batch, delta, steps, epochs, sigma, epsilon, to_steps) -> int:
    """Refuse inputs outside ACCOUNT_RANGES; returns the number of steps."""
    import math
    if sigma is not None and sigma <= 0:
        raise SiloflError(f"sigma must be positive, got {sigma}")
    if epsilon is not None and epsilon <= 0:
        raise SiloflError(f"epsilon must be positive, got {epsilon}")
    if not math.isfinite(batch):
        raise SiloflError(f"--batch must be a finite number, got {batch:g}")
    for name, v in (("n", n), ("sigma", sigma), ("epsilon", epsilon), ("delta", delta),
                    ("steps", steps), ("epochs", epochs)):
        _in_range(name, v)
    T = steps if steps is not None else to_steps()
    if T > ACCOUNT_RANGES["steps"][1]:
        raise SiloflError(f"--epochs {epochs:g} means {T} steps, more than "
                          f"{ACCOUNT_RANGES['steps'][1]}; give fewer epochs or a larger batch")
    return T


@contextlib.contextmanager
def _bounded_accounting():
    """Cap the accounting's time and memory (ACCOUNT_LIMITS): an extreme schedule is then a
    clean refusal instead of a hang or a machine out of memory."""
    import resource
    import signal
    secs, extra = ACCOUNT_LIMITS

    def _timeout(signum, frame):
        raise TimeoutError

    old_as = resource.getrlimit(resource.RLIMIT_AS)
    try:
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * resource.getpagesize()
        cap = used + extra
        if old_as[1] == resource.RLIM_INFINITY or cap < old_as[1]:
            resource.setrlimit(resource.RLIMIT_AS, (cap, old_as[1]))
    except (OSError, ValueError):
        old_as = None
    main = threading.current_thread() is threading.main_thread()
    old_alarm = signal.signal(signal.SIGALRM, _timeout) if main else None
    if main:
        signal.alarm(secs)
    try:
        yield
    except (MemoryError, TimeoutError):
        raise SiloflError(f"this schedule needs more than {secs} s or {extra // 2**30} GiB "
                          "to account: its σ is too small or its steps too many for an "
                          "answer that means anything; raise --sigma, lower --epsilon or "
                          "give fewer steps") from None
    finally:
        if main:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old_alarm)
        if old_as is not None:
            resource.setrlimit(resource.RLIMIT_AS, old_as)


def _print_quantities(title: str, out: dict, as_json: bool) -> None:
    if as_json:
        from silofl.experiments.atomic import dumps_strict, json_safe
        bad: list[str] = []
        json_safe(out, bad)
        # strict JSON: an infinite ε prints as null, named under "nonfinite"
        console.print_json(dumps_strict({**out, "nonfinite": bad} if bad else out))
        return
    t = Table(title=title)
    t.add_column("quantity")
    t.add_column("value", justify="right")
    for k, v in out.items():
        t.add_row(k, f"{v:.6g}" if isinstance(v, float) else str(v))
    console.print(t)


def _account_node(n, b, delta, steps, epochs, sigma, epsilon, S, as_json):
    from silofl.privacy import node_level as node_dp
    try:
        if (steps is None) == (epochs is None):
            raise SiloflError("give exactly one of --steps or --epochs")
        if (sigma is None) == (epsilon is None):
            raise SiloflError("give exactly one of --sigma (to get ε) or --epsilon (to get σ)")
        if not 1 <= b <= n:
            raise SiloflError(f"need 1 ≤ batch ≤ n, got n={n}, batch={b}")
        if not 1 <= S <= n:
            raise SiloflError(f"--S must be in [1, n], got {S}")
        d = delta if delta is not None else 1.0 / n
        if not 0 < d < 1:
            raise SiloflError(f"delta must be in (0, 1), got {d}")
        T = _account_bounds(n, b, d, steps, epochs, sigma, epsilon,
                            lambda: node_dp.node_steps(n, b, epochs))
        out = {"n": n, "S": S, "batch": b, "steps": T, "delta": d}
        with _bounded_accounting():
            # both adjacencies: "node+edges" (a person and their contacts: 2S − 1 examples
            # affected, the pipeline's default) and "node" (fixed public graph: S examples)
            for adj, key in (("node+edges", "node_edges"), ("node", "node")):
                out[f"affected_{key}"] = node_dp.affected_examples(n, S, adj)
                if sigma is not None:
                    out[f"epsilon_{key}_rdp"] = node_dp.node_epsilon(n, S, b, sigma, T, d,
                                                                     adjacency=adj)
                else:
                    out[f"sigma_{key}_rdp"] = node_dp.calibrate_node_sigma(
                        epsilon, n, S, b, T, d, adjacency=adj)
        if sigma is not None:
            out["sigma"] = sigma
        else:
            out["target_epsilon"] = epsilon
        out["assumption"] = node_dp.PRUNING_ASSUMPTION
    except SiloflError as e:
        _fail(e)
    _print_quantities("node-level DP-SGD accounting (Theorem 2.4.4, replacement; node_edges: "
                      "a person and their contacts, 2S − 1 examples affected; node: fixed "
                      "public graph, S examples)", out, as_json)


def _report_dir(results: Path, out: Optional[Path]) -> Path:
    return out if out is not None else results.with_name(results.stem + "-report")


@app.command()
def sweep(config: Path = typer.Argument(..., help="sweep TOML: run sections + [sweep] grid"),
          results: Optional[Path] = typer.Option(
              None, "--results", help="results file (default: sweep.results, relative to "
              "the config file)"),
          workers: Optional[int] = typer.Option(None, "--workers", "-j",
                                                help="processes (default: sweep.workers)"),
          quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
          set_: Optional[list[str]] = typer.Option(
              None, "--set", help="override a key SECTION.KEY=VALUE (TOML value), e.g. "
              "sweep.seeds=[0,1] or training.rounds=5 (repeat)")):
    """Run (or resume) a privacy-utility sweep: methods × ε × λ × lr × seeds, one JSON line
    per finished run; then print the best settings chosen on validation data."""
    from rich.progress import MofNCompleteColumn, TimeRemainingColumn

    from silofl.experiments.report import selection_table
    from silofl.experiments.selection import select_best
    from silofl.experiments.sweep import NOT_COUNTED, read_results, run_sweep
    from silofl.experiments.sweep_config import load_sweep_config
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
            outcome = run_sweep(sc, results=results, workers=workers, on_progress=on_progress)
        head, records = read_results(outcome.results)
    except SiloflError as e:
        _fail(e)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted:[/] finished runs are saved; run the same command "
                  "again to resume")
        raise typer.Exit(130)
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
    if sc.sweep.tuning == "none":
        console.print("sweep.tuning = 'none': one setting per method, fixed in advance; each "
                      "run meets its (ε, δ) on its own (runs are not composed with each other)")
    else:
        console.print(escape(NOT_COUNTED))


# arguments shared by `plot` and `report`
SweepResults = Annotated[Path, typer.Argument(help="results file written by `silofl sweep`")]
ReportDir = Annotated[Optional[Path], typer.Option(
    "--out", help="directory (default: RESULTS-report/)")]
FigureEpsilon = Annotated[Optional[float], typer.Option(
    "--epsilon", help="ε of the λ and over-rounds figures (a swept value; "
    "default: [report] epsilon or the middle ε)")]


@app.command()
def plot(results: SweepResults, out: ReportDir = None, epsilon: FigureEpsilon = None):
    """Draw the sweep's figures as PNGs: ε vs test metric, MR-MTL vs λ, and metric over
    rounds (hyperparameters chosen on validation)."""
    from silofl.experiments.figures import make_figures
    from silofl.experiments.sweep import read_results
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
    from silofl.experiments.selection import select_best
    from silofl.experiments.sweep import read_results
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
    console.print(f"Report: [bold]{escape(str(d / 'report.html'))}[/] (+ PNGs, summary.json)")


schema_app = typer.Typer(help="Declared schemas: the public facts preprocessing may use.")
app.add_typer(schema_app, name="schema")


@schema_app.command("draft")
def schema_draft(data: Path = typer.Argument(..., help="the table (CSV, CSV.gz, Parquet)"),
                 label_column: str = typer.Option(..., "--label-column"),
                 silo_column: Optional[str] = typer.Option(None, "--silo-column"),
                 out: Path = typer.Option(..., "--out", help="TOML file to write"),
                 sep: str = typer.Option("", "--sep", help="CSV column separator (default ,)"),
                 encoding: str = typer.Option("", "--encoding",
                                              help="CSV text encoding (default utf-8)")):
    """Write a schema *draft* read from the data (feature kinds, observed ranges, levels,
    label classes) for a person to check against public documentation. It is marked
    `drafted = true` and refused until that line is deleted: values read from the data are
    only public once someone has confirmed them from public sources."""
    from silofl.data import read_table
    from silofl.data.schema import draft_schema
    try:
        if out.exists():
            raise SiloflError(f"{str(out)!r} exists; choose another --out (a reviewed "
                              "schema is never overwritten)")
        _check_out_file(out)
        from silofl.data.column_roles import likely_non_features
        frame = read_table(data, sep=sep, encoding=encoding,
                           settings=("--sep", "--encoding", "--drop"))
        text = draft_schema(frame, silo_column, label_column)
        left_out = likely_non_features(frame, silo_column, label_column)
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


def _check_out_file(out: Path) -> None:
    """--out names a file to write: its folder must exist (nothing is created for it)."""
    from silofl.config.input import check_writable_file
    check_writable_file(out, "--out")
    if not out.parent.is_dir():
        raise SiloflError(f"the folder of --out does not exist: {str(out.parent)!r}; "
                          "create it first or choose another path")


@app.command()
def predict(run_dir: Path = typer.Option(..., "--run", help="a run directory (runs/<time>)"),
            silo: str = typer.Option(..., "--silo", help="whose personal model to apply"),
            method: Optional[str] = typer.Option(
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
    from silofl.experiments.atomic import write_bytes_atomic
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


budget_app = typer.Typer(help="Lifetime privacy budgets per silo (the budget store).")
app.add_typer(budget_app, name="budget")
StorePath = Annotated[Optional[Path], typer.Option("--store", help=(
    "the budget store (SQLite file; default: the deployment's store, "
    "<silofl home>/stores/<deployment>.sqlite)"))]
Deployment = Annotated[str, typer.Option("--deployment", help=(
    "the deployment whose default store to use ([budget] deployment)"))]


def _open_store(path: Optional[Path], deployment: str = "default"):
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
                silo: Optional[str] = typer.Option(None, help="one silo, with its charges"),
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
        from silofl.experiments.atomic import dumps_strict
        console.print_json(dumps_strict({"store": shown, "silos": rows, "charges": charges,
                                         "log": log}))
        return
    t = Table(title=f"lifetime budgets in {escape(shown)}")
    for c in ["silo", "target ε, δ", "spent ε", "RDP / PLD", "remaining", "runs",
              "unfinished"]:
        t.add_column(c, justify="left" if c == "silo" else "right")
    for r in rows:
        runs = len({c["run"] for c in charges[r["silo"]]})
        pld = "n/a" if r["epsilon_pld"] is None else f"{r['epsilon_pld']:.3f}"
        t.add_row(escape(r["silo"]), f"{r['target_epsilon']:g}, {r['delta']:g}",
                  f"{r['epsilon']:.3f} ({r['accountant']})", f"{r['epsilon_rdp']:.3f} / {pld}",
                  f"{r['remaining']:.3f}", str(runs), str(r["unfinished_runs"]))
    console.print(t)
    if silo:
        ct = Table(title=f"charges of {escape(silo)} (current epoch)")
        for c in ["run", "command", "method", "label", "count", "status", "noise"]:
            ct.add_column(c)
        for c in charges[silo]:
            ct.add_row(c["run"], c["command"], c["method"], c["label"], str(c["count"]),
                       c["status"], c["noise"])
        console.print(ct)
    for entry in log:
        console.print(f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(entry['time']))} "
                      f"{escape(str(entry['silo'] or '(whole store)'))}: {entry['action']} — "
                      f"{escape(entry['reason'])} ({escape(entry['detail'])})")
    console.print("'remaining' is target − spent; privacy costs compose, they do not add up, "
                  "so a new run may fit more or less than that.")


@budget_app.command("export")
def budget_export(store: StorePath = None, deployment: Deployment = "default",
                  out: Optional[Path] = typer.Option(None, "--out", help="JSON file "
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


def _write_atomic(path: Path, text: str) -> None:
    from silofl.experiments.atomic import write_text_atomic
    write_text_atomic(path, text)


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
    from silofl.data.federation import PrivacyTarget
    try:
        if not yes:
            raise SiloflError("changing a lifetime target changes the guarantee every person "
                              "in the silo gets; repeat with --yes to confirm (logged)")
        with _open_store(store, deployment) as st:
            st.set_target(silo, PrivacyTarget(epsilon, delta), reason)
    except SiloflError as e:
        _fail(e)
    console.print(f"Silo {escape(silo)}: lifetime target ε = {epsilon:g}, δ = {delta:g}")


def _cli_store(store: Optional[Path], scratch: bool):
    """The store a command charges: scratch, --store, or the default deployment's store
    (announced loudly when this creates it)."""
    from silofl.privacy import store_paths
    from silofl.privacy.budget import BudgetStore
    if scratch:
        return BudgetStore(None)
    st = BudgetStore(store if store is not None else store_paths.default_store_path())
    if st.created:
        err.print(f"[bold yellow]NEW budget store created: {escape(str(st.path))}[/] (no "
                  "earlier charges are in it)")
    else:
        err.print(f"budget store: {escape(st.describe())}")
    return st


def _need_pandemic_extra() -> None:
    try:
        import numba  # noqa: F401
        import sknetwork  # noqa: F401
    except ImportError:
        raise SiloflError("the pandemic pipeline needs the 'pandemic' extra (numba, "
                          "scikit-network); install it with: pip install -e '.[pandemic]'") from None


pandemic_app = typer.Typer(help="Pandemic forecasting (US/UK PETs challenge schema).")
app.add_typer(pandemic_app, name="pandemic")
from silofl.theory.cli import theory_app  # noqa: E402  (MR-MTL mean-estimation theory)
app.add_typer(theory_app, name="theory")


@pandemic_app.command("synth")
def pandemic_synth(persons: int = typer.Option(10_000, help="number of persons"),
                   regions: int = typer.Option(5, help="number of regions (counties)"),
                   seed: int = typer.Option(0),
                   out: Path = typer.Option(..., "--out", help="output directory"),
                   fmt: str = typer.Option("csv", "--format", help="csv or parquet"),
                   overwrite: bool = typer.Option(False, help="replace a different dataset")):
    """Write a synthetic outbreak in the challenge's seven-file schema (+ target labels)."""
    from silofl.pandemic import synthesize
    try:
        with console.status("generating outbreak…"):
            s = synthesize(out, persons=persons, regions=regions, seed=seed,
                           overwrite=overwrite, format=fmt)
    except SiloflError as e:
        _fail(e)
    st = s.get("stats", {})
    console.print(f"Wrote {persons} persons in {regions} regions to [bold]{out}[/]: "
                  f"{st.get('contacts', '?')} contacts, ever infected "
                  f"{st.get('ever_infected_fraction', float('nan')):.2%}, newly infected in "
                  f"the final week {st.get('final_window_new_infection_fraction', float('nan')):.2%}")


def _pandemic_config(centralized, rounds, epsilon, batch, lam, lr, S, no_privacy, seed,
                     noise="secure", adjacency="node+edges", preprocessing="declared",
                     method="mrmtl", clusters=2, we_user=None, we_update="gradient"):
    from silofl.pandemic.pipeline import PandemicConfig
    return PandemicConfig(federated=not centralized, rounds=rounds, epsilon=epsilon,
                          batch_size=batch, lam=lam, lr=lr, S=S, private=not no_privacy,
                          seed=seed, noise=noise, adjacency=adjacency,
                          preprocessing=preprocessing, method=method, clusters=clusters,
                          we_user=we_user, we_update=we_update)


def _pandemic_tuning(mode: str, lams: str, trials: float, cfg):
    """`--tuning`: None, or the `TuningConfig` of a privately tuned graph run (checked by
    `tuning.graph.check_setting` before anything is read or reserved)."""
    from silofl.errors import ConfigError
    from silofl.config import TuningConfig
    if mode == "none":
        return None
    if mode != "private":
        raise ConfigError(f"--tuning must be 'none' or 'private', got {mode!r}")
    try:
        grid = [float(x) for x in lams.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--tuning-lam must be comma-separated numbers, e.g. "
                          f"0.01,0.1,1; got {lams!r}") from None
    tc = TuningConfig(mode="private", method=cfg.method, lam=grid, mean_trials=trials,
                      pivot_lam=cfg.lam)
    from silofl.tuning.graph import check_setting
    check_setting(tc, cfg)
    return tc


def _pandemic_tuning_table(privacy: list[dict]) -> Table:
    """Per region: the released setting and the RepeatAndSelect release's own ε."""
    first = privacy[0]["tuning"]
    h = first["h_distribution"]
    dist = (f"TNB(η={h['eta']:g}, γ={h['gamma']:.3g})" if h["distribution"] == "tnb"
            else f"Poisson(μ={h['mu']:g})")
    t = Table(title=f"tuned privately: h_k ~ {dist}, E\\[h] = {h['mean_trials']:.3g} "
                    "(secret per region)")
    for c in ["region", "chosen λ", "chosen lr", "score persons", "score Δ", "score noise",
              "RepeatAndSelect ε", "ε spent (all)"]:
        t.add_column(c, justify="left" if c == "region" else "right")
    for p in privacy:
        tu = p["tuning"]
        ch, v = tu.get("chosen") or {}, tu["validation"]
        pivot = ch.get("pivot", True)
        t.add_row(escape(p["region"]), "pivot λ̄" if pivot else f"{ch['lam']:g}",
                  "-" if pivot else f"{ch['lr']:g}", str(v["persons"]),
                  f"{v['sensitivity']:.3g}", f"{v['noise_std']:.3g}",
                  f"{tu.get('charged_epsilon', float('nan')):.3f}",
                  f"{p['epsilon_spent']:.3f}")
    t.caption = ("score: mean focal loss clipped to [0, B] at the last labelled window; "
                 "Δ = min(A, m)·B/m (A examples change per replaced person); ε spent "
                 "includes the pivot and the whole tuned release")
    return t


@pandemic_app.command("train")
def pandemic_train(data: Path = typer.Option(..., "--data", help="directory of the 7 inputs"),
                   model_dir: Path = typer.Option(Path("pandemic-model"), "--model"),
                   centralized: bool = typer.Option(False, help="one silo instead of regions"),
                   rounds: int = typer.Option(2), epsilon: float = typer.Option(5.0),
                   batch: int = typer.Option(512), lam: float = typer.Option(0.1),
                   lr: float = typer.Option(0.3), S: int = typer.Option(20, "--S"),
                   no_privacy: bool = typer.Option(False, "--no-privacy"),
                   seed: int = typer.Option(0),
                   noise: str = typer.Option("secure", help=(
                       "secure (OS-entropy CSPRNG) or seeded (reproducible from --seed: "
                       "not a privacy guarantee)")),
                   adjacency: str = typer.Option("node+edges", help=(
                       "node+edges (a person and their contacts: 2S-1 examples affected) "
                       "or node (fixed public contact graph: S examples)")),
                   preprocessing: str = typer.Option("declared", help=(
                       "data-dependent constants: declared (public numbers), private "
                       "(charged node-level release) or uncharged (fit on the data, not "
                       "charged)")),
                   store: Optional[Path] = typer.Option(None, "--store", help=(
                       "lifetime budget store (SQLite): runs on the same data compose "
                       "(default: <silofl home>/stores/default.sqlite)")),
                   scratch: bool = typer.Option(False, "--scratch", help=(
                       "charge an in-memory scratch budget: an experiment, not a release")),
                   method: str = typer.Option("mrmtl", "--method", help=(
                       "federated algorithm on the core engine: mrmtl, local, fedavg, "
                       "finetune, ditto, mocha (--lam is its λ), ifca, ifca_local, "
                       "ifca_finetune, ifca_mrmtl or weight_erosion")),
                   clusters: int = typer.Option(2, "--clusters", help=(
                       "the IFCA family: number of cluster models (≤ regions)")),
                   we_user: Optional[str] = typer.Option(None, "--we-user", help=(
                       "weight_erosion: the user region its model is personalized for, "
                       "e.g. region-51001")),
                   we_update: str = typer.Option("gradient", "--we-update", help=(
                       "weight_erosion: what each region sends per round: gradient (one "
                       "node-level DP-SGD step) or local_sgd (a local pass)")),
                   tuning: str = typer.Option("none", "--tuning", help=(
                       "none, or private: tune λ per region (mrmtl/ditto) by a random "
                       "number of trials, best released by a noisy node-level score; "
                       "the whole release is charged (README 'Private tuning on graph "
                       "data')")),
                   tuning_lam: str = typer.Option("0.01,0.03,0.1,0.3,1", "--tuning-lam",
                                                  help="λ grid of --tuning private"),
                   tuning_trials: float = typer.Option(10.0, "--tuning-trials", help=(
                       "mean number of trials h per region (h ~ geometric with this "
                       "mean, drawn secretly in each region)"))):
    """Train per-region risk models (MR-MTL by default, node-level DP) and save them. A private run
    first reserves its whole spending in the lifetime budget store (refused, exit 2,
    nothing written, if a region's lifetime budget cannot pay)."""
    st = None
    try:
        _need_pandemic_extra()
        from silofl.pandemic import read_dataset
        from silofl.privacy.node_level import ADJACENCY_TEXT, PRUNING_ASSUMPTION
        from silofl.pandemic.pipeline import SEEDED_NOTE, SIZES_ASSUMPTION, train
        from silofl.privacy.budget import BudgetStore
        cfg = _pandemic_config(centralized, rounds, epsilon, batch, lam, lr, S, no_privacy,
                               seed, noise, adjacency, preprocessing, method, clusters,
                               we_user, we_update)
        cfg.validate()
        tc = _pandemic_tuning(tuning, tuning_lam, tuning_trials, cfg)
        with console.status("reading data…"):
            ds = read_dataset(data)
        if cfg.private:
            st = _cli_store(store, scratch)
        with Progress(TextColumn("training"), BarColumn(), TextColumn("round {task.completed}/"
                      "{task.total}"), TimeElapsedColumn(), console=err) as prog:
            task = prog.add_task("train", total=rounds)
            pm = train(ds, cfg, on_round=lambda t, T: prog.update(task, completed=t),
                       store=st, command="silofl pandemic train", tuning=tc)
        pm.save(model_dir)
    except SiloflError as e:
        _fail(e)
    finally:
        if st is not None:
            st.close()
    cfg = pm.config
    if not cfg.private:
        console.print("No differential privacy: this run is for comparison only.")
    else:
        t = Table(title=f"node-level privacy per region ({escape(cfg.method)})")
        for c in ["region", "persons", "S", "affected", "steps", "σ", "ε spent (RDP)", "δ",
                  "lifetime ε / target"]:
            t.add_column(c, justify="left" if c == "region" else "right")
        for p in pm.privacy:
            life = (f"{p['lifetime_epsilon_spent']:.3f} / {p['lifetime_target_epsilon']:g}"
                    if "lifetime_epsilon_spent" in p else "-")
            t.add_row(escape(p["region"]), str(p["n"]), str(p["S"]),
                      str(p.get("affected_examples", "-")), str(p["steps"]),
                      f"{p['noise_multiplier']:.3g}", f"{p['epsilon_spent']:.3f}",
                      f"{p['delta']:.2g}", life)
        console.print(t)
        if pm.privacy and "tuning" in pm.privacy[0]:
            console.print(_pandemic_tuning_table(pm.privacy))
        sel = pm.privacy[0].get("selections") if pm.privacy else None
        if sel:  # the IFCA family: its private cluster selections are in the ε above
            console.print(f"Cluster selections: {sel['count']} per region, each an "
                          f"exponential mechanism at ε = {sel['epsilon']:.3g} "
                          f"(sensitivity {escape(sel['sensitivity'])}), in the ε above.")
        console.print(f"Adjacency ({cfg.adjacency}): {escape(ADJACENCY_TEXT[cfg.adjacency])}.")
        console.print(f"Assumptions: {escape(PRUNING_ASSUMPTION)}; "
                      f"{escape(SIZES_ASSUMPTION)}.")
        noise = ("secure (CSPRNG keyed from OS entropy)" if cfg.noise == "secure" else
                 f"seeded — {SEEDED_NOTE}")
        pre = {"declared": "declared (fixed public constants; no statistic of the data)",
               "private": "private (one node-level release per region, in the ε above)",
               "uncharged": "uncharged (fit on each region's data, not charged)"}
        first = pm.privacy[0] if pm.privacy else {}
        where = first.get("budget_store") or "scratch (in memory)"
        console.print(f"Noise: {noise}. Preprocessing: {pre[cfg.preprocessing]}. Budget "
                      f"store: {escape(where)}, run {first.get('run_id', '-')}.")
    for note in pm.notes:
        err.print(f"[bold yellow]note:[/] {escape(note)}")
    console.print(f"Saved model to [bold]{escape(str(model_dir))}[/]")


# --- node-level privacy audit of the pandemic pipeline (silofl.audit.pandemic) -----------
@pandemic_app.command("audit")
def pandemic_audit(data: Path = typer.Option(..., "--data", help="directory of the 7 inputs"),
                   region: Optional[str] = typer.Option(
                       None, "--region", help="region audited, e.g. region-51001 or 51001 "
                       "(default: the first)"),
                   kind: str = typer.Option("one-run", "--kind", help="one-run | multi-run"),
                   canaries: Optional[int] = typer.Option(
                       None, "--canaries", help="one-run: canary persons (default "
                       "min(200, region size)); multi-run: 1"),
                   contacts: int = typer.Option(5, "--contacts",
                                                help="home contacts per canary (≤ S-1)"),
                   runs: int = typer.Option(100, "--runs",
                                            help="multi-run: jobs on each of D and D′"),
                   confidence: float = typer.Option(0.95, "--confidence"),
                   out: Path = typer.Option(None, "--out", help=(
                       "directory for audit.json and audit.html (default "
                       "runs/pandemic-audit-<time>)")),
                   centralized: bool = typer.Option(False, help="one silo instead of regions"),
                   rounds: int = typer.Option(2), epsilon: float = typer.Option(5.0),
                   batch: int = typer.Option(512), lam: float = typer.Option(0.1),
                   lr: float = typer.Option(0.3), S: int = typer.Option(20, "--S"),
                   seed: int = typer.Option(0),
                   noise: str = typer.Option("secure", help="secure or seeded"),
                   adjacency: str = typer.Option("node+edges", help="node+edges or node"),
                   preprocessing: str = typer.Option("declared",
                                                     help="declared, private or uncharged"),
                   method: str = typer.Option("mrmtl", "--method"),
                   store: Optional[Path] = typer.Option(None, "--store", help=(
                       "lifetime budget store charged by a one-run audit (default: "
                       "<silofl home>/stores/default.sqlite)")),
                   scratch: bool = typer.Option(False, "--scratch", help=(
                       "charge an in-memory scratch budget (required for multi-run)")),
                   quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar")):
    """Audit node-level DP of `pandemic train` with canary persons: the region's claimed ε
    beside an empirical lower bound (exit 3 on a violation). The one-run audit trains once
    on the region's data (charged to --store, or --scratch); multi-run needs --scratch."""
    st = None
    try:
        _need_pandemic_extra()
        from silofl.audit import write_audit
        from silofl.audit.pandemic import audit_pandemic
        from silofl.errors import ConfigError
        from silofl.pandemic import read_dataset
        from silofl.privacy.budget import BudgetStore
        cfg = _pandemic_config(centralized, rounds, epsilon, batch, lam, lr, S, False, seed,
                               noise, adjacency, preprocessing, method)
        cfg.validate()
        if kind == "multi-run" and not scratch:  # refused before anything is read
            raise ConfigError("a multi-run audit trains --runs jobs on each of D and D′: an "
                              "experiment, not a release; add --scratch, or use --kind "
                              "one-run on the real store")
        with console.status("reading data…"):
            ds = read_dataset(data)
        st = _cli_store(store, scratch)
        dest = out if out is not None else Path("runs") / \
            time.strftime("pandemic-audit-%Y%m%d-%H%M%S")
        with Progress(TextColumn("audit"), BarColumn(), TextColumn("{task.completed}/"
                      "{task.total} jobs"), TimeElapsedColumn(), console=err,
                      disable=quiet) as prog:
            task = prog.add_task("audit", total=None)
            rep = audit_pandemic(ds, cfg, region=region, kind=kind, canaries=canaries,
                                 contacts=contacts, runs=runs, confidence=confidence,
                                 store=st, on_progress=lambda d, t: prog.update(
                                     task, completed=d, total=t))
        files = write_audit(rep, dest)
    except SiloflError as e:
        _fail(e)
    finally:
        if st is not None:
            st.close()
    _audit_footer(rep, files, f"Neighbouring: {rep.neighbouring}.")


@pandemic_app.command("predict")
def pandemic_predict(data: Path = typer.Option(..., "--data"),
                     model_dir: Path = typer.Option(Path("pandemic-model"), "--model"),
                     out: Path = typer.Option(Path("predictions.csv"), "--out")):
    """Score every person's risk of infection in the next 7 days; evaluate if labels exist."""
    import pandas as pd
    try:
        _need_pandemic_extra()
        from silofl.pandemic import read_dataset
        from silofl.pandemic.pipeline import PandemicModel, evaluate, predict
        from silofl.pandemic.readers import find_table_file
        from silofl.pandemic.schema import TARGET
        pm = PandemicModel.load(model_dir)
        try:
            find_table_file(data, TARGET)
            has_target = True
        except SiloflError:
            has_target = False
        ds = read_dataset(data, with_target=has_target)
        with console.status("predicting…"):
            scores = predict(ds, pm)
        pd.DataFrame({"pid": ds.pids, "score": scores}).to_csv(out, index=False)
        ev = evaluate(ds, scores) if has_target else None
    except SiloflError as e:
        _fail(e)
    console.print(f"Wrote {len(scores)} risk scores to [bold]{escape(str(out))}[/]")
    for note in pm.notes:  # the model's caveats travel with its predictions
        err.print(f"[bold yellow]note (model):[/] {escape(note)}")
    if ev:
        t = Table(title="evaluation (challenge score: AUPRC over all persons)")
        t.add_column("metric")
        t.add_column("value", justify="right")
        for k in ["auprc", "auprc_sir_baseline", "positive_rate", "recall_at_num_positives"]:
            t.add_row(k, f"{ev[k]:.4f}")
        for r, v in ev["per_region_auprc"].items():
            t.add_row(f"auprc region {r}", f"{v:.4f}")
        console.print(t)


# --- networked runtime: silofl deploy init / silo / server (runtime/network) ----------
deploy_app = typer.Typer(help="Set up a consortium: per-silo configs, TLS and signing keys.")
app.add_typer(deploy_app, name="deploy")


@deploy_app.command("init")
def deploy_init(
        out: Path = typer.Option(..., "--out", help="folder to create (must be new or empty)"),
        silo: Optional[list[str]] = typer.Option(None, "--silo", help="a silo name (repeat)"),
        demo: Optional[str] = typer.Option(None, "--demo",
                                           help="'heart': write each hospital's own data"),
        regions: Optional[Path] = typer.Option(
            None, "--regions", help="a pandemic dataset folder (the 7 challenge files): one "
            "silo per region, each with its own folder; graph job (--set S=20, pooling=…)"),
        schema: Optional[Path] = typer.Option(
            None, "--schema", help="the consortium's declared schema (TOML): each silo gets "
            "its own folder and reads its own table with it"),
        table: Optional[list[str]] = typer.Option(
            None, "--table", help="NAME=PATH: silo NAME's own table (repeat; default: a "
            "placeholder in its silo.toml to fill in)"),
        split: Optional[Path] = typer.Option(
            None, "--split", help="one-machine demo: a table with a silo column, cut into "
            "one CSV per silo folder"),
        silo_column: Optional[str] = typer.Option(
            None, "--silo-column", help="--split: the column naming each row's silo "
            "(default: the schema's silo_column)"),
        sep: str = typer.Option("", "--sep", help="--split: the table's CSV separator "
                                "(default ,)"),
        encoding: str = typer.Option("", "--encoding", help="--split: the table's CSV "
                                     "text encoding (default utf-8)"),
        store_dir: Optional[Path] = typer.Option(
            None, "--store-dir", help="folder for each silo's lifetime budget store "
            "(<silo>.sqlite; default: each silo user's lifetime store, <silofl home>/stores/default.sqlite)"),
        address: str = typer.Option("127.0.0.1:9092", "--address", help="server host:port"),
        host: Optional[list[str]] = typer.Option(None, "--host",
                                                 help="extra server host name/IP for TLS"),
        method: str = typer.Option("mrmtl", "--method"),
        rounds: Optional[int] = typer.Option(
            None, "--rounds", help="default: the simulator's [training] rounds"),
        epsilon: float = typer.Option(1.0, "--epsilon", help="each silo's ε for this job"),
        delta: Optional[float] = typer.Option(
            None, "--delta", help="default: the simulator's [privacy] delta"),
        noise: str = typer.Option("secure", "--noise", help="secure | seeded (experiments)"),
        overwrite: bool = typer.Option(False, "--overwrite"),
        set_: Optional[list[str]] = typer.Option(
            None, "--set", help="a [job] setting KEY=VALUE (TOML value), e.g. clusters=3, "
            "we_user='Cleveland' (repeat)")):
    """Write server.toml, silo_<name>.toml, the consortium CA, the server's TLS certificate
    and each silo's signing key into one folder (one-machine demo; see README for how to
    spread it over institutions)."""
    from silofl.errors import ConfigError
    from silofl.config import check_privacy_target
    from silofl.config.input import toml_value
    from silofl.runtime.network import deploy
    try:
        # before anything is written
        check_privacy_target(epsilon, deploy.default_delta() if delta is None else delta, "--")
        job = {"method": method, **({} if rounds is None else {"rounds": rounds})}
        for item in set_ or []:  # --set key=value: the value read as TOML, else as text
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. clusters=3")
            job[key.strip()] = toml_value(value, value)
        written = deploy.init(out, silos=silo, demo=demo, address=address, hosts=host,
                              epsilon=epsilon, delta=delta, noise=noise, overwrite=overwrite,
                              job=job, regions=regions, schema=schema, tables=table,
                              split=split, silo_column=silo_column, store_dir=store_dir,
                              split_sep=sep, split_encoding=encoding)
    except SiloflError as e:
        _fail(e)
    t = Table(title=f"consortium in {escape(str(out))}")
    t.add_column("role")
    t.add_column("start with")
    t.add_row("server", f"silofl server --config {escape(written['server'])}")
    for name, path in written["silos"].items():
        t.add_row(escape(name), f"silofl silo --config {escape(path)}")
    console.print(t)
    console.print("certs/ca.key signs the server certificate: keep it offline in production.")
    if written.get("unnamed_rows"):
        err.print(f"[yellow]note:[/] {written['unnamed_rows']} row(s) of the --split table "
                  "have no silo name and were left out")
    for name, data in written.get("tables", {}).items():
        if data.startswith("<"):
            console.print(f"silo {escape(name)}: write the path of its own table under \\[data] "
                          f"path in {escape(written['silos'][name])}")
    if "flower" in written:  # Flower's SuperLink/SuperNode route (README: SecAgg+)
        console.print(f"Flower App for flower-superlink/flower-supernode/flwr run: "
                      f"{escape(written['flower']['app'])} (FLWR_HOME="
                      f"{escape(written['flower']['flower_home'])})")


@deploy_app.command("key")
def deploy_key(name: str = typer.Option(..., "--name", help="this silo's name"),
               out: Path = typer.Option(Path("."), "--out", help="folder (keys/ is created)")):
    """Make this silo's signing key pair at the silo: keys/<name>.key stays here, send only
    keys/<name>.pub to the coordinator (the server's [silos] table)."""
    from silofl.privacy.ledger import silo_file_id
    from silofl.runtime.network import deploy
    fid = silo_file_id(name)
    if (out / "keys" / f"{fid}.key").exists():
        _fail(SiloflError(f"{out / 'keys' / (fid + '.key')} exists; a silo's key is never "
                          "overwritten (move it away first if you really mean to replace it)"))
    priv, pub = deploy.write_silo_key(out, fid)
    console.print(f"private key {escape(str(priv))} (keep it here, mode 0600); public key "
                  f"{escape(str(pub))} (send it to the coordinator)")
    from silofl.runtime.network.flower_app import write_node_auth_key
    _, ssh_pub = write_node_auth_key(priv)  # the same key for SuperNode authentication
    console.print(f"SuperLink route: {escape(str(ssh_pub))} is what the coordinator "
                  "registers (flwr supernode register)")


@app.command("silo")
def silo_cmd(config: Path = typer.Option(..., "--config", help="this silo's silo.toml"),
             wait: float = typer.Option(120.0, "--wait",
                                        help="seconds to keep trying to reach the server")):
    """Run one silo: join the server, check every requested round against this silo's own
    budget store, train on its own data only, send back the update."""
    from silofl.runtime.network.flower import run_silo
    from silofl.runtime.network.silo import load_silo_config
    from silofl.runtime.network.silo_lock import hold
    with contextlib.ExitStack() as lock:
        try:
            cfg = load_silo_config(config)
            lock.enter_context(hold(cfg.state_dir, cfg.name))  # one process per silo state
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                program = run_silo(cfg, max_wait=wait)
        except SiloflError as e:
            _fail(e)
        _silo_report(program, cfg)


def _silo_report(program, cfg) -> None:
    """The silo's closing table and its saved model (under the state-folder lock)."""
    if program.job is None:
        _fail(SiloflError(f"silo {cfg.name!r} never received a job it accepted"))
    t = Table(title=f"silo {escape(cfg.name)}")
    for c in ("rounds run", "status", "test metric (local)", "store"):
        t.add_column(c)
    try:  # tabular: the default metric on its test rows; a region: AUPRC on its target
        value = program.evaluate()
        metric = f"{value:.4f}"
        silo = getattr(program, "silo", None)
        if program.job.get("data_kind", "table") != "graph" and silo is not None:
            # beside its baseline, as `silofl run` shows it: a one-class model is flagged
            from silofl.experiments.quality import silo_line
            from silofl.models.metrics import default_metric
            metric = silo_line(default_metric(program.job["task"]), value, silo.y_test)
    except SiloflError:  # nothing to score against (a region without its target file)
        metric = "n/a"
    status = "exhausted" if program.exhausted else "ok" if program.done else \
        "ran no round (not asked: rejected at join? see the server's log)"
    t.add_row(str(program.done), status,
              escape(metric), escape(str(cfg.budget_store)))
    console.print(t)
    _save_release("silo", program)


@app.command("server")
def server_cmd(config: Path = typer.Option(..., "--config", help="the job's server.toml")):
    """Run the server: join the registered silos, run the method's server step each round,
    checkpoint after each round (a restart resumes)."""
    from silofl.runtime.network.flower import run_server
    from silofl.runtime.network.server import load_server_config
    try:
        cfg = load_server_config(config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            program = run_server(cfg)
    except SiloflError as e:
        _fail(e)
    s = program.summary()
    t = Table(title=f"{escape(s['method'])}: {s['rounds_done']} round(s) done")
    for c in ("silo", "status", "rounds", "σ", "q", "steps/round"):
        t.add_column(c)
    for name, r in s["silos"].items():
        t.add_row(escape(name), r["status"], str(len(r["rounds"])), f"{r['sigma']:.4g}",
                  f"{r['q']:.4g}", str(r["steps"]))
    console.print(t)
    from silofl.experiments.atomic import write_json_atomic
    write_json_atomic(Path(cfg.state_dir) / "summary.json", s)
    _save_release("server", program)


def _save_release(role: str, program) -> None:
    """Save the released model (runtime/network/release) and say where it is."""
    from silofl.runtime.network import release
    try:
        where = (release.save_silo_release if role == "silo"
                 else release.save_server_release)(program)
    except SiloflError as e:
        err.print(f"[yellow]no model saved:[/] {escape(str(e))}")
        return
    if where is None:
        console.print(f"{escape(program.job['method'])} has no single shared model; the "
                      "silos saved their own")
        return
    who = program.cfg.name if role == "silo" else release.SHARED
    import shlex  # a command the user can paste: 'VA Long Beach' must stay one argument
    console.print(f"Saved the model to [bold]{escape(str(where))}[/]: silofl predict --run "
                  f"{escape(shlex.quote(str(where)))} --silo {escape(shlex.quote(who))} "
                  "--data <rows.csv> --out <preds.csv>")
# --- end networked runtime ------------------------------------------------------------


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
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        lines.append(f"{type(e).__module__}.{type(e).__qualname__} (message withheld)")
        for fr in traceback.extract_tb(e.__traceback__):
            lines.append(f"  {fr.filename}:{fr.lineno} in {fr.name}: {(fr.line or '').strip()}")
        e = e.__cause__ or e.__context__
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


from silofl.cli_help import escape_help  # noqa: E402
escape_help(app)  # "[budget] store" in a help text prints literally

if __name__ == "__main__":
    main()

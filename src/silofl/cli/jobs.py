"""Job commands that write a run directory: run, rank, erosion, ldp-compare, contrib."""

from __future__ import annotations

import warnings
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from silofl.cli.common import JobStore, Quiet, RunsOut, Scratch, SetItems, _job_config
from silofl.cli.root import _fail, _show_warning, app, console, err
from silofl.errors import SiloflError

# rich.progress is imported inside the commands that draw a bar: `silofl --help` and
# the other commands do not load it.


@app.command()
def run(config: Path | None = typer.Option(None, "--config", "-c",
                                              help="TOML config (default: built-in heart data)"),
        out: RunsOut = None,
        no_privacy: bool = typer.Option(False, "--no-privacy",
                                        help="train without DP (comparison only)"),
        store: Path | None = typer.Option(
            None, "--store", help="lifetime budget store (default: [budget] store, else "
            "the deployment's store <silofl home>/stores/<deployment>.sqlite)"),
        scratch: Scratch = False,
        resume: Path | None = typer.Option(None, "--resume", help=(
            "continue a killed run from its last checkpoint (its run directory; the config "
            "it started with is used)")),
        force_resume: bool = typer.Option(False, "--force-resume", help=(
            "resume although the run's owner is on another host (only when you know it is "
            "dead)")),
        quiet: Quiet = False,
        set_: list[str] | None = typer.Option(
            None, "--set", help="override a config key SECTION.KEY=VALUE (TOML value), e.g. "
            "training.rounds=5 or privacy.epsilon=0.5 (repeat; paths relative to the "
            "working directory; paths in the config file are relative to that file)")):
    """Train Local, FedAvg and MR-MTL (or the configured methods) at each silo's own
    privacy target and print a comparison table; writes a run directory."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from silofl.experiments.resume import resume_run
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
    _run_report(rep)


def _proxy_lines(rep) -> list[str]:
    """One line per method whose λ was chosen on a declared-public proxy (`mode = proxy`)."""
    out = []
    for r in rep.results:
        t = r.method.get("tuning") if isinstance(r.method, dict) else None
        if isinstance(t, dict) and t.get("mode") == "proxy":
            src = t.get("proxy_path") or t.get("proxy_source")
            out.append(f"{rep.label(r)}: λ = {t['chosen_lam']:g} chosen on the proxy {src}, "
                       "declared public by this config; the choice read no silo row and cost "
                       "the silos ε = 0")
    return out


def _run_report(rep) -> None:
    """What `silofl run` prints: results, quality warnings, the privacy table, the footer."""
    from silofl.experiments.report import (
        baseline_line,
        flamby_comparison,
        privacy_table,
        quality_lines,
        results_table,
    )
    from silofl.privacy.targets import ADJACENCY
    console.print(results_table(rep))
    if (bl := baseline_line(rep)) is not None:
        console.print(escape(bl))
    for line in quality_lines(rep):  # a useless model never looks fine
        console.print(f"[bold yellow]warning:[/] {escape(line)}")
    if (fl := flamby_comparison(rep)) is not None:  # built-in heart data only
        console.print(escape(fl))
    for line in _proxy_lines(rep):
        console.print(escape(line))
    if (pt := privacy_table(rep)) is not None:
        console.print(pt)
        if getattr(rep, "persons", None):  # person level: a person seen by m silos
            from silofl.experiments.person_report import person_table
            console.print(person_table(rep.persons))
        console.print(f"Adjacency: {escape(getattr(rep, 'adjacency', ADJACENCY))}. "
                      f"Noise: {rep.noise}. Budget store: "
                      f"{escape(rep.store_text() or '')}, run {rep.run_id}. "
                      "Assumed: silo sizes are public; per-round test metrics are not "
                      "privatized (privacy_report.json states every assumption).")
    else:
        console.print("No differential privacy: this run is for comparison only.")
    _job_footer(rep, "config.toml, history.json, ledgers/, models/ with a model card per silo, "
                "privacy_report.json, summary.json, metric_over_rounds.png" + (
                    ", alpha_over_rounds.png (Weight Erosion's α)" if any(
                        "alpha" in r.history.extra for r in rep.results) else ""))


def _job_footer(rep, files: str) -> None:
    """What every job command prints last: its notes (stderr) and its run directory."""
    for note in rep.notes():
        err.print(f"[bold yellow]note:[/] {escape(note)}")
    if rep.run_dir:
        console.print(f"Run directory: [bold]{escape(str(rep.run_dir))}[/] ({files})")


@app.command()
def rank(config: Path | None = typer.Option(None, "--config", "-c",
                                               help="TOML config: data, model, privacy"),
         user: str = typer.Option(..., "--user", help="the user silo u_0 (its name)"),
         top: int | None = typer.Option(None, "--top", help="select the K best silos"),
         threshold: float | None = typer.Option(
             None, "--threshold", help="select silos with transfer loss ≤ T"),
         out: RunsOut = None,
         store: JobStore = None,
         scratch: Scratch = False,
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
def erosion(config: Path | None = typer.Option(None, "--config", "-c",
                                                  help="TOML config: data, model, privacy"),
            users: str | None = typer.Option(None, "--users",
                                                help="'all': every silo as the user (default)"),
            user: list[str] | None = typer.Option(None, "--user", help=(
                "a user silo (its name); repeat for several")),
            out: RunsOut = None,
            store: JobStore = None,
            scratch: Scratch = False,
            contributions: bool | None = typer.Option(
                None, "--contributions/--no-contributions", help=(
                    "make each user's contribution report now (else later: silofl contrib; "
                    "default: [erosion] contributions, true)")),
            set_: SetItems = None):
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
    for col in ("user", "Global", "Weight Erosion", "Local", "majority", "final α (others)"):
        t.add_column(col, justify="left" if col in ("user", "final α (others)") else "right")
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
        from silofl.experiments.contribution_report import table as contribution_table
        for c in rep.contributions.values():
            console.print(contribution_table(c))
    _job_footer(rep, "erosion.json, erosion_<user>.png, contribution.html/.json, "
                "contribution_*_<user>.png, round_logs/, ledgers/, config.toml")


# --- PrivateKT vs local-DP baselines (silofl.experiments.ldp_compare) -----------------------
@app.command("ldp-compare")
def ldp_compare(config: Path | None = typer.Option(None, "--config", "-c", help=(
                    "TOML config (e.g. examples/privatekt_mnist_cpu.toml)")),
                out: Path = typer.Option(Path("runs/ldp-compare"), "--out",
                                         help="directory for comparison.json/.png"),
                store: Path | None = typer.Option(None, "--store", help=(
                    "lifetime budget store charged by all three jobs (default: a scratch "
                    "store per job: an experiment, not a release)"))):
    """PrivateKT, FedAvg with local DP on clipped updates and FedAvg with DP-SGD at the same
    per-round ε (training.ldp_epsilon): accuracy against rounds, cumulative ε per client."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

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
            ranking: Path | None = typer.Option(
                None, "--ranking", help="a `silofl rank` run directory (adds Ndoye ranks)"),
            out: Path | None = typer.Option(
                None, "--out", help="where to write the report (default: RUN_DIR)"),
            permutations: int = typer.Option(
                200, "--permutations", help="Monte-Carlo orders beyond --max-exact silos"),
            max_exact: int = typer.Option(
                10, "--max-exact", help="exact Shapley up to this many other silos"),
            seed: int = typer.Option(0, "--seed", help="seed of the Monte-Carlo orders"),
            quiet: Quiet = False):
    """Contribution report of a Weight Erosion run (per user: α over rounds, Ndoye rank,
    leave-one-out, Shapley), rebuilt from its released round logs and the user's own
    held-out rows: no training, nothing charged."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from silofl.experiments import contribution as C
    from silofl.experiments import contribution_report as CR
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
        html_path = CR.write_reports(out if out is not None else run_dir, reps)
    except SiloflError as e:
        _fail(e)
    for c in reps.values():
        console.print(CR.table(c))
    for note in dict.fromkeys(n for c in reps.values() for n in c.notes):
        err.print(f"[bold yellow]note:[/] {escape(note)}")
    console.print(f"Report: [bold]{escape(str(html_path))}[/] (contribution.json, "
                  "contribution_alpha_<user>.png, contribution_values_<user>.png)")

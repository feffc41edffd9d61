"""`silofl pandemic …`: the pandemic domain's commands (synth, train, audit, predict).

The only CLI module that reaches the pandemic domain, and only inside its commands: the
domain (and its numba/scikit-network extra) is imported when a pandemic command runs, never
by `silofl --help` or another command."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from silofl.cli.audit import _audit_footer
from silofl.cli.common import Quiet, Scratch
from silofl.cli.root import _fail, app, console, err
from silofl.errors import SiloflError

# rich.progress is imported inside the commands that draw a bar: `silofl --help` and
# the other commands do not load it.


def _cli_store(store: Path | None, scratch: bool):
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
                          "scikit-network); install it with: pip install -e "
                          "'.[pandemic]'") from None

pandemic_app = typer.Typer(help="Pandemic forecasting (US/UK PETs challenge schema).")
app.add_typer(pandemic_app, name="pandemic")


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
                  "the final week "
                  f"{st.get('final_window_new_infection_fraction', float('nan')):.2%}")


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
    `pandemic.tuning.check_setting` before anything is read or reserved)."""
    from silofl.config import TuningConfig
    from silofl.errors import ConfigError
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
    from silofl.pandemic.tuning import check_setting
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
                   store: Path | None = typer.Option(None, "--store", help=(
                       "lifetime budget store (SQLite): runs on the same data compose "
                       "(default: <silofl home>/stores/default.sqlite)")),
                   scratch: Scratch = False,
                   method: str = typer.Option("mrmtl", "--method", help=(
                       "federated algorithm on the core engine: mrmtl, local, fedavg, "
                       "finetune, ditto, mocha (--lam is its λ), ifca, ifca_local, "
                       "ifca_finetune, ifca_mrmtl or weight_erosion")),
                   clusters: int = typer.Option(2, "--clusters", help=(
                       "the IFCA family: number of cluster models (≤ regions)")),
                   we_user: str | None = typer.Option(None, "--we-user", help=(
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
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    st = None
    try:
        _need_pandemic_extra()
        from silofl.pandemic import read_dataset
        from silofl.pandemic.pipeline import train
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
    _pandemic_train_report(pm, model_dir)


def _pandemic_train_report(pm, model_dir: Path) -> None:
    """What `pandemic train` prints: the node-level privacy per region (or that there is
    none), tuning and cluster selections, assumptions, notes, where the model is."""
    from silofl.pandemic.charges import SIZES_ASSUMPTION
    from silofl.privacy.node_level import ADJACENCY_TEXT, PRUNING_ASSUMPTION
    from silofl.runtime.plan import SEEDED_NOTE
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


# --- node-level privacy audit of the pandemic pipeline (silofl.pandemic.audit) -----------
@pandemic_app.command("audit")
def pandemic_audit(data: Path = typer.Option(..., "--data", help="directory of the 7 inputs"),
                   region: str | None = typer.Option(
                       None, "--region", help="region audited, e.g. region-51001 or 51001 "
                       "(default: the first)"),
                   kind: str = typer.Option("one-run", "--kind", help="one-run | multi-run"),
                   view: str | None = typer.Option(
                       None, "--view", help="white-box (= server: Dirac node canaries in "
                       "the server's view; one-run default) | black-box (= model: canary "
                       "persons scored by their loss; multi-run default)"),
                   canaries: int | None = typer.Option(
                       None, "--canaries", help="one-run: white-box canaries (default "
                       "1000) or black-box canary persons (default min(200, region "
                       "size)); multi-run: 1"),
                   contacts: int = typer.Option(5, "--contacts",
                                                help="black-box: home contacts per "
                                                "canary person (≤ S-1)"),
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
                   store: Path | None = typer.Option(None, "--store", help=(
                       "lifetime budget store charged by a one-run audit (default: "
                       "<silofl home>/stores/default.sqlite)")),
                   scratch: bool = typer.Option(False, "--scratch", help=(
                       "charge an in-memory scratch budget (required for multi-run)")),
                   quiet: Quiet = False):
    """Audit node-level DP of `pandemic train`: the region's claimed ε beside an empirical
    lower bound (exit 3 on a violation). The one-run audit trains once (charged to
    --store, or --scratch), by default white box: Dirac node canaries in the server's view;
    multi-run (black box, canary persons) needs --scratch."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    st = None
    try:
        _need_pandemic_extra()
        from silofl.audit import write_audit
        from silofl.errors import ConfigError
        from silofl.pandemic import read_dataset
        from silofl.pandemic.audit import audit_pandemic
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
                                 store=st, view=view, on_progress=lambda d, t: prog.update(
                                     task, completed=d, total=t),
                                 # a seeded experiment reproduces its canaries and coins too
                                 seed=seed if noise == "seeded" else None)
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

"""The networked runtime's commands: deploy init/key, silo, server."""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from silofl.cli.root import _fail, app, console, err
from silofl.errors import SiloflError

deploy_app = typer.Typer(help="Set up a consortium: per-silo configs, TLS and signing keys.")
app.add_typer(deploy_app, name="deploy")


@deploy_app.command("init")
def deploy_init(
        out: Path = typer.Option(..., "--out", help="folder to create (must be new or empty)"),
        silo: list[str] | None = typer.Option(None, "--silo", help="a silo name (repeat)"),
        demo: str | None = typer.Option(None, "--demo",
                                           help="'heart': write each hospital's own data"),
        regions: Path | None = typer.Option(
            None, "--regions", help="a pandemic dataset folder (the 7 challenge files): one "
            "silo per region, each with its own folder; graph job (--set S=20, pooling=…)"),
        schema: Path | None = typer.Option(
            None, "--schema", help="the consortium's declared schema (TOML): each silo gets "
            "its own folder and reads its own table with it"),
        table: list[str] | None = typer.Option(
            None, "--table", help="NAME=PATH: silo NAME's own table (repeat; default: a "
            "placeholder in its silo.toml to fill in)"),
        split: Path | None = typer.Option(
            None, "--split", help="one-machine demo: a table with a silo column, cut into "
            "one CSV per silo folder"),
        silo_column: str | None = typer.Option(
            None, "--silo-column", help="--split: the column naming each row's silo "
            "(default: the schema's silo_column)"),
        sep: str = typer.Option("", "--sep", help="--split: the table's CSV separator "
                                "(default ,)"),
        encoding: str = typer.Option("", "--encoding", help="--split: the table's CSV "
                                     "text encoding (default utf-8)"),
        store_dir: Path | None = typer.Option(
            None, "--store-dir", help="folder for each silo's lifetime budget store "
            "(<silo>.sqlite; default: each silo user's lifetime store, "
            "<silofl home>/stores/default.sqlite)"),
        address: str = typer.Option("127.0.0.1:9092", "--address", help="server host:port"),
        host: list[str] | None = typer.Option(None, "--host",
                                                 help="extra server host name/IP for TLS"),
        method: str = typer.Option("mrmtl", "--method"),
        rounds: int | None = typer.Option(
            None, "--rounds", help="default: the simulator's [training] rounds"),
        epsilon: float = typer.Option(1.0, "--epsilon", help="each silo's ε for this job"),
        delta: float | None = typer.Option(
            None, "--delta", help="default: the simulator's [privacy] delta"),
        noise: str = typer.Option("secure", "--noise", help="secure | seeded (experiments)"),
        overwrite: bool = typer.Option(False, "--overwrite"),
        set_: list[str] | None = typer.Option(
            None, "--set", help="a [job] setting KEY=VALUE (TOML value), e.g. clusters=3, "
            "we_user='Cleveland' (repeat)")):
    """Write server.toml, silo_<name>.toml, the consortium CA, the server's TLS certificate
    and each silo's signing key into one folder (one-machine demo; see README for how to
    spread it over institutions)."""
    from silofl.config import check_privacy_target
    from silofl.config.input import toml_value
    from silofl.errors import ConfigError
    from silofl.runtime.network import consortium, deploy
    try:
        # before anything is written
        check_privacy_target(epsilon, deploy.default_delta() if delta is None else delta, "--")
        job = {"method": method, **({} if rounds is None else {"rounds": rounds})}
        for item in set_ or []:  # --set key=value: the value read as TOML, else as text
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. clusters=3")
            job[key.strip()] = toml_value(value, value)
        written = consortium.init(out, silos=silo, demo=demo, address=address, hosts=host,
                              epsilon=epsilon, delta=delta, noise=noise, overwrite=overwrite,
                              job=job, regions=regions, schema=schema, tables=table,
                              split=split, silo_column=silo_column, store_dir=store_dir,
                              split_sep=sep, split_encoding=encoding)
    except SiloflError as e:
        _fail(e)
    _deploy_report(out, written)


def _deploy_report(out: Path, written: dict) -> None:
    """What `deploy init` prints: how to start each role, and what is left to fill in."""
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
                      f"{escape(written['flower']['flower_home'])}); start each SuperNode "
                      "as `python -m silofl.runtime.network.supernode --poll-interval 0.05 "
                      "<flower-supernode args>` (Flower's own polls every 3 s), and optionally its "
                      "worker `silofl silo-worker --config "
                      "<silo.toml>`")


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
    from silofl.runtime.network.silo_config import load_silo_config
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


@app.command("silo-worker")
def silo_worker_cmd(config: Path = typer.Option(..., "--config", help="this silo's silo.toml")):
    """Serve this silo's Flower ClientApp messages from one long-lived process (optional):
    the per-message ClientApp forwards over a 0600 socket in the silo's state folder and
    skips the silo program's imports; same handler, charges reserved before any read, state
    on disk (stopping the worker loses nothing)."""
    from silofl.runtime.network.silo_worker import main as worker_main
    worker_main(["--config", str(config)])


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
    unit = "per person" if s.get("privacy_unit") == "person" else "per row"
    t = Table(title=f"{escape(s['method'])}: {s['rounds_done']} round(s) done "
                    f"(each silo's DP {unit})")
    for c in ("silo", "status", "rounds", "σ", "q", "steps/round"):
        t.add_column(c)
    for name, r in s["silos"].items():
        t.add_row(escape(name), r["status"], str(len(r["rounds"])), f"{r['sigma']:.4g}",
                  f"{r['q']:.4g}", str(r["steps"]))
    console.print(t)
    from silofl.io import write_json_atomic
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
    if program.job["method"] == "dp_gbdt":  # trees: their own files, not a `predict` run
        console.print(f"Saved the trees to [bold]{escape(str(where))}[/] (gbdt*.json; "
                      "XGBoost's format: gbdt*.xgboost.json; the privacy report: "
                      "gbdt*-privacy.json)")
        return
    who = program.cfg.name if role == "silo" else release.SHARED
    import shlex  # a command the user can paste: 'VA Long Beach' must stay one argument
    console.print(f"Saved the model to [bold]{escape(str(where))}[/]: silofl predict --run "
                  f"{escape(shlex.quote(str(where)))} --silo {escape(shlex.quote(who))} "
                  "--data <rows.csv> --out <preds.csv>")

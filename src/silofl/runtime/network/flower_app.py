"""Flower's own deployment route: a Flower App (ServerApp + ClientApp) run by
`flower-superlink` / `flower-supernode` / `flwr run`, optionally with SecAgg+.

The default deployment. Same programs as the legacy fast path (`flower.py`): the ServerApp
drives `server.ServerProgram` through `flower.SiloflStrategy` under Flower's
`DefaultWorkflow`, polling for replies every `[server] poll_interval` seconds
(`PollingGrid`); the ClientApp (`clientapp.client_app`, a module of its own so that the
process SuperNode starts per message imports nothing of the server's) wraps
`silo.SiloProgram` in `clientapp.SiloClient`. There is no second algorithm implementation
here, only transport. At the end the server saves its shared model as `silofl server`
does (`release.save_server_release`); each silo saves its own after its last round.

* The ClientApp reads its silo.toml from the SuperNode's `--node-config
  'silo-config="/path/silo.toml"'`: its own data, (ε_k, δ_k), budget store, state and
  signing key. SuperNode starts a fresh ClientApp process per message, so the accepted
  (public) job description is kept in the run's `Context.state` and re-accepted from the
  silo's own state on disk before each round — the silo's checks and its store are the
  same as on the legacy route. `require-secagg=true` in the node config makes the silo
  refuse any round that is not SecAgg+-masked.
* The ServerApp reads server.toml from the run config (`server-config`). With
  `secagg = true` (FedAvg, MR-MTL) the fit round is Flower's `SecAggPlusWorkflow`: each
  silo's update is quantized, masked and summed; the server unmasks only the weighted
  mean (settings and extra error: `secagg`). Join and round replies stay signed by each
  silo's key (round replies over their fields only, not the update's hash); the masked
  updates themselves cannot be checked individually (the server never sees them): who may
  send them is enforced by SuperNode authentication.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from pathlib import Path

import numpy as np
from flwr.app import Context, Error, Message, RecordDict
from flwr.common import parameters_to_ndarrays
from flwr.server import LegacyContext, ServerApp
from flwr.server import ServerConfig as FlowerServerConfig
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid

from silofl.errors import ConfigError, SiloflError
from silofl.io import write_json_atomic
from silofl.runtime.network import messages as W
from silofl.runtime.network import secagg as S
from silofl.runtime.network.clientapp import client_app
from silofl.runtime.network.flower import SiloflStrategy
from silofl.runtime.network.hosting import consortium_method
from silofl.runtime.network.server import ServerProgram, load_server_config

log = logging.getLogger("flwr.silofl")


# --- server (SuperLink side) ----------------------------------------------------------

class SecAggStrategy(SiloflStrategy):
    """`SiloflStrategy` whose round is a SecAgg+ sum: sets the workflow's public settings
    for the silos asked, and runs the server step on the unmasked weighted mean."""

    def __init__(self, program: ServerProgram, workflow: SecAggPlusWorkflow):
        super().__init__(program)
        self.workflow = workflow
        self.asked: list[str] = []  # the silos of the round under way

    def configure_fit(self, server_round, parameters, client_manager):
        ins = super().configure_fit(server_round, parameters, client_manager)
        regs = [self.p.silos[self.names[proxy.cid]] for proxy, _ in ins]
        if len(regs) < 2:
            raise SiloflError(f"round {self.p.done + 1}: SecAgg+ needs at least 2 silos, "
                              f"{len(regs)} available; stopping (checkpointed)")
        S.check_capacity(len(regs))
        job, wf = self.p.job, self.workflow
        self.asked = [r.name for r in regs]
        if consortium_method(self.p.algorithm):  # ULDP: the unweighted sum of all K shares
            self._uldp_settings(regs)
            return ins
        wf.clipping_range = S.clipping_range([vars(r) for r in regs], job["lr"], job["clip"],
                                             job["rounds"], job["method"])
        wf.max_weight = S.max_weight([r.n_train if job["weighted"] else 1.0 for r in regs])
        wf.reconstruction_threshold = S.reconstruction_threshold(len(regs))
        return ins

    def _uldp_settings(self, regs: list) -> None:
        """ULDP's SecAgg+ settings: every silo in the sum (threshold K), weight 1 each, the
        range of a share (`secagg.share_range`) from public join replies and the job."""
        K, alg, job = len(self.p.names), self.p.algorithm, self.p.job
        if len(regs) != K:
            raise SiloflError(f"round {self.p.done + 1}: uldp needs all {K} silos in the sum, "
                              f"{len(regs)} available; stopping (checkpointed)")
        wf = self.workflow
        wf.clipping_range = S.share_range([r.n_train for r in regs], job["clip"],
                                          self.p.consortium_sigma(), K, alg.m)
        wf.max_weight = 1.0
        wf.reconstruction_threshold = S.uldp_threshold(K)

    def aggregate_fit(self, server_round, results, failures):
        t = self.p.done + 1
        names = []
        for proxy, res in results:
            name = self.names.get(proxy.cid)
            try:
                rep = W.check_fields(dict(res.metrics), W.ROUND_REPLY, "update")
                if name is None or rep["silo"] != name or rep["round"] != t or \
                        rep["job_hash"] != self.p.hash or rep["status"] != "ok":
                    raise W.ProtocolError(f"reply of {name!r} does not match round {t}")
                W.verify(self.p.keys[name], rep, None)   # signed by that silo's key
            except W.ProtocolError as e:   # its masked vector is already in the sum
                raise SiloflError(f"round {t}: the SecAgg+ sum includes a reply that fails "
                                  f"the checks ({e}); a masked sum cannot be split, the run "
                                  f"stops (checkpointed after round {self.p.done})") from None
            names.append(name)
        for name in set(self.asked) - set(names):   # dropped out: re-join next round
            for cid in [c for c, n in self.names.items() if n == name]:
                del self.names[cid]
            log.warning("round %d: silo %s left the SecAgg+ round; it is asked to re-join",
                        t, name)
        mean = None
        if results:
            mean = np.asarray(parameters_to_ndarrays(results[0][1].parameters)[0],
                              dtype=np.float64).reshape(1, -1)
        self.p.step(t, {n: None for n in names}, mean=mean)
        log.info("round %d done with SecAgg+ over %d silo(s): %s (clipping range %.4g)", t,
                 len(names), ", ".join(sorted(names)), self.workflow.clipping_range)
        return None, {}


class PollingGrid(Grid):
    """A ServerApp's grid whose `send_and_receive` polls for replies every `interval`
    seconds (flwr 1.41's own loop sleeps a fixed 3 s between polls, which is most of a
    round's overhead on this route). Pushes and pulls through the wrapped grid's public
    `push_messages` / `pull_messages`; everything else is the wrapped grid's."""

    def __init__(self, grid: Grid, interval: float):
        self.grid, self.interval = grid, float(interval)

    def __getattr__(self, name):
        return getattr(self.grid, name)

    def set_run(self, run):
        self.grid.set_run(run)

    @property
    def run(self):
        return self.grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self):
        return self.grid.get_node_ids()

    def push_messages(self, messages):
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids):
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages, *, timeout=None):
        waiting = set(self.push_messages(messages))
        end = None if timeout is None else time.monotonic() + timeout
        replies: list = []
        while waiting and (end is None or time.monotonic() < end):
            got = list(self.pull_messages(waiting))
            replies.extend(got)
            waiting -= {m.metadata.reply_to_message_id for m in got}
            if waiting:
                time.sleep(self.interval)  # a poll interval, not a synchronisation
        return replies


def run_server_app(grid, context: Context) -> ServerProgram:
    """The ServerApp body: serve the remaining rounds of server.toml's job (resuming from
    its checkpoint); writes `<state_dir>/summary.json`."""
    path = context.run_config.get("server-config")
    if not path:
        raise ConfigError("run config has no server-config; pass --run-config "
                          "'server-config=\"/path/to/server.toml\"' to flwr run")
    cfg = load_server_config(str(path))
    if not isinstance(grid, LoopbackGrid):  # the in-process grid answers at once
        grid = PollingGrid(grid, cfg.poll_interval)
    program = ServerProgram(cfg)
    remaining = program.rounds - program.done
    if remaining > 0:
        workflow = None
        strategy = SiloflStrategy(program)
        if cfg.secagg:
            # all silos share with all (num_shares 1.0); the majority threshold is set per
            # round for the silos asked (SecAggStrategy.configure_fit)
            workflow = SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=0.5,
                                          timeout=cfg.round_timeout)
            strategy = SecAggStrategy(program, workflow)
        legacy = LegacyContext(context, config=FlowerServerConfig(
            num_rounds=remaining, round_timeout=cfg.round_timeout), strategy=strategy)
        DefaultWorkflow(fit_workflow=workflow)(grid, legacy)
    Path(cfg.state_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(cfg.state_dir) / "summary.json",
                      {**program.summary(), "secagg": cfg.secagg})
    save_shared_model(program)
    return program


def save_shared_model(program: ServerProgram) -> Path | None:
    """The server's shared model and card, as `silofl server` saves them
    (`release.save_server_release`); None when the method has none or nothing is saved."""
    from silofl.runtime.network import release
    try:
        where = release.save_server_release(program)
    except ConfigError as e:
        log.warning("no shared model saved: %s", e)
        return None
    if where is not None:
        log.info("saved the shared model to %s", where)
    return where


server_app = ServerApp()


@server_app.main()
def _server_main(grid, context: Context) -> None:
    run_server_app(grid, context)


# --- in-process transport (tests, benchmarks of the protocol without process start-up) ---

class _Run:
    run_id = 1


_DELIVERY = threading.Lock()


class LoopbackGrid(Grid):
    """For tests and benchmarks: delivers each message to `client_app` in this process,
    one persistent Context per node (as a SuperNode keeps it); a ClientApp exception
    becomes an error reply (as a SuperNode reports it). No network, no isolation."""

    def __init__(self, node_configs: dict[int, dict]):  # node id → its --node-config
        from flwr.supercore.task_identity import TaskIdentity
        # what the SuperLink sets for a ServerApp process
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        self.contexts = {nid: Context(run_id=1, node_id=nid, node_config=cfg,
                                      state=RecordDict(), run_config={})
                         for nid, cfg in node_configs.items()}

    def set_run(self, run):
        pass

    @property
    def run(self):
        return _Run()

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        with _DELIVERY:  # one message at a time, as one process (parallel joins queue here)
            return self._deliver(messages)

    def _deliver(self, messages):
        out = []
        for m in messages:
            try:
                # a copy, as if serialized: the ClientApp must not touch the server's objects
                out.append(client_app(copy.deepcopy(m), self.contexts[m.metadata.dst_node_id]))
            except Exception as e:  # the SuperNode reports a ClientApp exception
                out.append(Message(Error(code=1, reason=str(e)), reply_to=m))
        return out


# --- what `silofl deploy init` writes for this route ------------------------------------

# two entry modules: the ClientApp process (one per message) imports only the light client
# module, never the ServerApp's (flower_app, server, accounting) imports. An assignment,
# not a bare import: `flwr run` checks the attribute by reading the module's assignments
CLIENT_SHIM = '''"""Flower ClientApp of this consortium (silofl)."""
from silofl.runtime.network import clientapp as _app

client_app = _app.client_app
'''
SERVER_SHIM = '''"""Flower ServerApp of this consortium (silofl)."""
from silofl.runtime.network import flower_app as _app

server_app = _app.server_app
'''


def write_app(out: Path, server_toml: Path, address: str, insecure: bool) -> dict:
    """Write `<out>/flower_app/` (pyproject + entry-point shim for `flwr run`) and
    `<out>/flower_home/config.toml` (the SuperLink connection for the `flwr` CLI)."""
    from silofl.io import write_text_atomic
    out = Path(out).resolve()
    app, home = out / "flower_app", out / "flower_home"
    for folder in (app, home):
        folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(app / "pyproject.toml", f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "silofl-consortium"
version = "1.0.0"
description = "silofl networked runtime (ServerApp + ClientApp)"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "silofl"

[tool.flwr.app.components]
serverapp = "silofl_server:server_app"
clientapp = "silofl_client:client_app"

[tool.flwr.app.config]
server-config = "{Path(server_toml).resolve()}"
""")
    write_text_atomic(app / "silofl_client.py", CLIENT_SHIM)
    write_text_atomic(app / "silofl_server.py", SERVER_SHIM)
    tls = "insecure = true" if insecure else f'root-certificates = "{out / "certs" / "ca.pem"}"'
    write_text_atomic(home / "config.toml", f"""[superlink]
default = "consortium"

[superlink.consortium]
address = "{address}"
{tls}
""")
    return {"app": str(app), "flower_home": str(home)}


def write_node_auth_key(private_pem: Path) -> tuple[Path, Path]:
    """The silo's signing key also as OpenSSH files for SuperNode authentication
    (`flower-supernode --auth-supernode-private-key`, `flwr supernode register`)."""
    from cryptography.hazmat.primitives import serialization as ser

    from silofl.io import write_bytes_atomic
    key = W.load_private_key(private_pem)
    priv, pub = Path(private_pem).with_suffix(".ssh"), Path(private_pem).with_suffix(".ssh.pub")
    write_bytes_atomic(priv, key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH,
                                               ser.NoEncryption()))
    priv.chmod(0o600)
    write_bytes_atomic(pub, key.public_key().public_bytes(ser.Encoding.OpenSSH,
                                                          ser.PublicFormat.OpenSSH))
    return priv, pub


# --- one-machine demo: SuperLink + one SuperNode per silo + `flwr run` ------------------

#: Poll intervals of flwr 1.41's SuperLink route (README "Poll intervals"):
#: * ServerApp waiting for replies: [server] poll_interval in server.toml (`PollingGrid`;
#:   flwr's own loop: a fixed 3 s);
#: * SuperExec starting a waiting task's ClientApp/ServerApp process: this environment
#:   variable (flwr: 1 s, range 0.01..60), set for superlink/supernode by `local_commands`;
#: * SuperNode pulling its next message when it has none (flwr: a fixed 3 s) and waiting
#:   for its ClientApp's reply (flwr: 0.5 s): `--poll-interval` of the launcher
#:   `python -m silofl.runtime.network.supernode` (`supernode.py`), which `local_commands`
#:   uses in place of `flower-supernode`.
SUPEREXEC_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
SUPEREXEC_POLL_S = 0.05
SUPERNODE_LAUNCHER = "silofl.runtime.network.supernode"

def local_commands(out: Path, silo_configs: dict[str, str], port: int, *,
                   node_auth: bool = True, bin_dir: str | None = None,
                   task_poll: float = SUPEREXEC_POLL_S,
                   node_poll: float | None = None) -> dict:
    """The exact commands of a one-machine deployment of `silofl deploy init`'s folder
    `out` (TLS with its CA; SuperNode authentication with each silo's OpenSSH key):
    {"superlink": argv, "register": [argv], "supernodes": {silo: argv}, "run": argv,
    "env": {name: value}, "workers": {silo: argv}} ("workers": optional per-silo
    `silo_worker` processes; the ClientApp forwards to a running one). Run them with env
    FLWR_HOME=<out>/flower_home and "env" (the
    SuperExec's task poll interval, `task_poll` seconds: how soon a SuperNode/SuperLink
    starts the ClientApp/ServerApp process of a waiting task; flwr's default is 1 s).
    Each SuperNode runs through the launcher `python -m silofl.runtime.network.supernode
    --poll-interval <node_poll>` (default `supernode.DEFAULT_POLL_S`; Flower's own
    `flower-supernode` polls every 3 s when idle); the interpreter is `bin_dir`'s python,
    else this one.
    Multi-machine: the same commands, with the SuperLink's host in place of 127.0.0.1
    (and in `deploy init --address`)."""
    import sys
    import tomllib

    from silofl.runtime.network.supernode import DEFAULT_POLL_S
    out = Path(out).resolve()
    b = (lambda n: str(Path(bin_dir) / n)) if bin_dir else (lambda n: n)  # noqa: E731
    node = [b("python") if bin_dir else sys.executable, "-m", SUPERNODE_LAUNCHER,
            "--poll-interval", f"{DEFAULT_POLL_S if node_poll is None else node_poll:g}"]
    certs = out / "certs"
    link = [b("flower-superlink"), "--ssl-ca-certfile", str(certs / "ca.pem"),
            "--ssl-certfile", str(certs / "server.pem"), "--ssl-keyfile",
            str(certs / "server.key"), "--port", str(port),
            "--disable-runtime-dependency-installation"]
    if node_auth:
        link.append("--enable-supernode-auth")
    register, nodes, workers = [], {}, {}
    for i, (name, cfg) in enumerate(sorted(silo_configs.items())):
        key = Path(tomllib.loads(Path(cfg).read_text())["silo"]["private_key"])
        key = (Path(cfg).parent / key).with_suffix(".ssh")
        if node_auth:
            register.append([b("flwr"), "supernode", "register", str(key) + ".pub",
                             "consortium"])
        nodes[name] = [*node, "--root-certificates", str(certs / "ca.pem"),
                       "--superlink", f"127.0.0.1:{port}", "--port", str(port + 1 + i),
                       "--node-config", f'silo-config="{Path(cfg).resolve()}"'] + (
            ["--auth-supernode-private-key", str(key)] if node_auth else [])
        workers[name] = [node[0], "-m", "silofl.runtime.network.silo_worker", "--config",
                         str(Path(cfg).resolve())]
    run = [b("flwr"), "run", str(out / "flower_app"), "consortium", "--stream"]
    env = {SUPEREXEC_POLL_ENV: f"{task_poll:g}"}
    return {"superlink": link, "register": register, "supernodes": nodes, "run": run,
            "env": env, "workers": workers}

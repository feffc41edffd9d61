"""Flower's SuperLink/SuperNode route (runtime/network/flower_app) and SecAgg+ on it.

Function level: the ServerApp body (`run_server_app`, Flower's DefaultWorkflow and
SecAggPlusWorkflow) and the ClientApp (`client_app`, with Flower's `secaggplus_mod`) talk
through `flower_app.LoopbackGrid`, a Grid that hands each (copied) message to the ClientApp
in this process with that SuperNode's own Context — the real protocol code, without
process start-up.
End to end: one run of real `flower-superlink` + `flower-supernode` processes on 127.0.0.1
with TLS and SuperNode authentication, and an unregistered SuperNode that cannot join.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
import time
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict  # noqa: E402

from silofl.errors import ConfigError, SiloflError  # noqa: E402
from silofl.privacy import events  # noqa: E402
from silofl.privacy.budget import BudgetStore  # noqa: E402
from silofl.runtime.network import consortium as network_init  # noqa: E402
from silofl.runtime.network import deploy, flower_app, silo_worker
from silofl.runtime.network import secagg as S
from silofl.runtime.network.server import load_server_config  # noqa: E402

JOB = {"rounds": 1, "lr": 0.1, "batch_size": 16, "local_epochs": 0.5, "lam": 0.5}
BIN = Path(sys.executable).parent


def consortium(tmp: Path, method: str, secagg: bool, port: int = 9092, rounds: int = 1):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = network_init.init(tmp, demo="heart", noise="seeded", address=f"127.0.0.1:{port}",
                        job={**JOB, "method": method, "rounds": rounds})
    raw = tomllib.loads((tmp / "server.toml").read_text())
    raw["server"].update(secagg=secagg, join_timeout=20.0)
    (tmp / "server.toml").write_text(deploy._toml(raw))
    return w


def run_loopback(tmp: Path, method: str, secagg: bool, require: bool = False):
    w = consortium(tmp, method, secagg)
    nodes = {100 + i: {"silo-config": str(p), **({"require-secagg": True} if require else {})}
             for i, p in enumerate(sorted(w["silos"].values()))}
    grid = flower_app.LoopbackGrid(nodes)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                  run_config={"server-config": str(tmp / "server.toml")})
    return flower_app.run_server_app(grid, ctx), w


def deploy_silos(folder: Path) -> dict[str, Path]:
    return {tomllib.loads(p.read_text())["silo"]["name"]: p for p in folder.glob("silo_*.toml")}


def charged_steps(cfg, name: str) -> int:
    """DP-SGD steps charged in silo `name`'s own store (0 when it holds none)."""
    silo = tomllib.loads(Path(cfg).read_text())["silo"]
    path = Path(cfg).parent / silo["budget_store"]
    if not path.exists():
        return 0
    with BudgetStore(path) as store:
        rows = store.charges(name)
    return sum(c * r["count"] for r in rows
               for c in events.flatten(events.from_json(r["event"])).values())


def _spy_on_flower_quantization(monkeypatch) -> dict:
    """Record, inside Flower's `secaggplus_mod`, what each silo really quantized: the
    weight factor r_k it multiplied by, the clipping range c and levels Q it used, and the
    largest |r_k u_k| it fed in. (Flower's own values, not silofl's statement of them.)"""
    mod = importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
    seen = {"ratio": [], "c": [], "Q": [], "max_abs": []}
    quantize, multiply = mod.quantize, mod.parameters_multiply

    def spy_multiply(params, factor):
        seen["ratio"].append(float(factor))
        return multiply(params, factor)

    def spy_quantize(params, clipping_range, target_range):
        seen["c"].append(float(clipping_range))
        seen["Q"].append(int(target_range))
        seen["max_abs"].append(max(float(np.abs(a).max()) for a in params))
        return quantize(params, clipping_range, target_range)

    monkeypatch.setattr(mod, "parameters_multiply", spy_multiply)
    monkeypatch.setattr(mod, "quantize", spy_quantize)
    return seen


def _quantization_error_bound(seen: dict) -> float:
    """Per-coordinate bound on |SecAgg+ weighted mean − exact weighted mean|, derived from
    Flower's quantization (flwr.common.secure_aggregation.quantization), independently of
    silofl's `secagg.mean_error_bound`:

    * silo k sends round_stoch((r_k u_k + c) · Q / 2c): off by < 1 level = 2c/Q, and the
      server divides the unmasked sum by Σ r_k: at most K · 2c / (Q Σ r_k);
    * r_k = round(w_k / w_max · Q) / Q is off by ≤ 1/(2Q) from the exact weight ratio, which
      moves a weighted mean of values |u| ≤ U by at most Σ_k (1/(2Q)) · 2U / Σ r_k = K U /(Q Σ r_k).
    Valid only without clipping (every |r_k u_k| ≤ c), which the caller checks."""
    K, c, Q = len(seen["ratio"]), seen["c"][0], seen["Q"][0]
    total = sum(seen["ratio"])
    U = max(m / r for m, r in zip(seen["max_abs"], seen["ratio"]))
    return K * (2.0 * c + U) / (Q * total)


@pytest.mark.parametrize("method", ["fedavg", "mrmtl"])
def test_secagg_mean_equals_plain_mean_within_stated_error(tmp_path, method, monkeypatch):
    plain, _ = run_loopback(tmp_path / "plain", method, secagg=False)
    seen = _spy_on_flower_quantization(monkeypatch)
    masked, w = run_loopback(tmp_path / "secagg", method, secagg=True)
    assert plain.done == masked.done == 1
    K = len(masked.silos)
    assert len(seen["ratio"]) == len(seen["c"]) == K  # every silo quantized, once
    assert len(set(seen["c"])) == 1 and len(set(seen["Q"])) == 1
    assert max(seen["max_abs"]) <= seen["c"][0]   # no coordinate clipped (else: a bias)
    assert sum(seen["ratio"]) >= 1.0 - 1e-12        # the largest silo's weight ratio is 1
    bound = _quantization_error_bound(seen)
    # same seeded batches and noise: the only difference is SecAgg+'s quantization
    diff = np.abs(plain.server.params - masked.server.params)
    assert diff.max() <= bound, (diff.max(), bound)
    assert diff.max() > 0  # the sum really went through masking/quantization
    assert np.abs(plain.server.params).max() > 100 * bound  # the check has teeth
    # the error silofl states (README, secagg.mean_error_bound) covers the derived one
    regs = list(masked.silos.values())
    c = S.clipping_range([vars(r) for r in regs], masked.job["lr"], masked.job["clip"],
                         masked.job["rounds"], method)
    assert c == seen["c"][0] and S.mean_error_bound(K, c) >= bound
    summary = json.loads((Path(w["server"]).parent / "state/server/summary.json").read_text())
    assert summary["secagg"] and all(s["rounds"] == [1] for s in summary["silos"].values())
    # each silo charged exactly the round it ran (its DP-SGD steps), in its own store
    for name, cfg in w["silos"].items():
        assert charged_steps(cfg, name) == masked.silos[name].steps > 0


def test_secagg_round_goes_on_when_a_silo_is_exhausted(tmp_path):
    """A silo whose lifetime budget covers one of two rounds fails its second masked
    round before anything is charged; SecAgg+ removes it from the sum, the others finish."""
    w = consortium(tmp_path / "c", "fedavg", secagg=True, rounds=2)
    small = sorted(w["silos"])[0]
    raw = tomllib.loads(Path(w["silos"][small]).read_text())
    raw["silo"]["lifetime_epsilon"] = 0.85 * raw["silo"]["epsilon"]
    Path(w["silos"][small]).write_text(deploy._toml(raw))
    raw = tomllib.loads((tmp_path / "c" / "server.toml").read_text())
    raw["server"]["min_silos"] = 3
    (tmp_path / "c" / "server.toml").write_text(deploy._toml(raw))
    grid = flower_app.LoopbackGrid({100 + i: {"silo-config": str(w["silos"][n])}
                                    for i, n in enumerate(sorted(w["silos"]))})
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                  run_config={"server-config": str(tmp_path / "c" / "server.toml")})
    prog = flower_app.run_server_app(grid, ctx)
    assert prog.done == 2 and np.all(np.isfinite(prog.server.params))
    assert prog.silos[small].rounds == [1]
    assert all(prog.silos[n].rounds == [1, 2] for n in w["silos"] if n != small)
    assert charged_steps(w["silos"][small], small) == prog.silos[small].steps
    for n in w["silos"]:
        if n != small:
            assert charged_steps(w["silos"][n], n) == 2 * prog.silos[n].steps


def test_silo_requiring_secagg_refuses_plain_rounds_before_any_charge(tmp_path):
    with pytest.raises(SiloflError, match="min_silos"):
        run_loopback(tmp_path / "c", "fedavg", secagg=False, require=True)
    w = {n: p for n, p in deploy_silos(tmp_path / "c").items()}
    assert all(charged_steps(cfg, name) == 0 for name, cfg in w.items())


def test_secagg_config_checks(tmp_path):
    consortium(tmp_path / "c", "ditto", secagg=True)
    with pytest.raises(ConfigError, match="weighted mean"):
        load_server_config(tmp_path / "c" / "server.toml")
    consortium(tmp_path / "d", "fedavg", secagg=True)
    from silofl.runtime.network.flower import run_server
    with pytest.raises(ConfigError, match="SuperLink"):
        run_server(load_server_config(tmp_path / "d" / "server.toml"))
    assert S.reconstruction_threshold(2) == 2 and S.reconstruction_threshold(23) == 12
    with pytest.raises(ValueError, match="overflows"):
        S.check_capacity(1024)


# --- real processes --------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ports_free(port: int, n: int) -> bool:
    for p in range(port, port + n):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                return False
    return True


@pytest.fixture
def deployment(tmp_path):
    """A consortium folder, TLS SuperLink with SuperNode authentication on loopback."""
    port = _free_port()
    while not _ports_free(port, 16):
        port = _free_port()
    out = tmp_path / "c"
    w = consortium(out, "fedavg", secagg=False, port=port)
    cmds = flower_app.local_commands(out, w["silos"], port, bin_dir=str(BIN))
    env = {**os.environ, **cmds["env"], "FLWR_HOME": str(out / "flower_home"),
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    procs = []

    def start(argv, log):
        procs.append(subprocess.Popen(argv, env=env, stdout=open(tmp_path / log, "w"),
                                      stderr=subprocess.STDOUT))
        return procs[-1]

    start(cmds["superlink"], "superlink.log")
    yield out, w, cmds, env, start, tmp_path
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


#: Bound on each readiness wait of the end-to-end test (SuperLink up, SuperNodes online, the
#: run). Generous: on a busy 2-core machine each Flower process start (imports, TLS) takes
#: tens of seconds; the waits end as soon as the condition holds, so a quiet machine is fast.
READY_S = 300.0


def _wait_registered(cmd, env, deadline):
    """Retry `flwr supernode register` until the SuperLink accepts it (it may still be
    starting): the SuperLink's readiness signal."""
    r = None
    while time.monotonic() < deadline:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=max(1.0, deadline - time.monotonic()))
        if r.returncode == 0:
            return
        time.sleep(0.5)  # poll interval, not synchronisation
    out = "" if r is None else r.stdout[-500:] + r.stderr[-500:]
    raise AssertionError(f"could not register a SuperNode within {READY_S:g} s: {out}")


def _wait_online(env, count: int, deadline) -> None:
    """Wait until `count` SuperNodes are online at the SuperLink (`flwr supernode list`),
    so that the run does not start its join window before the nodes have connected."""
    nodes: list = []
    while time.monotonic() < deadline:
        r = subprocess.run([str(BIN / "flwr"), "supernode", "list", "consortium", "--format",
                            "json"], env=env, capture_output=True, text=True,
                           timeout=max(1.0, deadline - time.monotonic()))
        try:
            nodes = json.loads(r.stdout).get("nodes", [])
        except json.JSONDecodeError:
            nodes = []
        if sum(n.get("status") == "online" for n in nodes) >= count:
            return
        time.sleep(0.5)  # poll interval
    raise AssertionError(f"{count} SuperNode(s) not online within {READY_S:g} s: {nodes}")


@pytest.mark.slow
@pytest.mark.network
def test_superlink_route_tls_node_auth_end_to_end(deployment):
    """Two hospitals as SuperNodes (TLS, registered keys; one with its silo worker) run a
    FedAvg round through `flwr run`; a SuperNode with an unregistered key and one without the consortium CA
    cannot join. (SecAgg+ is exercised at function level above: over real processes each
    of its 4 stages costs a SuperNode poll and a ClientApp process start — see README.)"""
    out, w, cmds, env, start, tmp = deployment
    names = sorted(cmds["supernodes"])
    run, intruder = names[:2], names[2]
    raw = tomllib.loads((out / "server.toml").read_text())
    # the join window starts only after both SuperNodes are online (below); it still covers
    # each ClientApp's process start, slow on a loaded machine
    raw["server"].update(expected_silos=2, min_silos=2, join_timeout=READY_S)
    raw["silos"] = {n: raw["silos"][n] for n in run}
    (out / "server.toml").write_text(deploy._toml(raw))
    deadline = time.monotonic() + READY_S
    for cmd in cmds["register"]:
        if any(f"{deploy.silo_file_id(n)}.ssh.pub" in cmd[3] for n in run):
            _wait_registered(cmd, env, deadline)
    # the first hospital also runs its silo worker (its ClientApps forward to it), the
    # second none (its ClientApps handle each message in-process)
    worker = start(cmds["workers"][run[0]], "worker.log")
    sock = silo_worker.socket_path(w["silos"][run[0]])
    while not sock.exists():
        assert worker.poll() is None and time.monotonic() < deadline, \
            (tmp / "worker.log").read_text()[-1500:]
        time.sleep(0.2)  # poll interval, not synchronisation
    for n in run:
        start(cmds["supernodes"][n], f"node_{deploy.silo_file_id(n)}.log")
    _wait_online(env, len(run), time.monotonic() + READY_S)
    bad_key = start(cmds["supernodes"][intruder] + ["--max-retries", "0"], "badkey.log")
    no_ca = [a for a in cmds["supernodes"][intruder] if a != str(out / "certs" / "ca.pem")]
    no_ca = [("--insecure" if a == "--root-certificates" else a) for a in no_ca]
    no_ca[no_ca.index("--port") + 1] = str(int(no_ca[no_ca.index("--port") + 1]) + 10)
    no_tls = start(no_ca + ["--max-retries", "0"], "notls.log")
    r = subprocess.run(cmds["run"], env=env, capture_output=True, text=True,
                       timeout=2 * READY_S)
    summary = out / "state" / "server" / "summary.json"
    assert summary.is_file(), r.stdout[-3000:] + r.stderr[-2000:]
    s = json.loads(summary.read_text())
    assert s["rounds_done"] == 1 and not s["secagg"]
    assert sorted(s["silos"]) == run and all(v["rounds"] == [1] for v in s["silos"].values())
    for name in run:  # each hospital charged exactly its round, in its own store
        assert charged_steps(w["silos"][name], name) == s["silos"][name]["steps"] > 0
    assert "train message" in (tmp / "worker.log").read_text()   # really forwarded
    for p, log in ((bad_key, "badkey.log"), (no_tls, "notls.log")):
        try:
            rc = p.wait(READY_S)  # --max-retries 0: exits once refused
        except subprocess.TimeoutExpired:
            rc = None
        text = (tmp / log).read_text()
        assert rc not in (None, 0) and "SuperNode ID" not in text, text[-1500:]
    assert "No SuperNode found with the given public key" in \
        (tmp / "superlink.log").read_text()
    assert charged_steps(w["silos"][intruder], intruder) == 0


def test_superlink_route_saves_the_silo_models_and_the_shared_model(tmp_path):
    """The App route saves what `silofl silo` / `silofl server` save (release.py): each
    silo's model and card after its last round, the server's shared model at the end."""
    from silofl.experiments.artifacts import load_run
    from silofl.runtime.network.silo_config import load_silo_config
    program, w = run_loopback(tmp_path, "mrmtl", secagg=False)
    assert program.done == 1
    for name, path in w["silos"].items():
        saved = load_run(load_silo_config(path).release_dir)
        card = saved.model_card(name)
        assert card["networked"] and card["privacy"]["rounds_run"] == 1, card
        assert 0 < card["privacy"]["epsilon"] <= card["privacy"]["target_epsilon"] * 1.000001
    shared = load_run(program.cfg.release_dir).model_card("shared")
    assert "that silo's own model card" in shared["privacy"]["statement"]


def test_server_poll_interval_is_read_and_checked(tmp_path):
    consortium(tmp_path, "fedavg", secagg=False)
    path = tmp_path / "server.toml"
    assert load_server_config(path).poll_interval == 0.05   # the default
    raw = tomllib.loads(path.read_text())
    raw["server"]["poll_interval"] = 0.5
    path.write_text(deploy._toml(raw))
    assert load_server_config(path).poll_interval == 0.5
    raw["server"]["poll_interval"] = 0.0
    path.write_text(deploy._toml(raw))
    with pytest.raises(ConfigError, match="poll_interval = 0 s is out of range"):
        load_server_config(path)


class _SlowGrid(flower_app.LoopbackGrid):
    """Answers each pushed message only at the `after`-th pull (counts pulls, no clock)."""

    def __init__(self, after: int):
        super().__init__({})
        self.after, self.pulls, self.pushed = after, 0, []

    def push_messages(self, messages):
        self.pushed = list(messages)
        return [f"m{i}" for i in range(len(self.pushed))]

    def pull_messages(self, message_ids):
        self.pulls += 1
        if self.pulls < self.after:
            return []
        from types import SimpleNamespace
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i))
                for i in sorted(message_ids)]


def test_polling_grid_polls_until_every_reply_is_in():
    inner = _SlowGrid(after=3)
    replies = flower_app.PollingGrid(inner, 0.01).send_and_receive(["a", "b"])
    assert inner.pulls == 3 and len(replies) == 2
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1"]
    # a timeout already spent: one push, no pull, no reply (the caller's failures)
    inner = _SlowGrid(after=1)
    assert flower_app.PollingGrid(inner, 0.01).send_and_receive(["a"], timeout=0.0) == []
    assert inner.pulls == 0

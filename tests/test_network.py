"""Networked runtime (runtime/network): silo and server processes over Flower gRPC on
127.0.0.1 with TLS, every run bounded by timeouts; and the silo's checks in-process."""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import socket
import sys
import time
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

import silofl.runtime.network.flower  # noqa: E402,F401  (imported once, before forking)
from silofl import cli  # noqa: E402
from silofl.errors import ConfigError  # noqa: E402
from silofl.privacy import events  # noqa: E402
from silofl.privacy.budget import BudgetStore, BudgetStoreError  # noqa: E402
from silofl.privacy.ledger import tightest  # noqa: E402
from silofl.privacy.targets import PrivacyTarget  # noqa: E402
from silofl.runtime.network import consortium as network_init  # noqa: E402
from silofl.runtime.network import deploy
from silofl.runtime.network import messages as W
from silofl.runtime.network.jobspec import job_algorithm, job_config, job_model  # noqa: E402
from silofl.runtime.network.server import ServerProgram, load_server_config  # noqa: E402
from silofl.runtime.network.silo import SiloProgram, new_nonce  # noqa: E402
from silofl.runtime.network.silo_config import load_silo_config

JOB = {"rounds": 3, "lam": 0.5, "lr": 0.1, "batch_size": 16, "local_epochs": 0.5}
#: each silo's δ as `deploy init` writes it: the simulator's [privacy] delta (one config model)
DELTA = deploy.default_delta()
#: Bound (s) on every wait of these tests: the server listening, a silo reaching it, the
#: server waiting for silos to (re)join, processes finishing. Generous, because each process
#: start (imports, TLS) takes seconds to tens of seconds on a busy 2-core machine; every wait
#: ends as soon as its condition holds, so a quiet machine is not slowed down.
READY_S = 300.0
WAIT = str(int(READY_S))  # a silo's --wait: how long it keeps trying to reach the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def consortium(tmp: Path, job=None, **kw) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return generous(network_init.init(tmp / "c", demo="heart", noise="seeded",
                                    address=f"127.0.0.1:{free_port()}",
                                    job={**JOB, **(job or {})}, **kw))


def generous(w: dict) -> dict:
    """The server waits up to READY_S for its silos (default 60 s: short on a busy machine).
    A text edit: deploy's server.toml may hold tables `edit_toml` does not write back."""
    path = Path(w["server"])
    text = re.sub(r"(?m)^join_timeout *=.*\n", "", path.read_text())
    assert text.count("[server]\n") == 1
    path.write_text(text.replace("[server]\n", f"[server]\njoin_timeout = {READY_S}\n", 1))
    assert load_server_config(path).join_timeout == READY_S
    return w


def edit_toml(path, section: str, **values) -> None:
    """Set keys of one section in a config written by deploy.init (flat TOML)."""
    raw = tomllib.loads(Path(path).read_text())
    raw[section].update(values)
    Path(path).write_text(deploy._toml(raw))


def _child(args, log, env) -> None:
    """A silo or server process: the `silofl` CLI, forked from this already-imported
    interpreter (separate memory; only loopback gRPC between the processes)."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # not pytest's capture
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    for h in logging.getLogger("flwr").handlers:
        if isinstance(h, logging.StreamHandler):
            h.setStream(sys.stderr)
    os.environ.update(env or {})
    sys.argv = ["silofl", *args]
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def start(args, log: Path, env=None):
    p = multiprocessing.get_context("fork").Process(target=_child, args=(args, log, env))
    p.start()
    return p


def serving(server_cfg, proc, timeout: float = READY_S) -> None:
    """Wait until the server listens (silos started earlier back off for seconds)."""
    host, port = load_server_config(server_cfg).address.rsplit(":", 1)
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.is_alive():
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"the server did not start listening within {timeout:g} s "
                         f"(alive: {proc.is_alive()})")


def finish(procs, timeout: float = READY_S) -> list[int]:
    """Wait for every process (killing all on timeout); their exit codes."""
    end = time.monotonic() + timeout
    try:
        for p in procs:
            p.join(timeout=max(0.1, end - time.monotonic()))
        return [p.exitcode for p in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


def logged(log: Path, text: str, proc, timeout: float = READY_S) -> None:
    """Wait until `text` appears in the log of the running process `proc`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.is_alive():
        if log.exists() and text in log.read_text(errors="replace"):
            return
        time.sleep(0.05)  # poll interval
    raise AssertionError(f"{text!r} not in {log.name} within {timeout:g} s: "
                         f"{log.read_text(errors='replace')[-2000:] if log.exists() else ''}")


def wait_exit(p, timeout: float) -> int | None:
    p.join(timeout=timeout)
    return p.exitcode


def steps_in_store(path, name) -> tuple[int, list[str]]:
    """DP-SGD steps counted for `name` in its store, and the statuses of its charges."""
    with BudgetStore(path) as store:
        rows = store.charges(name)
    steps = sum(c * r["count"] for r in rows
                for c in events.flatten(events.from_json(r["event"])).values())
    return steps, [r["status"] for r in rows]


def silo_params(silo_cfg) -> np.ndarray:
    cfg = load_silo_config(silo_cfg)
    with np.load(Path(cfg.state_dir) / "state.npz") as z:
        return z["params"][0]


def simulator_params(server_cfg) -> tuple[np.ndarray, list]:
    from silofl.data.heart import load_heart_disease
    from silofl.runtime.simulator import simulate
    job = load_server_config(server_cfg).job
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(1.0, DELTA))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(fed, job_model(job), job_algorithm(job), job_config(job),
                       hosting="per_silo")
    return res.params, res.plans


@pytest.mark.network
def test_network_mrmtl_equals_simulator_and_stores_hold_exactly_the_steps(tmp_path):
    w = consortium(tmp_path)
    procs = [start(["server", "--config", w["server"]], tmp_path / "server.log")]
    serving(w["server"], procs[0])
    procs += [start(["silo", "--config", p, "--wait", WAIT], tmp_path / f"{i}.log")
              for i, p in enumerate(w["silos"].values())]
    codes = finish(procs)
    assert codes == [0] * 5, (tmp_path / "server.log").read_text()[-3000:]
    assert "TLS on" in (tmp_path / "server.log").read_text()
    sim, plans = simulator_params(w["server"])
    for k, (name, cfg) in enumerate(w["silos"].items()):
        np.testing.assert_array_equal(silo_params(cfg), sim[k])
        steps, status = steps_in_store(load_silo_config(cfg).budget_store, name)
        assert steps == JOB["rounds"] * plans[k].steps_per_pass
        assert status == ["charged"] * JOB["rounds"]


@pytest.mark.slow
@pytest.mark.network
def test_budget_exhausted_silo_leaves_others_go_on_and_intruders_cannot_join(tmp_path):
    w = consortium(tmp_path, min_silos=2)
    names = list(w["silos"])
    small = names[2]
    # a lifetime budget between what one and two rounds spend: the silo runs round 1 only
    probe = load_silo_config(w["silos"][small])
    probe.budget_store = tmp_path / "probe.sqlite"  # the silo's own store stays untouched
    prog = SiloProgram(probe)
    srv = ServerProgram(load_server_config(w["server"]))
    prog.join({"protocol": W.PROTOCOL, "kind": "join", "job": W.canonical(srv.job).decode(),
               "nonce": new_nonce()})
    ev = prog.trainer.round_events()[0]
    from dp_accounting import SelfComposedDpEvent
    e1, e2 = (tightest(SelfComposedDpEvent(ev, r), DELTA)[0] for r in (1, 2))
    prog.store.close()
    edit_toml(w["silos"][small], "silo", lifetime_epsilon=(e1 + e2) / 2)
    # an intruder: a registered name with a key the server does not know
    bad = Path(w["silos"][names[0]]).with_name("intruder.toml")
    bad.write_text(Path(w["silos"][names[0]]).read_text())
    deploy.write_silo_key(tmp_path / "c", "intruder")
    edit_toml(bad, "silo", private_key="keys/intruder.key", state_dir="state/intruder",
              budget_store="stores/intruder.sqlite")
    # a client that does not trust the consortium CA cannot even connect (TLS)
    other_ca = tmp_path / "other_ca.pem"
    from cryptography.hazmat.primitives import serialization
    other_ca.write_bytes(deploy.make_ca()[1].public_bytes(serialization.Encoding.PEM))
    notls = Path(w["silos"][names[1]]).with_name("notls.toml")
    notls.write_text(Path(w["silos"][names[1]]).read_text())
    edit_toml(notls, "silo", state_dir="state/notls", budget_store="stores/notls.sqlite")
    edit_toml(notls, "server", root_certificate=str(other_ca))
    procs = [start(["server", "--config", w["server"]], tmp_path / "server.log")]
    serving(w["server"], procs[0])
    # the intruder keeps retrying for --wait seconds once the server is gone: a shorter
    # bound (it connects at once: the server already listens)
    procs += [start(["silo", "--config", str(bad), "--wait", "60"], tmp_path / "bad.log")]
    logged(tmp_path / "server.log", "rejected at join", procs[0])  # the intruder came first
    procs += [start(["silo", "--config", p, "--wait", WAIT], tmp_path / f"{i}.log")
              for i, p in enumerate(w["silos"].values())]
    procs += [start(["silo", "--config", str(notls), "--wait", "4"], tmp_path / "notls.log")]
    codes = finish(procs)
    log = (tmp_path / "server.log").read_text()
    assert codes[0] == 0 and codes[2:6] == [0] * 4, log[-3000:]
    assert "rejected at join" in log and "no valid signature" in log
    summary = ServerProgram(load_server_config(w["server"])).summary()["silos"]
    assert summary[small]["status"] == "exhausted" and summary[small]["rounds"] == [1]
    for n in names:
        if n != small:
            assert summary[n]["rounds"] == [1, 2, 3]
    steps, status = steps_in_store(load_silo_config(w["silos"][small]).budget_store, small)
    assert steps == prog.plan.steps_per_pass and status == ["charged"]
    with BudgetStore(load_silo_config(w["silos"][small]).budget_store) as store:
        assert store.spent(small)["within_target"]
    # neither outsider ran anything
    with BudgetStore(tmp_path / "c" / "stores" / "intruder.sqlite") as store:
        assert all(store.charges(n) == [] for n in store.silos())  # reserved nothing
    assert codes[6] != 0 and not (tmp_path / "c" / "state" / "notls").exists()
    # the rejected intruder ends with a clean refusal, not an unexpected error
    bad_log = (tmp_path / "bad.log").read_text()
    assert "unexpected" not in bad_log and codes[1] in (0, 2), bad_log[-2000:]
    assert "ran no round" in " ".join(bad_log.split()), bad_log[-2000:]


def test_silo_refuses_what_its_own_plan_and_store_do_not_allow(tmp_path):
    w = consortium(tmp_path)
    name, path = next(iter(w["silos"].items()))
    prog = SiloProgram(load_silo_config(path))
    srv = ServerProgram(load_server_config(w["server"]))
    join = {"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce()}
    # more rounds than the silo allows, or another noise mode: refused at join
    for change in ({"rounds": 50}, {"noise": "secure"}, {"method": "ditto"}):
        rep = prog.join({**join, "job": W.canonical({**srv.job, **change}).decode()})
        assert rep["status"] == "refused", change
    rep = prog.join({**join, "job": W.canonical(srv.job).decode()})
    assert srv.accept_join(rep).status == "ok"
    good = srv.request(name, 1)
    for change in ({"sigma": good["sigma"] / 2}, {"steps": good["steps"] + 1},
                   {"q": min(1.0, good["q"] * 2)}, {"method": "fedavg"}, {"round": 4}):
        rep, update = prog.round({**good, **change}, [srv.message])
        assert rep["status"] == "refused" and update is None, change
    assert prog.store.charges(name) == []  # nothing reserved, nothing read
    rep, update = prog.round(good, [srv.message])
    assert rep["status"] == "ok" and update.shape == (1, srv.message.size)
    # the server lost the reply: the same request is answered again, not run again
    rep2, update2 = prog.round(good, [srv.message])
    np.testing.assert_array_equal(update, update2)
    assert steps_in_store(prog.cfg.budget_store, name)[0] == prog.plan.steps_per_pass
    # the same round with another message is refused (a round runs once)
    rep3, _ = prog.round(good, [srv.message + 1.0])
    assert rep3["status"] == "refused"
    # a silo whose store is spent answers "exhausted" and runs nothing
    with BudgetStore(prog.cfg.budget_store) as s:
        delta, spent = s.target(name).delta, s.spent(name)["epsilon"]
        with pytest.raises(BudgetStoreError, match="already spent"):  # below it: refused
            s.set_target(name, PrivacyTarget(spent / 2, delta), "test")
        s.set_target(name, PrivacyTarget(spent, delta), "test: a fully spent silo")
    prog.cfg.lifetime_epsilon = spent
    rep4, _ = prog.round(srv.request(name, 2), [srv.message])
    assert rep4["status"] == "exhausted" and prog.exhausted
    assert steps_in_store(prog.cfg.budget_store, name)[0] == prog.plan.steps_per_pass


def test_malformed_oversized_and_forged_messages_are_rejected(tmp_path, monkeypatch):
    w = consortium(tmp_path)
    name, path = next(iter(w["silos"].items()))
    prog = SiloProgram(load_silo_config(path))
    srv = ServerProgram(load_server_config(w["server"]))
    rep = prog.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
                     "job": W.canonical(srv.job).decode()})
    srv.accept_join(rep)
    good = srv.request(name, 1)
    P = srv.message.size
    bad_requests = [({**good, "extra": 1}, [srv.message]), ({**good, "round": "1"}, [srv.message]),
                    ({**good, "protocol": "silofl-net/0"}, [srv.message]),
                    (good, [srv.message, srv.message]), (good, [np.full(P, np.nan)]),
                    (good, [srv.message.astype(np.float32)]), (good, [np.zeros(P + 1)])]
    for fields, arrays in bad_requests:
        with pytest.raises(W.ProtocolError):
            prog.round(fields, arrays)
    monkeypatch.setattr(W, "MAX_ARRAY_BYTES", 8 * (P - 1))
    with pytest.raises(W.ProtocolError, match="exceeds the limit"):
        prog.round(good, [srv.message])
    monkeypatch.undo()
    assert prog.store.charges(name) == []
    rep, update = prog.round(good, [srv.message])
    # a forged or altered update does not verify against the silo's registered key
    with pytest.raises(W.ProtocolError, match="signature"):
        srv.accept_update(name, 1, rep, [update + 1e-9])
    with pytest.raises(W.ProtocolError, match="signature"):
        srv.accept_update(name, 1, {**rep, "round": 1, "reason": "x"}, [update])
    with pytest.raises(W.ProtocolError):
        srv.accept_update(name, 1, rep, [np.zeros((1, P + 3))])
    assert srv.accept_update(name, 1, rep, [update])[0] == "ok"


@pytest.mark.slow
@pytest.mark.network
def test_silo_crash_mid_round_and_rejoin(tmp_path):
    w = consortium(tmp_path, job={"rounds": 4}, min_silos=2)
    edit_toml(w["server"], "server", rejoin_wait=READY_S)  # ends when the silo is back
    names = list(w["silos"])
    crash = names[0]
    procs = [start(["server", "--config", w["server"]], tmp_path / "server.log")]
    serving(w["server"], procs[0])
    procs += [start(["silo", "--config", p, "--wait", WAIT], tmp_path / f"{i}.log",
                    env={"SILOFL_FAULT_SILO_CRASH_ROUND": "2"} if n == crash else None)
              for i, (n, p) in enumerate(w["silos"].items())]
    assert wait_exit(procs[1], READY_S) == 17  # crashed in round 2, after its charge
    procs.append(start(["silo", "--config", w["silos"][crash], "--wait", WAIT],
                       tmp_path / "rejoin.log"))
    codes = finish(procs[:1] + procs[2:])
    assert codes == [0] * 5, (tmp_path / "server.log").read_text()[-3000:]
    summary = ServerProgram(load_server_config(w["server"])).summary()["silos"]
    assert summary[crash]["rounds"] == [1, 3, 4]
    for n in names[1:]:
        assert summary[n]["rounds"] == [1, 2, 3, 4]
    steps, status = steps_in_store(load_silo_config(w["silos"][crash]).budget_store, crash)
    per_round = SiloProgram(load_silo_config(w["silos"][crash])).store  # reopen: it is shared
    per_round.close()
    # rounds 1, 3, 4 executed; round 2 was charged before the crash and stays counted
    assert sorted(status) == ["charged"] * 3 + ["reserved"]
    _, plans = simulator_params(w["server"])
    assert steps == 4 * plans[0].steps_per_pass


@pytest.mark.slow
@pytest.mark.network
def test_server_restart_resumes_from_its_checkpoint(tmp_path):
    w = consortium(tmp_path, job={"rounds": 4})
    procs = [start(["server", "--config", w["server"]], tmp_path / "server1.log",
                   env={"SILOFL_FAULT_SERVER_EXIT_ROUND": "2"})]
    serving(w["server"], procs[0])
    procs += [start(["silo", "--config", p, "--wait", WAIT], tmp_path / f"{i}.log")
              for i, p in enumerate(w["silos"].values())]
    assert wait_exit(procs[0], READY_S) == 17
    assert ServerProgram(load_server_config(w["server"])).done == 2
    procs[0] = start(["server", "--config", w["server"]], tmp_path / "server2.log")
    codes = finish(procs)
    assert codes == [0] * 5, (tmp_path / "server2.log").read_text()[-3000:]
    # resumed, not restarted: the same models as an uninterrupted run, each step charged once
    sim, plans = simulator_params(w["server"])
    for k, (name, cfg) in enumerate(w["silos"].items()):
        np.testing.assert_array_equal(silo_params(cfg), sim[k])
        steps, _ = steps_in_store(load_silo_config(cfg).budget_store, name)
        assert steps == 4 * plans[k].steps_per_pass


def test_config_errors_are_specific(tmp_path):
    from silofl.errors import ConfigError
    w = consortium(tmp_path)
    edit_toml(w["server"], "server", min_silos=9)
    with pytest.raises(ConfigError, match="min_silos"):
        load_server_config(w["server"])
    edit_toml(w["server"], "server", min_silos=2)
    edit_toml(w["server"], "job", method="sgd_magic")
    with pytest.raises(ConfigError, match="does not run over the network"):
        load_server_config(w["server"])
    edit_toml(w["server"], "job", method="ifca", clusters=9)  # more clusters than silos
    with pytest.raises(ConfigError, match="clusters = 9 is more than the 4 silos"):
        load_server_config(w["server"])
    edit_toml(w["server"], "job", method="weight_erosion", clusters=2, we_user="Mars")
    with pytest.raises(ConfigError, match="user 'Mars' is not a silo"):
        load_server_config(w["server"])
    p = next(iter(w["silos"].values()))
    raw = Path(p).read_text().replace('root_certificate = "certs/ca.pem"', "")
    Path(p).write_text(raw)
    with pytest.raises(ConfigError, match="TLS is required"):
        load_silo_config(p)
    with pytest.raises(ConfigError, match="not empty"):
        network_init.init(tmp_path / "c", demo="heart")
    # the CLI: a clear error, exit code 2, nothing written
    from typer.testing import CliRunner
    for args, msg in ((["--method", "sgd_magic"], "does not run over the network"),
                      (["--rounds", "0"], "rounds must be a positive integer"),
                      (["--noise", "weak"], "noise must be")):
        res = CliRunner().invoke(cli.app, ["deploy", "init", "--out", str(tmp_path / "x"),
                                           "--demo", "heart", *args])
        assert res.exit_code == 2 and msg in " ".join(res.output.split())
        assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("method", ["fedavg", "ditto", "finetune", "local", "fedprox", "scaffold",
                                    "apfl", "fedper", "fedrep", "fedbn"])
def test_silo_and_server_programs_run_the_simulators_code(tmp_path, method):
    """Every network method, programs driven in-process (the transport is tested above):
    the same models as the simulator's per-silo mode, each store holding what ran."""
    model = {"fedbn": {"model": "mlp_norm"}}.get(method, {})  # FedBN: personal LayerNorms
    w = consortium(tmp_path, job={"method": method, "rounds": 2, **model})
    for p in w["silos"].values():
        edit_toml(p, "silo", methods=[method])
    srv = ServerProgram(load_server_config(w["server"]))
    silos = {n: SiloProgram(load_silo_config(p)) for n, p in w["silos"].items()}
    for s in silos.values():
        srv.accept_join(s.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
                                "job": W.canonical(srv.job).decode()}))
    for t in (1, 2):
        ups = {}
        for n, s in silos.items():
            rep, u = s.round(srv.request(n, t), [srv.message])
            status, u = srv.accept_update(n, t, rep, [] if u is None else [u])
            assert status == "ok"
            ups[n] = u
        srv.step(t, ups)
    sim, plans = simulator_params(w["server"])
    alg = job_algorithm(srv.job)
    from silofl.algorithms.base import ServerState
    for k, (n, s) in enumerate(silos.items()):
        personal = alg.personal_models(s.state, ServerState(srv.server.params))[0]
        np.testing.assert_array_equal(personal, sim[k])
        steps, _ = steps_in_store(s.cfg.budget_store, n)
        assert steps == 2 * alg.passes_per_round * plans[k].steps_per_pass


def _drive(srv, silos, rounds, absent=()):
    """Silo and server programs in-process: join, then each round every silo the server
    asks (its selection among those not `absent`) answers its request, then the server
    step."""
    for s in silos.values():
        srv.accept_join(s.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
                                "job": W.canonical(srv.job).decode()}))
    for t in range(1, rounds + 1):
        ups = {}
        for n in srv.selected(t, [n for n in silos if n not in absent]):  # who is asked
            s = silos[n]
            rep, u = s.round(srv.request(n, t), [srv.message])
            status, u = srv.accept_update(n, t, rep, [] if u is None else [u])
            assert status == "ok", rep["reason"]
            ups[n] = u
        srv.step(t, ups)


def _store_events(path, name):
    """The multiset of base DP events charged to `name` in a store (all rows)."""
    with BudgetStore(path) as store:
        rows = store.charges(name)
    out = {}
    for r in rows:
        for e, c in events.flatten(events.from_json(r["event"])).items():
            out[repr(e)] = out.get(repr(e), 0) + c * r["count"]
    return out, [r["status"] for r in rows]


@pytest.mark.parametrize("method,extra", [
    ("ifca", {"selection_rounds": 0.5}),
    ("ifca_local", {"selection_rounds": 0.5, "clusters": 3}),
    ("ifca_finetune", {"selection_rounds": 0.3, "finetune_fraction": 0.7}),
    ("ifca_mrmtl", {"selection_rounds": 0.3}),
    ("mocha", {}),
    ("weight_erosion", {"we_update": "gradient", "we_p_d": 0.5}),
    ("weight_erosion", {"we_update": "local_sgd", "we_p_d": 0.5}),
    ("scaffold", {}), ("apfl", {"apfl_alpha": 0.7})])
def test_cluster_mocha_and_erosion_over_the_network_equal_the_simulator(tmp_path, method, extra):
    """IFCA (private cluster selection in each silo's own store), Mocha (the released models
    broadcast, each silo its own row) and Weight Erosion (the user named in the job): the
    silo and server programs give the simulator's per-silo models, and each silo's store
    holds exactly the events the simulator's store holds for that silo. SCAFFOLD (x and c
    broadcast, control variates kept by each silo) and APFL (α kept by each silo) too."""
    from silofl.data.heart import load_heart_disease
    from silofl.runtime.simulator import simulate
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(1.0, DELTA))
    job = {"method": method, "rounds": 3, **extra}
    if method == "weight_erosion":
        job["we_user"] = fed.names[1]
    w = consortium(tmp_path, job=job)
    for p in w["silos"].values():
        edit_toml(p, "silo", methods=[method])
    srv = ServerProgram(load_server_config(w["server"]))
    silos = {n: SiloProgram(load_silo_config(p)) for n, p in w["silos"].items()}
    _drive(srv, silos, 3)
    alg = job_algorithm(srv.job)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(fed, job_model(srv.job), alg, job_config(srv.job), hosting="per_silo",
                       store=BudgetStore(tmp_path / "sim.sqlite"))
    for k, (n, s) in enumerate(silos.items()):
        np.testing.assert_array_equal(alg.personal_models(s.state, srv.server)[0],
                                      res.params[k])
        got, status = _store_events(s.cfg.budget_store, n)
        assert got == _store_events(tmp_path / "sim.sqlite", n)[0]
        assert set(status) == {"charged"} and len(status) >= 3
        assert 0.0 <= s.evaluate() <= 1.0  # the silo's local metric of its personal model
        if method.startswith("ifca"):  # each selection round's selection, in its own store
            sel = [c for e, c in got.items() if e.startswith("ZCDpEvent")]
            assert sel == [alg.schedule(3).select_until]
        # a restarted silo (a fresh process) still holds the last broadcast it received
        fresh = SiloProgram(load_silo_config(w["silos"][n]))
        assert fresh.resume() and fresh.done == 3
        np.testing.assert_array_equal(fresh.final_model(), s.final_model())


def test_erosion_and_mocha_go_on_without_a_silo_and_ifca_refuses_a_foreign_sigma(tmp_path):
    """A silo missing a round: Weight Erosion leaves its α and drops its row (present
    False), Mocha keeps its last released model; a silo refuses a request whose σ is not
    the one it calibrated (IFCA), nothing charged."""
    from silofl.data.heart import load_heart_disease
    names = load_heart_disease(seed=0).names
    for method, job in (("weight_erosion", {"we_user": names[0], "we_p_d": 0.5}),
                        ("mocha", {})):
        w = consortium(tmp_path / method, job={"method": method, "rounds": 2, **job},
                       min_silos=2)
        for p in w["silos"].values():
            edit_toml(p, "silo", methods=[method])
        srv = ServerProgram(load_server_config(w["server"]))
        silos = {n: SiloProgram(load_silo_config(p)) for n, p in w["silos"].items()}
        before = srv.server.params.copy()
        _drive(srv, silos, 2, absent={names[3]})
        if method == "weight_erosion":
            assert srv.server.alpha[3] == 1.0 and srv.server.alpha[0] == 1.0
            assert np.all(np.isfinite(srv.server.params))
        else:
            np.testing.assert_array_equal(srv.server.params[3], before[3])
            assert not np.array_equal(srv.server.params[0], before[0])
        assert srv.summary()["silos"][names[3]]["rounds"] == []
        assert _store_events(silos[names[3]].cfg.budget_store, names[3])[1] == []
    w = consortium(tmp_path / "ifca", job={"method": "ifca", "rounds": 2})
    p = w["silos"][names[0]]
    edit_toml(p, "silo", methods=["ifca"])
    srv = ServerProgram(load_server_config(w["server"]))
    silo = SiloProgram(load_silo_config(p))
    srv.accept_join(silo.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
                               "job": W.canonical(srv.job).decode()}))
    req = {**srv.request(names[0], 1), "sigma": srv.silos[names[0]].sigma / 2}
    rep, u = silo.round(req, [srv.message])
    assert rep["status"] == "refused" and "sigma" in rep["reason"] and u is None
    assert _store_events(silo.cfg.budget_store, names[0])[1] == []
    assert srv.message.shape == (2 * srv.P,)  # the G candidate models, broadcast
    # a (correctly signed) update naming a cluster that does not exist is rejected
    rep, u = silo.round(srv.request(names[0], 1), [srv.message])
    assert rep["status"] == "ok" and u.shape == (1, srv.P + 1)
    forged = u.copy()
    forged[0, 0] = 5.0
    rep["signature"] = W.sign(silo.key, rep, forged)
    with pytest.raises(W.ProtocolError, match="not one of the 2 clusters"):
        srv.accept_update(names[0], 1, rep, [forged])


@pytest.mark.parametrize("method", ["privatekt", "fedavg_ldp"])
def test_local_dp_methods_over_the_network_equal_the_simulator(tmp_path, method):
    """PrivateKT / FedAvg-LDP: the server asks only its public selection among the silos
    whose plan covers one more upload; each asked silo charges its upload (randomized
    response / noised update) in its own store before reading. Same models and the same
    charged events as the simulator's per-silo mode; the public set is pinned by its hash."""
    import dp_accounting as dpa

    from silofl.data.heart import load_heart_disease
    from silofl.runtime.simulator import simulate
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(1.0, DELTA))
    # a public, unlabeled set for the test: the silos' test features (declared public here)
    fed.meta["public_X"] = np.concatenate([s.X_test for s in fed.silos])
    job = {"method": method, "rounds": 3, "ldp_epsilon": 0.4, "kt_samples": 2,
           "kt_server_epochs": 1, "local_epochs": 0.5}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = network_init.init(tmp_path / "c", federation=fed, noise="seeded", job=job,
                        address=f"127.0.0.1:{free_port()}")
    srv = ServerProgram(load_server_config(w["server"]))
    silos = {n: SiloProgram(load_silo_config(p)) for n, p in w["silos"].items()}
    for s in silos.values():
        srv.accept_join(s.join({"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
                                "job": W.canonical(srv.job).decode()}))
    asked = []
    for t in (1, 2, 3):
        ups = {}
        for n in srv.selected(t, list(silos)):
            rep, u = silos[n].round(srv.request(n, t), [srv.message])
            status, u = srv.accept_update(n, t, rep, [] if u is None else [u])
            assert status == "ok", rep["reason"]
            ups[n] = u
        asked.append(sorted(ups))
        srv.step(t, ups)
    assert all(0 < len(a) < 4 for a in asked)  # a sample of the silos, each round
    from silofl.runtime.network.jobspec import load_public
    alg = job_algorithm(srv.job, load_public(srv.cfg.public_data, "test"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(fed, job_model(srv.job), alg, job_config(srv.job), hosting="per_silo",
                       store=BudgetStore(tmp_path / "sim.sqlite"))
    np.testing.assert_array_equal(srv.server.params, res.params[0])
    for n, s in silos.items():
        got, status = _store_events(s.cfg.budget_store, n)
        assert got == _store_events(tmp_path / "sim.sqlite", n)[0]
        uploads = sum(n in a for a in asked)
        assert uploads <= s.cap and set(status) <= {"charged"}
        want = events.flatten(dpa.SelfComposedDpEvent(alg.upload_event(), uploads)) \
            if uploads else {}
        assert got == {repr(e): c for e, c in want.items()}
    if method != "privatekt":
        return
    # a broadcast whose knowledge-transfer indices point outside the public set is refused
    n, s = next(iter(silos.items()))
    bad = srv.message.copy()
    bad[-1] = len(fed.meta["public_X"]) + 3
    rep, u = s.round(srv.request(n, 3), [bad])  # checked before anything else
    assert rep["status"] == "refused" and "knowledge-transfer" in rep["reason"] and u is None
    # a silo whose public set differs from the pinned one refuses the job
    p = next(iter(w["silos"].values()))
    np.savez(tmp_path / "c" / "other.npz", X=fed.meta["public_X"][:-1])
    edit_toml(p, "silo", public_data="other.npz", state_dir="state/x",
              budget_store="stores/x.sqlite")
    rep = SiloProgram(load_silo_config(p)).join(
        {"protocol": W.PROTOCOL, "kind": "join", "nonce": new_nonce(),
         "job": W.canonical(srv.job).decode()})
    assert rep["status"] == "refused" and "differs" in rep["reason"]


@pytest.mark.slow
@pytest.mark.network
def test_privatekt_over_tls_processes_asks_only_the_selected_silos(tmp_path):
    """PrivateKT with 4 silo processes + 1 server over TLS: the server asks each round only
    its public selection; the final global model equals the simulator's per-silo mode."""
    from silofl.data.heart import load_heart_disease
    from silofl.runtime.network.jobspec import load_public
    from silofl.runtime.simulator import simulate
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(1.0, DELTA))
    fed.meta["public_X"] = np.concatenate([s.X_test for s in fed.silos])  # public here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = network_init.init(tmp_path / "c", federation=fed, noise="seeded", min_silos=1,
                        address=f"127.0.0.1:{free_port()}",
                        job={"method": "privatekt", "rounds": 3, "ldp_epsilon": 0.4,
                             "kt_server_epochs": 1, "local_epochs": 0.5})
    generous(w)
    procs = [start(["server", "--config", w["server"]], tmp_path / "server.log")]
    serving(w["server"], procs[0])
    procs += [start(["silo", "--config", p, "--wait", WAIT], tmp_path / f"{i}.log")
              for i, p in enumerate(w["silos"].values())]
    codes = finish(procs)
    assert codes == [0] * 5, (tmp_path / "server.log").read_text()[-3000:]
    cfg = load_server_config(w["server"])
    with np.load(Path(cfg.state_dir) / "server.npz") as z:
        final = z["params"]
    job = cfg.job
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(fed, job_model(job), job_algorithm(job, load_public(cfg.public_data,
                                                                           "t")),
                       job_config(job), hosting="per_silo")
    np.testing.assert_array_equal(final, res.params[0])
    rounds = [r["silos"] for r in ServerProgram(cfg).log]
    assert len(rounds) == 3 and all(0 < len(r) < 4 for r in rounds)


def run_regions(tmp_path: Path, job: dict) -> dict:
    """A 2400-person outbreak in 3 regions deployed with `deploy init --regions` (seeded,
    ε = 6, δ = 1e-5), run as 3 `silofl silo` processes + `silofl server` over TLS; returns
    what deploy wrote (after every process exited 0)."""
    from silofl.pandemic import synthesize
    synthesize(tmp_path / "outbreak", persons=2400, regions=3, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = network_init.init(tmp_path / "c", regions=tmp_path / "outbreak", noise="seeded",
                        address=f"127.0.0.1:{free_port()}", epsilon=6.0, delta=1e-5,
                        job=job, min_silos=3)
    generous(w)
    logs = tmp_path / "logs"
    logs.mkdir()
    server = start(["server", "--config", w["server"]], logs / "server.log")
    serving(w["server"], server)
    silos = [start(["silo", "--config", cfg, "--wait", WAIT], logs / f"{i}.log")
             for i, cfg in enumerate(w["silos"].values())]
    codes = finish([server, *silos])
    assert codes == [0] * (1 + len(silos)), [p.read_text()[-2000:] for p in logs.iterdir()]
    return w


@pytest.mark.slow
@pytest.mark.network
def test_graph_regions_as_tls_processes_equal_in_process_pandemic_training(tmp_path):
    """One engine for graph data too: `silofl deploy init --regions` gives every region of
    a pandemic dataset its own folder and silo config; each region runs as its own
    `silofl silo` process (node-level unit, its own store) against `silofl server` over TLS,
    and the seeded run's personal models equal `pipeline.train` in one process bit for
    bit; each store holds exactly the rounds its region ran."""
    from silofl.pandemic import pipeline as P
    from silofl.pandemic import read_dataset
    from silofl.pandemic.regions import raw_weights
    from silofl.runtime.network.silo import open_program
    rounds = 2
    w = run_regions(tmp_path, {"rounds": rounds, "batch_size": 64, "seed": 2})
    ref = P.train(read_dataset(tmp_path / "outbreak"), P.PandemicConfig(
        rounds=rounds, batch_size=64, epsilon=6.0, delta=1e-5, seed=2, noise="seeded"))
    assert sorted(ref.regions) == sorted(w["silos"])
    for k, name in enumerate(ref.regions):
        prog = open_program(load_silo_config(w["silos"][name]))
        assert prog.resume() and prog.done == rounds
        np.testing.assert_array_equal(raw_weights(prog.final_model(), prog.region),
                                      ref.weights[k])
        charges = prog.store.charges(name)
        assert [(c["label"], c["status"]) for c in charges] == [("node-dpsgd", "charged")] * 2
        assert prog.store.spent(name)["epsilon"] == pytest.approx(
            ref.privacy[k]["epsilon_spent"], rel=1e-9)
        auprc = prog.evaluate()  # AUPRC on the region's own target (local); NaN: no case
        positives = read_dataset(prog.cfg.data, with_target=True).target.sum()
        assert (0.0 < auprc <= 1.0) if positives else np.isnan(auprc)
    # SecAgg+'s clipping range bounds model changes; regions send models: refused
    text = Path(w["server"]).read_text().replace("[server]\n", "[server]\nsecagg = true\n", 1)
    Path(w["server"]).write_text(text)
    with pytest.raises(ConfigError, match="tabular jobs"):
        load_server_config(w["server"])


def test_auto_lambda_job_over_the_network_programs(tmp_path):
    """lam = "auto" as a job key: the silo and server programs (in-process) run the
    estimator the simulator's per-silo mode runs — the same λ path and personal models
    (same process: equal within 1e-12) — and each store holds the steps of a fixed-λ run."""
    w = consortium(tmp_path, job={"method": "mrmtl", "lam": "auto", "rounds": 4})
    srv = ServerProgram(load_server_config(w["server"]))
    assert srv.job["lam"] == "auto"
    silos = {n: SiloProgram(load_silo_config(p)) for n, p in w["silos"].items()}
    _drive(srv, silos, 4)
    from silofl.data.heart import load_heart_disease
    from silofl.runtime.simulator import simulate
    fed = load_heart_disease(seed=0).with_targets(PrivacyTarget(1.0, DELTA))
    alg = job_algorithm(srv.job)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(fed, job_model(srv.job), alg, job_config(srv.job), hosting="per_silo")
    sim, plans = res.params, res.plans
    assert srv.server.path == alg.describe()["lam_path"] and len(srv.server.path) == 4
    for k, (n, s) in enumerate(silos.items()):
        personal = alg.auto_personal(s.state.params, srv.server)[0]
        np.testing.assert_allclose(personal, sim[k], rtol=1e-12, atol=1e-12)
        steps, _ = steps_in_store(s.cfg.budget_store, n)
        assert steps == 4 * plans[k].steps_per_pass


def test_secagg_refuses_an_auto_lambda_job_before_anything_runs(tmp_path):
    """SecAgg+ hides each silo's update, from which lam = "auto" sets λ_k: the server's
    configuration is refused with a specific error, and no store holds a charge."""
    w = consortium(tmp_path, job={"method": "mrmtl", "lam": "auto"})
    edit_toml(w["server"], "server", secagg=True)
    with pytest.raises(ConfigError, match=r'lam = "auto" sets λ_k from those updates'):
        load_server_config(w["server"])
    for n, p in w["silos"].items():  # no silo ever reached its store
        store = load_silo_config(p).budget_store
        if Path(store).exists():
            with pytest.raises(BudgetStoreError, match="is not in budget store"):
                steps_in_store(store, n)

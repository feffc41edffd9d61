"""The per-silo worker (`silo_worker`): a ClientApp forwards to it when its socket answers,
gets the reply the in-process handler gives, falls back when no worker answers, and the
socket is the silo's own (0600)."""

from __future__ import annotations

import socket
import stat
import threading

import numpy as np
import pytest

pytest.importorskip("flwr")

from silofl.runtime.network import silo_worker as SW  # noqa: E402
from silofl.runtime.network import worker_link as WL  # noqa: E402
from silofl.runtime.network.silo_config import load_silo_config  # noqa: E402
from test_network_flower import charged_steps, run_loopback  # noqa: E402


def _start_workers(silos: dict, served: list) -> list[socket.socket]:
    """One worker per silo in a thread (the same code as the process; cheaper to start)."""
    socks = []
    for cfg in silos.values():
        srv = SW.listen(cfg)

        def loop(srv=srv, cfg=cfg):
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:   # closed at the end of the test
                    return
                with conn:
                    SW.handle(conn, cfg)
                    served.append(cfg)
        threading.Thread(target=loop, daemon=True).start()
        socks.append(srv)
    return socks


def _silos(tmp):
    import tomllib
    return {tomllib.loads(p.read_text())["silo"]["name"]: p for p in tmp.glob("silo_*.toml")}


def test_forwarded_round_equals_in_process(tmp_path, monkeypatch):
    """The same seeded MR-MTL round, once in-process and once through each silo's worker:
    the same shared model (tolerance 1e-12: the same code in the same process) and the same
    charges; every message went through a worker."""
    import test_network_flower as T
    base, _ = run_loopback(tmp_path / "a", "mrmtl", secagg=False)
    served: list = []
    real = T.consortium

    def with_workers(tmp, *a, **k):   # start the workers once the folder exists
        w = real(tmp, *a, **k)
        socks.extend(_start_workers(w["silos"], served))
        return w
    socks: list = []
    monkeypatch.setattr(T, "consortium", with_workers)
    try:
        fwd, w = run_loopback(tmp_path / "b", "mrmtl", secagg=False)
    finally:
        for s in socks:
            s.close()
    assert base.done == fwd.done == 1
    assert len(served) >= 2 * len(w["silos"]), served   # join + round per silo
    np.testing.assert_allclose(fwd.server.params, base.server.params, rtol=0, atol=1e-12)
    for name, cfg in w["silos"].items():
        steps = charged_steps(cfg, name)
        assert steps > 0 and steps == charged_steps(_silos(tmp_path / "a")[name], name)


def test_missing_or_dead_worker_falls_back(tmp_path):
    """No socket, or a socket file whose worker is gone: the ClientApp handles the message
    itself (the run finishes and charges as without a worker)."""
    w = T_consortium(tmp_path / "probe")
    cfg = next(iter(w["silos"].values()))
    assert WL.forward(SW.socket_path(cfg), None, None) is None   # nothing there
    srv = SW.listen(cfg)
    srv.close()   # a worker that died: its socket file stays, nobody answers
    assert SW.socket_path(cfg).exists()
    assert WL.forward(SW.socket_path(cfg), None, None) is None
    program, w = run_loopback(tmp_path / "c", "mrmtl", secagg=False)
    assert program.done == 1
    assert all(charged_steps(p, n) > 0 for n, p in w["silos"].items())


def T_consortium(tmp):
    from test_network_flower import consortium
    return consortium(tmp, "mrmtl", secagg=False)


def test_socket_is_0600_in_the_silo_state_folder_and_not_shared(tmp_path):
    w = T_consortium(tmp_path / "c")
    cfg = next(iter(w["silos"].values()))
    srv = SW.listen(cfg)
    try:
        path = SW.socket_path(cfg)
        assert path.parent == load_silo_config(cfg).state_dir
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        from silofl.errors import ConfigError
        with pytest.raises(ConfigError, match="already serves"):
            SW.listen(cfg)   # a live worker is never replaced
    finally:
        srv.close()


def test_worker_refuses_another_silos_config_and_the_clientapp_raises(tmp_path):
    """A message whose node config names another silo is refused by the worker; the
    ClientApp reports the worker's error instead of re-running the message itself."""
    from flwr.app import Context, RecordDict

    from silofl.errors import SiloflError
    w = T_consortium(tmp_path / "c")
    a, b = list(w["silos"].values())[:2]
    srv = SW.listen(a)
    t = threading.Thread(target=SW.serve, args=(a, srv, 1), daemon=True)
    t.start()
    try:
        from flwr.app import Message
        msg = Message(RecordDict(), dst_node_id=1, message_type="query")
        ctx = Context(run_id=1, node_id=1, node_config={"silo-config": str(b)},
                      state=RecordDict(), run_config={})
        with pytest.raises(SiloflError, match="this worker serves"):
            WL.forward(SW.socket_path(a), msg, ctx)
        t.join(timeout=60)
    finally:
        srv.close()


def test_cli_silo_worker_serves_and_refuses_a_bad_config(tmp_path):
    """`silofl silo-worker`: a bad config exits 2 naming the file and leaves no socket; a
    good one serves on the silo's 0600 socket until stopped (readiness: its own line)."""
    import subprocess
    import sys

    bad = subprocess.run([sys.executable, "-m", "silofl.cli", "silo-worker", "--config",
                          str(tmp_path / "missing.toml")], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "missing.toml" in bad.stderr
    w = T_consortium(tmp_path / "c")
    cfg = next(iter(w["silos"].values()))
    p = subprocess.Popen([sys.executable, "-m", "silofl.cli", "silo-worker", "--config",
                          str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()   # blocks until the worker says it serves (or exits)
        assert "silo worker: serving" in line, p.stderr.read() if p.poll() is not None else line
        path = SW.socket_path(cfg)
        assert stat.S_ISSOCK(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        p.terminate()
        p.wait(timeout=120)

"""Networked runtime over loopback: per-round wall time against the in-process simulator.

Vehicle-like workload (`silofl.data.vehicle_like`: 23 silos, n_k 872..1933, d = 100, linear
SVM, MR-MTL, batch 64): the first 4 silos and all 23. Each silo is its own process (forked
from this interpreter, so start-up imports are not timed), talking to the server process
over Flower gRPC on 127.0.0.1, with TLS and without. Per-round time is the median gap
between consecutive completed rounds on the server (join and start-up excluded).
Network overhead per silo-round = (network round − simulator round) / K.

    .venv/bin/python benchmarks/bench_network.py [--rounds 12]

SecAgg+ (`--secagg`): Flower's SuperLink/SuperNode route (`runtime/network/flower_app`),
per-round time without and with SecAgg+ (a) in one process over `LoopbackGrid` — the
protocol's own cost (masking, key agreement, Shamir shares, quantization, four stages) for
4 and 23 silos — and (b) as real `flower-superlink` + 4 `flower-supernode` processes with
TLS and SuperNode authentication (`--app-rounds`, 0 skips it), where each message costs a
SuperNode poll (≤ 3 s in flwr 1.41) and a fresh ClientApp process.

Figures are printed, not asserted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from silofl.data import PrivacyTarget, vehicle_like
from silofl.data.federation import Federation
from silofl.runtime.network import deploy
from silofl.runtime.network.flower import run_server, run_silo
from silofl.runtime.network.server import load_server_config
from silofl.runtime.network.silo import job_algorithm, job_config, job_model, load_silo_config
from silofl.runtime.simulator import simulate

JOB = {"method": "mrmtl", "model": "svm", "lam": 0.1, "batch_size": 64, "lr": 0.01,
       "clip": 6.0, "local_epochs": 1.0, "noise": "seeded"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quiet() -> None:
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import logging
    logging.getLogger("flwr").setLevel(logging.WARNING)


def _server(path):
    _quiet()
    warnings.simplefilter("ignore")
    run_server(load_server_config(path))
    os._exit(0)


def _silo(path):
    _quiet()
    warnings.simplefilter("ignore")
    run_silo(load_silo_config(path), max_wait=60)
    os._exit(0)


def network_round(fed: Federation, rounds: int, tls: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        addr = f"127.0.0.1:{_port()}"
        w = deploy.init(Path(tmp) / "c", federation=fed, address=addr, epsilon=10.0,
                        noise="seeded", insecure=not tls,
                        job={**JOB, "rounds": rounds, "dim": fed.dim, "task": "binary",
                             "num_classes": 2})
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=_server, args=(w["server"],))]
        procs[0].start()
        host, port = addr.rsplit(":", 1)
        while socket.socket().connect_ex((host, int(port))) != 0:
            time.sleep(0.05)
        procs += [ctx.Process(target=_silo, args=(p,)) for p in w["silos"].values()]
        for p in procs[1:]:
            p.start()
        for p in procs:
            p.join(timeout=600)
        log = json.loads((Path(tmp) / "c" / "state" / "server" / "server.json").read_text())
        t = np.array([r["time"] for r in log["log"]])
        assert len(t) == rounds, "the run did not finish"
        return float(np.median(np.diff(t)))


def simulator_round(fed: Federation, rounds: int, hosting: str) -> float:
    from silofl.runtime.network.server import JOB_DEFAULTS
    job = {**JOB_DEFAULTS, **JOB, "rounds": rounds, "dim": fed.dim, "task": "binary",
           "num_classes": 2, "accountant": "pld", "seed": 0, "weighted": True,
           "finetune_fraction": 0.5, "l2": 0.0, "silos": json.dumps(fed.names)}
    fed = fed.with_targets(PrivacyTarget(10.0, 1e-5))
    from silofl.runtime.plan import plan_silos
    alg, cfg, model = job_algorithm(job), job_config(job), job_model(job)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plans = plan_silos(fed, alg, cfg)  # calibration is not a round's cost
        best = np.inf
        for _ in range(2):  # the first run warms the accountant's caches
            t0 = time.perf_counter()
            simulate(fed, model, alg, cfg, plans=plans, hosting=hosting)
            best = min(best, time.perf_counter() - t0)
    return best / rounds


def _app_folder(tmp: Path, fed: Federation, rounds: int, secagg: bool, port: int = 9092):
    import tomllib
    w = deploy.init(tmp, federation=fed, address=f"127.0.0.1:{port}", epsilon=10.0,
                    noise="seeded", job={**JOB, "rounds": rounds, "dim": fed.dim,
                                         "task": "binary", "num_classes": 2})
    raw = tomllib.loads((tmp / "server.toml").read_text())
    raw["server"].update(secagg=secagg, min_silos=len(w["silos"]))
    (tmp / "server.toml").write_text(deploy._toml(raw))
    return w


def _round_times(folder: Path) -> np.ndarray:
    log = json.loads((folder / "state" / "server" / "server.json").read_text())
    return np.array([r["time"] for r in log["log"]])


def loopback_app_round(fed: Federation, rounds: int, secagg: bool) -> float:
    """Median per-round time of the Flower App in one process (LoopbackGrid)."""
    import logging
    from flwr.app import Context, RecordDict
    from silofl.runtime.network import flower_app
    logging.getLogger("flwr").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = _app_folder(Path(tmp) / "c", fed, rounds, secagg)
        grid = flower_app.LoopbackGrid({100 + i: {"silo-config": str(p)}
                                        for i, p in enumerate(w["silos"].values())})
        ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={"server-config": w["server"]})
        flower_app.run_server_app(grid, ctx)
        t = _round_times(Path(tmp) / "c")
        assert len(t) == rounds, "the run did not finish"
        return float(np.median(np.diff(t)))


def process_app_round(fed: Federation, rounds: int, secagg: bool) -> float:
    """Median per-round time over real SuperLink + SuperNode processes (TLS, node auth)."""
    import subprocess
    from silofl.runtime.network import flower_app
    port = _port()
    bin_dir = str(Path(sys.executable).parent)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = Path(tmp) / "c"
        w = _app_folder(out, fed, rounds, secagg, port)
        cmds = flower_app.local_commands(out, w["silos"], port, bin_dir=bin_dir)
        env = {**os.environ, "FLWR_HOME": str(out / "flower_home"),
               "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
        procs = [subprocess.Popen(cmds["superlink"], **quiet)]
        try:
            for cmd in cmds["register"]:
                for _ in range(60):
                    if subprocess.run(cmd, **quiet).returncode == 0:
                        break
                    time.sleep(0.5)
            procs += [subprocess.Popen(c, **quiet) for c in cmds["supernodes"].values()]
            subprocess.run(cmds["run"], timeout=3600, **quiet)
            t = _round_times(out)
        finally:
            for p in procs:
                p.terminate()
        assert len(t) == rounds, "the run did not finish"
        return float(np.median(np.diff(t)))


def secagg_main(rounds: int, app_rounds: int) -> None:
    full = vehicle_like(seed=0)
    print("Flower App route, Vehicle-like MR-MTL, per-round wall time (median)")
    print(f"{'silos':>5} {'loopback plain':>15} {'loopback SecAgg+':>17} "
          f"{'SecAgg+ extra/silo':>19}")
    for K in (4, 23):
        fed = Federation(full.silos[:K], full.feature_names, full.task, full.num_classes,
                         name=f"vehicle-like-{K}")
        plain = loopback_app_round(fed, rounds, secagg=False)
        masked = loopback_app_round(fed, rounds, secagg=True)
        print(f"{K:>5} {plain * 1e3:>13.0f}ms {masked * 1e3:>15.0f}ms "
              f"{(masked - plain) / K * 1e3:>17.1f}ms")
        sys.stdout.flush()
    if app_rounds > 1:
        fed = Federation(full.silos[:4], full.feature_names, full.task, full.num_classes,
                         name="vehicle-like-4")
        plain = process_app_round(fed, app_rounds, secagg=False)
        masked = process_app_round(fed, app_rounds, secagg=True)
        print(f"SuperLink + 4 SuperNodes (TLS, node auth): plain {plain:.1f} s/round, "
              f"SecAgg+ {masked:.1f} s/round")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--secagg", action="store_true",
                    help="measure the Flower App route with and without SecAgg+ instead")
    ap.add_argument("--app-rounds", type=int, default=3,
                    help="rounds over real SuperLink/SuperNode processes (0: skip)")
    a = ap.parse_args()
    if a.secagg:
        return secagg_main(min(a.rounds, 4), a.app_rounds)
    full = vehicle_like(seed=0)
    print(f"Vehicle-like MR-MTL, {a.rounds} rounds, per-round wall time (median), loopback")
    print(f"{'silos':>5} {'simulator':>10} {'sim/silo':>10} {'net plain':>10} {'net TLS':>10}"
          f" {'overhead/silo-round (TLS)':>27}")
    for K in (4, 23):
        fed = Federation(full.silos[:K], full.feature_names, full.task, full.num_classes,
                         name=f"vehicle-like-{K}")
        sim = simulator_round(fed, a.rounds, "joint")
        per = simulator_round(fed, a.rounds, "per_silo")
        plain = network_round(fed, a.rounds, tls=False)
        tls = network_round(fed, a.rounds, tls=True)
        print(f"{K:>5} {sim * 1e3:>8.1f}ms {per * 1e3:>8.1f}ms {plain * 1e3:>8.1f}ms "
              f"{tls * 1e3:>8.1f}ms {(tls - sim) / K * 1e3:>24.1f}ms")
        sys.stdout.flush()
    print("(Flower's simulation engine: ≈ 17 ms per client-round measured earlier here)")


if __name__ == "__main__":
    main()

"""Networked runtime over loopback: per-round wall time against the in-process simulator.

Vehicle-like workload (`silofl.data.vehicle_like`: 23 silos, n_k 872..1933, d = 100, linear
SVM, MR-MTL, batch 64): the first 4 silos and all 23. Each silo is its own process (forked
from this interpreter, so start-up imports are not timed), talking to the server process
over Flower gRPC on 127.0.0.1, with TLS and without. Per-round time is the median gap
between consecutive completed rounds on the server (join and start-up excluded).
Network overhead per silo-round = (network round − simulator round) / K.

    .venv/bin/python benchmarks/bench_network.py [--rounds 12]

Figures are printed, not asserted. SecAgg+ is not measured (not built yet).
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
    job = {**JOB, "rounds": rounds, "dim": fed.dim, "task": "binary", "num_classes": 2,
           "accountant": "pld", "seed": 0, "weighted": True, "finetune_fraction": 0.5, "l2": 0.0}
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args()
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

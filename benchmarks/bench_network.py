"""Networked runtime over loopback: per-round wall time against the in-process simulator.

Vehicle-like workload (`silofl.data.vehicle_like`: 23 silos, n_k 872..1933, d = 100, linear
SVM, MR-MTL, batch 64): the first 4 silos and all 23. Each silo is its own process (forked
from this interpreter, so start-up imports are not timed), talking to the server process
over Flower gRPC on 127.0.0.1, with TLS and without. Per-round time is the median gap
between consecutive completed rounds on the server (join and start-up excluded).
Network overhead per silo-round = (network round − simulator round) / K.

    .venv/bin/python benchmarks/bench_network.py [--rounds 12]

SecAgg+ (`--secagg`): Flower's SuperLink/SuperNode route (`runtime/network/flower_app`),
per-round time without and with SecAgg+ in one process over `LoopbackGrid` — the
protocol's own cost (masking, key agreement, Shamir shares, quantization, four stages) for
4 and 23 silos — then the real processes below.

Real processes (`--app`, or after `--secagg`; `--app-rounds 0` skips them): one
`flower-superlink` + K `flower-supernode` processes (K from `--app-silos`, default 4,23)
with TLS and SuperNode authentication, plain and SecAgg+, against the in-process
simulator. Printed: per-round time and overhead per silo-round; ClientApp processes per
silo-round (one per message) with their lifetime and CPU; the stages of a round (a stage is
one message to every silo) with their period and spread; start-up (SuperLink up, K keys
registered, `flwr run` until round 1 is done: the ServerApp joins the silos one after the
other); peak memory of all processes together (PSS and RSS sum, sampled from /proc every
0.25 s); CPU by process kind and what the rest of the machine used meanwhile; a bare
ClientApp start (a fresh interpreter importing flwr's entry point and silofl's App).
Every run is bounded by `--app-timeout` s and stopped when less than 1 GiB of memory is
left; this process becomes the reaper of its descendants (Flower detaches some) and ends
all of them afterwards ("left over" must read 0). Linux only (/proc). 23 SuperNodes each
start a fresh ClientApp process per message: on a small machine run it niced, e.g.

    nice .venv/bin/python benchmarks/bench_network.py --app --app-silos 4,23 \
        --app-rounds 3 --json network_app.json

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

from silofl.data import vehicle_like
from silofl.data.federation import Federation
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.network import consortium, deploy
from silofl.runtime.network.flower import run_server, run_silo
from silofl.runtime.network.jobspec import job_algorithm, job_config, job_model
from silofl.runtime.network.server import load_server_config
from silofl.runtime.network.silo_config import load_silo_config
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
        w = consortium.init(Path(tmp) / "c", federation=fed, address=addr, epsilon=10.0,
                        noise="seeded", insecure=not tls,
                        job={**JOB, "rounds": rounds, "dim": fed.dim, "task": "binary",
                             "num_classes": 2})
        _own_stores(w, Path(tmp) / "stores")
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


def _own_stores(w: dict, where: Path) -> None:
    """Give every silo of consortium `w` a fresh budget store under `where`: a measurement
    must neither spend the machine's default store nor be refused by it."""
    import tomllib
    for name, path in w["silos"].items():
        raw = tomllib.loads(Path(path).read_text())
        raw["silo"]["budget_store"] = str(Path(where).resolve() / f"{name}.sqlite")
        Path(path).write_text(deploy._toml(raw))


def _app_folder(tmp: Path, fed: Federation, rounds: int, secagg: bool, port: int = 9092,
                join_timeout: float = 60.0):
    import tomllib
    w = consortium.init(tmp, federation=fed, address=f"127.0.0.1:{port}", epsilon=10.0,
                    noise="seeded", job={**JOB, "rounds": rounds, "dim": fed.dim,
                                         "task": "binary", "num_classes": 2})
    _own_stores(w, tmp / "stores")
    raw = tomllib.loads((tmp / "server.toml").read_text())
    raw["server"].update(secagg=secagg, min_silos=len(w["silos"]), join_timeout=join_timeout)
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


# --- real SuperLink + K SuperNode processes ----------------------------------------------

_KINDS = (("flwr-clientapp", "ClientApp"), ("flwr-serverapp", "ServerApp"),
          ("flower-superexec", "SuperExec"), ("flower-supernode", "SuperNode"),
          ("silofl.runtime.network.supernode", "SuperNode"),
          ("silofl.runtime.network.silo_worker", "silo worker"),
          ("flower-superlink", "SuperLink"), ("flwr", "flwr CLI"))
_TICK = os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    """Wall-clock time of boot (s), to 0.01 s: process start times are ticks since boot."""
    return time.time() - float(Path("/proc/uptime").read_text().split()[0])


def _subreaper() -> None:
    """Make this process the reaper of its orphaned descendants (Linux), so that processes
    Flower detaches (the SuperLink's SuperExec starts a new session) stay in our tree and
    are found and ended at clean-up."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


class ProcWatch:
    """Samples this process's descendants from /proc: memory of all of them together
    (PSS: shared pages split among the processes sharing them; and the plain RSS sum), CPU
    time by kind, and each ClientApp process's start (exact, 0.01 s) and last sighting."""

    def __init__(self):
        self.me, self.boot = os.getpid(), _boot_time()
        self.seen: dict[tuple[int, int], dict] = {}   # (pid, start tick) → facts
        self.peak = {"pss": 0.0, "rss": 0.0, "procs": 0, "clientapps": 0, "by_kind": {}}
        self.min_available = float("inf")
        self.last_clientapps = 0

    @staticmethod
    def _stat(pid: str):
        s = Path(f"/proc/{pid}/stat").read_text()
        f = s[s.rfind(")") + 2:].split()   # fields after "pid (comm)"
        return int(f[1]), f[0], int(f[11]) + int(f[12]), int(f[19])  # ppid, state, cpu, start

    def descendants(self) -> dict[int, tuple]:
        stats, kids = {}, {}
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    stats[int(pid)] = st = self._stat(pid)
                except (OSError, IndexError, ValueError):  # gone meanwhile
                    continue
                kids.setdefault(st[0], []).append(int(pid))
        out, todo = {}, list(kids.get(self.me, []))
        while todo:
            pid = todo.pop()
            out[pid] = stats[pid]
            todo += kids.get(pid, [])
        return out

    def sample(self) -> None:
        now, pss, rss, by_kind, n_app = time.time(), 0.0, 0.0, {}, 0
        for pid, (_, state, cpu, start) in self.descendants().items():
            if state == "Z":
                continue
            key = (pid, start)
            if key not in self.seen:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                name = " ".join(Path(c.decode(errors="replace")).name for c in cmd[:3])
                kind = next((k for tag, k in _KINDS if tag in name.split()), "other")
                self.seen[key] = {"kind": kind, "start": self.boot + start / _TICK,
                                  "cpu0": cpu}
            info = self.seen[key]
            info.update(last=now, cpu=cpu)
            try:
                m = dict(line.split(":", 1) for line in
                         Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
            except (OSError, ValueError):
                continue
            p_kib = float(m["Pss"].split()[0])
            pss, rss = pss + p_kib, rss + float(m["Rss"].split()[0])
            by_kind[info["kind"]] = by_kind.get(info["kind"], 0.0) + p_kib
            n_app += info["kind"] == "ClientApp"
        if pss > self.peak["pss"]:
            self.peak.update(pss=pss, by_kind=by_kind)
        self.peak["rss"] = max(self.peak["rss"], rss)
        self.peak["procs"] = max(self.peak["procs"],
                                 sum(v["last"] == now for v in self.seen.values()))
        self.peak["clientapps"] = max(self.peak["clientapps"], n_app)
        self.last_clientapps = n_app
        mem = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        self.min_available = min(self.min_available, float(mem["MemAvailable"].split()[0]))

    def clientapps(self) -> list[dict]:
        return [v for v in self.seen.values() if v["kind"] == "ClientApp"]

    def cpu_by_kind(self) -> dict[str, float]:
        """CPU seconds spent while watched (a ClientApp's last ≤ 0.25 s may be missed)."""
        out: dict[str, float] = {}
        for v in self.seen.values():
            cpu = v["cpu"] - (0 if v["kind"] == "ClientApp" else v["cpu0"])
            out[v["kind"]] = out.get(v["kind"], 0.0) + cpu / _TICK
        return out

    def stop_all(self, grace: float = 10.0) -> list[str]:
        """SIGTERM every descendant, SIGKILL what is left after `grace` s, reap; returns
        what is still alive afterwards (should be nothing)."""
        import signal
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            alive = {p for p, st in self.descendants().items() if st[1] != "Z"}
            for pid in alive:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            end = time.time() + wait
            while time.time() < end and any(
                    st[1] != "Z" for st in self.descendants().values()):
                self._reap()
                time.sleep(0.1)
        self._reap()
        return [f"{pid} ({self.seen.get((pid, st[3]), {}).get('kind', '?')})"
                for pid, st in self.descendants().items() if st[1] != "Z"]

    @staticmethod
    def _reap() -> None:
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    return
            except ChildProcessError:
                return


def _busy() -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy since boot, now)."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / _TICK, time.time()


def _busy_cores(a: tuple[float, float], b: tuple[float, float]) -> float:
    return (b[0] - a[0]) / (b[1] - a[1])


def _clientapp_figures(apps: list[dict], t: np.ndarray, K: int) -> dict:
    """ClientApp processes against the round completion times `t` (rounds 2..: round 1
    also holds the K sequential joins). A stage is one message to every silo (plain: 1 per
    round; SecAgg+: 4), so the starts of a round, sorted, fall into stages of K (a
    re-launched ClientApp would shift them: see `clientapps_per_silo_round`)."""
    starts = np.array(sorted(a["start"] for a in apps))
    by_start = sorted(apps, key=lambda a: a["start"])
    out = {"clientapps_before_round1": int((starts <= t[0]).sum()),
           "clientapps": [{"start": a["start"] - t[0], "life": a["last"] - a["start"],
                           "cpu": a["cpu"] / _TICK} for a in by_start]}
    later = (starts > t[0]) & (starts <= t[-1])
    out["clientapps_per_silo_round"] = float(later.sum() / (K * (len(t) - 1)))
    if not later.any():
        return out
    out["clientapp_life_s"] = float(np.median([by_start[i]["last"] - by_start[i]["start"]
                                               for i in np.flatnonzero(later)]))
    out["clientapp_cpu_s"] = float(np.median([by_start[i]["cpu"] / _TICK
                                              for i in np.flatnonzero(later)]))
    spread, period = [], []
    for r in range(1, len(t)):
        s = starts[(starts > t[r - 1]) & (starts <= t[r])]
        stages = [s[i:i + K] for i in range(0, len(s) - len(s) % K, K)]
        spread += [g[-1] - g[0] for g in stages]
        period += list(np.diff([g[0] for g in stages]))
    out["stage_spread_s"] = float(np.median(spread)) if spread else None
    out["stage_period_s"] = float(np.median(period)) if period else None
    return out


def bare_clientapp_start(repeats: int = 3) -> dict:
    """Wall and CPU seconds (best of `repeats`) and peak RSS of a fresh interpreter that
    imports what a ClientApp process imports: flwr's `flwr-clientapp` entry point; then
    silofl's ClientApp module (`clientapp`, what the App shim loads); then also the silo
    program a join or round message needs (data, plan, accounting: numpy, pandas,
    dp_accounting)."""
    import subprocess
    out = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # VmHWM: this process image's peak RSS (ru_maxrss would carry the parent's over fork)
    report = ("; import resource as r, re; u = r.getrusage(r.RUSAGE_SELF); print(u.ru_utime"
              " + u.ru_stime, re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status')"
              ".read()).group(1))")
    entry = "import flwr.supernode.cli.flwr_clientapp"
    for label, code in (("flwr", entry),
                        ("flwr + silofl App", entry + "; import silofl.runtime.network.clientapp"),
                        ("flwr + silofl App + silo program",
                         entry + "; import silofl.runtime.network.clientapp, "
                                 "silofl.runtime.network.silo")):
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", code + report], check=True, env=env,
                               capture_output=True, text=True)
            cpu, rss = p.stdout.split()
            runs.append((time.perf_counter() - t0, float(cpu), float(rss) / 1024))
        wall, cpu, rss = min(runs)
        out[label] = {"wall_s": wall, "cpu_s": cpu, "maxrss_mb": rss}
    return out


def _tail(path: Path, n: int = 15) -> list[str]:
    """The last `n` lines of a log, without terminal colour codes."""
    import re
    text = path.read_text(errors="replace") if path.exists() else ""
    return re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()[-n:]


def process_app_run(fed: Federation, rounds: int, secagg: bool, timeout: float,
                    progress=None, keep_logs: str | None = None,
                    workers: bool = False) -> dict:
    """One run over real `flower-superlink` + K `flower-supernode` processes (TLS,
    SuperNode authentication), `rounds` rounds. Returns the per-round time (median gap
    between completed rounds), the start-up phases, ClientApp processes per round and
    their lifetimes, CPU by process kind and the peak memory of all processes together;
    on failure "error" with the last lines of the `flwr run` and SuperLink logs. Everything
    started is ended at the end (also on error or after `timeout` s). `keep_logs`: a folder
    to copy every process's log to. `workers`: also start each silo's `silo_worker`
    (`local_commands()["workers"]`), which the ClientApps forward to."""
    import shutil
    import subprocess

    from silofl.runtime.network import flower_app
    _subreaper()
    port, K = _port(), len(fed.silos)
    bin_dir = str(Path(sys.executable).parent)
    watch = ProcWatch()
    res: dict = {"silos": K, "secagg": secagg, "rounds": rounds, "workers": workers}
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, logs = Path(tmp) / "c", Path(tmp) / "logs"
        logs.mkdir()
        # the first round waits for all K sequential joins: allow them the whole run
        w = _app_folder(out, fed, rounds, secagg, port, join_timeout=timeout)
        cmds = flower_app.local_commands(out, w["silos"], port, bin_dir=bin_dir)
        env = {**os.environ, **cmds["env"], "FLWR_HOME": str(out / "flower_home"),
               "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

        def start(cmd, name):
            with open(logs / f"{name}.log", "wb") as f:
                return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        deadline, t = time.time() + timeout, np.array([])
        t0, busy0, own0 = time.time(), _busy(), sum(os.times()[:2])
        try:
            start(cmds["superlink"], "superlink")
            while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
                if time.time() > deadline:
                    raise RuntimeError("the SuperLink did not start")
                time.sleep(0.05)
            res["superlink_s"] = time.time() - t0
            t1 = time.time()
            for cmd in cmds["register"]:
                while subprocess.run(cmd, timeout=60, capture_output=True,
                                     env=env).returncode != 0:
                    if time.time() > deadline:
                        raise RuntimeError(f"could not register {cmd[-2]}")
                    time.sleep(0.5)
            res["register_s"] = time.time() - t1
            for name, c in (cmds["workers"] if workers else {}).items():
                start(c, f"worker_{name}")
            for name, c in cmds["supernodes"].items():
                start(c, f"supernode_{name}")
            t_run = time.time()
            run = start(cmds["run"], "flwr_run")
            state = out / "state" / "server"
            while run.poll() is None or not (state / "summary.json").exists():
                watch.sample()
                done = len(_round_times(out)) if (state / "server.json").exists() else 0
                if progress:
                    progress(f"{K} SuperNodes{' SecAgg+' if secagg else ''}: round "
                             f"{done}/{rounds} done, {time.time() - t0:.0f} s, "
                             f"{watch.last_clientapps} ClientApp processes")
                if run.poll() is not None and not (state / "summary.json").exists():
                    raise RuntimeError(f"flwr run exited ({run.returncode}) after {done} "
                                       f"round(s), {time.time() - t0:.0f} s")
                if time.time() > deadline:
                    raise RuntimeError(f"not finished within {timeout:g} s ({done} rounds)")
                if watch.min_available < 1024 ** 2:   # KiB: stop before the machine swaps
                    raise RuntimeError("less than 1 GiB of memory left: stopped")
                time.sleep(0.25)
            t = _round_times(out)
            if len(t) != rounds:
                raise RuntimeError(f"the run finished {len(t)} of {rounds} rounds")
        except RuntimeError as e:
            res["error"] = str(e)
            res["log_tail"] = {n: _tail(logs / f"{n}.log") for n in ("flwr_run", "superlink")}
        finally:
            res["leftovers"] = watch.stop_all()
            if keep_logs:
                dest = Path(keep_logs) / f"K{K}_{'secagg' if secagg else 'plain'}"
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(logs, dest)
    res["cpu_s"] = watch.cpu_by_kind()
    own = sum(os.times()[:2]) - own0   # this process: driving and sampling
    res["bench_cores"] = own / (time.time() - busy0[1])
    res["others_cores"] = _busy_cores(busy0, _busy()) - (sum(res["cpu_s"].values()) + own) / (
        time.time() - busy0[1])   # other users of the machine meanwhile (not this run)
    res["peak"] = {**watch.peak, "pss_gib": watch.peak["pss"] / 1024 ** 2,
                   "rss_gib": watch.peak["rss"] / 1024 ** 2}
    res["clientapps_started"] = len(watch.clientapps())
    if "error" in res:
        return res
    res["round_s"] = float(np.median(np.diff(t)))
    res["first_round_after_run_s"] = float(t[0] - t_run)
    res["startup_s"] = float(t[0] - t0 - res["round_s"])   # all before round 1's own work
    res.update(_clientapp_figures(watch.clientapps(), t, K))
    res["wall_s"] = float(t[-1] - t0)
    return res


def _subset(full: Federation, K: int) -> Federation:
    return Federation(full.silos[:K], full.feature_names, full.task, full.num_classes,
                      name=f"vehicle-like-{K}")


def secagg_main(rounds: int) -> None:
    full = vehicle_like(seed=0)
    print("Flower App route in one process (LoopbackGrid), Vehicle-like MR-MTL, per-round "
          "wall time (median)")
    print(f"{'silos':>5} {'loopback plain':>15} {'loopback SecAgg+':>17} "
          f"{'SecAgg+ extra/silo':>19}")
    for K in (4, 23):
        plain = loopback_app_round(_subset(full, K), rounds, secagg=False)
        masked = loopback_app_round(_subset(full, K), rounds, secagg=True)
        print(f"{K:>5} {plain * 1e3:>13.0f}ms {masked * 1e3:>15.0f}ms "
              f"{(masked - plain) / K * 1e3:>17.1f}ms")
        sys.stdout.flush()


def _machine() -> dict:
    import platform

    import flwr
    mem = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return {"cores": os.cpu_count(), "load_avg": os.getloadavg(),
            "mem_gib": float(mem["MemTotal"].split()[0]) / 1024 ** 2,
            "python": platform.python_version(), "flwr": flwr.__version__,
            "nice": os.nice(0)}


def app_main(silos: list[int], rounds: int, timeout: float, json_path: str | None,
             modes: tuple[bool, ...] = (False, True), keep_logs: str | None = None,
             workers: bool = False) -> None:
    """Real SuperLink + K SuperNodes, plain and SecAgg+, against the simulator."""
    from rich.console import Console
    from rich.table import Table
    console = Console(width=max(150, Console().width))
    full = vehicle_like(seed=0)
    facts = _machine()
    console.print(f"machine: {facts['cores']} cores, {facts['mem_gib']:.0f} GiB, load "
                  f"{', '.join(f'{x:.2f}' for x in facts['load_avg'])} (1/5/15 min), "
                  f"nice {facts['nice']}, Python {facts['python']}, flwr {facts['flwr']}")
    with console.status("bare ClientApp start (fresh interpreter, imports only)"):
        bare = bare_clientapp_start()
    for label, b in bare.items():
        console.print(f"bare ClientApp start, imports of {label}: {b['wall_s']:.2f} s wall, "
                      f"{b['cpu_s']:.2f} s CPU, peak RSS {b['maxrss_mb']:.0f} MB")
    runs = []
    with console.status("") as status:
        for K in silos:
            fed = _subset(full, K)
            status.update(f"{K} silos: in-process simulator")
            sim = simulator_round(fed, 12, "joint")
            status.update(f"{K} silos: legacy fast path (start_client, TLS)")
            try:
                legacy = network_round(fed, max(rounds, 4), tls=True)
            except (AssertionError, OSError) as e:  # a run that did not finish: say so
                print(f"legacy fast path, {K} silos: did not finish ({e})")
                legacy = None
            for secagg in modes:
                r = process_app_run(fed, rounds, secagg, timeout, progress=status.update,
                                    keep_logs=keep_logs, workers=workers)
                r["simulator_round_s"], r["legacy_round_s"] = sim, legacy
                runs.append(r)
                label = f"{K} SuperNodes{' SecAgg+' if secagg else ''}"
                if "error" in r:
                    console.print(f"[red]{label} failed: {r['error']}; peak "
                                  f"{r['peak']['clientapps']} ClientApp processes at once, "
                                  f"{r['clientapps_started']} started; left over: "
                                  f"{len(r['leftovers'])}[/red]")
                    for name, lines in r["log_tail"].items():
                        console.print(f"last lines of {name}:", *lines, sep="\n  ",
                                      markup=False, highlight=False)
                else:
                    console.print(f"{label}: {r['round_s']:.1f} s/round, start-up "
                                  f"{r['startup_s']:.0f} s")
    facts["load_avg_end"] = os.getloadavg()
    if json_path:
        from silofl.io import write_json_atomic
        write_json_atomic(json_path, {"machine": facts, "bare_clientapp_start": bare,
                                      "runs": runs})
        console.print(f"wrote {json_path}")
    ok = [r for r in runs if "error" not in r]
    if not ok:
        sys.exit(1)
    t = Table(title=f"Default route: SuperLink + K SuperNodes over loopback (TLS, SuperNode "
                    f"auth), beside the simulator and the legacy fast path (start_client, TLS), "
                    f"Vehicle-like MR-MTL, {rounds} rounds: per round (median)")
    for c in ("K", "SecAgg+", "s/round", "simulator ms/round", "overhead per silo-round (s)",
              "legacy fast path ms/round", "legacy overhead per silo-round (ms)",
              "ClientApps per silo-round", "stage period (s)", "stage spread (s)",
              "ClientApp lifetime (s)", "ClientApp CPU (s)", "others' load (cores)"):
        t.add_column(c, justify="right")

    def f(x, fmt):
        return "–" if x is None else format(x, fmt)
    for r in ok:
        t.add_row(str(r["silos"]), "yes" if r["secagg"] else "no", f"{r['round_s']:.1f}",
                  f"{r['simulator_round_s'] * 1e3:.1f}",
                  f"{(r['round_s'] - r['simulator_round_s']) / r['silos']:.2f}",
                  f(r["legacy_round_s"] and r["legacy_round_s"] * 1e3, ".1f"),
                  f(r["legacy_round_s"] and (r["legacy_round_s"] - r["simulator_round_s"])
                    / r["silos"] * 1e3, ".1f"),
                  f"{r['clientapps_per_silo_round']:.2f}", f(r.get("stage_period_s"), ".1f"),
                  f(r.get("stage_spread_s"), ".1f"), f(r.get("clientapp_life_s"), ".1f"),
                  f(r.get("clientapp_cpu_s"), ".2f"), f"{r['others_cores']:.1f}")
    console.print(t)
    t = Table(title="Start-up (SuperLink up, K keys registered, then `flwr run` until round 1 "
                    "is done) and resources of all processes together")
    for c in ("K", "SecAgg+", "SuperLink up (s)", "register K keys (s)",
              "flwr run → round 1 done (s)", "start-up excl. one round (s)",
              "ClientApps before round 1", "peak PSS (GiB)", "peak RSS sum (GiB)",
              "peak processes", "CPU s: ClientApps / SuperNodes+SuperExecs / rest",
              "left over"):
        t.add_column(c, justify="right")
    for r in ok:
        cpu = r["cpu_s"]
        node = cpu.get("SuperNode", 0.0) + cpu.get("SuperExec", 0.0)
        rest = sum(cpu.values()) - node - cpu.get("ClientApp", 0.0)
        t.add_row(str(r["silos"]), "yes" if r["secagg"] else "no", f"{r['superlink_s']:.1f}",
                  f"{r['register_s']:.1f}", f"{r['first_round_after_run_s']:.0f}",
                  f"{r['startup_s']:.0f}", str(r["clientapps_before_round1"]),
                  f"{r['peak']['pss_gib']:.2f}", f"{r['peak']['rss_gib']:.2f}",
                  str(r["peak"]["procs"]),
                  f"{cpu.get('ClientApp', 0.0):.0f} / {node:.0f} / {rest:.0f}",
                  str(len(r["leftovers"])))
    console.print(t)
    console.print("Per round: median gap between completed rounds (server log). Overhead per "
                  "silo-round = (s/round − simulator) / K. ClientApps per silo-round: "
                  "ClientApp processes started in rounds 2.. (one per message). A stage is "
                  "one message to every silo; its period is the median gap between the first "
                  "ClientApp starts of consecutive stages, its spread the median time from "
                  "its first to its last ClientApp start (SuperNode and SuperExec polling). "
                  "ClientApp lifetime and CPU: medians per process (sampled every 0.25 s). "
                  "Others' load: CPU the rest of the machine used meanwhile. PSS splits shared "
                  "pages among the processes sharing them; the RSS sum counts them once per "
                  "process.")
    if len(ok) < len(runs):
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--secagg", action="store_true",
                    help="measure the Flower App route in one process (LoopbackGrid) with and "
                         "without SecAgg+, then over real processes (--app-silos)")
    ap.add_argument("--app", action="store_true",
                    help="only the real SuperLink/SuperNode processes (--app-silos)")
    ap.add_argument("--app-silos", default="4,23",
                    help="numbers of SuperNodes to run over real processes, e.g. 4,23")
    ap.add_argument("--app-rounds", type=int, default=3,
                    help="rounds over real SuperLink/SuperNode processes (0: skip them)")
    ap.add_argument("--app-timeout", type=float, default=1800.0,
                    help="seconds one real-process run may take (then it is stopped)")
    ap.add_argument("--app-modes", default="plain,secagg",
                    help="which real-process runs: plain, secagg or both (plain,secagg)")
    ap.add_argument("--keep-logs", default=None,
                    help="copy every real-process run's logs into this folder")
    ap.add_argument("--json", default=None, help="also write the real-process figures here")
    ap.add_argument("--app-workers", action="store_true",
                    help="also start each silo's long-lived silo_worker (the ClientApps "
                         "forward to it instead of importing the silo program)")
    a = ap.parse_args()
    try:
        silos = [int(k) for k in a.app_silos.split(",")]
        if any(not 2 <= k <= 23 for k in silos):
            raise ValueError
    except ValueError:
        ap.error(f"--app-silos {a.app_silos!r}: give numbers of silos between 2 and 23 "
                 f"(Vehicle-like has 23; SecAgg+ needs 2), comma-separated, e.g. 4,23")
    modes = tuple(dict.fromkeys({"plain": False, "secagg": True}.get(m, None)
                                for m in a.app_modes.split(",")))
    if None in modes:
        ap.error(f"--app-modes {a.app_modes!r}: give plain, secagg or plain,secagg")
    if a.app_rounds == 1 or a.app_rounds < 0:
        ap.error("--app-rounds: give 0 (skip) or at least 2 (per-round time is the gap "
                 "between completed rounds)")
    if a.secagg or a.app:
        if a.secagg:
            secagg_main(min(a.rounds, 4))
        if a.app_rounds:
            app_main(silos, a.app_rounds, a.app_timeout, a.json, modes, a.keep_logs,
                     a.app_workers)
        return
    full = vehicle_like(seed=0)
    print(f"Vehicle-like MR-MTL, {a.rounds} rounds, per-round wall time (median), loopback")
    print(f"{'silos':>5} {'simulator':>10} {'sim/silo':>10} {'net plain':>10} {'net TLS':>10}"
          f" {'overhead/silo-round (TLS)':>27}")
    for K in (4, 23):
        fed = _subset(full, K)
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

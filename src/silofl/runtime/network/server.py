"""The server program: runs the algorithm's server step over the silos that answered.

It never sees a row of data, a budget store or a noise stream: it sends each silo the
public job description and, every round, the broadcast message with the work it expects
(steps, q, σ as the silo itself reported them at join); it takes the signed updates of the
silos that ran the round, renormalizes the weights over them, and applies
`Algorithm.server_step`. A round with fewer than `min_silos` updates stops the run with a
clear error. After every completed round the server state is checkpointed to disk
(atomically); a restarted server resumes after its last completed round.
"""

from __future__ import annotations

import io
import json
import os
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from silofl.errors import ConfigError, SiloflError
from silofl.privacy.accounting import DEFAULT_ACCOUNTANT
from silofl.experiments.atomic import write_bytes_atomic, write_json_atomic
from silofl.runtime.network import messages as W
from silofl.runtime.network.silo import (JOB_KEYS, check_job, job_algorithm, job_config,
                                         job_model)

#: fault injection for tests and drills: exit abruptly after checkpointing this round
CRASH_ENV = "SILOFL_FAULT_SERVER_EXIT_ROUND"
JOB_DEFAULTS = {"lam": 0.3, "weighted": True, "finetune_fraction": 0.5, "model": "logistic",
                "task": "binary", "num_classes": 2, "local_epochs": 1.0, "batch_size": 32,
                "lr": 0.1, "clip": 1.0, "l2": 0.0, "accountant": DEFAULT_ACCOUNTANT,
                "noise": "secure", "seed": 0}


@dataclass
class ServerConfig:
    address: str
    job: dict
    silos: dict[str, Path]          # silo name → its registered public key (PEM)
    state_dir: Path
    expected_silos: int
    min_silos: int
    certificates: tuple[Path, Path, Path] | None  # CA, server cert, server key; None: plain
    join_timeout: float = 60.0      # s to wait for enough silos before a round
    round_timeout: float = 600.0    # s a round may take (a silo slower is left out)
    rejoin_wait: float = 0.0        # s to wait each round for silos that dropped out
    secagg: bool = False


def load_server_config(path: str | Path) -> ServerConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read server config {str(path)!r}: {e}") from None
    base = path.parent
    unknown = set(raw) - {"server", "job", "silos"}
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {sorted(unknown)}; use [server], "
                          "[job], [silos]")
    s, j, silos = raw.get("server", {}), raw.get("job", {}), raw.get("silos", {})
    bad = set(j) - set(JOB_KEYS)
    if bad:
        raise ConfigError(f"{path}: unknown [job] key(s) {sorted(bad)}; known: "
                          f"{', '.join(sorted(JOB_KEYS))}")
    job = {**JOB_DEFAULTS, **j}
    for k in ("local_epochs", "lr", "clip", "l2", "lam", "finetune_fraction"):
        if isinstance(job.get(k), int) and not isinstance(job.get(k), bool):
            job[k] = float(job[k])
    try:
        job = check_job({k: job[k] for k in JOB_KEYS})
        job_algorithm(job)  # validates the method for the network
        job_config(job).validate()
        insecure = bool(s.get("insecure", False))
        certs = None
        if not insecure:
            certs = tuple(base / s[k] for k in ("root_certificate", "certificate",
                                                 "private_key"))
        cfg = ServerConfig(
            address=str(s["address"]), job=job,
            silos={str(n): base / p for n, p in silos.items()},
            state_dir=base / s["state_dir"],
            expected_silos=int(s.get("expected_silos", len(silos))),
            min_silos=int(s.get("min_silos", len(silos))), certificates=certs,
            join_timeout=float(s.get("join_timeout", 60.0)),
            round_timeout=float(s.get("round_timeout", 600.0)),
            rejoin_wait=float(s.get("rejoin_wait", 0.0)),
            secagg=bool(s.get("secagg", False)))
    except KeyError as e:
        raise ConfigError(f"{path}: missing key {e.args[0]!r} (TLS needs root_certificate, "
                          "certificate and private_key under [server]; `silofl deploy init` "
                          "writes a complete config)") from None
    except W.ProtocolError as e:
        raise ConfigError(f"{path}: [job] {e}") from None
    if not silos:
        raise ConfigError(f"{path}: [silos] is empty; list each silo's name = public key file")
    if not 1 <= cfg.min_silos <= cfg.expected_silos <= len(silos):
        raise ConfigError(f"{path}: need 1 ≤ min_silos ({cfg.min_silos}) ≤ expected_silos "
                          f"({cfg.expected_silos}) ≤ registered silos ({len(silos)})")
    if cfg.secagg:
        raise ConfigError(f"{path}: secagg = true is not available yet in this version; "
                          "remove it (updates are protected by DP and TLS, not SecAgg+)")
    return cfg


@dataclass
class Registered:
    name: str
    n_train: int
    q: float
    steps: int
    sigma: float
    status: str = "ok"        # ok | refused | exhausted
    reason: str = ""
    rounds: list[int] = field(default_factory=list)


class ServerProgram:
    """The algorithm's server side over explicit, checkpointed state."""

    def __init__(self, cfg: ServerConfig):
        self.cfg = cfg
        self.job = cfg.job
        self.hash = W.job_hash(self.job)
        self.algorithm = job_algorithm(self.job)
        model = job_model(self.job)
        _, self.server = self.algorithm.init(model.init_params(), 1, rounds=self.job["rounds"])
        self.keys = {n: W.load_public_key(p) for n, p in cfg.silos.items()}
        self.silos: dict[str, Registered] = {}
        self.done = 0
        self.log: list[dict] = []
        self._load()

    @property
    def message(self) -> np.ndarray:
        return np.asarray(self.algorithm.broadcast(self.server), dtype=np.float64)

    def accept_join(self, reply: dict) -> Registered | None:
        """Check a join reply (schema, signature of a registered silo, job): the silo's
        registration, or None (ProtocolError) for an unknown or unauthenticated client."""
        rep = W.check_fields(reply, W.JOIN_REPLY, "joined")
        key = self.keys.get(rep["silo"])
        if key is None:
            raise W.ProtocolError(f"silo {rep['silo']!r} is not registered in this server's "
                                  "[silos]; rejected")
        W.verify(key, rep, None)
        if rep["status"] == "ok" and rep["job_hash"] != self.hash:
            raise W.ProtocolError(f"silo {rep['silo']!r} accepted another job; rejected")
        reg = Registered(rep["silo"], rep["n_train"], rep["q"], rep["steps"], rep["sigma"],
                         rep["status"], rep["reason"])
        old = self.silos.get(reg.name)
        if old is not None:
            reg.rounds = old.rounds
        self.silos[reg.name] = reg
        return reg

    def request(self, name: str, t: int) -> dict:
        r = self.silos[name]
        return {"protocol": W.PROTOCOL, "kind": "round", "job_hash": self.hash, "round": t,
                "method": self.job["method"], "steps": r.steps, "q": r.q, "sigma": r.sigma,
                "silo": name}

    def accept_update(self, name: str, t: int, reply: dict, arrays: list):
        """A silo's checked reply: (status, update row (1, P) or None)."""
        rep = W.check_fields(reply, W.ROUND_REPLY, "update")
        if rep["silo"] != name:
            raise W.ProtocolError(f"reply from the connection of silo {name!r} claims to be "
                                  f"from {rep['silo']!r}; rejected")
        P = self.message.shape[0]
        shape = (1, P) if rep["status"] == "ok" and len(arrays) else None
        update = W.check_array(arrays, shape, "update")
        W.verify(self.keys[name], rep, update)
        if rep["round"] != t or rep["job_hash"] != self.hash:
            raise W.ProtocolError(f"silo {name!r} answered round {rep['round']} of job "
                                  f"{rep['job_hash'][:8]}, expected round {t}; rejected")
        if rep["status"] != "ok":
            self.silos[name].status, self.silos[name].reason = rep["status"], rep["reason"]
        return rep["status"], update

    def step(self, t: int, updates: dict[str, np.ndarray | None]) -> None:
        """The server step over the silos that ran round t, weights renormalized over
        them (min_silos rule), then checkpoint."""
        if len(updates) < self.cfg.min_silos:
            raise SiloflError(
                f"round {t}: only {len(updates)} silo(s) ran it ({', '.join(updates) or 'none'})"
                f", fewer than min_silos = {self.cfg.min_silos}; the run stops after round "
                f"{self.done} (checkpointed in {self.cfg.state_dir}; restart the server to "
                "resume when enough silos are back)")
        names = sorted(updates)
        weights = np.array([self.silos[n].n_train if self.job["weighted"] else 1.0
                            for n in names], dtype=float)
        rows = [updates[n] for n in names]
        update = None if any(r is None for r in rows) else np.concatenate(rows)
        self.server = self.algorithm.server_step(self.server, update, weights)
        for n in names:
            self.silos[n].rounds.append(t)
        self.done = t
        self.log.append({"round": t, "silos": names, "time": time.time()})
        self._save()
        if os.environ.get(CRASH_ENV) == str(t):
            os._exit(17)

    # -- checkpoint ---------------------------------------------------------------------
    def _paths(self):
        d = Path(self.cfg.state_dir)
        return d / "server.npz", d / "server.json"

    def _save(self) -> None:
        arrays, meta = self._paths()
        arrays.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        fields = {k: v for k, v in vars(self.server).items() if isinstance(v, np.ndarray)}
        np.savez(buf, **fields)
        write_bytes_atomic(arrays, buf.getvalue())
        write_json_atomic(meta, {
            "job_hash": self.hash, "job": self.job, "round": self.done,
            "state_type": type(self.server).__name__,
            "state_none": [k for k, v in vars(self.server).items() if v is None],
            "silos": {n: vars(r) for n, r in self.silos.items()}, "log": self.log})

    def _load(self) -> None:
        arrays, meta = self._paths()
        if not meta.is_file():
            return
        m = json.loads(meta.read_text())
        if m["job_hash"] != self.hash:
            raise ConfigError(f"{meta.parent} holds the checkpoint of another job (its [job] "
                              "differs); use a fresh state_dir for a new job")
        with np.load(arrays, allow_pickle=False) as z:
            fields = {k: z[k] for k in z.files}
        from silofl.algorithms import base
        cls = getattr(base, m["state_type"], type(self.server))
        self.server = cls(**fields, **{k: None for k in m["state_none"]})
        self.done, self.log = int(m["round"]), m["log"]
        self.silos = {n: Registered(**r) for n, r in m["silos"].items()}

    def summary(self) -> dict:
        return {"job_hash": self.hash, "method": self.job["method"], "rounds_done": self.done,
                "silos": {n: {"status": r.status, "reason": r.reason, "rounds": r.rounds,
                              "sigma": r.sigma, "q": r.q, "steps": r.steps}
                          for n, r in self.silos.items()}}

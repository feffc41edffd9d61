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

import json
import os
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.config import Config
from silofl.config.base import did_you_mean
from silofl.config.network import ServerSection, read_server_file
from silofl.data.bounds import bounds_to_json
from silofl.errors import ConfigError, SiloflError
from silofl.io import write_json_atomic, write_npz_atomic
from silofl.runtime.network import messages as W
from silofl.runtime.network import secagg as S
from silofl.runtime.network.hosting import (
    asks_subset,
    check_row,
    consortium_method,
    encode_message,
    local_dp_family,
    merge_updates,
    select_silos,
    update_width,
)
from silofl.runtime.network.jobspec import (
    JOB_KEYS,
    auto_clip_job,
    check_job,
    data_module,
    job_algorithm,
    job_config,
    job_model,
    job_params0,
    job_silos,
    load_public,
    public_sha256,
    tables_as_json,
)

if TYPE_CHECKING:
    from silofl.runtime.network.gbdt_host import GbdtServerHost

#: fault injection for tests and drills: exit abruptly after checkpointing this round
CRASH_ENV = "SILOFL_FAULT_SERVER_EXIT_ROUND"


def _job_defaults() -> dict:
    """The job's defaults, read from the simulator's configuration model
    (`silofl.config`): one set of keys and defaults for `silofl run` and the
    network. Only what has no simulator counterpart is stated here."""
    c = Config()
    t, p, d, m = c.training, c.privacy, c.data, c.model
    same = ("lam", "weighted", "finetune_fraction", "local_epochs", "batch_size", "lr",
            "clip", "l2", "seed", "clusters", "selection_fraction", "selection_rounds",
            "we_user", "we_p_s", "we_p_d", "we_update", "we_participation", "we_count",
            "we_newcomer", "ldp_epsilon", "ldp_mechanism", "ldp_delta", "client_fraction",
            "max_participation", "kt_samples", "kt_buffer", "kt_self_train",
            "kt_server_epochs", "kt_server_lr", "prox_mu", "apfl_alpha", "apfl_alpha_lr")
    return {**{k: getattr(t, k) for k in same},
            "we_join_round": json.dumps(t.we_join_round, sort_keys=True),
            "we_leave_round": json.dumps(t.we_leave_round, sort_keys=True),
            "model": m.name, "accountant": p.accountant, "noise": p.noise,
            "standardize": d.standardize, "impute": d.impute,
            "preprocess_share": d.preprocess_share,
            # network-only: the task and classes come from the schema (or are stated), the
            # public set of PrivateKT is pinned by its hash, graph data by its settings
            "task": "binary", "num_classes": 2, "public_seed": 0, "public_sha256": "",
            "data_kind": "tabular", "graph": "", "schema_sha256": "", "clip_auto": "",
            "privacy_unit": p.unit, "max_rows_per_person": p.max_rows_per_person,
            "persons_in_silos": p.persons_in_silos, "uldp_weighting": t.uldp_weighting,
            "uldp_sample_rate": t.uldp_sample_rate,
            "trees": json.dumps(c.trees.model_dump(), sort_keys=True),  # dp_gbdt's [trees]
            "bounds": ""}  # dp_gbdt: its bins' bounds (from the declared schema)


JOB_DEFAULTS = _job_defaults()
_SERVER = ServerSection.model_fields


@dataclass
class ServerConfig:
    """The server's settings with paths resolved (`load_server_config`); the keys, types
    and defaults of server.toml are `silofl.config.network.ServerSection`'s."""

    address: str
    job: dict
    silos: dict[str, Path]          # silo name → its registered public key (PEM)
    state_dir: Path
    expected_silos: int
    min_silos: int
    certificates: tuple[Path, Path, Path] | None  # CA, server cert, server key; None: plain
    join_timeout: float = _SERVER["join_timeout"].default  # s to wait for enough silos
    round_timeout: float = _SERVER["round_timeout"].default  # s a round may take
    rejoin_wait: float = _SERVER["rejoin_wait"].default  # s to wait for dropped silos
    poll_interval: float = _SERVER["poll_interval"].default  # s between reply polls
    secagg: bool = False
    public_data: Path | None = None  # PrivateKT's public set (.npz with X), as the silos'
    schema: Path | None = None       # the consortium's declared schema (tables at the silos)
    run_dir: Path | None = None      # where the shared model goes (default: state_dir)

    @property
    def release_dir(self) -> Path:
        return Path(self.run_dir if self.run_dir is not None else self.state_dir)


def load_server_config(path: str | Path) -> ServerConfig:
    """Read server.toml (paths relative to its folder); ConfigError naming the file and
    the bad key (`silofl.config.network.ServerFile`, the job's keys: `JOB_KEYS`)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read server config {str(path)!r}: {e}") from None
    base = path.parent
    f = read_server_file(raw, str(path))
    s, j, silos = f.server, auto_clip_job(f.job), f.silos
    bad = set(j) - set(JOB_KEYS)
    if bad:
        near = [did_you_mean(k, list(JOB_KEYS)) for k in sorted(bad)]
        hint = "".join(f"; did you mean 'job.{n}'?" for n in near if n)
        raise ConfigError(f"{path}: unknown [job] key(s) {sorted(bad)}{hint}; known: "
                          f"{', '.join(sorted(JOB_KEYS))}")
    job = tables_as_json({**JOB_DEFAULTS, **j})
    if isinstance(job["bounds"], list):  # dp_gbdt's bounds as a TOML array of pairs
        try:
            job["bounds"] = bounds_to_json(np.asarray(job["bounds"], dtype=np.float64))
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: [job] bounds must be pairs [lower, upper], one per "
                              f"feature, got {job['bounds']!r:.200}") from None
    if isinstance(job["graph"], dict):  # [job.graph]: graph data's settings, as JSON
        job["graph"] = json.dumps(job["graph"], sort_keys=True)
    # the silos of the job in [silos] order (silo k = the k-th registered), unless stated
    job.setdefault("silos", json.dumps([str(n) for n in silos]))
    for k in ("local_epochs", "lr", "clip", "l2", "lam", "finetune_fraction",
              "selection_fraction", "selection_rounds", "we_p_s", "we_p_d",
              "we_participation", "ldp_epsilon",
              "ldp_delta", "client_fraction", "kt_self_train", "kt_server_lr", "prox_mu",
              "apfl_alpha", "apfl_alpha_lr", "uldp_sample_rate"):
        if isinstance(job.get(k), int) and not isinstance(job.get(k), bool):
            job[k] = float(job[k])
    public_path = base / s.public_data if s.public_data is not None else None
    public = load_public(public_path, f"server config {path}")
    if public is not None:  # pinned in the job: every silo checks its own copy against it
        job["public_sha256"] = public_sha256(public)
    schema_path = base / s.schema if s.schema is not None else None
    if schema_path is not None:  # the job names the schema by its hash, and its shape
        _schema_job(job, j, schema_path, path)
    try:
        job = check_job({k: job[k] for k in JOB_KEYS})
        if sorted(job_silos(job)) != sorted(str(n) for n in silos):
            raise ConfigError(f"{path}: [job] silos {job_silos(job)} must name exactly the "
                              f"registered [silos] {sorted(silos)}")
        job_algorithm(job, public)  # validates the method for the network
        graph = data_module(job["data_kind"])
        if graph is None:
            job_config(job).validate()
        else:
            graph.check_job(job)
    except KeyError as e:
        raise ConfigError(f"{path}: missing [job] key {e.args[0]!r} (`silofl deploy init` "
                          "writes a complete config)") from None
    except W.ProtocolError as e:
        raise ConfigError(f"{path}: [job] {e}") from None
    certs = s.certificates()
    cfg = ServerConfig(
        address=s.address, job=job, silos={str(n): base / p for n, p in silos.items()},
        state_dir=base / s.state_dir,
        expected_silos=len(silos) if s.expected_silos is None else s.expected_silos,
        min_silos=len(silos) if s.min_silos is None else s.min_silos,
        certificates=None if certs is None else (base / certs[0], base / certs[1],
                                                 base / certs[2]),
        join_timeout=s.join_timeout, round_timeout=s.round_timeout,
        rejoin_wait=s.rejoin_wait, poll_interval=s.poll_interval, secagg=s.secagg,
        public_data=public_path,
        schema=schema_path, run_dir=base / s.run_dir if s.run_dir is not None else None)
    _check_server(cfg, job, silos, path)
    return cfg


def _check_server(cfg: ServerConfig, job: dict, silos: dict, path: Path) -> None:
    """The [server] settings against the registered silos and the job (ConfigError)."""
    if not silos:
        raise ConfigError(f"{path}: [silos] is empty; list each silo's name = public key file")
    if not 0.01 <= cfg.poll_interval <= 60.0:
        raise ConfigError(f"{path}: [server] poll_interval = {cfg.poll_interval:g} s is out "
                          "of range; give 0.01 to 60 seconds (default 0.05)")
    if not 1 <= cfg.min_silos <= cfg.expected_silos <= len(silos):
        raise ConfigError(f"{path}: need 1 ≤ min_silos ({cfg.min_silos}) ≤ expected_silos "
                          f"({cfg.expected_silos}) ≤ registered silos ({len(silos)})")
    if cfg.secagg and job["data_kind"] != "tabular":
        raise ConfigError(f"{path}: secagg = true is for tabular jobs: a graph job's regions "
                          "send their models (not bounded changes), which SecAgg+'s clipping "
                          "range does not cover; remove it")
    if cfg.secagg and job["clip_auto"]:
        raise ConfigError(f"{path}: secagg = true needs a fixed clip (its clipping range is "
                          "set from [job] clip); clip = \"auto\" has none: set clip to a number")
    if cfg.secagg and job["lam"] == "auto":
        raise ConfigError(f"{path}: secagg = true hides each silo's update from the server, "
                          "and lam = \"auto\" sets λ_k from those updates: set lam to a "
                          "number (e.g. 1.0) or remove secagg")
    if cfg.secagg and job["method"] == "dp_gbdt":
        raise ConfigError(f"{path}: secagg = true is not available for dp_gbdt: each tree's "
                          "splits are chosen from the summed histograms, which SecAgg+'s "
                          "clipping range and integer encoding do not cover yet; remove it")
    if cfg.secagg and job["method"] not in S.SECAGG_METHODS:
        raise ConfigError(f"{path}: secagg = true needs a method whose server step is a "
                          f"weighted mean (fedavg, mrmtl) or a sum (uldp), not "
                          f"{job['method']!r}; remove it")
    if job["method"] in S.SECAGG_ONLY:
        _check_uldp(cfg, job, silos, path)


def _check_uldp(cfg: ServerConfig, job: dict, silos: dict, path: Path) -> None:
    """ULDP over the network: inside a SecAgg+ sum, at person level, every silo each round."""
    if not cfg.secagg:
        raise ConfigError(
            f"{path}: method 'uldp' runs over the network only inside a SecAgg+ sum: its "
            "person-level guarantee holds where the server sees nothing but the sum of the "
            "silos' shares (each carries 1/K of the noise). Set [server] secagg = true "
            "(Flower's SuperLink route, `flwr run`), or run uldp in the simulator")
    if job["privacy_unit"] != "person":
        raise ConfigError(f"{path}: method 'uldp' weights persons across silos: set [job] "
                          "privacy_unit = \"person\" (every silo's data names its persons)")
    if job["uldp_weighting"] != "uniform" or job["uldp_sample_rate"] != 1.0:
        raise ConfigError(
            f"{path}: over the network uldp runs with [job] uldp_weighting = \"uniform\" (1/M "
            "for the declared persons_in_silos) and uldp_sample_rate = 1: linked weights need "
            "a linkage protocol between the silos (each silo would learn the others' record "
            "counts of its persons, and could not check that a person's weights sum to ≤ 1), "
            "and sampling needs a consortium secret the server does not hold; use the "
            "simulator (`silofl run`) for those")
    if not cfg.min_silos == cfg.expected_silos == len(silos):
        raise ConfigError(
            f"{path}: method 'uldp' needs every one of the {len(silos)} silos in every "
            "sum (a sum without a silo's share lacks its part of the noise σC); remove "
            f"[server] min_silos / expected_silos (default: all) or set both to {len(silos)}")


def _schema_job(job: dict, stated: dict, schema_path: Path, path: Path) -> None:
    """Fill the job's schema hash, feature count, task and classes from the declared schema
    (ConfigError where [job] states them otherwise)."""
    from silofl.runtime.network.silo_table import check_preprocessing, read_schema, schema_sha256
    schema = read_schema(schema_path, f"server config {path}")
    try:  # what every silo will apply: never uncharged; private steps need declared bounds
        check_preprocessing(schema, {**job, "preprocess_share": float(job["preprocess_share"])})
    except ConfigError as e:
        raise ConfigError(f"{path}: [job] {e}") from None
    lab = schema.label
    derived = {"schema_sha256": schema_sha256(schema), "dim": len(schema.feature_names),
               "task": lab.kind,
               "num_classes": max(len(lab.classes), 2) if lab.kind != "regression" else 2}
    wrong = [f"{k} = {stated[k]!r} (the schema gives {v!r})" for k, v in derived.items()
             if k in stated and stated[k] != v]
    if job["method"] == "dp_gbdt":  # the bins' bounds: public job data every silo checks
        from silofl.runtime.network.silo_table import declared_bounds, same_bounds
        try:
            bounds = declared_bounds(schema, job)
        except ConfigError as e:
            raise ConfigError(f"{path}: [job] {e}") from None
        if job["bounds"] and not same_bounds(job["bounds"], bounds):
            wrong.append(f"bounds = {job['bounds'][:200]!r} (the schema gives "
                         f"{bounds_to_json(bounds)!r})")
        derived["bounds"] = bounds_to_json(bounds)
    if wrong:
        raise ConfigError(f"{path}: [job] " + "; ".join(wrong) + "; remove them: the "
                          "schema decides")
    job.update(derived)


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

    #: the job's Algorithm and its server state (None for dp_gbdt, whose server program
    #: `gbdt` hosts: `gbdt_host.GbdtServerHost`)
    algorithm: Any
    server: Any
    gbdt: GbdtServerHost | None

    def __init__(self, cfg: ServerConfig):
        self.cfg = cfg
        self.job = cfg.job
        self.hash = W.job_hash(self.job)
        self.names = job_silos(self.job)  # silo k = names[k], as in the simulator
        self.gbdt = None
        if self.job["method"] == "dp_gbdt":  # not an Algorithm: the trees' server program
            from silofl.runtime.network.gbdt_host import GbdtServerHost
            self.algorithm, self.server, self.P = None, None, 0
            self.gbdt = GbdtServerHost(self)
        else:
            self.algorithm = job_algorithm(self.job, load_public(cfg.public_data, "server"))
            start = job_params0(self.job, job_model(self.job))
            self.P = start.shape[0]
            _, self.server = self.algorithm.init(start, len(self.names),
                                                 rounds=self.job["rounds"])
        self.keys = {n: W.load_public_key(p) for n, p in cfg.silos.items()}
        self.silos: dict[str, Registered] = {}
        self.done = 0
        self.log: list[dict] = []
        self._load()

    @property
    def rounds(self) -> int:
        """Rounds of the job (dp_gbdt: one per protocol message)."""
        return self.gbdt.total if self.gbdt is not None else int(self.job["rounds"])

    @property
    def message(self) -> np.ndarray:
        if self.gbdt is not None:
            return self.gbdt.message
        return encode_message(self.algorithm, self.algorithm.broadcast(self.server))

    def accept_join(self, reply: dict) -> Registered:
        """Check a join reply (schema, signature of a registered silo, job): the silo's
        registration (ProtocolError for an unknown or unauthenticated client)."""
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

    def selected(self, t: int, available: list[str]) -> list[str]:
        """The silos to ask in round t among the `available` ones still in the job: all of
        them, or for a local-DP method the public selection among those whose reported
        plan covers one more upload, or for Weight Erosion with a participation schedule
        the silos of round t's public schedule (each silo still checks for itself)."""
        ok = np.array([n in available and n in self.silos and self.silos[n].status == "ok"
                       and (not local_dp_family(self.algorithm)
                            or len(self.silos[n].rounds) < self.silos[n].steps)
                       for n in self.names])
        self.asked = [self.names[k] for k in select_silos(self.algorithm, ok, t)]
        return [n for n in available if n in self.asked]

    def request(self, name: str, t: int) -> dict:
        r = self.silos[name]
        sigma = self.consortium_sigma() if consortium_method(self.algorithm) else r.sigma
        return {"protocol": W.PROTOCOL, "kind": "round", "job_hash": self.hash, "round": t,
                "method": self.job["method"], "steps": r.steps, "q": r.q, "sigma": sigma,
                "silo": name}

    def consortium_sigma(self) -> float:
        """ULDP's one σ: the largest any silo calibrated for its own (ε_k, δ_k) (their join
        replies; public), so that every silo's target holds (each silo accepts a σ at least
        its own, and charges the σ it ran)."""
        return max((r.sigma for r in self.silos.values()), default=0.0)

    def n_persons(self) -> np.ndarray:
        """(K,) every job silo's number of persons as its join reply stated (ULDP's Z)."""
        missing = [n for n in self.names if n not in self.silos]
        if missing:
            raise SiloflError(f"uldp needs every silo's number of persons; {missing} never "
                              "joined")
        return np.array([self.silos[n].n_train for n in self.names], dtype=float)

    def accept_update(self, name: str, t: int, reply: dict, arrays: list):
        """A silo's checked reply: (status, update row (1, P) or None)."""
        rep = W.check_fields(reply, W.ROUND_REPLY, "update")
        if rep["silo"] != name:
            raise W.ProtocolError(f"reply from the connection of silo {name!r} claims to be "
                                  f"from {rep['silo']!r}; rejected")
        shape = (1, update_width(self.algorithm, self.P)) if self.gbdt is None \
            else self.gbdt.update_shape()
        shape = shape if rep["status"] == "ok" and len(arrays) else None
        update = W.check_array(arrays, shape, "update")
        W.verify(self.keys[name], rep, update)
        if update is not None:
            bad = check_row(self.algorithm, update, lr=self.job["lr"],
                            batch=self.job["batch_size"], n=self.silos[name].n_train,
                            round=t, silo=self.names.index(name))
            if bad:
                raise W.ProtocolError(f"silo {name!r}: malformed update ({bad}); rejected")
        if rep["round"] != t or rep["job_hash"] != self.hash:
            raise W.ProtocolError(f"silo {name!r} answered round {rep['round']} of job "
                                  f"{rep['job_hash'][:8]}, expected round {t}; rejected")
        if rep["status"] != "ok":
            self.silos[name].status, self.silos[name].reason = rep["status"], rep["reason"]
        return rep["status"], update

    def step(self, t: int, updates: dict[str, np.ndarray | None],
             mean: np.ndarray | None = None) -> None:
        """The server step over the silos that ran round t, weights renormalized over
        them (min_silos rule), then checkpoint. `mean` (1, P): SecAgg+ gave only the
        weighted mean of the rows of `updates`' silos (their values are then None)."""
        need = self.cfg.min_silos
        if asks_subset(self.algorithm):  # only the selected (scheduled) silos were asked
            need = min(need, len(getattr(self, "asked", [])) or need)
        if len(updates) < need:
            raise SiloflError(
                f"round {t}: only {len(updates)} silo(s) ran it ({', '.join(updates) or 'none'})"
                f", fewer than min_silos = {self.cfg.min_silos}; the run stops after round "
                f"{self.done} (checkpointed in {self.cfg.state_dir}; restart the server to "
                "resume when enough silos are back)")
        names = sorted(updates, key=self.names.index)
        if self.gbdt is not None:
            self.gbdt.step(names, updates)
            self._done(t, names)
            return
        weighted = self.job["weighted"] and getattr(self.algorithm, "weighted", True)
        idx = {n: self.names.index(n) for n in names}
        update, weights = merge_updates(
            self.algorithm, {idx[n]: updates[n] for n in names},
            {idx[n]: float(self.silos[n].n_train) if weighted else 1.0 for n in names},
            len(self.names), t)
        if consortium_method(self.algorithm):  # ULDP: the step on the SecAgg+ sum only
            update, weights = self._sum_update(t, names, mean), np.ones(1)
        elif mean is not None:  # the weighted mean, with weight 1, is the same server step
            update, weights = np.asarray(mean, dtype=np.float64).reshape(1, -1), np.ones(1)
        self.server = self.algorithm.server_step(self.server, update, weights)
        self._done(t, names)

    def _done(self, t: int, names: list[str]) -> None:
        for n in names:
            self.silos[n].rounds.append(t)
        self.done = t
        self.log.append({"round": t, "silos": names, "time": time.time()})
        self._save()
        if os.environ.get(CRASH_ENV) == str(t):
            os._exit(17)

    def _sum_update(self, t: int, names: list[str], mean: np.ndarray | None) -> np.ndarray:
        """ULDP's (1, P) change from SecAgg+'s mean of the K shares (every weight 1):
        Σ_k u_k = K·mean; never from individual shares, and never from a partial sum."""
        if mean is None or len(names) != len(self.names):
            raise SiloflError(
                f"round {t}: uldp steps only on the SecAgg+ sum of all {len(self.names)} "
                f"silos' shares, got {'a plain round' if mean is None else len(names)}; the "
                f"run stops after round {self.done} (checkpointed)")
        total = np.asarray(mean, dtype=np.float64).reshape(-1) * len(names)
        return self.algorithm.sum_update(self.server.params, total, self.n_persons(),
                                         float(self.job["lr"]), float(self.job["l2"]))

    # -- checkpoint ---------------------------------------------------------------------
    def _paths(self):
        d = Path(self.cfg.state_dir)
        return d / "server.npz", d / "server.json"

    def _save(self) -> None:
        arrays, meta = self._paths()
        arrays.parent.mkdir(parents=True, exist_ok=True)
        state, gbdt = ({}, self.gbdt.state()) if self.gbdt is not None \
            else (vars(self.server), ({}, None))  # dp_gbdt: its server program's state
        write_npz_atomic(arrays, compressed=False,  # keys: the server state's array fields
                         **{k: v for k, v in state.items() if isinstance(v, np.ndarray)},
                         **gbdt[0])
        write_json_atomic(meta, {
            "job_hash": self.hash, "job": self.job, "round": self.done,
            "state_type": type(self.server).__name__,
            "state_none": [k for k, v in state.items() if v is None],
            "silos": {n: vars(r) for n, r in self.silos.items()}, "log": self.log,
            "gbdt": gbdt[1]})

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
        if self.gbdt is not None:  # the trees' server program, where it stopped
            self.gbdt.restore(fields, m["gbdt"])
        else:
            from silofl.algorithms import base
            cls = getattr(base, m["state_type"], type(self.server))
            self.server = cls(**fields, **{k: None for k in m["state_none"]})
        self.done, self.log = int(m["round"]), m["log"]
        self.silos = {n: Registered(**r) for n, r in m["silos"].items()}

    def summary(self) -> dict:
        return {"job_hash": self.hash, "method": self.job["method"], "rounds_done": self.done,
                # what each silo's guarantee protects: one row, or all rows of one person
                "privacy_unit": self.job["privacy_unit"],
                "silos": {n: {"status": r.status, "reason": r.reason, "rounds": r.rounds,
                              "sigma": r.sigma, "q": r.q, "steps": r.steps}
                          for n, r in self.silos.items()}}

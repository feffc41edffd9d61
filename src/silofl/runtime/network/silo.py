"""The silo program: one institution's side of a networked run.

It loads only its own data (its own table read with the consortium's declared schema,
`silo_table`, or a pre-encoded .npz), keeps its own lifetime budget store and per-round ledger,
plans its own σ from its own (ε_k, δ_k) and the public job description, and for every
round the server requests it checks the work (job, method, steps, q, σ, round) against its
own plan and its own store *before* reading a row:

* a job it does not accept (method not allowed, more rounds than `max_rounds`, another
  noise mode than its own, another schema, a different feature count) is refused at join;
* a request whose steps, q or σ differ from what the silo calibrated is refused;
* each round reserves that round's DP-SGD events in the silo's store (`open_job`); when
  the store refuses (lifetime target reached) the silo answers "exhausted" and takes no
  more work: it leaves, the others go on.

State (personal model, last round, cached last reply) lives in `state_dir`, written after
each round, so a crashed silo restarts where it was; a round it was charged for but did not
finish stays charged (the reservation is never settled). A repeated request for its last
round (server restarted) is answered from the cache: no new computation, no new charge.
Only the update (what the algorithm sends) leaves the silo — test metrics stay local.
"""

from __future__ import annotations

import json
import os
import secrets
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import dp_accounting as dpa
import numpy as np

from silofl.data.federation import Federation, Silo
from silofl.errors import BudgetExceeded, ConfigError, SiloflError
from silofl.io import write_json_atomic, write_npz_atomic
from silofl.models import metrics as M
from silofl.privacy.budget import BudgetStore
from silofl.privacy.ledger import Ledger
from silofl.runtime.job import accountant_kind, open_job, silo_digest
from silofl.runtime.network import messages as W
from silofl.runtime.network import silo_table
from silofl.runtime.network.hosting import (
    check_message,
    consortium_method,
    decode_message,
    encode_update,
    local_dp_family,
    message_size,
    not_scheduled,
    own_step,
    round_events,
    server_view,
    silo_message,
    silo_randomness,
    slice_state,
    uldp_refusal,
)
from silofl.runtime.network.jobspec import (
    check_job,
    data_module,
    job_algorithm,
    job_config,
    job_model,
    job_params0,
    job_silos,
    load_public,
)
from silofl.runtime.network.silo_config import SiloConfig
from silofl.runtime.network.silo_table import (
    check_person_job,
    load_silo_data,
    read_silo_table,
    schema_sha256,
)
from silofl.runtime.plan import SiloPlan, TrainingConfig, pass_event, plan_job
from silofl.runtime.rules import gradient_rule
from silofl.runtime.sources import training_source
from silofl.training.trainer import LocalTrainer

if TYPE_CHECKING:
    from silofl.runtime.network.gbdt_host import GbdtSiloHost

#: fault injection for tests and drills: exit abruptly (as a crash) in this round, after
#: the round was charged and before its reply is sent
CRASH_ENV = "SILOFL_FAULT_SILO_CRASH_ROUND"


def open_program(cfg: SiloConfig, key=None) -> SiloProgram:
    """The silo program for the config's data kind (graph data: the pandemic track's)."""
    graph = data_module(cfg.data_kind)
    return SiloProgram(cfg, key) if graph is None else graph.RegionSiloProgram(cfg, key)


#: the accepted join request, kept in the state dir so that a fresh program (a new process
#: per request: SuperNode, the PETs challenge's runtime) re-accepts the same job (`resume`)
JOIN_FILE = "join.json"


class SiloProgram(silo_table.TableHooks):
    """One silo: `join(job, nonce)` then `round(request, message)` per round.

    What depends on the kind of data is in the `_data_*` hooks (tabular rows here; graph
    data in `silofl.pandemic.network.RegionSiloProgram`): reading the silo's own data, the
    checks of a job against it, the silo's plan, its trainer, the model's start and what
    one local pass costs. Everything else — the checks of every request, the reservation
    in the lifetime store, the algorithm's silo step, state on disk — is shared."""

    cfg: SiloConfig
    # the accepted job, its hash and this silo's plan: None until a join accepts one
    job: dict | None
    hash: str | None
    plan: SiloPlan | None
    #: the latest round served: its broadcast's digest and the update sent back
    last: dict | None
    #: why the silo is exhausted (set with `exhausted`)
    _why: str
    #: the latest shared model received (FedAvg's model for prediction); absent until one
    message: np.ndarray
    #: uldp: the consortium's σ this silo's rounds ran with (None until its first round)
    sigma_used: float | None

    def __init__(self, cfg: SiloConfig, key=None):
        self.cfg = cfg
        self.key = key if key is not None else W.load_private_key(cfg.private_key)
        self._data_open()
        self.store = BudgetStore(cfg.budget_store)
        self.job = self.hash = self.plan = None
        self.done, self.last = 0, None  # rounds served (0 until a job is joined)
        self.exhausted = False
        self.masked, self.sigma_used = False, None  # uldp: is the round masked (ClientApp)
        self.gbdt: GbdtSiloHost | None = None  # dp_gbdt: the trees' silo program, joined

    # -- the data hooks (tabular) ---------------------------------------------------------
    def _data_open(self) -> None:
        """Read the silo's own data: sets `n_train`, `dim` (model inputs), `fingerprint`.
        A table is encoded by the schema here and preprocessed at join (the job's modes)."""
        self.schema = self.raw = None
        if self.cfg.table is not None:
            self.raw, self.schema = read_silo_table(self.cfg.name, self.cfg.table,
                                                    self.cfg.target)
            self.silo, self.feature_names = self.raw.silos[0], list(self.raw.feature_names)
            self.schema_hash = schema_sha256(self.schema)
        else:
            self.silo, self.feature_names = load_silo_data(self.cfg)
        self.n_train, self.dim = self.silo.X_train.shape
        self.fingerprint = silo_digest(self.silo)  # train and test rows, any order

    def _data_check(self, job: dict) -> None:
        """ConfigError when the job does not fit this silo's data."""
        if job["data_kind"] != "tabular":
            raise ConfigError(f"silo {self.cfg.name!r} holds tabular data, the job trains on "
                              f"{job['data_kind']!r} data")
        mine = self.schema_hash if self.schema is not None else ""
        if job["schema_sha256"] != mine:
            raise ConfigError(
                f"silo {self.cfg.name!r} refuses the job: its schema "
                f"({mine[:12] or 'none: pre-encoded .npz data'}) differs from the job's "
                f"({job['schema_sha256'][:12] or 'none'}). The consortium shares one declared "
                "schema: use the coordinator's schema.toml unchanged")
        if job["dim"] != self.dim:
            raise ConfigError(f"silo {self.cfg.name!r} has {self.dim} features, the "
                              f"job's model expects {job['dim']}")
        check_person_job(self.cfg.name, job, self.silo, self.cfg.table)  # before any charge
        if self.raw is not None and self.hash is None:  # once per job (a re-join keeps it)
            self._table_plan(job)

    def _data_plan(self, job: dict, algorithm, tcfg: TrainingConfig) -> SiloPlan:
        """See `_silo_plan`; a private preprocessing release is composed into σ."""
        extra = {e.silo: e.event for e in self._table_extra()}
        return self._silo_plan(job, algorithm, tcfg, extra)

    def _silo_plan(self, job: dict, algorithm, tcfg: TrainingConfig, extra) -> SiloPlan:
        """This silo's plan (σ from its own (ε_k, δ_k)), as the simulator plans a federation
        of the job's silos; the others are stand-ins so that settings naming or counting
        silos (clusters ≤ K, the user silo) are checked alike."""
        c, me, names = self.cfg, self.silo, job_silos(job)
        fed = Federation([me if n == c.name else Silo(n, me.X_train, me.y_train, me.X_test,
                                                      me.y_test, me.target, me.person_train)
                          for n in names],
                         self.feature_names or [f"x{i}" for i in range(job["dim"])],
                         job["task"], job["num_classes"])
        return plan_job(fed, [algorithm], tcfg, extra)[0][names.index(c.name)]

    def _joined(self) -> tuple[dict, SiloPlan]:
        """The accepted job and this silo's plan (ConfigError before a join accepts one)."""
        if self.job is None or self.plan is None:
            raise ConfigError(f"silo {self.cfg.name!r} has accepted no job yet (join first)")
        return self.job, self.plan

    def _data_trainer(self) -> LocalTrainer:
        """The one-silo trainer over the silo's rows (ledgers are set per round)."""
        job, plan = self._joined()
        return LocalTrainer(
            model=self.model,
            data=training_source([self.silo], self.tcfg.privacy_unit,
                                 self.tcfg.max_rows_per_person, job["seed"]),
            rule=gradient_rule(self.tcfg, [plan]),  # clip = "auto": the silo's own tracker
            batch_size=self.tcfg.batch_size,
            steps_per_round=np.array([plan.steps_per_pass]), lr=self.tcfg.lr,
            l2=self.tcfg.l2, rng=silo_randomness(self.cfg.noise, job["seed"], self.cfg.name),
            ledgers=[Ledger(self.cfg.name, self.cfg.target, accountant_kind(self.tcfg.accountant),
                            None, allowance=Counter())])  # nothing allowed until a round

    def _data_pass_event(self):
        """What one local pass costs (DP-SGD's steps at the planned q, σ)."""
        _, p = self._joined()
        if p.noise_multiplier is None:  # plan_job calibrates σ for every private plan
            raise ConfigError(f"silo {self.cfg.name!r}: its plan has no noise multiplier")
        if consortium_method(self.algorithm):  # uldp: one round = one Gaussian(σ) release
            return self.algorithm.round_event(self.sigma_used or p.noise_multiplier)
        return pass_event(p, p.noise_multiplier)  # clip = "auto": with the count

    def _data_extra_events(self, t: int) -> list:
        """Charges of round t besides the algorithm's (graph data: a preprocessing release)."""
        return []

    def _data_before_step(self, t: int, ledger: Ledger) -> None:
        """Run after round t is reserved, before the silo step (graph: the release)."""

    def _data_evaluate(self, w: np.ndarray) -> float:
        job, _ = self._joined()
        fn = M.metric_fn(M.default_metric(job["task"]), self.model.name)
        return float(fn(self.silo.y_test, self.model.predict(w, self.silo.X_test)))

    # -- hello (a roster that pins keys on first use: the PETs challenge preset) ---------
    def hello(self, fields: dict) -> dict:
        """Name, public key (PEM) and model inputs, signed with the silo's key."""
        req = W.check_fields(fields, W.HELLO_REQUEST, "hello")
        reply = {"protocol": W.PROTOCOL, "kind": "hi", "silo": self.cfg.name,
                 "public_key": W.public_pem(self.key), "dim": int(self.dim),
                 "nonce": req["nonce"], "signature": ""}
        reply["signature"] = W.sign(self.key, reply, None)
        return reply

    # -- join -------------------------------------------------------------------------
    def join(self, fields: dict) -> dict:
        """Answer a join request: accept the job (and report the silo's plan) or refuse."""
        req = W.check_fields(fields, W.JOIN_REQUEST, "join")
        reply = {"protocol": W.PROTOCOL, "kind": "joined", "silo": self.cfg.name,
                 "status": "ok", "reason": "", "job_hash": "", "n_train": 0, "q": 0.0,
                 "steps": 0, "sigma": 0.0, "nonce": req["nonce"], "signature": ""}
        try:
            job = check_job(json.loads(req["job"]))
            reply["job_hash"] = W.job_hash(job)
            self._accept(job)
            self._keep_join(req)
            steps, q, sigma = self.reported
            reply.update(n_train=self._joined()[1].n, q=q, steps=steps, sigma=sigma)
            if self.exhausted:
                reply.update(status="exhausted", reason="budget exhausted in an earlier round")
        except (SiloflError, json.JSONDecodeError) as e:  # refused, with the reason
            reply.update(status="refused", reason=str(e)[:4000])
        reply["signature"] = W.sign(self.key, reply, None)
        return reply

    def _accept(self, job: dict) -> None:
        c = self.cfg
        if job["method"] not in c.methods:
            raise ConfigError(f"silo {c.name!r} does not run method {job['method']!r} "
                              f"(allowed: {', '.join(c.methods)})")
        if job["rounds"] > c.max_rounds and job["method"] != "dp_gbdt":  # trees: its host
            raise ConfigError(f"silo {c.name!r} allows at most {c.max_rounds} rounds, the "
                              f"job asks for {job['rounds']}")
        if job["noise"] != c.noise:
            raise ConfigError(f"silo {c.name!r} draws {c.noise} noise; the job asks for "
                              f"{job['noise']!r} (only the silo chooses its noise)")
        self._data_check(job)
        names = job_silos(job)
        if c.name not in names:
            raise ConfigError(f"silo {c.name!r} is not among the job's silos {names}")
        h = W.job_hash(job)
        if self.hash == h:
            return
        if self.hash is not None:
            raise ConfigError(f"silo {c.name!r} is running job {self.hash[:8]}; one job per "
                              "silo process")
        # the store's lifetime target must be the one this config states (else refuse now)
        self.store.register({c.name: c.lifetime}, explicit=True)
        if hasattr(self.store, "use_unit"):  # stores that record each charge's unit
            self.store.use_unit(job["privacy_unit"] if job["data_kind"] == "tabular" else "node")
        if job["method"] == "dp_gbdt":  # not an Algorithm: the trees' silo program
            from silofl.runtime.network.gbdt_host import GbdtSiloHost
            try:
                self.gbdt = GbdtSiloHost(self, job, h)
            except BaseException:
                self.job = self.hash = self.plan = None  # not joined
                raise
            return
        algorithm = job_algorithm(job, load_public(c.public_data, f"silo {c.name!r}"))
        tcfg, model = job_config(job), job_model(job)
        self.job, self.algorithm, self.tcfg, self.model = job, algorithm, tcfg, model
        try:
            plan = self._data_plan(job, algorithm, tcfg)  # σ from our own (ε_k, δ_k)
        except BaseException:
            self.job = None
            raise
        self.index, self.K = names.index(c.name), len(names)
        # what the silo reports and then requires of every request: (steps, q, σ); for a
        # local-DP method `steps` is the number of uploads its plan allows, σ is 0
        self.uploads, self.cap = 0, None
        if local_dp_family(algorithm):
            d = plan.declared
            self.cap = int(d.count) if isinstance(d, dpa.SelfComposedDpEvent) else 0
        self.reported = (self.cap if self.cap is not None else int(plan.steps_per_pass),
                         float(plan.q), float(plan.noise_multiplier or 0.0))
        self.plan, self.hash = plan, h
        self.trainer = self._data_trainer()
        self.P = int(job_params0(job, model).shape[0])
        state, _ = self.algorithm.init(job_params0(job, model), self.K, rounds=job["rounds"])
        self.state = slice_state(state, self.index)  # our share of the K silos' state
        self.done, self.last = 0, None
        try:
            self._load_state()
        except BaseException:
            self.job = self.hash = self.plan = None  # not joined
            raise

    # -- rounds -----------------------------------------------------------------------
    def round(self, fields: dict, arrays: list) -> tuple[dict, np.ndarray | None]:
        """Check the request (fields and the one broadcast array) against the silo's own
        plan and store, then run the round. Returns (signed reply, update or None)."""
        req = W.check_fields(fields, W.ROUND_REQUEST, "round")
        if self.job is None or self.plan is None:
            return self._reply(req, "refused", "no job accepted yet (join first)", None)
        if self.gbdt is not None:
            return self.gbdt.round(req, list(arrays))
        job = self.job
        message = W.check_array(list(arrays), (message_size(self.algorithm, self.K, self.P),),
                                "round")
        t = req["round"]
        shared = consortium_method(self.algorithm)  # uldp: σ checked by `uldp_refusal`
        wrong = [f"{k} {req[k]!r} ≠ {v!r}" for k, v in (
            ("job_hash", self.hash), ("silo", self.cfg.name), ("method", job["method"]),
            ("steps", self.reported[0]), ("q", self.reported[1]),
            ("sigma", None if shared else self.reported[2])) if v is not None and req[k] != v]
        if wrong:
            return self._reply(req, "refused", "request differs from this silo's own plan: "
                               + "; ".join(wrong) + "; nothing was run", None)
        why = uldp_refusal(self.masked, self.reported[2], self.sigma_used, req["sigma"]) \
            if shared else None
        if why:
            return self._reply(req, "refused", why + "; nothing was run", None)
        if not 1 <= t <= job["rounds"]:
            return self._reply(req, "refused", f"round {t} is outside the job's 1.."
                               f"{job['rounds']}; nothing was run", None)
        absent = not_scheduled(self.algorithm, t, self.index)  # our own copy of the schedule
        if absent:
            return self._reply(req, "refused", absent, None)
        bad = check_message(self.algorithm, decode_message(
            self.algorithm, message, self.K, self.P))
        if bad:
            return self._reply(req, "refused", f"malformed broadcast: {bad}; nothing was run",
                               None)
        digest = W.signed_bytes({}, message)
        if self.last is not None and t == self.done:
            if self.last["digest"] == digest.hex():   # the server lost our reply: resend it
                return self._reply(req, "ok", "resent", self.last["update"])
            return self._reply(req, "refused", f"round {t} already ran with another message; "
                               "a round runs once", None)
        if t < self.done:
            return self._reply(req, "refused", f"round {t} is older than this silo's last "
                               f"round {self.done}", None)
        if self.exhausted:
            return self._reply(req, "exhausted", "budget exhausted", None)
        if self.cap is not None and self.uploads >= self.cap:
            self.exhausted, self._why = True, (f"all {self.cap} uploads this silo's plan "
                                               "allows are spent")
            self._save_state()
            return self._reply(req, "exhausted", self._why, None)
        self.message = message  # the latest shared model (FedAvg's model for prediction)
        if shared:  # uldp: the σ this round (and every later one) runs and is charged with
            self.sigma_used = float(req["sigma"])
        update = self._run(t, message)
        if update is None and self.exhausted:
            return self._reply(req, "exhausted", self._why, None)
        self.last = {"digest": digest.hex(), "update": update}
        self.done = t
        if self.cap is not None:  # a local-DP row: [uploaded?, …] (None: no row sent)
            self.uploads += int(update is not None and update[0, 0] == 1)
        self._save_state()
        return self._reply(req, "ok", "", update)

    def _run(self, t: int, message: np.ndarray) -> np.ndarray | None:
        c, (accepted, p) = self.cfg, self._joined()
        declared = round_events(self.algorithm, None if self.cap is not None else
                                self._data_pass_event(), t, accepted["rounds"], p.target)
        extra = self._data_extra_events(t)
        if extra:
            declared = dpa.ComposedDpEvent([*extra, declared])
        round_plan = SiloPlan(p.name, p.n, p.q, p.steps_per_pass, p.target, p.noise_multiplier,
                              declared=declared, unit=p.unit)  # the store records the unit
        method = accepted["method"]
        try:  # reserve this round in the lifetime store before any row is read
            job = open_job(self.store, {method: [round_plan]}, lifetime={c.name: c.lifetime},
                           explicit_lifetime=True, command=f"silo {c.name} round {t}",
                           noise=c.noise, accountant=self.tcfg.accountant,
                           fingerprints={c.name: self.fingerprint},
                           extra=self._table_extra())
        except BudgetExceeded as e:
            self.exhausted, self._why = True, str(e)[:4000]
            self._save_state()
            return None
        self.trainer.ledgers = job.ledgers(method)
        try:
            if os.environ.get(CRASH_ENV) == str(t):
                os._exit(17)  # a crash after the charge: the reservation stays counted
            if self._table_extra():  # the private release, reserved with this round
                self._table_release(job)
            self._data_before_step(t, self.trainer.ledgers[0])
            if consortium_method(self.algorithm):  # uldp: its share, charged first
                self.state, update = self.algorithm.share_step(
                    self.state, self._view(message), self.trainer, t,
                    self.sigma_used if self.trainer.rule.private else None)
            else:
                self.state, update = own_step(self.algorithm, self.state,
                                              self._view(message), self.trainer, t, self.index)
        except BaseException:
            job.settle("failed")
            raise
        job.settle()
        return encode_update(self.algorithm, update)

    def _view(self, flat: np.ndarray):
        """Silo k's view of the flat broadcast (what its silo_step receives)."""
        return silo_message(self.algorithm, decode_message(self.algorithm, flat, self.K,
                                                           self.P), self.index)

    def _reply(self, req, status, reason, update):
        rep = {"protocol": W.PROTOCOL, "kind": "update", "silo": self.cfg.name,
               "status": status, "reason": reason, "job_hash": self.hash or "",
               "round": req["round"], "signature": ""}
        rep["signature"] = W.sign(self.key, rep, update)
        return rep, update

    @property
    def rounds(self) -> int:
        """Rounds of the accepted job (dp_gbdt: one per protocol message)."""
        job, _ = self._joined()
        return self.gbdt.total if self.gbdt is not None else int(job["rounds"])

    # -- state on disk ------------------------------------------------------------------
    def personal_model(self) -> np.ndarray:
        """(P,) the silo's own parameters (its last local model); what it predicts with is
        `final_model` (the shared model for methods whose personal model is shared)."""
        return self.state.params[0]

    def final_model(self, message: np.ndarray | None = None) -> np.ndarray:
        """(P,) the silo's personal model; methods whose personal model is the shared one
        use `message` (default: the last shared model received, one round behind the
        server's final model)."""
        from silofl.algorithms.base import ServerState
        message = getattr(self, "message", None) if message is None else message
        if message is None:
            if message_size(self.algorithm, self.K, self.P) != self.P:
                raise ConfigError(f"silo {self.cfg.name!r} has received no broadcast yet; its "
                                  f"{self._joined()[0]['method']} model needs one (run a "
                                  "round first)")
            srv = ServerState(self.state.params[0])
        else:
            srv = server_view(self.algorithm,
                              decode_message(self.algorithm, message, self.K, self.P))
        return self.algorithm.personal_models(self.state, srv)[0]

    def evaluate(self, message: np.ndarray | None = None) -> float:
        """Test metric of the silo's personal model (`final_model`) on its own test set
        (stays local)."""
        if self.gbdt is not None:  # the trees it built (its personal ones, if any)
            return self.gbdt.evaluate()
        return self._data_evaluate(self.final_model(message))

    def _paths(self):
        d = Path(self.cfg.state_dir)
        return d / "state.npz", d / "state.json"

    def _keep_join(self, req: dict) -> None:
        Path(self.cfg.state_dir).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(self.cfg.state_dir) / JOIN_FILE, req)

    def resume(self) -> bool:
        """Re-accept the job this silo accepted before (kept in its state dir), as a fresh
        process must; True when there was one. Refusals raise ConfigError."""
        path = Path(self.cfg.state_dir) / JOIN_FILE
        if not path.is_file():
            return False
        rep = self.join(json.loads(path.read_text()))
        if rep["status"] == "refused":
            raise ConfigError(f"silo {self.cfg.name!r} cannot resume the job kept in {path}: "
                              f"{rep['reason']}")
        return True

    def _save_state(self) -> None:
        arrays, meta = self._paths()
        arrays.parent.mkdir(parents=True, exist_ok=True)
        extra = {} if self.last is None or self.last["update"] is None else \
            {"last_update": self.last["update"]}
        if getattr(self, "message", None) is not None:  # the last shared model received
            extra["last_message"] = self.message
        fields = vars(self.state)
        arrays_ = {k if k == "params" else f"state_{k}": v for k, v in fields.items()
                   if isinstance(v, np.ndarray)}
        clip = getattr(getattr(self, "trainer", None), "rule", None)
        if clip is not None and clip.adaptive is not None:  # clip = "auto": silo state
            extra["clip"] = clip.adaptive.clip
        write_npz_atomic(arrays, compressed=False, **arrays_, **extra)  # keys: state_*, last_*
        write_json_atomic(meta, {
            "silo": self.cfg.name, "job_hash": self.hash, "round": self.done,
            "exhausted": self.exhausted, "reason": getattr(self, "_why", ""),
            "uploads": getattr(self, "uploads", 0),
            "sigma_used": getattr(self, "sigma_used", None),  # uldp: the consortium's σ
            "last_digest": None if self.last is None else self.last["digest"],
            # scalar fields (rounds done, …); arrays are in the .npz, the rest (IFCA's
            # public schedule) is rebuilt from the job at restart
            "state": {k: v for k, v in fields.items()
                      if isinstance(v, (int, float, str, bool)) or v is None},
            "noise": self.cfg.noise,
            # a private preprocessing release (a DP output): applied again at a restart
            "constants": self.constants if getattr(self, "prep", None) is not None
            and self.prep.private and not self.table_release_due else None})

    def _load_state(self) -> None:
        arrays, meta = self._paths()
        if not meta.is_file():
            return
        m = json.loads(meta.read_text())
        if m.get("job_hash") != self.hash:
            raise ConfigError(f"silo {self.cfg.name!r}: {meta.parent} holds the state of "
                              "another job; give this job a fresh state_dir")
        with np.load(arrays, allow_pickle=False) as z:
            saved = {k[6:]: z[k] for k in z.files if k.startswith("state_")}
            saved["params"] = z["params"]
            last = z["last_update"] if "last_update" in z else None
            if "last_message" in z:
                self.message = z["last_message"]
            tracker = self.trainer.rule.adaptive
            if tracker is not None and "clip" in z:  # clip = "auto": where it had moved to
                tracker.clip[:] = z["clip"]
        import dataclasses
        self.state = dataclasses.replace(self.state, **saved, **m["state"])
        self.done, self.exhausted = int(m["round"]), bool(m["exhausted"])
        self.uploads = int(m.get("uploads", 0))
        self.sigma_used = m.get("sigma_used")
        self._why = m.get("reason", "")
        if m.get("constants") is not None and self.raw is not None:
            self._use_constants(silo_table.apply_constants(self.raw, m["constants"]))
        if m["last_digest"] is not None:
            self.last = {"digest": m["last_digest"], "update": last}


def new_nonce() -> str:
    return secrets.token_hex(16)

"""In-process simulator: all silos' DP-SGD steps as batched array operations.

The simulator plays both roles of an algorithm — it calls the silo step for all silos
at once (through one `LocalTrainer` hosting every silo) and then the server step — and
evaluates every silo's personal model on its own test set after each round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, cast

import numpy as np

from silofl.algorithms.base import Algorithm
from silofl.data.federation import Federation
from silofl.errors import ConfigError
from silofl.models import metrics as M
from silofl.models.base import Model
from silofl.privacy.budget import BudgetStore
from silofl.privacy.ledger import Ledger
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.job import Job, fingerprints, open_job
from silofl.runtime.network.hosting import per_silo_step, per_silo_trainers
from silofl.runtime.plan import SiloPlan, TrainingConfig, job_targets, plan_silos
from silofl.runtime.rules import final_clips, gradient_rule
from silofl.runtime.sources import training_source
from silofl.training.dpsgd import GradientRule
from silofl.training.persons import PersonSource
from silofl.training.sampling import NODE_LABEL, NodeUnit
from silofl.training.trainer import LocalTrainer


@dataclass
class History:
    rounds: list[int] = field(default_factory=list)
    pooled: list[float] = field(default_factory=list)
    per_silo: list[list[float]] = field(default_factory=list)  # [round][silo]
    #: metrics on the named `eval_sets` of `simulate` (e.g. "validation"), at the same rounds:
    #: name -> {"pooled": [round], "per_silo": [round][silo]}
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {"rounds": self.rounds, "pooled": self.pooled, "per_silo": self.per_silo}
        if self.extra:
            d["extra"] = self.extra
        return d


@dataclass
class RunResult:
    """What `simulate` returns: one method's run.

    Attributes
    ----------
    method : dict
        The algorithm's description (``Algorithm.describe``).
    metric : str
        The test metric's name.
    silos : list of str
        Silo names, in order (K).
    history : History
        Metric per evaluated round: ``rounds``, ``pooled`` and ``per_silo[round][silo]``.
    final_per_silo : list of float
        Each silo's final metric on its own test set (K values).
    final_pooled : float
        The final metric over all test rows.
    plans : list of SiloPlan
        Each silo's plan (σ, sampling rate, steps, target).
    ledgers : list of Ledger or None
        Each silo's charges (None for a non-private run).
    params : numpy.ndarray
        The personal models, shape (K, P).
    seconds : float
        Wall-clock time of the run (not privatized).
    noise : {"secure", "seeded"}
        The noise mode ("seeded": not a privacy guarantee).
    run_id : str or None
        The budget store's id of the run (None: non-private).
    scratch : bool
        Charged to a scratch store: an experiment, not a release.
    shared : numpy.ndarray or None
        The server's model(s) at the end: (P,), or (G, P) for IFCA's clusters; None
        where the method keeps none.
    """

    method: dict
    metric: str
    silos: list[str]
    history: History
    final_per_silo: list[float]
    final_pooled: float
    plans: list[SiloPlan]
    ledgers: list[Ledger] | None
    params: np.ndarray  # (K, P) personal models
    seconds: float
    noise: str = "secure"          # "secure" | "seeded" (reproducible: not a guarantee)
    run_id: str | None = None      # the budget store's id of this run (None: non-private)
    scratch: bool = False          # charged to a scratch store: an experiment, not a release
    #: the server's model(s) at the end, where the method keeps one: (P,) the shared/mean
    #: model, or (G, P) IFCA's cluster models; None otherwise
    shared: np.ndarray | None = None

    def privacy(self) -> list[dict]:
        """Each silo's privacy statement: its ledger's report and its plan.

        Returns
        -------
        list of dict
            One dict per silo (epsilon_pld, epsilon_rdp, target, σ, q, steps, ...);
            empty for a non-private run.
        """
        if self.ledgers is None:
            return []
        return [dict(led.report(), **p.to_dict()) for led, p in zip(self.ledgers, self.plans)]


def evaluate(model: Model, params: np.ndarray, fed: Federation, metric: str) -> np.ndarray:
    """(K,) test metric of each silo's personal model on its own test set."""
    return evaluate_sets(model, params, [(s.X_test, s.y_test) for s in fed.silos], metric)


def evaluate_sets(model: Model, params: np.ndarray, sets: list[tuple[np.ndarray, np.ndarray]],
                  metric: str) -> np.ndarray:
    """(K,) metric of each silo's personal model on its own (X, y) in `sets` (one per silo,
    in silo order); NaN where a silo's set is empty."""
    fn = M.metric_fn(metric, model.name)
    out = np.full(len(sets), np.nan)
    for k, (X, y) in enumerate(sets):
        if len(y):
            out[k] = fn(y, model.predict(params[k], X))
    return out


def simulate(fed: Federation, model: Model, algorithm: Algorithm, cfg: TrainingConfig,
             *, metric: str | None = None, plans: list[SiloPlan] | None = None,
             ledger_dir: Path | None = None,
             on_round: Callable[[int, float], None] | None = None,
             eval_sets: dict[str, list[tuple[np.ndarray, np.ndarray]]] | None = None,
             store: BudgetStore | None = None, job: Job | None = None,
             method: str | None = None,
             lifetime: dict[str, PrivacyTarget] | None = None,
             resume: dict | None = None,
             checkpoint: Callable[[dict], None] | None = None,
             checkpoint_every: int = 1, restored: dict | None = None,
             source=None, params0: np.ndarray | None = None,
             hosting: str = "joint", probe: RuleProbe | None = None) -> RunResult:
    """Train `algorithm` on `fed` in this process, each silo at its own privacy target.

    Privacy: the run spends each silo's lifetime budget, reserved before any data is
    read. Either pass `job` (a reservation made by ``silofl.runtime.job.open_job`` for a
    whole job) or a `store` (this call reserves, then settles, its own plan there); with
    neither, a scratch in-memory store is used and the result is marked as an experiment.

    Parameters
    ----------
    fed : Federation
        The silos, each with a `PrivacyTarget` when ``cfg.private``.
    model : Model
        From `silofl.make_model`.
    algorithm : Algorithm
        From `silofl.make_algorithm`.
    cfg : TrainingConfig
        The shared settings; σ per silo is calibrated from its target.
    metric : str, optional
        The test metric (default: accuracy for classification, MSE for regression).
    plans : list of SiloPlan, optional
        Already computed plans (``silofl.runtime.plan.plan_silos``).
    ledger_dir : Path, optional
        Where each silo's ledger is written as it charges.
    on_round : callable (round, pooled metric) -> None, optional
        Called after every evaluation.
    eval_sets : dict of str to list of (X, y), optional
        Extra held-out sets, one (X, y) per silo, evaluated at the same rounds as the test
        sets into ``History.extra``.
    store : BudgetStore, optional
        The lifetime budget store to reserve in and settle to.
    job : Job, optional
        A reservation covering this run; `method` names its plans in it.
    method : str, optional
        This run's label (default: the algorithm's name).
    lifetime : dict of str to PrivacyTarget, optional
        Lifetime targets of silos the store has not seen (default: their run target).
    resume : dict, optional
        A checkpoint state: continue after its round.
    checkpoint : callable (state) -> None, optional
        Called after every `checkpoint_every`-th round (and the last) with the training
        state (a secure noise stream is never saved: a resumed run draws fresh entropy).
    checkpoint_every : int, default 1
        Rounds between checkpoints.
    restored : dict, optional
        Ledger entries restored from a checkpoint.
    source : optional
        Another silo data source than `fed`'s arrays (same ``n``/``gather`` interface as
        ``SiloArrays``; graph data gathers neighbourhood features per batch).
    params0 : numpy.ndarray, optional
        The starting model, shape (P,) (default: the model's).
    hosting : {"joint", "per_silo"}, default "joint"
        "per_silo" runs each silo on its own one-silo trainer and random stream, exactly
        as the silo processes of a networked run (seeded mode: the same models).
    probe : RuleProbe, optional
        Audits only (`silofl.audit.whitebox`): given the run's DP-SGD rule, returns the
        rule to train with (the same rule with canaries attached, or a deliberately
        weakened copy in an audit's self-test).

    Returns
    -------
    RunResult
        History, final metrics, plans, ledgers and the (K, P) personal models.

    Raises
    ------
    ConfigError
        Invalid settings (before any data access).
    BudgetExceeded
        The run would take a silo over its lifetime target: nothing is executed.
    """
    if hosting not in ("joint", "per_silo") or hosting == "per_silo" and (
            resume is not None or checkpoint is not None or source is not None
            or getattr(cfg, "privacy_unit", "example") == "node"):
        raise ConfigError(f"hosting must be 'joint' or 'per_silo' (per_silo: example or person level, "
                          f"without resume, checkpoint or another data source), got {hosting!r}")
    t0 = time.perf_counter()
    model.check_task(fed.task)
    bind_data(algorithm, fed, model)
    metric = metric or M.default_metric(fed.task)
    if plans is None:
        plans = plan_silos(fed, algorithm, cfg)
    else:  # plans made elsewhere (a sweep's parent process) were bound on another instance
        algorithm.bind_silos(fed.names)
    method = method or algorithm.name
    ledgers, own = None, None
    if cfg.private:
        if job is None:
            # a fresh scratch store has no earlier charge to compare data digests with and
            # is gone after this call: hashing every silo's rows would buy nothing there
            own = job = open_job(
                store if store is not None else BudgetStore(None), {method: plans},
                lifetime=lifetime or job_targets(plans),
                explicit_lifetime=lifetime is not None, command=f"simulate {method}",
                noise=cfg.noise, accountant=cfg.accountant,
                fingerprints=None if store is None else fingerprints(fed))
        ledgers = job.ledgers(method, ledger_dir, restored)
    try:
        result = _train(fed, model, algorithm, cfg, metric, plans, ledgers, on_round,
                        eval_sets, t0, resume, checkpoint, checkpoint_every, source, params0,
                        hosting=hosting, probe=probe)
    except BaseException:
        if own is not None:
            own.settle("failed")
        raise
    if own is not None:
        own.settle()
    if job is not None:
        result.run_id, result.scratch = job.run_id, job.scratch
    result.noise = cfg.noise
    return result


def bind_data(algorithm: Algorithm, fed: Federation, model: Model) -> None:
    """Give an algorithm that needs them (PrivateKT: the public set) the federation and the
    model, and one that splits the model (FedPer, FedRep, FedBN: `bind_model`) the model,
    before planning, so their checks fail before any budget is spent."""
    hook = getattr(algorithm, "bind_data", None)
    if hook is not None:
        hook(fed, model)
    split = getattr(algorithm, "bind_model", None)
    if split is not None:
        split(model)


def node_unit(fed, cfg: TrainingConfig) -> NodeUnit | None:
    """The trainer's privacy unit for `cfg` (None: example level)."""
    if cfg.privacy_unit != "node":
        return None
    return NodeUnit(cfg.node_S, cfg.adjacency, tuple(fed.names), cfg.seed)


class RuleProbe(Protocol):
    """An audit's hook on a run's DP-SGD rule (see `simulate`'s `probe`)."""

    def attach(self, rule: GradientRule) -> GradientRule:
        """The rule to train with."""
        ...


class _SeededStream(Protocol):
    """What `Randomness.seeded` builds: a stream over a NumPy generator, whose state a
    checkpoint keeps (a secure stream has none to keep)."""

    gen: np.random.Generator


def _train(fed, model, algorithm, cfg, metric, plans, ledgers, on_round, eval_sets,
           t0, resume=None, checkpoint=None, every: int = 1, source=None,
           params0=None, hosting: str = "joint", probe: RuleProbe | None = None) -> RunResult:
    # non-private runs protect nothing, so they stay reproducible
    secure = cfg.private and cfg.noise == "secure"
    rng = Randomness.os_entropy() if secure else Randomness.seeded(cfg.seed)
    rule = gradient_rule(cfg, plans)
    if probe is not None:  # an audit's instrument (silofl.audit.whitebox); GradientRule
        rule = probe.attach(rule)  # refuses a probe on a clip = "auto" rule
    trainer = LocalTrainer(
        model=model,
        data=source if source is not None else
        training_source(fed.silos, cfg.privacy_unit, cfg.max_rows_per_person, cfg.seed),
        rule=rule, batch_size=cfg.batch_size,
        steps_per_round=np.array([p.steps_per_pass for p in plans]),
        lr=cfg.lr, l2=cfg.l2, rng=rng, ledgers=ledgers, node=node_unit(fed, cfg),
        label=NODE_LABEL if cfg.privacy_unit == "node" else "dpsgd")
    start_params = model.init_params() if params0 is None else np.asarray(params0, float)
    silos, server = algorithm.init(start_params, fed.num_silos, rounds=cfg.rounds)
    # each silo's weight: its units (rows, or persons at person level), as a networked
    # silo reports them at join and the server weighs them
    weights = (np.array([p.n if p.unit == "person" else s.n_train
                         for p, s in zip(plans, fed.silos)], float)
               if getattr(algorithm, "weighted", True) else np.ones(fed.num_silos))
    step, trainers = algorithm.silo_step, None
    if hosting == "per_silo":  # each silo its own trainer and stream, as on the network
        trainers = per_silo_trainers(fed, model, cfg, plans, ledgers)
        step = lambda s, m, _joint, t: per_silo_step(algorithm, s, m, trainers, t)  # noqa: E731
    test_counts = np.array([s.n_test for s in fed.silos])
    hist, start = History(), 1
    if resume is not None:
        silos, server, hist = resume["silos"], resume["server"], resume["history"]
        start = resume["round"] + 1
        trainer.steps_done[:] = resume["steps_done"]
        trainer.selections_done[:] = resume["selections_done"]
        if resume["rng"] is not None and not rng.secure:  # built by Randomness.seeded
            cast(_SeededStream, rng).gen.bit_generator.state = resume["rng"]
        if rule.adaptive is not None:  # clip = "auto": each silo's clip is its state
            rule.adaptive.clip[:] = resume["clip"]
        if resume.get("rows") is not None and isinstance(trainer.data, PersonSource):
            trainer.data.stream_state = resume["rows"]  # which rows of a capped person
    for t in range(start, cfg.rounds + 1):
        silos, update = step(silos, algorithm.broadcast(server), trainer, t)
        server = algorithm.server_step(server, update, weights)
        if t % cfg.eval_every == 0 or t == cfg.rounds:
            personal = algorithm.personal_models(silos, server)
            vals = evaluate(model, personal, fed, metric)
            hist.rounds.append(t)
            hist.per_silo.append(vals.tolist())
            hist.pooled.append(M.pooled(vals, test_counts))
            for name, sets in (eval_sets or {}).items():
                ev = evaluate_sets(model, personal, sets, metric)
                rec = hist.extra.setdefault(name, {"pooled": [], "per_silo": []})
                rec["per_silo"].append(ev.tolist())
                rec["pooled"].append(M.pooled(ev, np.array([len(y) for _, y in sets])))
            if on_round:
                on_round(t, hist.pooled[-1])
        if checkpoint is not None and (t % every == 0 or t == cfg.rounds):
            checkpoint({"round": t, "silos": silos, "server": server, "history": hist,
                        "steps_done": trainer.steps_done.copy(),
                        "selections_done": trainer.selections_done.copy(),
                        "clip": None if rule.adaptive is None else rule.adaptive.clip.copy(),
                        "rows": trainer.data.stream_state  # person level: the row choice
                        if isinstance(trainer.data, PersonSource) else None,
                        "rng": None if rng.secure  # else built by Randomness.seeded
                        else cast(_SeededStream, rng).gen.bit_generator.state})
    final_clips(plans, rule, trainers if hosting == "per_silo" else None)
    final = np.array(hist.per_silo[-1])
    return RunResult(method=algorithm.describe(), metric=metric, silos=fed.names, history=hist,
                     final_per_silo=final.tolist(), final_pooled=hist.pooled[-1], plans=plans,
                     ledgers=ledgers, params=algorithm.personal_models(silos, server),
                     seconds=time.perf_counter() - t0, shared=_shared(server))


def _shared(server) -> np.ndarray | None:
    """The server's model(s) worth keeping (not Mocha's copy of the personal models)."""
    if hasattr(server, "clusters"):
        return np.array(server.clusters)
    p = getattr(server, "params", None)
    return np.array(p) if p is not None and np.ndim(p) == 1 else None


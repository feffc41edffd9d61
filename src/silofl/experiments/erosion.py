"""Weight Erosion with every silo as the user in turn (seed §5.3, Figure 1), as one job.

For each user u_0 the seed trains three models and reports, round by round, their metric
on the user's test rows together with the weights α_i of the Weight Erosion scheme:

* Global: FedAvg over all silos (the `fedavg` method; every silo gets the global model);
* Weight Erosion personalized for u_0 (one `weight_erosion` run per user);
* Local: the user's own model trained on its own training rows (the `local` method).

Privacy. K users mean K Weight Erosion runs, each taking one DP-SGD gradient per round from
every silo (one Poisson-sampled Gaussian step), so every silo's data is read K·rounds times
by them, plus FedAvg's and Local's DP-SGD steps. All of it is ONE job: `plan_job` calibrates
one σ per silo for the composition of the K users' runs, FedAvg and Local (and private
preprocessing, if any), `open_job` reserves it in the lifetime budget store before any data
is read, and the job is settled after (what executed stays charged). FedAvg and Local are
shared by all users (one run each): the global and local curves of user u are the per-silo
curves of those runs at silo u.

The majority-class baseline of user u is the majority class of u's training labels,
scored on u's test rows (for regression: the training mean). It is computed from the
user's own data and is NOT privatized and NOT charged: like every per-round test metric it
is the user's own, unreleased evaluation — do not publish it. Test rows are the rows the
data split holds out of every silo (`data.test_fraction`); only the user's are used for its
curves (the seed instead trains the other silos on all their rows).

Each user's run also gets its contribution report (`contribution.py`: leave-one-out and
Shapley values of the other silos from the run's released round log and the user's test
rows; nothing trained or charged), and its round log is saved as `round_logs/<user>.npz`
so that `silofl contrib` can rebuild the report.
"""

from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from silofl.config import Config
from silofl.errors import ConfigError, SiloflError
from silofl.experiments import build
from silofl.experiments import contribution as C
from silofl.experiments import contribution_report as CR
from silofl.experiments.figures import alpha_lines
from silofl.experiments.notes import job_notes
from silofl.experiments.run import (
    ADJACENCY,
    _base_dir,
    _combined,
    _lifetime,
    _make_run_dir,
    _prepare,
    _preprocess,
    check_demo_store,
    open_store,
)
from silofl.io import json_safe, savefig_atomic, write_json_atomic
from silofl.models import metrics as M
from silofl.privacy.budget import BudgetStore, PlannedCharge
from silofl.privacy.ledger import silo_file_id
from silofl.runtime.job import NO_METHOD, fingerprints, open_job
from silofl.runtime.plan import plan_job
from silofl.runtime.simulator import simulate

BASELINE_NOTE = ("majority-class baselines are computed from each user's own training labels "
                 "and scored on its own test rows; they are not privatized and not charged: "
                 "the user's own unreleased evaluation, like the per-round test metrics — do "
                 "not publish them")
METRIC_NOTE = ("per-round test metrics are computed on each user's held-out test rows and "
               "are not privatized: release the models, not those metrics")


def label_for(user: str) -> str:
    """The job's method label of user `user`'s Weight Erosion run."""
    return f"weight_erosion[{user}]"


@dataclass
class UserCurves:
    user: str
    rounds: list[int]                 # evaluation rounds
    global_: list[float]              # FedAvg's model on the user's test rows
    erosion: list[float]              # Weight Erosion for this user
    local: list[float]                # the user's local model
    baseline: float                   # majority class (regression: training mean)
    baseline_value: float             # the class (or mean) predicted
    alpha: np.ndarray                 # (rounds, K): α_i after each round

    def to_dict(self, silos: list[str]) -> dict:
        return {"rounds": self.rounds,
                "metric": {"global": self.global_, "weight_erosion": self.erosion,
                           "local": self.local, "majority_baseline": self.baseline},
                "majority_prediction": self.baseline_value,
                "alpha": {"rounds": list(range(1, len(self.alpha) + 1)),
                          **{s: self.alpha[:, k].tolist() for k, s in enumerate(silos)}}}


@dataclass
class ErosionReport:
    silos: list[str]
    users: list[str]
    metric: str
    curves: dict[str, UserCurves]
    p_s: float
    p_d: float
    private: bool = True
    noise: str = "secure"
    noise_multiplier: dict[str, float] = field(default_factory=dict)
    calibrated_for: str = ""
    run_id: str | None = None
    store: str | None = None
    scratch: bool = False
    demo: bool = False            # the demo store of the public built-in data
    run_dir: Path | None = None
    combined_privacy: list[dict] = field(default_factory=list)
    uncharged: list[str] = field(default_factory=list)
    lifetime: list[dict] = field(default_factory=list)
    #: per user: the contribution report, the released round log (+ its meta) it came from
    contributions: dict = field(default_factory=dict)
    round_logs: dict = field(default_factory=dict)
    contribution_notes: list[str] = field(default_factory=list)

    @property
    def calibration(self) -> str:
        k = len(self.users)
        return (f"σ calibrated for {k} user{'s' if k != 1 else ''} composed (+ Global/FedAvg "
                f"and Local: {k + 2} methods in one job)")

    def notes(self) -> list[str]:
        return job_notes(private=self.private, noise=self.noise, scratch=self.scratch,
                         demo=self.demo, uncharged=self.uncharged, extra=[METRIC_NOTE, BASELINE_NOTE,
                                                          *self.contribution_notes])

    def to_dict(self) -> dict:
        return {"users": self.users, "silos": self.silos, "metric": self.metric,
                "p_s": self.p_s, "p_d": self.p_d, "private": self.private,
                "noise": self.noise, "notes": self.notes(),
                "calibration": self.calibration if self.private else None,
                "noise_multiplier": self.noise_multiplier,
                "calibrated_for": self.calibrated_for,
                "charged": ("every silo: FedAvg's and Local's DP-SGD steps and, for each "
                            "user's Weight Erosion run, one Poisson-sampled Gaussian step (a "
                            "local DP-SGD pass with we_update = 'local_sgd') per round the "
                            "silo took part in, composed" if self.private else None),
                "neighbouring_relation": ADJACENCY,
                "per_user": {u: self.curves[u].to_dict(self.silos) for u in self.users},
                "run_id": self.run_id, "budget_store": self.store,
                "scratch_store": self.scratch, "combined_privacy": self.combined_privacy,
                "lifetime": self.lifetime}


def resolve_users(names: list[str], users) -> list[str]:
    """`users`: None or "all" (every silo) or a list of silo names; refuse anything else
    (before anything is reserved or written)."""
    if len(names) < 2:
        raise ConfigError("Weight Erosion needs at least two silos (the user and one other)")
    if users is None or users == "all" or (isinstance(users, (list, tuple))
                                            and list(users) == ["all"]):
        return list(names)
    if isinstance(users, str):
        users = [users]
    users = list(users)
    if not users:
        raise ConfigError("no user silo given; name one or more, or 'all'")
    unknown = [u for u in users if u not in names]
    if unknown:
        raise ConfigError(f"unknown user silo{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(map(repr, unknown))}; silos are: {', '.join(names)}")
    dup = sorted({u for u in users if users.count(u) > 1})
    if dup:
        raise ConfigError(f"user {', '.join(map(repr, dup))} given more than once (each would "
                          "spend the silos' budget again)")
    return users


def majority_baseline(task: str, metric: str, model_name: str, y_train: np.ndarray,
                      y_test: np.ndarray) -> tuple[float, float]:
    """(score, prediction) of the constant predictor from the user's training labels:
    the majority class (ties: the smallest) for classification, the mean for regression,
    scored with `metric` on the user's test rows (NaN with no test rows)."""
    y_train, y_test = np.asarray(y_train), np.asarray(y_test)
    if task == "regression":
        c = float(np.mean(y_train))
        scores = np.full(len(y_test), c)
    else:
        classes, counts = np.unique(y_train.astype(int), return_counts=True)
        c = float(classes[np.argmax(counts)])
        if metric == "accuracy":
            return (float(np.mean(y_test.astype(int) == int(c))) if len(y_test)
                    else float("nan")), c
        scores = np.full(len(y_test), c)  # ranking metrics: a constant score
    if not len(y_test):
        return float("nan"), c
    return float(M.metric_fn(metric, model_name)(y_test, scores)), c


def erosion_for_users(cfg: Config, users=None, *, out_dir: Path | None = None,
                      store: BudgetStore | None = None,
                      contributions: bool = True) -> ErosionReport:
    """Weight Erosion for every user in `users` (None / "all": every silo), with Global
    (FedAvg), Local and the majority-class baseline, as one job (see the module docstring).
    Reserved in the lifetime budget store (`store`, else as `experiments.run.run`) before any
    data is read; settled after. Writes `erosion.json`, one `erosion_<user>.png` per user,
    `config.toml` and the ledgers to a run directory under `out_dir` (or [output] dir;
    nothing with output.dir = ""). `contributions=False` skips the contribution reports (their
    Shapley values cost seconds per user with many silos); the round logs are saved either
    way, so `silofl contrib` can make them later."""
    cfg = copy.deepcopy(cfg)
    cfg.training.methods = ["fedavg", "local"]
    build.require_row_unit(cfg, "silofl erosion")  # its one-step gradients: per row
    p = _prepare(cfg)
    names = p.raw.names
    users = resolve_users(names, users)
    we = []
    for u in users:
        cu = copy.deepcopy(cfg)
        cu.training.methods, cu.training.we_user = ["weight_erosion"], u
        we.append(build.build_algorithms(cu)[0])
    p.algorithms = p.algorithms + we
    p.labels = p.labels + [label_for(u) for u in users]
    # one σ per silo for the K users' runs, FedAvg and Local (and preprocessing) composed
    p.plans = plan_job(p.raw, p.algorithms, p.tcfg, extra=p.extra)
    base = _base_dir(cfg, out_dir)
    job = _reserve(cfg, p, users, store, base) if p.tcfg.private else None
    # --- reserved: settle whatever happens ---------------------------------------------
    run_dir = None
    try:
        for name in p.extra:
            job.spend_extra(name, "preprocess")
        fed = _preprocess(p, cfg)
        run_dir = _make_run_dir(cfg, base)
        results, alphas, logs = {}, {}, {}
        for alg, plans, label in zip(p.algorithms, p.plans, p.labels):
            results[label] = simulate(
                fed, p.model, alg, p.tcfg, metric=cfg.model.metric or None, plans=plans,
                job=job, method=label,
                ledger_dir=run_dir / "ledgers" / silo_file_id(label) if run_dir else None)
            if hasattr(alg, "alpha_history"):
                alphas[label] = np.array(alg.alpha_history)
                logs[label] = alg.round_log  # released, per round (contribution report)
        metric = results["fedavg"].metric
        curves = {u: _user_curves(fed, names.index(u), u, results, alphas, metric, p.model.name)
                  for u in users}
        if job is not None:
            job.settle()
        rep = ErosionReport(
            names, users, metric, curves, p_s=we[0].p_s, p_d=we[0].p_d,
            private=p.tcfg.private, noise=p.tcfg.noise,
            combined_privacy=_combined(list(results.values()), p.extra or None),
            uncharged=list(fed.meta.get("uncharged", [])), run_dir=run_dir)
        if p.tcfg.private:
            rep.noise_multiplier = {pl.name: pl.noise_multiplier for pl in p.plans[0]}
            rep.calibrated_for = p.plans[0][0].calibrated_for
        if job is not None:
            rep.run_id, rep.scratch = job.run_id, job.scratch
            rep.store = None if job.store.path is None else str(job.store.path)
            rep.demo = job.store.demo
            rep.lifetime = [job.store.spent(n) for n in names]
        # contribution report: released updates + the user's own test rows, nothing charged
        _contributions(rep, fed, p.model, {u: logs[label_for(u)] for u in users},
                       {u: we[i].aggregation.rule for i, u in enumerate(users)},
                       compute=contributions)
        if run_dir:
            _write(rep)
        return rep
    except BaseException:
        if job is not None and job.store.run_status(job.run_id) == "reserved":
            job.settle("failed")
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _reserve(cfg: Config, p, users: list[str], store: BudgetStore | None, base: Path | None):
    """Open the job: every user's run, FedAvg, Local and the preprocessing reserved in the
    lifetime store before any data is read."""
    raw_fps = fingerprints(p.raw)
    store = store if store is not None else open_store(cfg, base)
    check_demo_store(cfg, store)
    return open_job(store, dict(zip(p.labels, p.plans)), lifetime=_lifetime(cfg, p.raw),
                    explicit_lifetime=cfg.budget.epsilon is not None,
                    command="silofl erosion --user " + " --user ".join(users),
                    noise=p.tcfg.noise, accountant=p.tcfg.accountant,
                    fingerprints=raw_fps,
                    extra=[PlannedCharge(n, NO_METHOD, "preprocess", e)
                           for n, e in p.extra.items()])


def _user_curves(fed, k: int, u: str, results: dict, alphas: dict, metric: str,
                 model_name: str) -> UserCurves:
    """User ``u`` (silo ``k``)'s per-round curves: FedAvg, its Weight Erosion run, Local,
    and the majority-class baseline on its own test rows."""
    s = fed.silos[k]
    score, pred = majority_baseline(fed.task, metric, model_name, s.y_train, s.y_test)
    col = {lb: [row[k] for row in results[lb].history.per_silo]
           for lb in ("fedavg", "local", label_for(u))}
    return UserCurves(u, list(results["fedavg"].history.rounds), col["fedavg"],
                      col[label_for(u)], col["local"], score, pred, alphas[label_for(u)])


def _write(rep: ErosionReport) -> None:
    for u, (log, meta) in rep.round_logs.items():  # released quantities only
        if not C.save_round_log(rep.run_dir / C.ROUND_LOGS / f"{silo_file_id(u)}.npz", log,
                                meta):
            rep.contribution_notes.append(f"round log of user {u!r} not saved (over "
                                          f"{C.MAX_LOG_BYTES >> 20} MiB): `silofl contrib` "
                                          "cannot rebuild its report")
    bad: list[str] = []
    data = json_safe(rep.to_dict(), bad)
    write_json_atomic(rep.run_dir / "erosion.json", dict(data, nonfinite=bad), indent=1)
    for u in rep.users:
        plot_user(rep, u, rep.run_dir / f"erosion_{silo_file_id(u)}.png")
    if rep.contributions:  # contribution.json, contribution.html and their PNGs
        CR.write_reports(rep.run_dir, rep.contributions, rep.contribution_notes)


def _contributions(rep: ErosionReport, fed, model, logs: dict, rules: dict,
                   compute: bool = True) -> None:
    """Each user's contribution report (`contribution.contribution`) from its run's
    released round log and its own held-out rows; a user it cannot be made for gets a note
    (the job is already settled: nothing here may fail it)."""
    dp = job_notes(private=rep.private, noise=rep.noise, scratch=rep.scratch,
                   uncharged=rep.uncharged)  # what the released updates' guarantee is
    for u in rep.users:
        k = rep.silos.index(u)
        s = fed.silos[k]
        try:
            log = C.RoundLog.from_rounds(logs[u])
            rep.round_logs[u] = (log, {"user": u, "silos": rep.silos, "n_test": s.n_test,
                                       "aggregation": rules[u], "job_notes": dp,
                                       "private_preprocessing": C.private_preprocessing(fed),
                                       "constants": C.user_constants(fed, u)})
            if not compute:
                continue
            rep.contributions[u] = C.contribution(model, log, rep.silos, u, s.X_test,
                                                  s.y_test, aggregation=rules[u],
                                                  notes=dp)
        except SiloflError as e:
            rep.contribution_notes.append(f"no contribution report for user {u!r}: {e}")


def plot_user(rep: ErosionReport, user: str, path: Path) -> None:
    """Figure 1 layout: the three models' metric on the user's test rows and the majority
    baseline (top), every silo's α_i in the user's Weight Erosion run (below)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    c = rep.curves[user]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 2]})
    ax.plot(c.rounds, c.global_, "-", label="Global (FedAvg)")
    ax.plot(c.rounds, c.erosion, "-", label="Weight Erosion")
    ax.plot(c.rounds, c.local, "-", label="Local")
    if np.isfinite(c.baseline):
        ax.axhline(c.baseline, color="red", ls="--", lw=1,
                   label=f"majority class ({c.baseline_value:g}; unreleased)")
    ax.set_ylabel(f"{rep.metric} on {user}'s test rows")
    ax.legend(fontsize=8)
    sub = rep.calibration if rep.private else "non-private"
    ax.set_title(f"user {user}: p_d = {rep.p_d:g}, p_s = {rep.p_s:g}\n{sub}", fontsize=9)
    alpha_lines(ax2, np.arange(1, len(c.alpha) + 1), c.alpha, rep.silos, user)
    ax2.set_xlabel("round")
    fig.tight_layout()
    savefig_atomic(fig, path, dpi=110)
    plt.close(fig)

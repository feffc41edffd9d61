"""The adapted Ndoye factor (seed §4.3): rank the other silos by how well a model trained
on their data transfers to the user silo u_0.

1. Every silo i trains f_i alone (the `local` method, DP-SGD) as one ordinary job: planned,
   reserved in the lifetime budget store, charged to ledgers, settled.
2. Silo i releases its cross-validation loss L_CV_i(f_i): the mean per-example loss, clipped
   to [0, B], over its held-out rows (the rows the data split keeps out of training, the
   same "test" rows every run holds out), plus Gaussian noise. Add/remove one held-out row
   changes the clipped sum by at most B; n_cv_i is public (as every silo size in silofl),
   so the mean moves by at most B/n_cv_i and the noise is N(0, (z_i·B/n_cv_i)²).
   `GaussianDpEvent(z_i)` is part of the job's reservation before anything is read and is
   charged to silo i's lifetime budget; z_i is calibrated so that the release alone costs
   `cv_share`·ε_i at δ_i, and DP-SGD's σ_i is calibrated for the rest (one job target).
3. The user evaluates every f_i on its own held-out rows: L_S0(f_i). The f_i are DP
   releases, so this is post-processing for silos i; but the loss values are computed from
   the user's private rows and are NOT privatized: they stay with the user as its own
   decision input and must not be published.
4. Transfer loss L_S0(f_i) − L_CV_i(f_i), smaller = more similar; the user selects the top
   k or those at or under a threshold.

The K×K matrix (every silo as the user) is an analysis view for one party who holds all
data (a simulation, or a silo's own audit); each row is that user's unreleased evaluation.

Per-example loss: classification uses the 0-1 error (already in [0, 1]); regression the
squared error clipped to [0, B]. A diverged model (non-finite output) scores B.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from silofl.config import Config
from silofl.errors import ConfigError
from silofl.experiments import build
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
from silofl.privacy import accounting
from silofl.privacy.budget import BudgetStore, PlannedCharge
from silofl.privacy.randomness import Randomness
from silofl.runtime.job import NO_METHOD, fingerprints, open_job
from silofl.runtime.plan import plan_job
from silofl.runtime.simulator import simulate

CV_LABEL = "cv-loss"
DEFAULT_CV_SHARE = 0.1
USER_LOSS_NOTE = ("user losses L_S0(f_i) are computed on the user's own held-out rows and "
                  "are not privatized: they stay with the user (its decision input), do not "
                  "publish them")
MATRIX_NOTE = ("the transfer matrix holds every silo's own unreleased evaluation (row = "
               "user): an analysis view for whoever holds all the data, not a release")


@dataclass
class Ranking:
    user: str
    silos: list[str]              # all silos, in federation order
    user_loss: np.ndarray         # (K,) L_S0(f_i) on the user's held-out rows
    cv_loss: np.ndarray           # (K,) released private L_CV_i(f_i)
    loss_matrix: np.ndarray       # (K, K) [u, i] = L_{S_u}(f_i)
    order: list[str]              # other silos, best (smallest transfer loss) first
    selected: list[str]
    selection: dict | None        # {"top": k} | {"threshold": t} | None
    bound: float
    cv_sizes: dict[str, int]
    cv_noise_multiplier: dict[str, float]
    params: np.ndarray            # (K, P) the f_i (DP releases)
    noise: str = "secure"
    private: bool = True
    run_id: str | None = None
    store: str | None = None
    scratch: bool = False
    demo: bool = False            # the demo store of the public built-in data
    run_dir: Path | None = None
    combined_privacy: list[dict] = field(default_factory=list)
    uncharged: list[str] = field(default_factory=list)
    classification: bool = True

    @property
    def transfer(self) -> np.ndarray:
        return self.user_loss - self.cv_loss

    @property
    def transfer_matrix(self) -> np.ndarray:
        return self.loss_matrix - self.cv_loss[None, :]

    def cv_noise_std(self, name: str) -> float:
        """Standard deviation of the Gaussian noise on silo `name`'s released CV loss."""
        return self.cv_noise_multiplier[name] * self.bound / self.cv_sizes[name]

    def notes(self) -> list[str]:
        return job_notes(private=self.private, noise=self.noise, scratch=self.scratch,
                         demo=self.demo, uncharged=self.uncharged, extra=[USER_LOSS_NOTE, MATRIX_NOTE],
                         nonprivate="NON-PRIVATE ranking: CV losses are released exactly; "
                                    "no budget was charged")

    def rows(self) -> list[dict]:
        idx = {n: k for k, n in enumerate(self.silos)}
        return [{"rank": r + 1, "silo": n, "user_loss": float(self.user_loss[idx[n]]),
                 "private_cv_loss": float(self.cv_loss[idx[n]]),
                 "transfer_loss": float(self.transfer[idx[n]]),
                 "selected": n in self.selected} for r, n in enumerate(self.order)]

    def to_dict(self) -> dict:
        return {"user": self.user, "selection": self.selection, "selected": self.selected,
                "ranking": self.rows(), "loss_bound": self.bound,
                "loss": "0-1 error" if self.classification else "squared error clipped",
                "private": self.private, "noise": self.noise, "notes": self.notes(),
                "neighbouring_relation": ADJACENCY,
                "cv_release": {n: {"n_cv": self.cv_sizes[n],
                                   "noise_multiplier": self.cv_noise_multiplier.get(n),
                                   "noise_std": self.cv_noise_std(n)
                                   if n in self.cv_noise_multiplier else 0.0,
                                   "sensitivity": self.bound / self.cv_sizes[n]}
                               for n in self.silos},
                "silos": self.silos,
                "transfer_matrix": self.transfer_matrix.tolist(),
                "run_id": self.run_id, "budget_store": self.store,
                "scratch_store": self.scratch, "combined_privacy": self.combined_privacy}


def clipped_losses(model, params: np.ndarray, X: np.ndarray, y: np.ndarray, task: str,
                   bound: float) -> np.ndarray:
    """Per-example loss of the model `params` on (X, y), in [0, bound]."""
    scores = np.asarray(model.predict(params, X), float)
    bad = ~np.isfinite(scores) if scores.ndim == 1 else ~np.isfinite(scores).all(axis=1)
    if task == "regression":
        with np.errstate(over="ignore", invalid="ignore"):
            loss = (scores - y) ** 2
    else:
        if scores.ndim == 2:
            pred = np.argmax(np.nan_to_num(scores), axis=1)
        elif model.name == "svm":  # margins
            pred = (scores > 0).astype(int)
        else:
            pred = (scores >= 0.5).astype(int)
        loss = (pred != np.asarray(y).astype(int)).astype(float)
    loss = np.where(bad, bound, loss)  # a diverged model is maximally wrong
    return np.clip(np.nan_to_num(loss, nan=bound, posinf=bound), 0.0, bound)


def check_selection(names: list[str], user: str, top: int | None,
                    threshold: float | None) -> None:
    """Refuse a bad user or selection rule (before anything is reserved or written)."""
    if user not in names:
        raise ConfigError(f"unknown user silo {user!r}; silos are: {', '.join(names)}")
    if len(names) < 2:
        raise ConfigError("ranking needs at least two silos (the user and one other)")
    if top is not None and threshold is not None:
        raise ConfigError("give either --top or --threshold, not both")
    others = len(names) - 1
    if top is not None and (isinstance(top, bool) or not 1 <= top <= others):
        raise ConfigError(f"top k must be between 1 and {others} (the silos other than "
                          f"{user!r}), got {top}")
    if threshold is not None and not (math.isfinite(threshold) and threshold >= 0):
        raise ConfigError(f"threshold must be a finite number ≥ 0 (a transfer loss), got "
                          f"{threshold}")


def rank_silos(cfg: Config, user: str, *, top: int | None = None,
               threshold: float | None = None, out_dir: Path | None = None,
               store: BudgetStore | None = None, bound: float = 1.0,
               cv_share: float = DEFAULT_CV_SHARE) -> Ranking:
    """Rank every silo other than `user` by transfer loss (see the module docstring).

    One job: `local` training of every f_i plus every silo's private CV-loss release, both
    reserved in the lifetime budget store (`store`, else as `experiments.run.run`) before
    any data is read and settled after. Writes `ranking.json`, `transfer_heatmap.png`,
    `config.toml` and the ledgers to a run directory under `out_dir` (or [output] dir;
    nothing with output.dir = ""). The returned user losses are the user's private,
    unreleased evaluation."""
    if not (math.isfinite(bound) and bound > 0):
        raise ConfigError(f"loss bound B must be a positive number, got {bound}")
    if not 0 < cv_share < 1:
        raise ConfigError(f"cv_share must be a fraction of ε in (0, 1), got {cv_share}")
    cfg = copy.deepcopy(cfg)
    cfg.training.methods = ["local"]
    build.require_row_unit(cfg, "silofl rank")  # its CV losses: sensitivity B/n_cv per row
    p = _prepare(cfg)
    names = p.raw.names
    check_selection(names, user, top, threshold)
    cv_n = {s.name: s.n_test for s in p.raw.silos}  # public sizes of the held-out rows
    empty = [n for n, m in cv_n.items() if m == 0]
    if empty:
        raise ConfigError(f"silos {', '.join(empty)} hold no held-out rows for the CV loss; "
                          "raise data.test_fraction")
    prep_extra = dict(p.extra)
    z, cv_events, everything = _cv_release_events(p, cv_share)
    if p.tcfg.private:
        # DP-SGD's σ is calibrated for what is left once the CV release is composed in
        p.plans = plan_job(p.raw, p.algorithms, p.tcfg, extra=everything)
    base = _base_dir(cfg, out_dir)
    job = _reserve(cfg, p, user, store, base, cv_events) if p.tcfg.private else None
    # --- reserved: settle whatever happens ---------------------------------------------
    run_dir = None
    try:
        for name in prep_extra:
            job.spend_extra(name, "preprocess")
        fed = _preprocess(p, cfg)
        run_dir = _make_run_dir(cfg, base)
        r = simulate(fed, p.model, p.algorithms[0], p.tcfg, metric=cfg.model.metric or None,
                     plans=p.plans[0], job=job, method=p.labels[0],
                     ledger_dir=run_dir / "ledgers" / p.labels[0] if run_dir else None)
        cv = _released_cv(p, cfg, fed, r, job, z, bound)
        # the user side (each row: that silo's own, unreleased evaluation)
        losses = np.array([[clipped_losses(p.model, r.params[i], su.X_test, su.y_test,
                                           fed.task, bound).mean()
                            for i in range(fed.num_silos)] for su in fed.silos])
        if job is not None:
            job.settle()
    except BaseException:
        if job is not None:
            job.settle("failed")
        if run_dir is not None:
            import shutil
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    u = names.index(user)
    order, selected, selection = _select(names, u, losses[u] - cv, top, threshold)
    rep = Ranking(user, names, losses[u], cv, losses, order, selected, selection, bound, cv_n,
                  z, r.params, noise=p.tcfg.noise, private=p.tcfg.private, run_dir=run_dir,
                  combined_privacy=_combined([r], everything or None),
                  uncharged=list(fed.meta.get("uncharged", [])),
                  classification=fed.task != "regression")
    if job is not None:
        rep.run_id, rep.scratch = job.run_id, job.scratch
        rep.store = None if job.store.path is None else str(job.store.path)
        rep.demo = job.store.demo
    if run_dir:
        _write(rep)
    return rep


def _reserve(cfg: Config, p, user: str, store: BudgetStore | None, base: Path | None,
             cv_events: dict):
    """Open the ranking's job: the local training, the preprocessing and the CV releases
    reserved in the lifetime store before any data is read."""
    raw_fps = fingerprints(p.raw)
    store = store if store is not None else open_store(cfg, base)
    check_demo_store(cfg, store)
    extra = [PlannedCharge(n, NO_METHOD, "preprocess", e) for n, e in dict(p.extra).items()]
    extra += [PlannedCharge(n, NO_METHOD, CV_LABEL, e) for n, e in cv_events.items()]
    return open_job(store, dict(zip(p.labels, p.plans)), lifetime=_lifetime(cfg, p.raw),
                    explicit_lifetime=cfg.budget.epsilon is not None,
                    command=f"silofl rank --user {user}", noise=p.tcfg.noise,
                    accountant=p.tcfg.accountant, fingerprints=raw_fps, extra=extra)


def _cv_release_events(p, cv_share: float) -> tuple[dict, dict, dict]:
    """Per silo: the noise multiplier z of its CV-loss release (calibrated to
    ``cv_share`` of its ε), that release's event, and every event outside the method
    (preprocessing + CV release). Empty for a non-private run."""
    z: dict[str, float] = {}
    if not p.tcfg.private:
        return z, {}, {}
    import dp_accounting as dpa
    prep_extra = dict(p.extra)
    cache: dict = {}
    for s in p.raw.silos:
        key = (cv_share * s.target.epsilon, s.target.delta)
        if key not in cache:
            cache[key] = accounting.calibrate(lambda g: dpa.GaussianDpEvent(g), *key,
                                              kind=p.tcfg.accountant)
        z[s.name] = cache[key]
    cv_events = {n: dpa.GaussianDpEvent(v) for n, v in z.items()}
    everything = {n: dpa.ComposedDpEvent([prep_extra[n], e]) if n in prep_extra else e
                  for n, e in cv_events.items()}
    return z, cv_events, everything


def _released_cv(p, cfg: Config, fed, r, job, z: dict, bound: float) -> np.ndarray:
    """(K,) each silo's released CV loss of its own model: the mean clipped loss on its
    held-out rows plus Gaussian noise z·B/n (none when not private), each charged before
    its read."""
    rng = Randomness.for_mode(p.tcfg.noise if p.tcfg.private else "seeded",
                              [cfg.training.seed, 0xCF])
    cv = np.empty(fed.num_silos)
    for k, s in enumerate(fed.silos):
        if job is not None:
            job.spend_extra(s.name, CV_LABEL)  # recorded as executed before the read
        mean = float(clipped_losses(p.model, r.params[k], s.X_test, s.y_test, fed.task,
                                    bound).mean())
        noise = z[s.name] * bound / s.n_test * float(rng.normal((1,))[0]) if z else 0.0
        cv[k] = mean + noise
    return cv


def _select(names: list[str], u: int, transfer: np.ndarray, top: int | None,
            threshold: float | None) -> tuple[list[str], list[str], dict | None]:
    """The other silos by transfer loss (stable order), and those selected by ``top`` or
    ``threshold`` with how."""
    others = [k for k in np.argsort(transfer, kind="stable") if k != u]
    order = [names[k] for k in others]
    if top is not None:
        return order, order[:top], {"top": top}
    if threshold is not None:
        return order, [names[k] for k in others if transfer[k] <= threshold], \
            {"threshold": threshold}
    return order, [], None


def _write(rep: Ranking) -> None:
    bad: list[str] = []
    data = json_safe(rep.to_dict(), bad)
    write_json_atomic(rep.run_dir / "ranking.json", dict(data, nonfinite=bad), indent=1)
    plot_transfer(rep, rep.run_dir / "transfer_heatmap.png")


def plot_transfer(rep: Ranking, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    K = len(rep.silos)
    size = max(4.0, 0.5 * K + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    m = rep.transfer_matrix
    lim = float(np.nanmax(np.abs(m))) if np.isfinite(m).any() else 1.0
    im = ax.imshow(m, cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax.set_xticks(range(K), rep.silos, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(K), rep.silos, fontsize=8)
    ax.set_xlabel("model f_i of silo i")
    ax.set_ylabel("user silo")
    ax.set_title("transfer loss L_user(f_i) − private L_CV_i(f_i)\n(smaller = more similar; "
                 "rows are unreleased user evaluations)", fontsize=9)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    savefig_atomic(fig, path, dpi=120)
    plt.close(fig)

"""The model-view audit of the last iterate (black box), after Annamalai & De Cristofaro
2024, "Nearly tight black-box auditing of differentially private machine learning".

The attacker sees only the released model — no update, no intermediate model — and
queries its loss on one record of its choosing. What makes such an audit nearly tight:

* **worst-case initialization**: the job starts from parameters θ₀ the auditor picks (the
  DP guarantee holds for every θ₀). `init="worst-case"` pretrains the model on public
  records (for MNIST silos: the MNIST digits no silo holds, rotated and masked like the
  audited silo's) so the real records' gradients are small and the canary's clipped
  gradient dominates every step; `init="default"` starts from the model's own seeded
  initialization (the average case, for comparison);
* **a crafted canary**: for images a blank or all-white image, whichever the start model
  finds the more wrong, labelled with the class θ₀ finds least likely — so its gradient
  stays at the clip norm through training. Built from θ₀ and public facts only, never
  from the silo's rows;
* **a loss-based score on the last iterate**: the canary's logit-scaled confidence
  −log(e^loss − 1) = logit of p(canary's label), a monotone function of its loss that is
  close to linear in the parameters (so its law is close to Gaussian).

Many runs on D (the silo's data) and D′ = D + canary, interleaved (`engine.multi_run`):
a rigorous Clopper–Pearson bound (`bounds.multi_run_epsilon`) and an estimate, μ̂ of
the scores with the lower end of its one-sided interval (`estimate.mu_hat`), read as
μ-GDP at the claimed δ (`bounds.gdp_epsilon`; labelled as an estimate: it assumes
Gaussian scores). The family-wise error 1 − confidence is split evenly between the two
statements (and over the audited silos, Bonferroni), so a flag from either is a
violation at `confidence`. Every run is a whole job (reserve, preprocess, every method,
settle) on its own scratch store: N jobs on a silo's data are an experiment, not a
release.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np
from scipy import optimize, stats

from silofl.audit.bounds import gdp_epsilon
from silofl.audit.canaries import Canaries, insert, make_canaries
from silofl.audit.engine import (
    AUDIT_NOTE,
    AuditReport,
    Claim,
    SiloAudit,
    check_confidence,
    check_runs,
    multi_run,
    per_unit,
)
from silofl.audit.estimate import mu_hat
from silofl.audit.jobs import audited_silos, claim_of, run_job
from silofl.errors import ConfigError, DataError
from silofl.experiments import build
from silofl.experiments import run as run_mod
from silofl.experiments.notes import job_notes
from silofl.privacy.budget import BudgetStore

INITS = ("worst-case", "default")
COMMAND = "silofl audit (model view, last iterate)"
#: crafted image canaries: every pixel at this value (the public [0, 1] pixel scale)
CANARY_IMAGES = {"blank": 0.0, "white": 1.0}
#: the scores used when not given: black box
DEFAULT_SCORES = ("loss",)
#: jobs on each of D and D′ when not given
DEFAULT_RUNS = 200
#: the worst-case start: plain SGD with momentum on this many public records (fixed
#: before any data is seen; ~2 s for the ConvNet on a CPU)
PRETRAIN = {"size": 4000, "epochs": 2, "batch": 50, "lr": 0.05, "momentum": 0.9}
#: the scores of a released model (higher: "the canary was in"), each summed over the
#: job's methods: the canary's logit-scaled confidence (black box: one loss query), and
#: minus the squared distance of the weights from θ₀ (a model's user holds its weights).
#: The weights see the scale of the noise on all P parameters, which depends on the
#: silo's size n (σ is calibrated for q = b/n; a full batch is divided by n): D′ = D +
#: one record changes it by ~1/n, read with d′ ≈ √(2P)/n whatever σ — a leak under
#: add/remove adjacency that no gradient canary can show (tests/test_audit_lastiter.py)
SCORES = {"loss": "the canary's logit-scaled confidence −log(e^loss − 1)",
          "weights": "−‖θ_T − θ₀‖², the released weights' squared distance from the start"}

MODEL_VIEW_NOTE = ("model view (last iterate): the attacker sees only the released model: "
                   "its loss on one canary record (black box) and, with score 'weights', "
                   "its parameters; D and D′ = D + canary, each run a whole job on its own "
                   "scratch store")
ESTIMATE_ASSUMES = ("estimate, assumes Gaussian scores: μ̂ = (mean score on D′ − mean on "
                    "D)/pooled sd with a one-sided normal-theory interval, read as μ-GDP at "
                    "the claimed δ (exact for full-batch DP-SGD, q = 1; an approximation "
                    "for Poisson-subsampled DP-SGD); not proof")


@dataclasses.dataclass(frozen=True)
class StartModel:
    """The parameters every audited job starts from.

    Attributes
    ----------
    params : numpy.ndarray
        θ₀, shape (P,).
    init : str
        "worst-case" or "default".
    public_rows : int
        Public records pretrained on (0 for "default").
    note : str
        Where θ₀ came from, for the report.
    """

    params: np.ndarray
    init: str
    public_rows: int
    note: str


def check_scores(scores) -> None:
    """Refuse an empty or unknown choice of scores (ConfigError)."""
    if isinstance(scores, str) or not scores or any(s not in SCORES for s in scores) \
            or len(set(scores)) != len(scores):
        raise ConfigError(f"scores must be a non-empty list of distinct names from "
                          f"{', '.join(SCORES)}, got {scores!r}")


def check_init(init: str) -> None:
    """Refuse an unknown start (ConfigError)."""
    if init not in INITS:
        raise ConfigError(f"unknown audit start {init!r}; choose one of {', '.join(INITS)} "
                          "(worst-case: pretrained on public records, so the canary's "
                          "gradient dominates; default: the model's own initialization)")


# --- the start model --------------------------------------------------------------------

def public_digits(raw, silo: str, size: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`size` labelled MNIST digits that no silo of `raw` holds (a Rotated & Masked MNIST
    federation, `silofl.data.mnist`), rotated and masked like `silo`'s images.

    Parameters
    ----------
    raw : RawFederation
        From data.source = "mnist" (its meta names the digits each silo got).
    silo : str
        The audited silo (its rotation and mask are public: the data seed fixes them).
    size : int
        Digits wanted (fewer when fewer are free).
    rng : numpy.random.Generator
        Which free digits.

    Returns
    -------
    (X (n, 1, 28, 28) float32, y (n,) int64)

    Raises
    ------
    ConfigError
        Not an MNIST federation, or no digit is left over.
    """
    meta = raw.meta
    if not {"train_pool_index", "rotation", "masks"} <= set(meta):
        raise ConfigError("a worst-case start needs labelled public records: pass public=(X, "
                          "y) in the model's input space, or use data.source = 'mnist' (the "
                          "digits no silo holds are used), or init='default'")
    from silofl.data.mnist import mnist_arrays, transform

    X, y, _, _ = mnist_arrays()
    free = np.setdiff1d(np.arange(len(y)), np.asarray(meta["train_pool_index"]).ravel())
    if free.size == 0:
        raise ConfigError("a worst-case start pretrains on MNIST digits no silo holds, but "
                          "this federation deals out all of them; lower data.num_silos or "
                          "data.train_per_silo, or use init='default'")
    pick = rng.choice(free, min(size, free.size), replace=False)
    k = raw.names.index(silo)
    return transform(X[pick], int(meta["rotation"][k]), np.asarray(meta["masks"][k])), y[pick]


def pretrain(model, X: np.ndarray, y: np.ndarray, rng: np.random.Generator,
             params0: np.ndarray | None = None, epochs: int = PRETRAIN["epochs"],
             batch: int = PRETRAIN["batch"], lr: float = PRETRAIN["lr"],
             momentum: float = PRETRAIN["momentum"]) -> np.ndarray:
    """Non-private SGD with momentum on public records (X (n, ...), y (n,)).

    Returns
    -------
    numpy.ndarray
        The trained parameters, shape (P,) (from `params0`, default the model's init).
    """
    w = model.init_params() if params0 is None else np.array(params0, float)
    v = np.zeros_like(w)
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for i in range(0, len(order), batch):
            b = order[i:i + batch]
            g = model.grad_sum(w[None], X[b][None], y[b][None],
                               np.ones((1, len(b)), bool))[0] / len(b)
            v = momentum * v + g
            w = w - lr * v
    return w


def _check_public(raw, silo: str, public) -> tuple[np.ndarray, np.ndarray]:
    X, y = (np.asarray(a) for a in public)
    shape = raw.silo(silo).X_train.shape[1:]
    if X.ndim < 2 or X.shape[1:] != shape or y.shape != (len(X),) or len(X) < 1:
        raise DataError(f"public records of shape X {X.shape}, y {y.shape} do not fit silo "
                        f"{silo!r}: X must be (n, {', '.join(map(str, shape))}), y (n,)")
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
        raise DataError("public records must be finite (one holds NaN or infinity)")
    return X, y


def start_model(model, raw, silo: str, init: str, rng: np.random.Generator,
                public=None) -> StartModel:
    """θ₀ for auditing `silo`: the model's init, or pretrained on public records.

    Parameters
    ----------
    model : Model
        The job's model.
    raw : RawFederation
        The job's silos (only their public meta is read here, never their rows).
    silo : str
        The audited silo.
    init : {"worst-case", "default"}
    rng : numpy.random.Generator
        The public records drawn and their order.
    public : (X, y), optional
        Labelled public records in the model's input space (default: MNIST digits no
        silo holds, `public_digits`).

    Returns
    -------
    StartModel
    """
    check_init(init)
    if init == "default":
        return StartModel(model.init_params(), init, 0, "start: the model's own "
                          "initialization (average case)")
    if public is not None:
        X, y = _check_public(raw, silo, public)
        where = "the given public records"
    else:
        X, y = public_digits(raw, silo, PRETRAIN["size"], rng)
        where = "MNIST digits no silo holds, rotated and masked like the silo's"
    w = pretrain(model, X, y, rng)
    return StartModel(w, init, len(y), f"start: worst case, pretrained without noise on "
                      f"{len(y)} public records ({where}), {PRETRAIN['epochs']} epochs")


# --- the canary and its score ------------------------------------------------------------

def margin(model, w: np.ndarray, X: np.ndarray, y: np.ndarray, task: str) -> np.ndarray:
    """(n,) the logit-scaled confidence of the model `w` (P,) in each label y (n,) of
    X (n, ...): −log(e^loss − 1) for classification (= the logit of p(y) under the
    cross-entropy loss), −loss for a regression `task`."""
    loss = np.asarray(model.loss(w, X, y), float)
    if task == "regression":
        return -loss
    return -np.log(np.expm1(np.maximum(loss, 1e-30)))


def craft_canary(model, w0: np.ndarray, raw, silo: str, canary,
                 rng: np.random.Generator) -> tuple[Canaries, str]:
    """The audit's one canary record (raw feature space) and how it was made.

    `canary`: explicit `Canaries` (the first record is used), a name of
    `CANARY_IMAGES`, or None: for images the candidate of `CANARY_IMAGES` with the
    highest loss at θ₀ = `w0`, labelled with the class θ₀ finds least likely; for tables
    one record at the declared column bounds (`canaries.make_canaries`)."""
    s = raw.silo(silo)
    if isinstance(canary, Canaries):
        c = Canaries(np.asarray(canary.X)[:1], np.asarray(canary.y)[:1])
        _check_canary(raw, silo, c)
        return c, "canary: given"
    image = s.X_train.ndim == 4
    if canary is not None and (not isinstance(canary, str) or canary not in CANARY_IMAGES
                               or not image):
        raise ConfigError(f"unknown canary {canary!r}: give Canaries, or for image data one "
                          f"of {', '.join(CANARY_IMAGES)} (default: whichever the start "
                          "model finds the more wrong)")
    if not image:
        return make_canaries(raw, 1, rng), "canary: one record at the declared column bounds"
    best = None
    for name in [canary] if canary else list(CANARY_IMAGES):
        x = np.full((1, *s.X_train.shape[1:]), CANARY_IMAGES[name], s.X_train.dtype)
        if raw.task == "multiclass":  # the label θ₀ finds least likely
            lab = int(np.argmin(model.predict(w0, x)[0]))
        else:
            lab = int(model.predict(w0, x)[0] < 0.5)
        y = np.array([lab], dtype=s.y_train.dtype)
        loss = float(model.loss(w0, x, y)[0])
        if best is None or loss > best[2]:
            best = (name, Canaries(x, y), loss)
    assert best is not None
    return best[1], (f"canary: a {best[0]} image labelled {int(best[1].y[0])} (loss "
                     f"{best[2]:.2f} at the start model)")


def _check_canary(raw, silo: str, c: Canaries) -> None:
    s = raw.silo(silo)
    if c.X.shape[1:] != s.X_train.shape[1:] or c.y.shape != (len(c.X),) or len(c.X) < 1:
        raise DataError(f"a canary of shape X {c.X.shape}, y {c.y.shape} does not fit silo "
                        f"{silo!r}, whose records have shape {s.X_train.shape[1:]}")
    if not (np.all(np.isfinite(c.X)) and np.all(np.isfinite(c.y))):
        raise DataError("the canary must be finite (it holds NaN or infinity)")
    if raw.task != "regression" and not (c.y[0] == round(float(c.y[0]))
                                         and 0 <= c.y[0] < max(raw.num_classes, 2)):
        raise DataError(f"the canary's label must be a class id 0..{max(raw.num_classes, 2) - 1}")


# --- the engine's plug-in -----------------------------------------------------------------

class LastIterate:
    """The engine's multi-run plug-in (`engine.multi_run`): jobs on D and D′ from a chosen
    start model, scored on the released models' loss on the canary.

    Parameters
    ----------
    cfg : Config
        The audited job.
    raw : RawFederation
        Its silos, before preprocessing.
    init : {"worst-case", "default"}
    rng : numpy.random.Generator
        Public records, table canaries and (seeded noise only) each run's noise seed.
    public : (X, y), optional
        Public records for the worst-case start (`start_model`).
    """

    def __init__(self, cfg, raw, init: str, rng: np.random.Generator, public=None,
                 scores: tuple[str, ...] = DEFAULT_SCORES):
        check_init(init)
        check_scores(scores)
        self.cfg, self.raw, self.init, self.rng, self.public = cfg, raw, init, rng, public
        self.score_names = tuple(scores)
        self.model = build.build_model(cfg, raw)
        self.starts: dict[str, StartModel] = {}
        self.canaries: dict[str, tuple[Canaries, str]] = {}
        #: unit -> score name -> (scores on D, scores on D′), the estimates' input
        self.scores: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
        self.run_ids: list[str] = []
        self.labels: list[str] = []
        self.uncharged: list = []

    def neighbours(self, unit: str, canary) -> tuple:
        """(D, D′) planned for `unit` with its start model and crafted (or given) canary."""
        start = start_model(self.model, self.raw, unit, self.init, self.rng, self.public)
        c, how = craft_canary(self.model, start.params, self.raw, unit, canary, self.rng)
        self.starts[unit], self.canaries[unit] = start, (c, how)
        self.scores[unit] = {name: ([], []) for name in self.score_names}
        return tuple(run_mod._prepare(self.cfg, insert(self.raw, unit, c, np.array([inc])))
                     for inc in (False, True))

    def run_neighbour(self, unit: str, pair, which: int) -> tuple[dict[str, float], Claim]:
        """Train pair[which] (0: D, 1: D′) from the unit's start model on a scratch store;
        ({score name: the score summed over the job's methods}, the job's claim)."""
        p = pair[which]
        tcfg = p.tcfg
        if tcfg.noise == "seeded":  # reproducible, but each run needs its own noise
            tcfg = dataclasses.replace(tcfg, seed=int(self.rng.integers(2**31)))
        fed, results, job = run_job(self.cfg, p, BudgetStore(None), COMMAND, tcfg=tcfg,
                                    params0=self.starts[unit].params)
        run_id = None if job is None else job.run_id
        if run_id is not None:
            self.run_ids.append(run_id)
        self.labels, self.uncharged = p.labels, list(fed.meta.get("uncharged", []))
        k, s = fed.names.index(unit), fed.silo(unit)
        X, y = s.X_test[-1:], s.y_test[-1:]  # the canary, preprocessed like the silo's rows
        w0 = self.starts[unit].params
        out = {}
        for name in self.score_names:
            if name == "loss":
                v = sum(float(margin(p.model, r.params[k], X, y, fed.task)[0])
                        for r in results)
            else:
                v = -sum(float(np.sum((r.params[k] - w0) ** 2)) for r in results)
            self.scores[unit][name][which].append(v)
            out[name] = v
        return out, claim_of(results, p, unit)


# --- the estimate and the audit ------------------------------------------------------------

def gdp_mu(epsilon: float, delta: float) -> float:
    """The μ whose μ-GDP has exactly (ε, δ) (what a tight audit of a full-batch job with
    this claim would estimate); inf for ε = inf."""
    if math.isinf(epsilon):
        return math.inf
    if epsilon <= 0:
        return 0.0
    hi = 1.0
    while gdp_epsilon(hi, delta) < epsilon:
        hi *= 2
    return float(optimize.brentq(lambda m: gdp_epsilon(m, delta) - epsilon, 0.0, hi,
                                 xtol=1e-10))


def estimate(out: np.ndarray, inn: np.ndarray, delta: float, confidence: float) -> dict:
    """The ε estimate from the canary's scores on D (`out`, (N,)) and D′ (`inn`, (N′,)).

    Returns
    -------
    dict
        μ̂ ("mu"), its one-sided lower limit at `confidence` ("mu_lower"), "se", and
        their ε under μ-GDP at `delta` ("epsilon", "epsilon_lower": the verdict's), with
        what it assumes; "auc" of the scores and its μ-GDP reading √2·Φ⁻¹(AUC)
        ("mu_auc", "epsilon_auc": a point cross-check that assumes no score law).
    """
    mu, lower, se = mu_hat(out, inn, confidence)
    # a cross-check that needs no Gaussian scores: a μ-GDP mechanism's every test has
    # AUC ≤ Φ(μ/√2), so √2·Φ⁻¹(AUC) under-reads μ whatever the scores' law; far below μ̂,
    # it says the scores are not Gaussian and μ̂ is not to be trusted
    a, b = np.asarray(out, float), np.asarray(inn, float)
    auc = float(np.mean((b[:, None] > a[None, :]) + 0.5 * (b[:, None] == a[None, :])))
    mu_auc = math.sqrt(2) * float(stats.norm.ppf(auc))
    return {"mu": mu, "mu_lower": lower, "se": se, "epsilon": gdp_epsilon(mu, delta),
            "epsilon_lower": gdp_epsilon(lower, delta), "confidence": confidence, "auc": auc,
            "mu_auc": mu_auc, "epsilon_auc": gdp_epsilon(mu_auc, delta),
            "runs": [int(np.size(out)), int(np.size(inn))],
            "assumes": ESTIMATE_ASSUMES}


def audit_last_iterate(cfg, *, kind: str = "multi-run", silo: str | None = None,
                       canaries=None, runs: int | None = None, confidence: float = 0.95,
                       store: BudgetStore | None = None, seed: int | None = None,
                       init: str = "worst-case", public=None,
                       scores: tuple[str, ...] = DEFAULT_SCORES,
                       on_progress: Callable[[int, int], None] | None = None,
                       scores_out: dict | None = None) -> AuditReport:
    """The model-view (black box, last iterate) multi-run audit of the job `cfg`.

    Parameters
    ----------
    cfg : Config
        The job; privacy must be enabled. Any model with `init_params`, `loss`,
        `predict` and `grad_sum` (the torch models and the GLMs).
    kind : {"multi-run"}
        The only kind (a one-run black-box audit of the last iterate has no power here).
    silo : str, optional
        The silo audited (default: every silo).
    canaries : Canaries, str or None
        The canary: explicit `Canaries` (first record), for images "blank" or "white",
        or None (crafted, `craft_canary`); the count 1 is accepted as None.
    runs : int, optional
        Jobs on each of D and D′ (default `DEFAULT_RUNS`, at least `engine.MIN_RUNS`).
    confidence : float, default 0.95
        Family-wise confidence: half the error to the Clopper–Pearson bound, half to the
        estimate, each split over the audited silos.
    store : BudgetStore, optional
        Must be a scratch store if given (else [budget] scratch must be set): the runs
        are experiments, each charged to its own scratch store.
    seed : int, optional
        Public records, table canaries and seeded runs' noise (default: OS entropy).
    init : {"worst-case", "default"}, default "worst-case"
        The start model (`start_model`).
    public : (X, y), optional
        Public records for the worst-case start (default: MNIST digits no silo holds).
    scores : tuple of str, default ("loss",)
        What the attacker computes from the released model (`SCORES`): "loss" (black
        box) and "weights" (the parameters: sees the silo size through the noise scale).
        Every score is a statistic of the Clopper–Pearson test (chosen on half the runs),
        and each gets an estimate at the estimate's confidence split over the scores.
    on_progress : callable (done, total) -> None, optional
        After each job.
    scores_out : dict, optional
        Benchmarks and tests only: filled with silo -> score name -> (scores on D,
        scores on D′), one per run. They are values of statistics of models trained on
        the silo's data on scratch stores (uncharged), so no report carries them.

    Returns
    -------
    AuditReport
        view "model"; per silo the claimed ε, the rigorous bound (`lower_bound`), the
        estimate's lower end (`estimate_lower`) and details (estimate, start, canary).

    Raises
    ------
    ConfigError
        Privacy off, a kind other than multi-run, too few runs, a real store, an unknown
        init or canary, a worst-case start without public records.
    DataError
        A canary or public records that do not fit the silo.
    """
    t0 = time.perf_counter()
    runs, canaries = _check_settings(cfg, kind, init, confidence, runs, canaries, store)
    check_scores(scores)
    rng = np.random.default_rng(seed)  # None: OS entropy
    raw, names = audited_silos(cfg, silo)
    for n in names:  # misfit inputs fail before any pretraining or job
        if isinstance(canaries, Canaries):
            _check_canary(raw, n, Canaries(np.asarray(canaries.X)[:1],
                                           np.asarray(canaries.y)[:1]))
        if public is not None and init == "worst-case":
            _check_public(raw, n, public)
    mech = LastIterate(cfg, raw, init, rng, public, scores)
    half = 1 - (1 - confidence) / 2
    rows = multi_run(mech, names, canaries, runs, half, on_progress)
    for row in rows:
        _add_estimate(row, mech, per_unit(half, len(names)))
    if scores_out is not None:
        scores_out.update(mech.scores)
    notes = [AUDIT_NOTE, MODEL_VIEW_NOTE, *dict.fromkeys(mech.starts[n].note for n in names),
             *dict.fromkeys(mech.canaries[n][1] for n in names),
             "scores: " + "; ".join(f"{k}: {SCORES[k]}" for k in mech.score_names),
             "estimate: " + ESTIMATE_ASSUMES,
             f"confidence {confidence:.0%} family-wise: half of the error to the "
             "Clopper–Pearson bound, half to the estimates (split over the scores)"]
    ids = mech.run_ids
    return AuditReport("multi-run", rows, mech.labels, job_notes(
        private=True, noise=cfg.privacy.noise, scratch=True, uncharged=mech.uncharged,
        extra=notes), None, True, ids[:1] + ([f"... {len(ids) - 1} more"] if len(ids) > 1
                                              else []),
        time.perf_counter() - t0, confidence, cfg.privacy.noise,
        neighbouring=run_mod.ADJACENCY, view="model")


def _check_settings(cfg, kind: str, init: str, confidence: float, runs: int | None,
                    canaries, store: BudgetStore | None):
    """Everything `audit_last_iterate` refuses before reading any data; returns (runs,
    canaries) with their defaults."""
    if not cfg.privacy.enabled:
        raise ConfigError("an audit compares a claimed ε with an empirical lower bound, but "
                          "this config has no ε claim (privacy is disabled); enable "
                          "[privacy] with epsilon and delta")
    if kind != "multi-run":
        raise ConfigError(f"the model-view audit of the last iterate is multi-run only (D "
                          f"and D′ = D + one canary, many jobs each), got kind {kind!r}; use "
                          "--kind multi-run, or --view server for a one-run audit")
    check_init(init)
    check_confidence(confidence)
    runs = DEFAULT_RUNS if runs is None else runs
    check_runs(runs)
    if isinstance(canaries, int) and not isinstance(canaries, bool):
        if canaries != 1:
            raise ConfigError("the model-view audit uses one canary (D′ = D + one record); "
                              "leave --canaries out or set it to 1")
        canaries = None
    if canaries is not None and not isinstance(canaries, Canaries) and \
            canaries not in CANARY_IMAGES:
        raise ConfigError(f"unknown canary {canaries!r}: give Canaries, or for image data one "
                          f"of {', '.join(CANARY_IMAGES)}")
    if store is not None and not store.scratch or store is None and not cfg.budget.scratch:
        raise ConfigError(f"a multi-run audit trains {runs} jobs on each of D and D′: that is "
                          "an experiment, not a release, and would spend many jobs' worth of "
                          "the silo's lifetime budget. Run it on a scratch store (--scratch, "
                          "or [budget] scratch = true)")
    return runs, canaries


def _add_estimate(row: SiloAudit, mech: LastIterate, confidence: float) -> None:
    """Each score's estimate at `confidence` split evenly over the scores (Bonferroni);
    the row's estimate is the one with the highest lower end."""
    per = 1 - (1 - confidence) / len(mech.score_names)
    ests = {}
    for name, (out, inn) in mech.scores[row.silo].items():
        ests[name] = dict(estimate(np.array(out), np.array(inn), row.delta, per), score=name)
    best = max(ests.values(), key=lambda e: e["epsilon_lower"])
    start, (c, how) = mech.starts[row.silo], mech.canaries[row.silo]
    row.estimate_lower = best["epsilon_lower"]
    row.details.update(estimate=best, estimates=ests,
                       mu_claim=gdp_mu(row.claimed_epsilon, row.delta), init=start.init,
                       public_rows=start.public_rows, canary=how, canary_label=int(c.y[0]),
                       confidence_rigorous=confidence, confidence_estimate=per)

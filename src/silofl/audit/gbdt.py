"""Membership audit of DP federated gradient-boosted trees (`algorithms.dp_gbdt`): the
engine's plug-in (`engine.one_run`, `engine.multi_run`; no second engine). `silofl audit
--config` routes a job of method dp_gbdt here (`audit.tabular`, `audit.jobs.trees_job`).

Canaries are records inserted in an audited silo (each "in" by the engine's fair coin),
built to be worst case for trees and to be read from the server's view:

* auditing columns: C = ``ceil(LOAD·m / (B − 1))`` (histogram and random splits; cyclic
  splits: below) extra feature columns with public bounds [0, 1] (B = n_bins). Every
  real record (every silo, train and test) holds 0 there (bin 0); each canary holds a
  random bin in 1..B−1 of every auditing column (its code, drawn by the auditor). The
  cells of bins ≥ 1 hold canaries only — the trees' analogue of the Dirac gradient
  canaries of `audit.whitebox` — and each canary appears in C of them per histogram, so
  most of its contribution to a release lies where no real record is. Histogram splits:
  the released features grow by these columns, and with them each release's sensitivity
  √(m(G² + H²)) and its noise: the audited job is the job plus the auditing columns,
  calibrated to the same target.
* real features at a rarely populated bin corner (each at its declared lower or upper
  bound, by coin); the label by a fair coin (binary 0/1; regression 3G above or below
  the public starting margin, so |g| is clipped to G). Labels all alike would be worse:
  the trees learn the canaries as a group (they are the only rows off bin 0 in the
  auditing columns), fit them, and their |g| shrinks (measured: p ≈ 0.1 for label 0 after
  a few trees, ‖(g, h)‖ ≈ 0.15 instead of ≈ 0.56 with coin labels).

Settings: the job's own, resolved exactly as `train_dp_gbdt` resolves them on the job's
federation (`job_settings`: its defaults, T = 2d trees, automatic bins from Σ_k n_k and the
silos' σ_k, depth ⌈log2 B⌉), then fixed for the audited job — the auditing columns and the
canaries change neither T, D, B nor σ.

Cyclic splits (the default): tree t uses column t mod (d + C) of the audited job, whose
columns interleave (`layout`): real 0, auditing 0, real 1, auditing 1, …, with
C = min(d, ⌊T/2⌋) (`cyclic_columns`), C = d for the default T = 2d. So the job's T trees
stay T, each one leaf release of sensitivity √(G² + H²) at the job's σ — the same
mechanism, charged the same — but the odd trees release an auditing column's leaves (its
bins: the bins ≥ 1 hold canaries only) and the even ones the real features in the job's
cyclic order (one pass instead of two with T = 2d). Each canary sits in one canary-only
leaf per auditing tree; default canaries min(500, n, 2·C·(B − 1)) (each leaf gives Σg and Σh).

Scores (higher: guessed "in"; `audit.gbdt_scores`), functions of the releases, the
released model, the canaries and public settings only — never of a real record:

* "white-box": the server's view, every noisy release of the audited silo
  (`GbdtRelease`): the least-squares estimate of the canaries' inclusion from every cell
  only canaries populate (the auditing columns' bins ≥ 1, nodes and leaves only canaries
  reach), turned into a likelihood ratio;
* "black-box": minus the final ensemble's loss on the canary.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from silofl.algorithms.dp_gbdt import GbdtRelease, GbdtResult, train_dp_gbdt
from silofl.algorithms.gbdt_settings import (
    GbdtSettings,
    calibrate_sigma,
    gbdt_settings,
    resolve_bins,
)
from silofl.audit.engine import (
    AUDIT_NOTE,
    AuditReport,
    Claim,
    canary_count,
    check_confidence,
    check_kind,
    check_runs,
    multi_run,
    one_run,
)
from silofl.audit.gbdt_scores import ScoreSettings, black_box, white_box
from silofl.data.federation import Federation, Silo
from silofl.errors import ConfigError
from silofl.privacy.ledger import Ledger
from silofl.training.histograms import bin_edges, bin_features
from silofl.training.private_bins import edges_from_histograms

#: canaries per audited silo when not given (at most its training records)
DEFAULT_CANARIES = 500
#: auditing columns per canary per canary bin: C = ceil(LOAD·m/(B − 1)) columns, so the
#: m inclusions are read from LOAD times as many noisy cells (least squares, well posed)
LOAD = 3
#: names of the auditing columns (prefix + index)
COLUMN_PREFIX = "_audit_"
#: the neighbouring relation of the trees' claim (example level, add/remove one row)
ADJACENCY = "add/remove one training record of the audited silo (example level)"
#: train_dp_gbdt keywords the audit owns
_RESERVED = ("seed", "private", "observe", "noise_scale", "bounds", "noise")
#: cyclic splits: default canaries ≤ this × the canary-only leaves C·(B − 1) (each leaf
#: gives two equations, Σg and Σh; each canary sits in C leaves)
CYCLIC_PER_LEAF = 2
#: multi-run runs per side when not given
DEFAULT_RUNS = 200


@dataclass(frozen=True)
class TreeCanaries:
    """m tree canaries: X (m, d) on the real features, y (m,), and each one's code (m, C):
    its bin in 1..B−1 of each of the C auditing columns."""

    X: np.ndarray
    y: np.ndarray
    code: np.ndarray

    @property
    def m(self) -> int:
        return int(self.X.shape[0])


def tree_canaries(m: int, bounds: np.ndarray, n_bins: int, task: str, base_score: float,
                  clip_g: float, rng: np.random.Generator,
                  columns: int | None = None) -> TreeCanaries:
    """`m` canaries from public facts only (see the module docstring).

    Parameters
    ----------
    m : int
        Number of canaries.
    bounds : numpy.ndarray
        (d, 2) declared [lower, upper] of the real features.
    n_bins : int
        Bins per feature B; the canaries use bins 1..B−1 of ``ceil(LOAD·m/(B − 1))``
        auditing columns.
    task : {"binary", "regression"}
    base_score, clip_g : float
        The run's public starting margin and gradient clip G.
    rng : numpy.random.Generator
        The corners and the codes.
    columns : int, optional
        C, the auditing columns (default ``ceil(LOAD·m/(B − 1))``; cyclic splits: fixed by
        the trees, `cyclic_columns`).

    Returns
    -------
    TreeCanaries
    """
    b = np.asarray(bounds, float)
    corner = rng.random((m, b.shape[0])) < 0.5
    X = np.where(corner, b[None, :, 0], b[None, :, 1])
    # labels by fair coins: the canaries carry no signal the trees could learn (labels
    # all alike would be learnt, their leaves would fit them and |g| would shrink)
    sign = rng.random(m) < 0.5
    if task == "binary":
        y = sign.astype(float)
    else:  # g = margin − y clipped to ±G: the label 3G away from the start
        y = base_score + np.where(sign, 3.0, -3.0) * clip_g
    C = math.ceil(LOAD * m / (n_bins - 1)) if columns is None else int(columns)
    return TreeCanaries(X, y, rng.integers(1, n_bins, size=(m, C)))


def audit_rows(c: TreeCanaries, columns: int, n_bins: int,
               order: np.ndarray | None = None) -> np.ndarray:
    """(m, d + columns) the canaries' rows: real features, then the auditing columns (the
    centre of the code's bin; 0 — bin 0, the real records' — beyond the code); columns
    taken in `order` (`layout`) when given."""
    A = np.zeros((c.m, columns))
    A[:, :c.code.shape[1]] = (c.code + 0.5) / n_bins
    rows = np.hstack([c.X, A])
    return rows if order is None else rows[:, order]


def cyclic_columns(trees: int, d: int) -> int:
    """C for cyclic splits: min(d, ⌊T/2⌋), at least 1 — with `layout`'s interleaving the
    odd trees of the first 2C release an auditing column's leaves."""
    return max(1, min(d, trees // 2))


def layout(d: int, columns: int, interleave: bool) -> np.ndarray:
    """(d + columns,) the trained column order as indices into [real features, auditing
    columns]: as they are, or (cyclic splits; columns ≤ d) real 0, auditing 0, real 1,
    auditing 1, …, then the remaining real features — so tree t's feature t mod (d + C)
    alternates between a real feature and an auditing column."""
    if not interleave:
        return np.arange(d + columns)
    pairs = np.stack([np.arange(columns), d + np.arange(columns)], axis=1).ravel()
    return np.concatenate([pairs, np.arange(columns, d)])


def with_columns(fed: Federation, columns: int, order: np.ndarray | None = None) -> Federation:
    """`fed` with `columns` auditing columns of zeros appended to every row (columns then
    taken in `order` when given)."""
    names = list(fed.feature_names) + [f"{COLUMN_PREFIX}{j}" for j in range(columns)]
    if order is not None:
        names = [names[j] for j in order]

    def pad(X: np.ndarray) -> np.ndarray:
        P = np.hstack([X, np.zeros((X.shape[0], columns))])
        return P if order is None else P[:, order]
    silos = [replace(s, X_train=pad(s.X_train), X_test=pad(s.X_test)) for s in fed.silos]
    return replace(fed, silos=silos, feature_names=names, meta=dict(fed.meta))


def _canary_persons(ids: np.ndarray | None, k: int) -> np.ndarray | None:
    """`ids` with k fresh person ids appended, one per canary row (a job with a
    `[data] person_column` keeps one id per row; trees are per-row DP, so each canary
    is its own person); None stays None."""
    if ids is None:
        return None
    if ids.dtype.kind in "iu":  # int ids: above every real one
        start = int(ids.max()) + 1 if ids.size else 0
        return np.concatenate([ids, np.arange(start, start + k, dtype=ids.dtype)])
    new = np.array([f"__silofl_canary_{j}" for j in range(k)], dtype=object)
    return np.concatenate([ids.astype(object), new])


def _insert(fed: Federation, silo: str, X: np.ndarray, y: np.ndarray,
            included: np.ndarray) -> Federation:
    inc = np.asarray(included, bool)
    silos: list[Silo] = []
    for s in fed.silos:
        if s.name == silo:
            s = replace(s, X_train=np.vstack([s.X_train, X[inc]]),
                        y_train=np.concatenate([s.y_train, y[inc].astype(s.y_train.dtype)]),
                        person_train=_canary_persons(s.person_train, int(inc.sum())))
        silos.append(s)
    return replace(fed, silos=silos, meta=dict(fed.meta))


# --- the plug-in ----------------------------------------------------------------------------

@dataclass
class _Finished:
    """A finished one-run job: the canaries' scores and claims per audited silo."""

    out: dict[str, dict[str, np.ndarray]]
    claims: dict[str, Claim]

    def scores(self, unit: str) -> dict[str, np.ndarray]:
        return self.out[unit]

    def claim(self, unit: str) -> Claim:
        return self.claims[unit]


def _claim(result: GbdtResult, k: int) -> Claim:
    rep = result.report[k]
    return Claim(float(rep["epsilon"]), float(rep["target_epsilon"]), float(rep["delta"]))


@dataclass
class GbdtMechanism:
    """The engine's plug-in for `train_dp_gbdt` on `fed` with `kwargs` (its settings,
    resolved as the job resolves them: `job_settings`); `noise_scale` is the self-test's
    broken variant (0: noise off, the claim unchanged); `noise` is the training's noise
    ("seeded" when the audit is seeded, so its verdict reproduces; else "secure")."""

    fed: Federation
    bounds: np.ndarray
    kwargs: dict[str, Any]
    seed: int
    noise_scale: float = 1.0
    noise: str = "secure"
    runs: int = 0
    settings: ScoreSettings = field(init=False)
    n_bins: int = field(init=False)
    cyclic: bool = field(init=False)
    columns: int | None = field(init=False)

    def __post_init__(self) -> None:
        self.kwargs, st = job_settings(self.fed, self.kwargs)
        d = self.fed.dim
        self.n_bins, self.cyclic = st.n_bins, st.splits == "cyclic"
        self.columns = cyclic_columns(st.trees, d) if self.cyclic else None
        cols = tuple(range(1, 2 * self.columns, 2)) if self.columns else None
        self.settings = ScoreSettings(st.task, st.clip_g, st.clip_h, st.subsample, st.depth,
                                      d, cols, st.sigma_bins(1.0) if st.private_bins else 0.0)

    def default_canaries(self, unit: str) -> int:
        """min(500, the silo's training records) — cyclic splits: also at most
        CYCLIC_PER_LEAF × the canary-only leaves C·(B − 1)."""
        n = min(DEFAULT_CANARIES, self.fed.silo(unit).n_train)
        if self.columns:
            n = min(n, max(2, CYCLIC_PER_LEAF * self.columns * (self.n_bins - 1)))
        return n

    def draw(self, unit: str, canaries: Any, rng: np.random.Generator) -> TreeCanaries:
        return self.make(unit, canary_count(canaries, self.default_canaries(unit)), rng)

    def make(self, unit: str, m: int, rng: np.random.Generator) -> TreeCanaries:
        """`m` canaries for `unit` (at most its training records)."""
        n = self.fed.silo(unit).n_train
        if m > n:
            raise ConfigError(f"{m} canaries are more than the {n} training records of silo "
                              f"{unit!r}; use at most {n}")
        return tree_canaries(m, self.bounds, self.n_bins, self.fed.task,
                             float(self.kwargs.get("base_score", 0.0)),
                             self.settings.clip_g, rng, self.columns)

    def _order(self, cols: int) -> np.ndarray:
        return layout(self.fed.dim, cols, self.cyclic)

    def prepare_one(self, chosen: dict[str, tuple[TreeCanaries, np.ndarray]]):
        B = self.n_bins
        cols = max(c.code.shape[1] for c, _ in chosen.values())
        order = self._order(cols)
        fed = with_columns(self.fed, cols, order)
        rows = {}
        for unit, (c, inc) in chosen.items():
            rows[unit] = (c, audit_rows(c, cols, B, order))
            fed = _insert(fed, unit, rows[unit][1], c.y, inc)
        return fed, rows

    def _bounds(self, fed: Federation) -> np.ndarray:
        """(D, 2) the declared bounds of the trained columns: the real features' and
        [0, 1] per auditing column, in `layout` order."""
        cols = fed.dim - self.fed.dim
        b = np.vstack([self.bounds, np.tile([0.0, 1.0], (cols, 1))])
        return b[self._order(cols)]

    def _train(self, fed: Federation, seed: int) -> tuple[GbdtResult, list[GbdtRelease]]:
        seen: list[GbdtRelease] = []
        result = train_dp_gbdt(fed, bounds=self._bounds(fed), seed=seed, noise=self.noise,
                               noise_scale=self.noise_scale, observe=seen.append,
                               **self.kwargs)
        return result, seen

    def _scores(self, fed: Federation, result: GbdtResult, seen: list[GbdtRelease],
                unit: str, c: TreeCanaries, rows: np.ndarray) -> dict[str, np.ndarray]:
        k = fed.names.index(unit)
        mine = [r for r in seen if r.silo == k]
        sigma = float(result.report[k]["sigma"])
        counts = [r.g for r in seen if r.tree < 0]
        # private bins: the server's edges, from every silo's released counts (as it does)
        edges = (edges_from_histograms(np.sum(counts, axis=0), self._bounds(fed), self.n_bins)
                 if counts else bin_edges(self._bounds(fed), self.n_bins))
        bins = bin_features(rows, edges)
        return {"white-box": white_box(self.settings, mine, result.ensemble, rows, bins,
                                       c.y, sigma),
                "black-box": black_box(fed.task, result.ensemble, rows, c.y)}

    def run_one(self, prepared) -> _Finished:
        fed, rows = prepared
        result, seen = self._train(fed, self.seed)
        out = {u: self._scores(fed, result, seen, u, c, x) for u, (c, x) in rows.items()}
        return _Finished(out, {u: _claim(result, fed.names.index(u)) for u in rows})

    def neighbours(self, unit: str, canary: TreeCanaries):
        return tuple(self.prepare_one({unit: (canary, np.array([w]))}) for w in (False, True))

    def run_neighbour(self, unit: str, pair, which: int) -> tuple[dict[str, float], Claim]:
        fed, rows = pair[which]
        self.runs += 1  # a fresh seed per run: the runs' noise is independent
        result, seen = self._train(fed, self.seed + self.runs)
        c, x = rows[unit]
        sc = self._scores(fed, result, seen, unit, c, x)
        return ({k: float(v[0]) for k, v in sc.items()},
                _claim(result, fed.names.index(unit)))


def job_settings(fed: Federation, trees: dict[str, Any]) -> tuple[dict[str, Any], GbdtSettings]:
    """The job's settings resolved exactly as `train_dp_gbdt` resolves them on `fed` (the
    job's federation, before any canary or auditing column): its defaults where unset,
    "auto" trees and depth from d, "auto" bins from Σ_k n_k and every silo's calibrated
    σ_k (`gbdt_settings.resolve_bins`). The audited job then trains with these fixed, so
    the auditing columns and the canaries change neither T, D, B nor σ.

    Parameters
    ----------
    fed : Federation
        The job's federation (every silo with a target, or ``ledgers`` in `trees`).
    trees : dict
        `train_dp_gbdt` keywords as the job passes them (None or "auto": automatic).

    Returns
    -------
    (dict, GbdtSettings)
        The audited job's keywords (trees, depth, n_bins, splits explicit) and the
        resolved settings.
    """
    defaults = inspect.signature(train_dp_gbdt).parameters
    names = [p for p in inspect.signature(gbdt_settings).parameters if p not in ("task", "d")]
    kw = {k: trees[k] if trees.get(k) is not None else defaults[k].default for k in names}
    for k in ("trees", "depth", "clip_h", "max_leaf"):
        kw[k] = None if kw[k] == "auto" else kw[k]
    st = gbdt_settings(fed.task, fed.dim, **kw)
    if st.auto_bins or st.auto_depth:
        leds = trees.get("ledgers") or [Ledger(s.name, s.target) for s in fed.silos]  # type: ignore[arg-type]
        given = trees.get("noise_multipliers") or [None] * len(leds)
        sigmas = [calibrate_sigma(st, led, g) for led, g in zip(leds, given, strict=True)]
        st = resolve_bins(st, sum(s.n_train for s in fed.silos), sigmas)
    out = {k: v for k, v in trees.items() if v is not None
           and not (v == "auto" and k in ("trees", "depth", "n_bins", "clip_h", "max_leaf"))}
    out.update(trees=st.trees, depth=st.depth, n_bins=st.n_bins, splits=st.splits)
    return out, st


def _check(fed: Federation, kwargs: dict[str, Any], kind: str) -> None:
    bad = sorted(set(kwargs) & set(_RESERVED))
    if bad:
        raise ConfigError(f"audit_gbdt sets {', '.join(bad)} itself (the audit's seed, the "
                          "auditing columns' bounds, the observer); leave them out")
    if kwargs.get("edges") is not None:
        raise ConfigError("the trees' audit places its auditing columns' bins itself: leave "
                          "edges out (use [trees] bins = \"schema\" or \"private\")")
    if fed.is_image or fed.task not in ("binary", "regression"):
        raise ConfigError(f"the trees' audit needs a tabular binary or regression "
                          f"federation, got {fed.task!r}")
    if any(s.target is None for s in fed.silos) and kwargs.get("ledgers") is None:
        raise ConfigError("every silo needs a privacy target (Federation.with_targets) or "
                          "pass ledgers: the audit compares a claim with a bound")
    if kind == "multi-run" and kwargs.get("ledgers") is not None:
        raise ConfigError("a multi-run audit trains many jobs on purpose: it runs on fresh "
                          "in-memory ledgers; leave ledgers out")


def audit_gbdt(fed: Federation, *, silo: str | None = None, canaries: int | None = None,
               kind: str = "one-run", runs: int | None = None, confidence: float = 0.95,
               seed: int | None = None, bounds: Any = (-1.0, 1.0),
               **trees: Any) -> AuditReport:
    """Membership audit of `train_dp_gbdt` on `fed`: does each audited silo's claimed ε
    survive the attack of the module docstring?

    Parameters
    ----------
    fed : Federation
        Tabular, binary or regression, every silo with its privacy target (or pass
        ``ledgers=`` in `trees`: they are charged for the one-run job).
    silo : str, optional
        The audited silo (default: every silo; the bounds are then Bonferroni-corrected).
    canaries : int, optional
        One run: canaries per audited silo (default min(500, its training records)).
        Multi-run: leave out (one canary).
    kind : {"one-run", "multi-run"}
        One training job with m canaries each "in" by a fair coin (Steinke et al. 2023),
        or `runs` jobs on each of D and D′ = D + one canary (fresh in-memory ledgers).
    runs : int, optional
        Multi-run jobs per side (default 200, at least `engine.MIN_RUNS`).
    confidence : float
        Family-wise confidence of the lower bounds, in [0.5, 1).
    seed : int, optional
        Seeds the canaries, the coins and the training job, whose noise is then seeded
        (default: OS entropy, secure noise).
    bounds : (2,) or (d, 2) array-like
        The declared feature bounds, as `train_dp_gbdt` takes them.
    **trees
        `train_dp_gbdt`'s settings (trees, depth, n_bins, lr, lam, clip_g, clip_h,
        subsample, colsample, ..., ledgers); not seed, private, bounds, observe.

    Returns
    -------
    AuditReport
        Per silo: the claimed ε (the ledger's), the rigorous lower bound at `confidence`
        and `bounds.one_run_audit`'s (or `multi_run_epsilon`'s) details.

    Raises
    ------
    ConfigError
        Bad kind, confidence, canaries or settings; raised before any training.
    """
    return _audit(fed, silo=silo, canaries=canaries, kind=kind, runs=runs,
                  confidence=confidence, seed=seed, bounds=bounds, noise_scale=1.0,
                  trees=trees)


def _audit(fed: Federation, *, silo: str | None, canaries: int | None, kind: str,
           runs: int | None, confidence: float, seed: int | None, bounds: Any,
           noise_scale: float, trees: dict[str, Any]) -> AuditReport:
    """`audit_gbdt` with the self-test's `noise_scale` (released noise × it)."""
    t0 = time.perf_counter()
    check_kind(kind)
    check_confidence(confidence)
    _check(fed, trees, kind)
    names = [fed.silo(silo).name] if silo is not None else fed.names
    rng = np.random.default_rng(seed)
    b = _bounds(bounds, fed.dim)
    mech = GbdtMechanism(fed, b, dict(trees), int(rng.integers(2 ** 31)), noise_scale,
                         noise="secure" if seed is None else "seeded")
    if kind == "one-run":
        rows, _p, _job = one_run(mech, names, canaries, confidence, rng)
        what = (f"one run: {rows[0].details['canaries']} tree canaries per audited silo, "
                "each in with probability 1/2")
    else:
        if canaries not in (None, 1):
            raise ConfigError("a multi-run audit uses one canary (D′ = D + one record); "
                              "leave canaries out")
        n = DEFAULT_RUNS if runs is None else int(runs)
        check_runs(n)
        one = mech.make(names[0], 1, rng)
        rows = multi_run(mech, names, one, n, confidence)
        what = f"multi-run: {n} jobs on D and {n} on D′ = D + one tree canary"
    charged = trees.get("ledgers") is not None and kind == "one-run"
    notes = [AUDIT_NOTE, what,
             "canaries: records coded across auditing columns (public bounds [0, 1], bin 0 "
             "for every real record, a random bin >= 1 per column for each canary), real "
             "features at the declared bounds' corners, labels by fair coins; the audited "
             "job is the job plus these columns, with the job's settings resolved on the "
             "job's data (" + _settings_note(mech) + ")",
             "scores: white box (least squares on the cells only canaries populate in the "
             "noisy histograms and leaf sums, as the server receives them) and black box "
             "(the released ensemble's loss)",
             "charged to the given ledgers" if charged else
             "charged to fresh in-memory ledgers (an experiment: no lifetime store)"]
    if noise_scale != 1.0:
        notes.append(f"self-test: the released noise is × {noise_scale:g} while the ledgers "
                     "charge the target σ (broken privacy, on purpose)")
    return AuditReport(kind, rows, ["dp_gbdt"], notes, None, not charged, [],
                       time.perf_counter() - t0, confidence, "seeded" if seed is not None
                       else "entropy-seeded", neighbouring=ADJACENCY, view="trees")


def _settings_note(mech: GbdtMechanism) -> str:
    k = mech.kwargs
    what = f"{k['trees']} trees of depth {k['depth']}, {k['n_bins']} bins, {k['splits']} splits"
    if mech.columns:
        what += (f"; cyclic order interleaving real features and {mech.columns} auditing "
                 "columns: the odd trees release an auditing column's leaves, same T, σ "
                 "and one leaf release per tree")
    return what


def _bounds(bounds: Any, d: int) -> np.ndarray:
    b = np.asarray(bounds, dtype=np.float64)
    if b.shape == (2,):
        b = np.tile(b, (d, 1))
    if b.shape != (d, 2) or not np.all(np.isfinite(b)) or np.any(b[:, 0] >= b[:, 1]):
        raise ConfigError(f"bounds must be (lower, upper) or a ({d}, 2) array of finite "
                          f"lower < upper, got shape {b.shape}")
    return b

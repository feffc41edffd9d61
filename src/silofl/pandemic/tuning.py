"""Private tuning on graph data: the pandemic domain's pieces (thesis appendix E on the pandemic
track, `pandemic.pipeline.train(..., tuning=...)`).

The tuned release is the tabular one (`tuning.private.TunedPersonalization`): each region
draws a secret h_k ~ TNB/Poisson, trains h_k trials of random (λ, lr) beside a pivot model,
scores every trial with Gaussian noise and releases only the best. What changes at node
level (one *person* is the privacy unit, `privacy.node_level`):

* **The score** (`NodeValidation`).  A trial's raw score on region k is the mean clipped
  focal loss  s(w) = (1/m) Σ_i min(ℓ(w; x_i, y_i), B)  over the examples of m persons at
  one public, data-independent window: window_end = T − t_pred, the last window whose
  label week is fully observed (closest to the prediction target), of every person of
  the region (m = n) or, above `SCORE_PERSONS`, of a public seeded sample of m persons
  (it depends on n only).  No rows are held out: under node-level adjacency a held-out
  person still sits in training persons' neighbourhoods, so carving gains nothing; the
  base mechanism of RepeatAndSelect is (training, score) on the same data.
  *Sensitivity*: replacing one person changes at most A = `privacy.node_level.affected_examples(n,
  S, adjacency)` examples (S under "node", 2S − 1 under "node+edges"), each clipped loss
  by at most B, and m is public, so  Δ = min(A, m) · B / m  (replacement adjacency).
  The noise is N(0, (σ_s Δ)²), charged as a Gaussian of noise multiplier σ_s
  (`privacy.selection.GaussianScoreEvent`, RDP α / (2σ_s²)).  It holds under the same
  uncharged pruning assumption as training (`privacy.node_level.PRUNING_ASSUMPTION`) and
  needs model inputs that are a function of the person's example alone: declared or
  privately released constants.
  With ``preprocessing="uncharged"`` every example depends on region-wide statistics, so
  no such bound exists and tuning is refused (`check_setting`).
* **The score's noise multiplier and the accounting** are the privacy layer's
  (`silofl.privacy.node_tuning`: `node_score_sigma`, `GaussianScoreEvent`,
  `NodeRepeatAndSelectEvent`); the tuning path is the one of every unit
  (`silofl.tuning.private`), which takes a `NodeValidation` per region as its validation.
"""

from __future__ import annotations

import math

import numpy as np

from silofl.errors import ConfigError

#: the public cap on the persons a score is computed over (a seeded sample above it)
SCORE_PERSONS = 20_000
#: default clip bound B of a per-example focal loss in the score
DEFAULT_LOSS_BOUND = 1.0


# --- the node-level validation score -------------------------------------------------------

class NodeValidation:
    """The validation score of one region (module docstring).

    region: has ``.features`` (`NeighbourhoodFeatures`, built after the reservation),
    ``.n`` and ``.name``; inputs(X) maps gathered examples (B, D) to model inputs
    (B, P − 1); affected: A, the examples one replaced person changes; loss_bound: B;
    seed: keys the public person sample when n > `SCORE_PERSONS`.  Nothing is read until
    `scores` is called (after the trial's score charge)."""

    def __init__(self, region, inputs, *, affected: int,
                 loss_bound: float = DEFAULT_LOSS_BOUND, seed: int = 0,
                 max_persons: int = SCORE_PERSONS):
        if not (math.isfinite(loss_bound) and loss_bound > 0):
            raise ConfigError(f"tuning loss_bound (the clip B of a per-example loss in the "
                              f"validation score) must be positive, got {loss_bound}")
        self.region, self.inputs = region, inputs
        self.affected, self.loss_bound = int(affected), float(loss_bound)
        n = int(region.n)
        self.persons = np.arange(n) if n <= max_persons else np.sort(
            np.random.default_rng([int(seed), 0x5C0E]).choice(n, max_persons, replace=False))
        self._examples = None

    @property
    def size(self) -> int:
        """m, the persons scored (public: a function of n)."""
        return int(self.persons.size)

    def sensitivity(self, model=None) -> float:
        """Δ = min(A, m) · B / m under the node-level (replacement) adjacency."""
        return min(self.affected, self.size) * self.loss_bound / self.size

    def window_end(self) -> int:
        """The public window: the last one whose label week is observed (T − t_pred)."""
        return int(self.region.features.train_window_range[1])

    def examples(self, batch: int = 4096) -> tuple[np.ndarray, np.ndarray]:
        """(X (m, P − 1), y (m,)) at `window_end` — reads the region's private data."""
        if self._examples is None:
            F, we, Xs, ys = self.region.features, self.window_end(), [], []
            for lo in range(0, self.size, batch):
                p = self.persons[lo:lo + batch]
                X, y = F.gather(p, np.full(p.size, we, dtype=np.int64))
                Xs.append(np.asarray(self.inputs(X), dtype=np.float64))
                ys.append(np.asarray(y, dtype=np.float64))
            self._examples = (np.concatenate(Xs), np.concatenate(ys))
        return self._examples

    def scores(self, model, candidates: np.ndarray) -> np.ndarray:
        """(G,) raw score (mean clipped loss, lower is better) of each candidate (G, P)."""
        X, y = self.examples()
        return np.array([np.clip(model.loss(w, X, y), 0.0, self.loss_bound).mean()
                         for w in np.atleast_2d(candidates)])

    def describe(self) -> dict:
        return {"score": "mean per-person focal loss clipped to [0, B]",
                "window_end": "T - t_pred (last labelled window; public)",
                "persons": self.size, "loss_bound": self.loss_bound,
                "affected_examples": self.affected, "sensitivity": self.sensitivity()}


# --- which settings have an honest node-level score ----------------------------------------

def check_setting(tc, cfg) -> None:
    """Refuse (ConfigError) what the graph route cannot do honestly, before anything is
    reserved: ``tc`` a `TuningConfig`, ``cfg`` a `PandemicConfig`."""
    from silofl.tuning import setup
    if tc.mode != "private":
        raise ConfigError(f"graph tuning mode must be 'private' (or pass no tuning), got "
                          f"{tc.mode!r}")
    if not cfg.private:
        raise ConfigError("private tuning needs a private run (its selection is charged "
                          "to each region's node-level budget); drop --no-privacy, or "
                          "train fixed settings without tuning")
    if cfg.method not in setup.TUNABLE:
        raise ConfigError(f"private tuning tunes mrmtl or ditto (their λ), not method "
                          f"{cfg.method!r}; use --method mrmtl or ditto")
    if tc.method != cfg.method:
        raise ConfigError(f"tuning.method {tc.method!r} differs from the run's method "
                          f"{cfg.method!r}; set them alike")
    # the default select (subsample) is example-level only: graph tuning runs "random"
    if tc.select != "random" and "select" in tc.model_fields_set:
        raise ConfigError("graph tuning supports select = 'random' (random h, "
                          "RepeatAndSelect) only: the exponential-mechanism route is "
                          "accounted with zCDP, which does not compose with node-level "
                          "events here")
    if cfg.preprocessing == "uncharged":
        raise ConfigError(
            "private tuning needs an honest node-level validation score: its sensitivity "
            "bound (≤ A examples change per replaced person) holds only if every model "
            "input is a function of the person's own example, but preprocessing = "
            "'uncharged' standardizes with region-wide statistics of the data, so one "
            "person can move every example's score. Use preprocessing 'declared' or "
            "'private'")
    setup.validate(tc)
    if not tc.lam:
        raise ConfigError("tuning.lam is empty; list the λ values to try, e.g. "
                          "--tuning-lam 0.01,0.1,1")


def describe_release(alg, k: int) -> dict:
    """The tuning part of region k's privacy entry (``alg`` a `TunedPersonalization`
    after its run). h_k is never included: it is secret; only its distribution is."""
    chosen = (alg.last_release or [None] * (k + 1))[k]
    return {"tuned": "privately (random-h RepeatAndSelect, node-level)",
            "h_distribution": alg.dist.describe(), "lam_grid": list(alg.lams),
            "lr_grid": alg.lrs, "pivot_lam": alg.pivot_lam, "pivot": alg.pivot,
            "score_ratio": alg.score_ratio, "validation": alg.validation[k].describe(),
            "chosen": chosen}


__all__ = ["DEFAULT_LOSS_BOUND", "NodeValidation", "SCORE_PERSONS", "check_setting",
           "describe_release"]

"""Train and predict per-region infection-risk models with MR-MTL under node-level DP.

Each region (silo) builds neighbourhood features from its own subgraph (edges that cross
regions are cut), trains a focal-loss logistic regression with DP-SGD on batches of b
persons drawn uniformly *without replacement* (the sampling the node-level accountant
assumes), and pulls its model towards the mean of all regions' models (MR-MTL). Every
round is charged to the region's ledger as a node-level event *before* its data is read.
The centralized mode treats the whole population as one silo.

The training recipe (defaults of `PandemicConfig`; the reasons, measured on synthetic
outbreaks of 20k persons in 4 regions, positive rate ≈ 0.3%):

* **inputs** (``pooling="summary"``): a dozen "recent infections among my contacts"
  summaries of each example (`summary_inputs`) instead of 150+ mean-pooled columns.
  The label is a new infection, which in these data comes from infectious contacts; the
  mean-pooled one-hot history spreads that signal over 63 tiny columns (one infected
  neighbour moves a column by 1/19), and under node-level DP every extra weight adds
  noise to the scores: with mean pooling even non-private SGD stayed near the
  positive-rate baseline, with the summaries DP at ε = 5 beats it (2× on the 20k
  outbreak, 4–34× on a 10k one, depending on the training seed) — but an untrained
  equal-weight sum of the summaries does as well or better (README, "How much of the
  score is the inputs"; `summary_baseline`).  The
  summaries are a deterministic function of the example (own history, neighbour
  histories, contact durations/locations, empty-slot flags), so the node-level
  accounting is unchanged.
* **standardization** (``standardize=True``): every input column is centred and scaled
  per region; the gradients then have comparable scales across columns and one learning
  rate fits all of them (``lr=0.3``; the old ``lr=10`` on raw mean-pooled inputs
  diverged along the large columns and crawled along the small ones).  The constants
  come from the region's examples (features only, no labels) and are folded into the
  saved weights, so `PandemicModel.weights` act on the raw inputs.
* **bias initialization** (``bias_init=-5``): a fixed hyperparameter (a public guess at
  the log-odds of a weekly infection, *not* computed from the labels).  Starting at 0
  puts every example at p = 0.5, where the focal gradients of the 99.7% negatives all
  clip to C and drown the positives; near the prior, negatives have tiny gradients and
  the few positives (clipped to C, fig. 2.9) set the direction.
* **weight prior** (``prior_weight=0.1``): every summary input starts with weight 0.1, the
  public prior that more infection around a person means more risk.  Measured over 4
  training seeds on three synthetic outbreaks (20k/4 regions seeds 1, 2; 10k seed 3),
  the median DP lift over the positive rate went from 1.9×/1.8×/8.7× (start at 0, single
  runs 0.6×–34×) to 5.5×/12.4×/31.6×, about what the untrained equal-weight score gets
  (7.0×/12.6×/26×): at ε = 5 DP-SGD mostly keeps a good prior rather than finding one.
* **MR-MTL**: ``lr · lam ≪ 1`` (``lam=0.1``); with ``lr · lam ≈ 1`` every step snaps a
  region back to the mean and the local progress is lost.

What is not charged (as in the thesis): data-dependent preprocessing constants (feature
standardization, including that of the model inputs, Box-Cox λ, edge statistics) and the
pruning itself.
"""

from __future__ import annotations

import json
import math
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from silofl.data.federation import PrivacyTarget
from silofl.errors import ConfigError
from silofl.models.glm import FocalLoss
from silofl.pandemic import metrics as PM
from silofl.pandemic.baseline import sir_baseline_scores
from silofl.pandemic.features import (
    N_STATES, NeighbourhoodFeatures, build_neighbourhood_features,
)
from silofl.pandemic.node_dp import NodeLevelDpEvent, calibrate_node_sigma, node_steps
from silofl.pandemic.partition import input_directory
from silofl.pandemic.readers import PandemicData, read_dataset
from silofl.privacy.ledger import Ledger
from silofl.privacy.randomness import Randomness


@dataclass
class PandemicConfig:
    """Settings; units: lr per step, clip = L2 bound of a per-example gradient."""

    federated: bool = True      # one silo per region; False = centralized (one silo)
    S: int = 20                 # each person appears in ≤ S examples (own + S−1 others)
    priority: str = "random"    # pruning order: "random" or "duration" (longest contacts kept)
    pooling: str = "summary"    # "summary": recent-infection summaries (`summary_inputs`);
                                # "mean": own features + neighbour blocks averaged over slots;
                                # "concat": every neighbour slot kept (the thesis layout)
    t_window: int = 21          # days of infection history in each example
    rounds: int = 2
    local_epochs: float = 1.0
    batch_size: int = 512
    lr: float = 0.3             # for standardized inputs
    clip: float = 1.0
    lam: float = 0.1            # MR-MTL pull towards the mean model (keep lr · lam ≪ 1)
    standardize: bool = True    # centre/scale each input column per region (uncharged)
    bias_init: float = -5.0     # fixed prior log-odds guess, not computed from labels
    prior_weight: float = 0.1   # starting weight of every summary input (public prior: more
                                # infection around a person means more risk); summary only
    gamma: float = 2.0          # focal loss
    alpha: float = 0.75
    private: bool = True
    epsilon: float = 5.0        # node-level target for every region
    delta: float | None = None  # default 1/n of the region
    seed: int = 0

    def validate(self) -> None:
        if self.rounds < 1 or self.batch_size < 1:
            raise ConfigError("rounds and batch_size must be positive integers")
        if self.clip <= 0 or self.lr < 0 or self.lam < 0 or self.local_epochs <= 0:
            raise ConfigError("need clip > 0, lr ≥ 0, lam ≥ 0 and local_epochs > 0")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"pooling must be one of {', '.join(map(repr, POOLINGS))}, "
                              f"got {self.pooling!r}")
        if self.priority not in ("random", "duration"):
            raise ConfigError(f"priority must be 'random' or 'duration', got "
                              f"{self.priority!r}")
        if not np.isfinite(self.bias_init):
            raise ConfigError(f"bias_init must be a finite number, got {self.bias_init}")
        if not np.isfinite(self.prior_weight):
            raise ConfigError(f"prior_weight must be a finite number, got {self.prior_weight}")
        if self.private and not self.epsilon > 0:
            raise ConfigError(f"epsilon must be positive, got {self.epsilon}")


@dataclass
class Region:
    name: str
    persons: np.ndarray          # indices into the dataset's persons
    features: NeighbourhoodFeatures
    S: int = 0
    steps_per_round: int = 0
    sigma: float | None = None
    ledger: Ledger | None = None
    shift: np.ndarray | None = None  # model-input standardization (None: raw inputs)
    scale: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.persons.size)


@dataclass
class PandemicModel:
    """Trained per-region weights plus what prediction needs to rebuild features."""

    config: PandemicConfig
    regions: list[str]
    weights: np.ndarray          # (K, P)
    privacy: list[dict] = field(default_factory=list)
    timings: dict = field(default_factory=dict)

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / "weights.npy", self.weights)
        (directory / "model.json").write_text(json.dumps(
            {"config": asdict(self.config), "regions": self.regions, "privacy": self.privacy,
             "timings": self.timings}, indent=1, default=float))

    @classmethod
    def load(cls, directory: Path) -> "PandemicModel":
        directory = Path(directory)
        meta_path = directory / "model.json"
        if not meta_path.is_file():
            raise ConfigError(f"{directory} holds no trained pandemic model (model.json is "
                              "missing); run `silofl pandemic train` first")
        meta = json.loads(meta_path.read_text())
        return cls(PandemicConfig(**meta["config"]), meta["regions"],
                   np.load(directory / "weights.npy"), meta.get("privacy", []),
                   meta.get("timings", {}))


def build_regions(data: PandemicData, cfg: PandemicConfig) -> list[Region]:
    """Per-region neighbourhood features on each region's own subgraph."""
    if cfg.federated:
        if np.any(data.region < 0):
            raise ConfigError(f"{int((data.region < 0).sum())} persons have no region (no "
                              "home residence with a county); fix the data or use the "
                              "centralized mode")
        groups = [(f"region-{int(c)}", data.region_members(r))
                  for r, c in enumerate(data.region_codes)]
    else:
        groups = [("all", np.arange(data.num_persons))]
    return [build_region(data, name, persons, cfg) for name, persons in groups]


def build_region(data: PandemicData, name: str, persons: np.ndarray,
                 cfg: PandemicConfig) -> Region:
    """One silo: neighbourhood features of ``persons`` (person indices into ``data``) on
    the subgraph of contacts among them.  Reads features and states, never labels."""
    if persons.size == 0:
        raise ConfigError(f"{name} has no persons; drop it from the data")
    feats = build_neighbourhood_features(**data.feature_inputs(persons), S=cfg.S,
                                         t_window=cfg.t_window, seed=cfg.seed,
                                         priority=cfg.priority)
    return Region(name, persons, feats, S=feats.node_dp_S)


def plan_regions(regions: list[Region], cfg: PandemicConfig) -> None:
    """Steps, calibrated σ and a preflighted ledger per region — before any training."""
    for r in regions:
        if cfg.batch_size > r.n:
            raise ConfigError(f"batch_size {cfg.batch_size} is larger than {r.name} "
                              f"({r.n} persons); use batch_size ≤ {min(x.n for x in regions)}")
        r.steps_per_round = node_steps(r.n, cfg.batch_size, cfg.local_epochs)
        if not cfg.private:
            continue
        delta = cfg.delta if cfg.delta is not None else 1.0 / r.n
        total = r.steps_per_round * cfg.rounds
        r.sigma = calibrate_node_sigma(cfg.epsilon, r.n, r.S, cfg.batch_size, total, delta)
        r.ledger = Ledger(r.name, PrivacyTarget(cfg.epsilon, delta))
        r.ledger.preflight(NodeLevelDpEvent(r.n, r.S, cfg.batch_size, r.sigma, total))


POOLINGS = ("summary", "mean", "concat")

#: Columns of `summary_inputs`.  "infectious" = recorded I on the last history day;
#: "recent" = recorded I on any of the last 7 days; "new" = turned S → I within the last
#: 7 days; hours = the duration of the pair's longest contact (the edge kept by
#: `graph.dedupe_contacts`; not the pair's total time), in hours; home = that contact's
#: location has none of the activity flags (a residence).  Neighbours are the pruned
#: ones (≤ S − 1); tests/pandemic/test_learning.py recounts all of this from raw records.
SUMMARY_FEATURES = (
    "own_susceptible", "occupied_slots", "log_contact_hours",
    "log_n_infectious", "log_n_recent", "log_n_new",
    "log_hours_infectious", "log_hours_recent", "log_hours_new",
    "n_home_infectious", "n_home_recent", "n_home_new",
)
RECENT_DAYS = 7


def summary_inputs(F: NeighbourhoodFeatures, X: np.ndarray) -> np.ndarray:
    """(B, 12) recent-infection summaries of gathered examples X (B, D), columns
    `SUMMARY_FEATURES`: whether the person is still susceptible, how many neighbour slots
    are filled and the total contact time, and — for neighbours infectious now, recently
    or newly infected — their number, the contact hours with them and how many of them
    are household contacts.  Counts are summed over the slots (not averaged: the risk
    grows with the number of infectious contacts) and log1p-compressed.  A deterministic
    function of the example, so the node-level accounting is unchanged."""
    b, tw, dn, de = X.shape[0], F.t_window, F.d_node, F.d_edge
    own_last = X[:, dn + (tw - 1) * N_STATES]                  # own state S on the last day
    blocks = X[:, F.own_dim:].reshape(b, F.num_slots, F.block_dim)
    occupied = 1.0 - blocks[:, :, 0].astype(np.float64)
    edge = blocks[:, :, 1 + dn:1 + dn + de]
    hist = blocks[:, :, 1 + dn + de:].reshape(b, F.num_slots, tw, N_STATES)
    k = min(RECENT_DAYS, tw)
    infectious = hist[:, :, -1, 1].astype(np.float64)
    recent = hist[:, :, -k:, 1].max(axis=2).astype(np.float64)
    if tw > 1:
        k = min(RECENT_DAYS, tw - 1)
        new = (hist[:, :, -k - 1:-1, 0] * hist[:, :, -k:, 1]).max(axis=2).astype(np.float64)
    else:
        new = np.zeros_like(infectious)
    st = F.edge_stats  # undo the log-duration standardization of `_edge_features`
    seconds = np.expm1(edge[:, :, 1].astype(np.float64) * st["dur_std"] + st["dur_mean"])
    hours = occupied * np.maximum(seconds, 0.0) / 3600.0
    flags = edge[:, :, 3:de - 3]  # location activity flags (then lon, lat, unknown)
    home = occupied * ((flags.sum(axis=2) == 0) & (edge[:, :, de - 1] == 0))
    cols = [own_last.astype(np.float64), occupied.mean(axis=1),
            np.log1p(hours.sum(axis=1))]
    cols += [np.log1p(s.sum(axis=1)) for s in (infectious, recent, new)]
    cols += [np.log1p((s * hours).sum(axis=1)) for s in (infectious, recent, new)]
    cols += [(s * home).sum(axis=1) for s in (infectious, recent, new)]
    return np.stack(cols, axis=1).astype(np.float32)


def model_inputs(F: NeighbourhoodFeatures, X: np.ndarray, pooling: str) -> np.ndarray:
    """The model's view of gathered examples (B, D).  "summary": `summary_inputs`.
    "mean" averages the neighbour blocks (features, contact features, infection history,
    empty-slot flag), which a linear model can use far better than S − 1 separately
    weighted slots, with ~10× fewer parameters (so less DP noise).  "concat": the
    example as gathered.  Each example still depends only on the person and its ≤ S − 1
    pruned neighbours, so the node-level accounting is unchanged."""
    if pooling == "concat":
        return X
    if pooling == "summary":
        return summary_inputs(F, X)
    blocks = X[:, F.own_dim:].reshape(X.shape[0], F.num_slots, F.block_dim)
    return np.concatenate([X[:, :F.own_dim], blocks.mean(1)], axis=1)


def input_dim(F: NeighbourhoodFeatures, pooling: str) -> int:
    if pooling == "summary":
        return len(SUMMARY_FEATURES)
    return F.dim if pooling == "concat" else F.own_dim + F.block_dim


_SCALING_SAMPLE = 20_000


def fit_input_scaling(F: NeighbourhoodFeatures, pooling: str, seed: int,
                      max_persons: int = _SCALING_SAMPLE,
                      batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation (1 where a column is constant) of each model-input
    column over the region's examples, at one random training window per person (up to
    ``max_persons`` persons, a seeded sample).  Features only, no labels; like the other
    normalization constants, not charged to the accountant."""
    rng = np.random.default_rng([int(seed), 0x5CA1E])
    n = F.num_nodes
    persons = np.arange(n) if n <= max_persons else np.sort(
        rng.choice(n, size=max_persons, replace=False))
    windows = F.sample_windows(rng, n)
    total = np.zeros(input_dim(F, pooling))
    total_sq = np.zeros_like(total)
    for lo in range(0, persons.size, batch_size):
        p = persons[lo:lo + batch_size]
        Z = model_inputs(F, F.gather(p, windows[p], labels=False)[0], pooling)
        Z = Z.astype(np.float64)
        total += Z.sum(axis=0)
        total_sq += np.einsum("bd,bd->d", Z, Z)
    mean = total / persons.size
    std = np.sqrt(np.maximum(total_sq / persons.size - mean ** 2, 0.0))
    return mean, np.where(std > 1e-6, std, 1.0)


def fold_scaling(w: np.ndarray, shift: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Weights [v, c] acting on (x − shift) / scale → weights acting on raw x."""
    v = w[:-1] / scale
    return np.concatenate([v, [w[-1] - v @ shift]])


def region_streams(seed: int, name: str, round: int) -> tuple[np.random.Generator,
                                                            Randomness]:
    """(batch sampler, noise source) of one region in one round, derived from
    (seed, region name, round) only — so a region trained alone (a federated client)
    draws exactly what it draws inside the in-process `train`."""
    key = [int(seed), zlib.crc32(name.encode()), int(round)]
    return np.random.default_rng([*key, 1]), Randomness.seeded([*key, 7])


def round_event(r: Region, cfg: PandemicConfig) -> NodeLevelDpEvent:
    """The node-level DP charge of one round of ``r``'s local training."""
    return NodeLevelDpEvent(r.n, r.S, cfg.batch_size, r.sigma, r.steps_per_round)


def new_model(F: NeighbourhoodFeatures, cfg: PandemicConfig) -> FocalLoss:
    return FocalLoss(input_dim(F, cfg.pooling), gamma=cfg.gamma, alpha=cfg.alpha)


def initial_weights(model: FocalLoss, cfg: PandemicConfig) -> np.ndarray:
    """(P,) the common starting point of every region and of the mean model: the bias at
    `bias_init` and, with summary inputs, every input weight at `prior_weight` (fixed
    numbers, not computed from any data, so they cost no privacy)."""
    w = np.zeros(model.num_params)
    if cfg.pooling == "summary":
        w[:-1] = cfg.prior_weight
    w[-1] = cfg.bias_init
    return w


def fit_region_scaling(r: Region, cfg: PandemicConfig) -> None:
    """Set ``r.shift``/``r.scale`` (model-input standardization, features only) when
    ``cfg.standardize``."""
    if cfg.standardize:
        r.shift, r.scale = fit_input_scaling(r.features, cfg.pooling, cfg.seed)


def region_round(model: FocalLoss, w: np.ndarray, anchor: np.ndarray, r: Region,
                 cfg: PandemicConfig, round: int) -> np.ndarray:
    """One region's silo-side work in round ``round``: charge the round's DP-SGD steps
    to the region's ledger (BudgetExceeded, and nothing runs, if they do not fit), then
    — only then — read labelled examples for the local MR-MTL pass from ``w`` towards
    ``anchor`` (the mean model).  Both the in-process `train` and the Flower client
    (`silofl.pandemic.silo`) run exactly this.  Returns the new (P,) weights (in the
    standardized input space when ``r.shift`` is set)."""
    if cfg.private:
        r.ledger.charge(round_event(r, cfg), round=round, label="node-dpsgd")
    rng, noise = region_streams(cfg.seed, r.name, round)
    return _local_pass(model, w, anchor, r, cfg, rng, noise, epoch=round)


def server_step(W: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The MR-MTL server step: the mean of the region models (K, P) weighted by region
    size (K,).  Exactly rounded sums (math.fsum), so the result does not depend on the
    order in which the regions' models arrive."""
    W = np.asarray(W, dtype=np.float64)
    sizes = np.asarray(sizes, dtype=np.float64)
    weighted = sizes[:, None] * W
    return np.array([math.fsum(col) for col in weighted.T]) / math.fsum(sizes)


def privacy_entry(r: Region, cfg: PandemicConfig, rounds: int) -> dict:
    """What the model records about one region's privacy after ``rounds`` rounds."""
    entry = {"region": r.name, "n": r.n, "S": r.S, "batch_size": cfg.batch_size,
             "steps": r.steps_per_round * rounds, "noise_multiplier": r.sigma}
    if r.ledger:
        entry.update(target_epsilon=cfg.epsilon, delta=r.ledger.target.delta,
                     epsilon_spent=r.ledger.epsilon("rdp"))
    return entry


def raw_weights(w: np.ndarray, r: Region) -> np.ndarray:
    """(P,) weights acting on the raw model inputs (undoes the region's scaling)."""
    return w if r.shift is None else fold_scaling(w, r.shift, r.scale)


def _local_pass(model: FocalLoss, w: np.ndarray, anchor: np.ndarray, r: Region,
                cfg: PandemicConfig, rng: np.random.Generator, noise: Randomness,
                epoch: int) -> np.ndarray:
    windows = r.features.epoch_windows(cfg.seed, epoch)  # a random window per person per epoch
    b = cfg.batch_size
    for _ in range(r.steps_per_round):
        persons = rng.choice(r.n, size=b, replace=False)
        X, y = r.features.gather(persons, windows[persons].astype(np.int64))
        X = model_inputs(r.features, X, cfg.pooling)
        if r.shift is not None:
            X = ((X - r.shift) / r.scale).astype(np.float32)
        X, y = X[None], y[None].astype(np.float64)
        mask = np.ones((1, b))
        if cfg.private:
            g = model.clipped_grad_sum(w[None], X, y, mask, cfg.clip)[0]
            g = (g + noise.normal(g.shape) * r.sigma * cfg.clip) / b
        else:
            g = model.grad_sum(w[None], X, y, mask)[0] / b
        w = w - cfg.lr * (g + cfg.lam * (w - anchor))
    return w


def train(data: PandemicData, cfg: PandemicConfig,
          on_round: Callable[[int, int], None] | None = None) -> PandemicModel:
    """MR-MTL over regions (or one centralized model) with node-level DP-SGD."""
    cfg.validate()
    t0 = time.perf_counter()
    regions = build_regions(data, cfg)
    t_feat = time.perf_counter() - t0
    plan_regions(regions, cfg)
    t_scale = time.perf_counter()
    for r in regions:
        fit_region_scaling(r, cfg)
    t_scale = time.perf_counter() - t_scale
    model = new_model(regions[0].features, cfg)
    W = np.tile(initial_weights(model, cfg), (len(regions), 1))
    mean = initial_weights(model, cfg)
    sizes = np.array([r.n for r in regions], float)
    t1 = time.perf_counter()
    for t in range(1, cfg.rounds + 1):
        if cfg.private:  # every region can pay for this round, or none is charged
            for r in regions:
                r.ledger.check(round_event(r, cfg), round=t, label="node-dpsgd")
        for k, r in enumerate(regions):
            W[k] = region_round(model, W[k], mean, r, cfg, t)
        mean = server_step(W, sizes)
        if on_round:
            on_round(t, cfg.rounds)
    privacy = [privacy_entry(r, cfg, cfg.rounds) for r in regions]
    W = np.stack([raw_weights(W[k], r) for k, r in enumerate(regions)])
    return PandemicModel(cfg, [r.name for r in regions], W, privacy,
                         {"features_s": t_feat, "scaling_s": t_scale,
                          "train_s": time.perf_counter() - t1})


def predict(data: PandemicData, pm: PandemicModel, batch_size: int = 8192) -> np.ndarray:
    """(P,) risk of becoming infected in the 7 days after the history, for every person."""
    regions = build_regions(data, pm.config)
    if [r.name for r in regions] != pm.regions:
        raise ConfigError(f"the data's regions {[r.name for r in regions]} differ from the "
                          f"model's {pm.regions}; predict on the dataset the model was "
                          "trained for")
    scores = np.zeros(data.num_persons)
    for k, r in enumerate(regions):
        scores[r.persons] = predict_region(r, pm.weights[k], pm.config, batch_size)
    return scores


def predict_region(r: Region, weights: np.ndarray, cfg: PandemicConfig,
                   batch_size: int = 8192) -> np.ndarray:
    """(n,) risk for the region's persons (in ``r.persons`` order) from raw-input
    weights (P,), using the last ``t_window`` observed days."""
    model = new_model(r.features, cfg)
    scores = np.zeros(r.n)
    for persons, X in r.features.iter_prediction_batches(batch_size):
        scores[persons] = model.predict(weights, model_inputs(r.features, X, cfg.pooling))
    return scores


def evaluate(data: PandemicData, scores: np.ndarray) -> dict:
    """The challenge's score (AUPRC over all persons) plus per-region AUPRC, recall among
    the top-k (k = number of positives), the SIR baseline and the positive-rate baseline."""
    if data.target is None:
        raise ConfigError("the dataset has no ground-truth target file; read it with "
                          "with_target=True from a directory holding va_disease_outcome_target")
    y = data.target.astype(np.int64)
    k = max(int(y.sum()), 1)
    sir = sir_baseline_scores(data.states)
    return {"auprc": PM.average_precision(y, scores),
            "auprc_sir_baseline": PM.average_precision(y, sir),
            "positive_rate": PM.positive_rate(y),
            "recall_at_num_positives": PM.recall_at_k(y, scores, k),
            "per_region_auprc": {str(data.region_codes[int(r)]) if r >= 0 else "unknown": v
                                 for r, v in PM.per_region_average_precision(
                                     y, scores, data.region).items()}}


# --- challenge-style centralized entry points -----------------------------------------

def fit(person_data_path, household_data_path, residence_location_data_path,
        activity_location_data_path, activity_location_assignment_data_path,
        population_network_data_path, disease_outcome_data_path, model_dir,
        config: PandemicConfig | None = None) -> None:
    """Mirror of the challenge's centralized `fit`: trains on the seven input files (any
    names and folders; see `partition.input_directory`) and saves the model to
    ``model_dir``.  ``config`` defaults to the centralized recipe."""
    paths = (person_data_path, household_data_path, residence_location_data_path,
             activity_location_data_path, activity_location_assignment_data_path,
             population_network_data_path, disease_outcome_data_path)
    model_dir = Path(model_dir)
    data = read_dataset(input_directory(paths, model_dir / "inputs"))
    cfg = config or PandemicConfig(federated=False)
    train(data, cfg).save(model_dir)


def predict_to_csv(person_data_path, household_data_path, residence_location_data_path,
                   activity_location_data_path, activity_location_assignment_data_path,
                   population_network_data_path, disease_outcome_data_path, model_dir,
                   preds_format_path, preds_dest_path) -> None:
    """Mirror of the challenge's centralized `predict`: writes `pid,score` in the order
    of the format file."""
    paths = (person_data_path, household_data_path, residence_location_data_path,
             activity_location_data_path, activity_location_assignment_data_path,
             population_network_data_path, disease_outcome_data_path)
    model_dir = Path(model_dir)
    data = read_dataset(input_directory(paths, model_dir / "inputs"))
    scores = predict(data, PandemicModel.load(model_dir))
    write_predictions(data.pid_index, scores, preds_format_path, preds_dest_path)


def write_predictions(pid_index, scores: np.ndarray, preds_format_path,
                      preds_dest_path) -> None:
    """Fill the ``score`` column of the challenge's format file (``pid,score``, dummy
    scores) from ``scores`` (P,), indexed like ``pid_index``, keeping the file's row
    order, and write it to ``preds_dest_path``."""
    import pandas as pd
    fmt = pd.read_csv(preds_format_path)
    if "pid" not in fmt.columns:
        raise ConfigError(f"{preds_format_path} has no 'pid' column; the predictions "
                          "format file must have the columns pid,score")
    idx = pid_index.lookup(fmt["pid"].to_numpy())
    if np.any(idx < 0):
        bad = fmt["pid"].to_numpy()[idx < 0]
        raise ConfigError(f"{preds_format_path} lists {bad.size} pids that are not in the "
                          f"data (e.g. {bad[0]}); pass the format file of this dataset")
    fmt["score"] = scores[idx]
    fmt.to_csv(preds_dest_path, index=False)

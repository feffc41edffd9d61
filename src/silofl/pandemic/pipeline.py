"""Train and predict per-region infection-risk models with MR-MTL under node-level DP.

Each region (silo) builds neighbourhood features from its own subgraph (edges that cross
regions are cut), trains a focal-loss logistic regression with DP-SGD on batches of b
persons drawn uniformly *without replacement* (the sampling the node-level accountant
assumes), and pulls its model towards the mean of all regions' models (MR-MTL).  The
centralized mode treats the whole population as one silo.

**One engine.**  This module is a data source, a model and a preset for the core engine,
not a second engine: σ is calibrated by `runtime.plan.plan_job` (``privacy_unit="node"``,
the preprocessing release composed in), rounds run in `runtime.simulator.simulate`, every
local pass in `training.trainer.LocalTrainer` with the node-level unit (fixed-size
batches from `training.sampling.node_streams`, `NodeLevelDpEvent` charges), reading
examples through `engine.GraphSource` (neighbourhood features gathered per batch), the
budget reserved and settled by `runtime.job` (`open_job`/`Job`, as the tabular track).
So any method built on local passes runs on graph data (``method``:
`engine.NODE_METHODS`).  What stays here: regions, features and their constants, what a
run reserves (`planned_charges`, labels `ROUND_LABEL`/`PREPROCESS_LABEL`,
`reserve_regions`; a privately tuned run: `tuned_method`, `tuned_charges`), the model
file, prediction and the challenge's entry points.  Results equal the previous
stand-alone pipeline bit for bit (seeded noise; tests/pandemic/test_engine.py).

**What is guaranteed, and what is assumed** (every model states it, `privacy_entry`):

* *Adjacency* (``adjacency``).  ``"node+edges"`` (default): neighbouring datasets differ
  in one person *including their contacts* (the contact graph is private, the challenge's
  threat model), so up to 2S − 1 examples change.  ``"node"``: one person's attributes
  and states differ on a fixed, public contact graph: up to S examples.  Accounting:
  `node_dp` (Theorem 2.4.4, replacement, sensitivity 2ρC, ρ ~ Hypergeometric(n, S or
  2S − 1, b)).  Assumed, not charged: the degree-bounding pruning is data-dependent (a
  replaced person's edges can change which edges of others are kept,
  `node_dp.PRUNING_ASSUMPTION`), and region sizes n are public (they set σ and b/n).
* *Noise* (``noise``).  ``"secure"`` (default): all DP randomness of a region's round —
  its batch draws and its Gaussian noise, and the noise and sample of a private
  preprocessing release — comes from `Randomness.secure()` (a CSPRNG keyed from OS
  entropy); nothing follows from the seed.  ``"seeded"``: derived from (seed, region,
  round), exactly as before (the Flower run reproduces `train` bit for bit) — whoever
  knows the seed can replay the noise, so every output of a seeded run says
  `runtime.plan.SEEDED_NOTE`.  Seeded in both modes, because the guarantee does not need
  them secret (they are independent of the data and may be public): the training window
  of every person in every epoch, the pruning priorities, the persons and windows over
  which uncharged scaling statistics are taken, and the windows of the private release.
  The model's initialization is a fixed number, not random.
* *Lifetime budget*.  `train` charges a `silofl.privacy.budget.BudgetStore` (default: an
  in-memory scratch store, flagged `SCRATCH_NOTE`): it reserves everything the run will
  spend — private preprocessing and every round — per region before any record is
  read (a run that would take a region past its lifetime target is refused, nothing
  read), every region's `Ledger` may spend only what was reserved, and the store is
  settled to what executed (also on failure).  A second run on the same store composes
  with the first.
* *Preprocessing* (``preprocessing``): every constant computed from data — the
  model-input standardization, the household-size Box-Cox λ and standardization, the age
  and location standardization and the contact (edge) statistics — is ``"declared"``
  (default: fixed public numbers, `features.DECLARED_CONSTANTS` and
  `SUMMARY_DECLARED`, with their sources), ``"private"`` (one node-level Gaussian release
  per region, `private_release`, charged before it reads anything) or ``"uncharged"``
  (fit on the region without any charge: the old behaviour; listed by name as
  uncharged in the model and the CLI).  No statistic crosses regions.  The private
  release costs ``preprocessing_share`` (10%) of ε on its own and is composed with the
  rounds; at node level a person moves up to 2S − 1 summed vectors, so it is noisy for
  small regions (10k outbreak: median lift 20× vs 34× declared; 20k outbreak seed 1:
  3.6× vs 5.8×) and meant for regions of ~10⁵ persons.  In a private run the location
  coordinates keep their declared constants (they describe places, not persons), and
  with "mean"/"concat" pooling the model inputs are left unscaled (declared identity).

The training recipe (defaults of `PandemicConfig`; the reasons, measured on synthetic
outbreaks of 20k persons in 4 regions, positive rate ≈ 0.3%):

* **inputs** (``pooling="summary"``): a dozen "recent infections among my contacts"
  summaries of each example (`summary_inputs`) instead of 150+ mean-pooled columns.
  The label is a new infection, which in these data comes from infectious contacts; the
  mean-pooled one-hot history spreads that signal over 63 tiny columns (one infected
  neighbour moves a column by 1/19), and under node-level DP every extra weight adds
  noise to the scores: with mean pooling even non-private SGD stayed near the
  positive-rate baseline, with the summaries DP at ε = 5 beats it — but an untrained
  equal-weight sum of the summaries does about as well (README, "How much of the
  score is the inputs"; `summary_baseline`).  The summaries are a deterministic function
  of the example (own history, neighbour histories, contact durations/locations,
  empty-slot flags), so the node-level accounting is unchanged.
* **standardization** (``standardize=True``): every input column is centred and scaled
  (by the declared constants `SUMMARY_DECLARED` by default); the gradients then have
  comparable scales across columns and one learning rate fits all of them (``lr=0.3``;
  the old ``lr=10`` on raw mean-pooled inputs diverged along the large columns and
  crawled along the small ones).  The constants are folded into the saved weights, so
  `PandemicModel.weights` act on the raw inputs.  The declared scales do as well as the
  region's own (uncharged) statistics did: median lift over the positive rate over 5
  training seeds 35.5× vs 25.7× (10k outbreak, seed 3), 5.6× vs 5.6× (20k, seed 1),
  12.5× vs 12.4× (20k, seed 2).
* **bias initialization** (``bias_init=-5``): a fixed hyperparameter (a public guess at
  the log-odds of a weekly infection, *not* computed from the labels).  Starting at 0
  puts every example at p = 0.5, where the focal gradients of the 99.7% negatives all
  clip to C and drown the positives; near the prior, negatives have tiny gradients and
  the few positives (clipped to C, fig. 2.9) set the direction.
* **weight prior** (``prior_weight=0.1``): every summary input starts with weight 0.1, the
  public prior that more infection around a person means more risk.  Measured (before
  the current defaults: node adjacency, per-region uncharged standardization) over 4
  training seeds on three synthetic outbreaks (20k/4 regions seeds 1, 2; 10k seed 3),
  the median DP lift over the positive rate went from 1.9×/1.8×/8.7× (start at 0, single
  runs 0.6×–34×) to 5.5×/12.4×/31.6×, about what the untrained equal-weight score gets
  (7.0×/12.6×/26×): at ε = 5 DP-SGD mostly keeps a good prior rather than finding one.
* **MR-MTL**: ``lr · lam ≪ 1`` (``lam=0.1``); with ``lr · lam ≈ 1`` every step snaps a
  region back to the mean and the local progress is lost.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import dp_accounting as dpa
import numpy as np

from silofl.config.base import section_dataclass
from silofl.privacy.targets import PrivacyTarget
from silofl.errors import ConfigError, PrivacyError
from silofl.models.glm import FocalLoss
from silofl.pandemic import metrics as PM
from silofl.pandemic.baseline import sir_baseline_scores
from silofl.pandemic.engine import (
    NODE_METHODS, GraphFederation, GraphSilo, GraphSource, exact_mean, method_of,
    selection_charges, selection_summary,
)
from silofl.pandemic.features import (
    DECLARED_CONSTANTS, DECLARED_SOURCES, N_STATES, PRIVATE_BOUNDS, FeatureConstants,
    NeighbourhoodFeatures, build_neighbourhood_features, build_node_table, check_S,
    check_t_window,
)
from silofl.privacy.node_level import (
    ADJACENCIES, ADJACENCY_TEXT, PRUNING_ASSUMPTION, NodeLevelDpEvent, affected_examples,
    calibrate_node_sigma,
)
from silofl.pandemic.partition import input_directory
from silofl.pandemic.readers import PandemicData, read_dataset
from silofl.privacy.budget import SCRATCH_NOTE, BudgetStore, PlannedCharge
from silofl.privacy.ledger import Ledger
from silofl.privacy.randomness import Randomness
from silofl.runtime.job import Job, open_job
from silofl.runtime.plan import SEEDED_NOTE, SiloPlan, TrainingConfig, plan_job
from silofl.training import sampling as TS
from silofl.training.dpsgd import GradientRule
from silofl.training.trainer import LocalTrainer
from silofl.io import array_digest, write_bytes_atomic, write_json_atomic
from silofl.privacy import accounting, events
from silofl.privacy.store_paths import default_store_path
from silofl.runtime.simulator import simulate
from silofl.tuning import accounting as TA
from silofl.tuning.graph import DEFAULT_LOSS_BOUND, NodeValidation, describe_release, check_setting
from silofl.tuning.private import TunedPersonalization, score_sigma
from silofl.tuning.setup import distribution

NOISE_MODES = ("secure", "seeded")
PREPROCESSING = ("declared", "private", "uncharged")
#: the label of each kind of charge in ledgers and the budget store (the method is
#: ``cfg.method``, MR-MTL by default)
ROUND_LABEL = TS.NODE_LABEL  # "node-dpsgd"
PREPROCESS_LABEL = "preprocess"
#: what every node-level model assumes besides the pruning
SIZES_ASSUMPTION = ("region sizes n are treated as public: they set each region's "
                    "sampling rate b/n, its noise calibration and the averaging weights")
#: the items that preprocessing="uncharged" reads without any charge
UNCHARGED_ITEMS = (
    "age standardization (mean and standard deviation of the region's ages)",
    "household-size Box-Cox λ (maximum likelihood on the region) and standardization",
    "location longitude/latitude standardization (over the listed locations)",
    "contact statistics: mean and standard deviation of log duration and log count over "
    "the region's kept edges",
    "model-input standardization (mean and standard deviation of every input column over "
    "the region's examples)",
)


@section_dataclass("pandemic")
class PandemicConfig:
    """Settings; units: lr per step, clip = L2 bound of a per-example gradient. A checked
    dataclass on the configuration model's rules (`silofl.config.section_dataclass`):
    unknown keys and wrong types are `ConfigError`s; `validate` adds the track's checks."""

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
    standardize: bool = True    # centre/scale each model input (constants: `preprocessing`)
    bias_init: float = -5.0     # fixed prior log-odds guess, not computed from labels
    prior_weight: float = 0.1   # starting weight of every summary input (public prior: more
                                # infection around a person means more risk); summary only
    gamma: float = 2.0          # focal loss
    alpha: float = 0.75
    private: bool = True
    epsilon: float = 5.0        # node-level target for every region
    delta: float | None = None  # default 1/n of the region
    seed: int = 0
    noise: str = "secure"       # "secure": OS-entropy CSPRNG; "seeded": reproducible from
                                # (seed, region, round) — not a privacy guarantee
    adjacency: str = "node+edges"  # "node+edges": a person and their contacts (2S − 1
                                   # examples); "node": fixed public graph (S examples)
    preprocessing: str = "declared"  # data-dependent constants: "declared" (public
                                     # numbers), "private" (charged), "uncharged"
    preprocessing_share: float = 0.1  # "private": the share of epsilon its release costs
    declared: dict | None = None  # overrides of `features.DECLARED_CONSTANTS` by name
                                  # (e.g. another region's lon_mean/lat_mean)
    method: str = "mrmtl"       # the federated algorithm (`engine.NODE_METHODS`); lam is
                                # its λ where it has one (mrmtl, ditto, mocha)
    clusters: int = 2           # the IFCA family: cluster models (≤ regions)
    we_user: str | None = None  # weight_erosion: the user region u_0 (a region name)
    we_update: str = "gradient"  # weight_erosion: one node-level DP-SGD step per round
                                 # ("gradient") or a local pass ("local_sgd")

    def validate(self) -> None:
        check_S(self.S)
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
        if self.noise not in NOISE_MODES:
            raise ConfigError(f"noise must be 'secure' (OS entropy, the default) or 'seeded' "
                              f"(reproducible, not a privacy guarantee), got {self.noise!r}")
        if self.adjacency not in ADJACENCIES:
            raise ConfigError(f"adjacency must be one of {', '.join(map(repr, ADJACENCIES))}, "
                              f"got {self.adjacency!r}")
        if self.preprocessing not in PREPROCESSING:
            raise ConfigError(f"preprocessing must be one of "
                              f"{', '.join(map(repr, PREPROCESSING))}, got "
                              f"{self.preprocessing!r}")
        if self.preprocessing == "private" and not self.private:
            raise ConfigError("preprocessing='private' needs private=True (a non-private "
                              "run has no budget to charge it to); use 'declared'")
        if not 0 < self.preprocessing_share < 1:
            raise ConfigError(f"preprocessing_share must lie in (0, 1), got "
                              f"{self.preprocessing_share}")
        declared_constants(self)  # unknown names or bad values fail here
        if self.method not in NODE_METHODS:
            raise ConfigError(f"method must be one of {', '.join(NODE_METHODS)} (methods "
                              f"with node-level accounting), got {self.method!r}")
        method_of(self)  # the method's own settings (clusters, we_user) fail here

    @property
    def private_preprocessing(self) -> bool:
        return self.private and self.preprocessing == "private"


def declared_constants(cfg: PandemicConfig) -> FeatureConstants:
    """`features.DECLARED_CONSTANTS` with ``cfg.declared``'s overrides."""
    extra = dict(cfg.declared or {})
    known = set(DECLARED_CONSTANTS.to_dict()) - {"source"}
    bad = sorted(set(extra) - known)
    if bad:
        raise ConfigError(f"unknown declared constant(s) {', '.join(bad)}; known: "
                          f"{', '.join(sorted(known))}")
    return DECLARED_CONSTANTS.replace(**{k: float(v) for k, v in extra.items()})


@dataclass
class Region:
    name: str
    persons: np.ndarray          # indices into the dataset's persons
    features: NeighbourhoodFeatures | None = None  # None until built (after the reservation)
    S: int = 0
    steps_per_round: int = 0
    sigma: float | None = None
    ledger: Ledger | None = None
    shift: np.ndarray | None = None  # model-input standardization (None: raw inputs)
    scale: np.ndarray | None = None
    delta: float | None = None
    pre_sigma: float | None = None   # private preprocessing: noise multiplier, batch
    pre_batch: int = 0
    constants: FeatureConstants | None = None

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
    notes: list[str] = field(default_factory=list)
    constants: dict = field(default_factory=dict)  # region → `FeatureConstants` dict used

    def save(self, directory: Path) -> None:
        """weights.npy and model.json, each written atomically (weights first: a
        model.json never points at a missing or truncated weights file)."""
        import io

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.save(buf, self.weights)
        write_bytes_atomic(directory / "weights.npy", buf.getvalue())
        write_json_atomic(directory / "model.json",
                          {"config": asdict(self.config), "regions": self.regions,
                           "notes": self.notes, "privacy": self.privacy,
                           "constants": self.constants, "timings": self.timings}, indent=1)

    @classmethod
    def load(cls, directory: Path) -> "PandemicModel":
        directory = Path(directory)
        meta_path = directory / "model.json"
        if not meta_path.is_file():
            raise ConfigError(f"{directory} holds no trained pandemic model (model.json is "
                              "missing); run `silofl pandemic train` first")
        def damaged(what: str) -> ConfigError:
            return ConfigError(f"{directory} holds a damaged pandemic model ({what}); train "
                               "it again with `silofl pandemic train` or restore it from a "
                               "backup")
        try:
            meta = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise damaged("model.json is not valid JSON") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict) or \
                not isinstance(meta.get("regions"), list):
            raise damaged("model.json lacks its config or regions")
        # models saved before these fields existed were trained this way
        conf = {"noise": "seeded", "adjacency": "node", "preprocessing": "uncharged",
                **meta["config"]}
        try:
            config = PandemicConfig(**conf)
        except ConfigError:
            raise damaged("model.json's config has unknown keys") from None
        try:
            weights = np.load(directory / "weights.npy", allow_pickle=False)
        except (OSError, ValueError, EOFError):
            raise damaged("weights.npy is missing or unreadable") from None
        if weights.ndim != 2 or weights.shape[0] != len(meta["regions"]) or \
                not np.all(np.isfinite(weights)):
            raise damaged("weights.npy does not match model.json's regions or is not finite")
        return cls(config, meta["regions"], weights, meta.get("privacy", []),
                   meta.get("timings", {}), meta.get("notes", []),
                   meta.get("constants", {}))


# --- regions ---------------------------------------------------------------------------

def region_groups(data: PandemicData, cfg: PandemicConfig) -> list[Region]:
    """The silos and their persons, nothing else: region membership and sizes (public)."""
    if cfg.federated:
        if np.any(data.region < 0):
            raise ConfigError(f"{int((data.region < 0).sum())} persons have no region (no "
                              "home residence with a county); fix the data or use the "
                              "centralized mode")
        groups = [(f"region-{int(c)}", data.region_members(r))
                  for r, c in enumerate(data.region_codes)]
    else:
        groups = [("all", np.arange(data.num_persons))]
    out = []
    for name, persons in groups:
        if persons.size == 0:
            raise ConfigError(f"{name} has no persons; drop it from the data")
        out.append(Region(name, persons, S=cfg.S))
    return out


def build_regions(data: PandemicData, cfg: PandemicConfig,
                  constants: dict | None = None) -> list[Region]:
    """Per-region neighbourhood features on each region's own subgraph.  ``constants``
    (region → `FeatureConstants` or its dict) overrides the config's source; a
    private source needs them (a release is made, and charged, only by `train`)."""
    regions = region_groups(data, cfg)
    for r in regions:
        c = (constants or {}).get(r.name)
        build_features(data, r, cfg, None if c is None else _as_constants(c))
    return regions


def _as_constants(c) -> FeatureConstants:
    return c if isinstance(c, FeatureConstants) else FeatureConstants(**c)


def build_region(data: PandemicData, name: str, persons: np.ndarray,
                 cfg: PandemicConfig) -> Region:
    """One silo with its features built (declared or uncharged constants)."""
    if persons.size == 0:
        raise ConfigError(f"{name} has no persons; drop it from the data")
    r = Region(name, persons, S=cfg.S)
    build_features(data, r, cfg)
    return r


def build_features(data: PandemicData, r: Region, cfg: PandemicConfig,
                   constants: FeatureConstants | None = None) -> None:
    """Neighbourhood features of ``r.persons`` on the subgraph of contacts among them,
    normalized with ``constants`` or, when None, by ``cfg.preprocessing``: "declared",
    "uncharged" (fit on the region, not charged) or "private" (charges ``r.ledger``, then
    releases them with `private_release`; needs `plan_regions` and a ledger).  Reads
    features and states, never labels."""
    inputs = data.feature_inputs(r.persons)
    private = constants is None and cfg.preprocessing == "private"
    if constants is None:
        constants = "uncharged" if cfg.preprocessing == "uncharged" else declared_constants(cfg)
    r.features = build_neighbourhood_features(**inputs, S=cfg.S, t_window=cfg.t_window,
                                              seed=cfg.seed, priority=cfg.priority,
                                              constants=constants)
    if r.features.node_dp_S != r.S:  # the plan's S must be what the features give
        raise PrivacyError(f"{r.name}: the features bound appearances by S = "
                           f"{r.features.node_dp_S}, the plan by {r.S}")
    if private:
        private_release(r, cfg, inputs)
    r.constants = FeatureConstants(**r.features.fitted["constants"])


# --- planning ----------------------------------------------------------------------------

#: persons a private release sums over at most (a secret uniform sample above that)
PRIVATE_SAMPLE = 50_000


def training_config(cfg: PandemicConfig) -> TrainingConfig:
    """The core engine's settings for ``cfg``: node-level privacy unit (S, adjacency),
    batches of exactly ``batch_size`` persons, RDP accounting (node-level events bring
    their own RDP curve), evaluation only at the end (the pipeline evaluates itself)."""
    return TrainingConfig(rounds=cfg.rounds, local_epochs=cfg.local_epochs,
                          batch_size=cfg.batch_size, lr=cfg.lr, clip=cfg.clip,
                          private=cfg.private, accountant="rdp", noise=cfg.noise,
                          seed=cfg.seed, eval_every=cfg.rounds, privacy_unit="node",
                          node_S=cfg.S, adjacency=cfg.adjacency)


def graph_federation(regions: list[Region], cfg: PandemicConfig) -> GraphFederation:
    """The public facts of the regions (names, sizes, node-level targets) for the planner."""
    return GraphFederation([GraphSilo(r.name, r.n, PrivacyTarget(cfg.epsilon, r.delta)
                                      if cfg.private else None) for r in regions])


def plan_regions(regions: list[Region], cfg: PandemicConfig, algorithm=None) -> list:
    """Steps, calibrated σ (and the private preprocessing's σ) per region — from public
    facts only (n, S, the config), before any record is read — by the core planner
    (`runtime.plan.plan_job`, node-level unit, the preprocessing release composed in).
    Regions get a ledger checked against their target (`reserve_regions` replaces it by
    the job's, limited to what the budget store reserved). Returns the planner's
    `SiloPlan`s.  ``algorithm``: what runs instead of ``cfg.method`` (private tuning:
    `tuned_method`)."""
    for r in regions:
        if cfg.batch_size > r.n:
            raise ConfigError(f"batch_size {cfg.batch_size} is larger than {r.name} "
                              f"({r.n} persons); use batch_size ≤ {min(x.n for x in regions)}")
        if cfg.private:
            r.delta = cfg.delta if cfg.delta is not None else 1.0 / r.n
            if cfg.private_preprocessing:
                r.pre_batch = min(r.n, PRIVATE_SAMPLE)
                r.pre_sigma = calibrate_node_sigma(
                    cfg.epsilon * cfg.preprocessing_share, r.n, r.S, r.pre_batch, 1,
                    r.delta, adjacency=cfg.adjacency)
    extra = {r.name: preprocess_event(r, cfg) for r in regions} \
        if cfg.private_preprocessing else None
    plans = plan_job(graph_federation(regions, cfg), [algorithm or method_of(cfg)],
                     training_config(cfg), extra)[0]
    for r, p in zip(regions, plans):
        r.steps_per_round = p.steps_per_pass
        if cfg.private:
            r.sigma = p.noise_multiplier
            r.ledger = Ledger(r.name, PrivacyTarget(cfg.epsilon, r.delta))
            r.ledger.preflight(charged_event(
                planned_charges(r, cfg) if algorithm is None else
                tuned_charges(r, cfg, algorithm)))
    return plans


def passes_per_round(cfg: PandemicConfig) -> int:
    """Local passes per round of ``cfg.method`` (Ditto: 2)."""
    return method_of(cfg).passes_per_round


def round_event(r: Region, cfg: PandemicConfig) -> NodeLevelDpEvent:
    """The node-level DP charge of one round of ``r``'s local training."""
    return NodeLevelDpEvent(r.n, r.S, cfg.batch_size, r.sigma, r.steps_per_round,
                            cfg.adjacency)


def preprocess_event(r: Region, cfg: PandemicConfig) -> NodeLevelDpEvent:
    """The charge of ``r``'s private preprocessing release: one "step" of the node-level
    mechanism (a Gaussian sum over ``pre_batch`` examples, see `private_release`)."""
    return NodeLevelDpEvent(r.n, r.S, r.pre_batch, r.pre_sigma, 1, cfg.adjacency)


def planned_charges(r: Region, cfg: PandemicConfig, rounds: list[int] | None = None,
                    preprocess: bool | None = None) -> list[PlannedCharge]:
    """What ``r`` will spend: the private preprocessing (if any) and ``rounds`` (default:
    every round), as budget-store charges."""
    rounds = list(range(1, cfg.rounds + 1)) if rounds is None else rounds
    preprocess = cfg.private_preprocessing if preprocess is None else preprocess
    out = []
    if preprocess:
        out.append(PlannedCharge(r.name, cfg.method, PREPROCESS_LABEL,
                                 preprocess_event(r, cfg)))
    if rounds:
        out.append(PlannedCharge(r.name, cfg.method, ROUND_LABEL, round_event(r, cfg),
                                 len(rounds) * passes_per_round(cfg)))
    if cfg.private:  # the IFCA family's private cluster selections (label "select")
        out += selection_charges(method_of(cfg), r.name, cfg.method, cfg.epsilon, rounds,
                                 cfg.rounds)
    return out


# --- private tuning (silofl.tuning on graph data; README "Private tuning on graph data") ---

#: ledger labels of a tuned run: the pivot's passes, the RepeatAndSelect release
PIVOT_LABEL, TUNING_LABEL = "dpsgd-pivot", "tuning"


def tuned_method(regions: list[Region], cfg: PandemicConfig, tc):
    """``cfg.method`` (MR-MTL or Ditto) privately tuned per region (`TuningConfig` ``tc``,
    checked by `tuning.graph.check_setting`): `TunedPersonalization` with one node-level
    `NodeValidation` score per region (read only after its charge)."""
    val = [NodeValidation(r, (lambda X, r=r: region_inputs(r, cfg, X)),
                          affected=affected_examples(r.n, r.S, cfg.adjacency),
                          loss_bound=DEFAULT_LOSS_BOUND, seed=cfg.seed) for r in regions]
    return TunedPersonalization(list(tc.lam), distribution(tc), val,
                                lrs=list(tc.lr) or None, pivot=cfg.method,
                                pivot_lam=tc.pivot_lam, score_ratio=tc.score_ratio,
                                loss_bound=DEFAULT_LOSS_BOUND)


def tuned_charges(r: Region, cfg: PandemicConfig, alg) -> list[PlannedCharge]:
    """What a tuned run of ``r`` spends: the private preprocessing (if any), the pivot's
    passes (every round) and one RepeatAndSelect of a trial — the very events
    `TunedPersonalization` charges, so the job's ledgers allow exactly them."""
    ev = round_event(r, cfg)
    out = planned_charges(r, cfg, rounds=[])
    out.append(PlannedCharge(r.name, cfg.method, PIVOT_LABEL, ev, cfg.rounds))
    out.append(PlannedCharge(r.name, cfg.method, TUNING_LABEL, TA.select_event(
        ev, cfg.rounds, alg.dist, score_sigma(ev, cfg.rounds, alg.score_ratio))))
    return out


def tuning_entry(r: Region, k: int, cfg: PandemicConfig, alg) -> dict:
    """Region k's tuning record: the distribution of h (h_k itself stays secret), the
    grid, the score (window, persons, Δ, noise), the ε of the RepeatAndSelect charge alone
    and the released setting."""
    out = describe_release(alg, k)
    sig = score_sigma(round_event(r, cfg), cfg.rounds, alg.score_ratio)
    out["validation"].update(noise_multiplier=sig,
                             noise_std=sig * alg.validation[k].sensitivity())
    out["trial_steps"] = r.steps_per_round * cfg.rounds
    sel = [e for e in (r.ledger.entries if r.ledger else []) if e.label == TUNING_LABEL]
    if sel:
        out["charged_epsilon"] = accounting.epsilon(sel[0].event, r.delta, "rdp")
        out["event"] = events.to_dict(sel[0].event)
    return out


def charged_event(charges: list[PlannedCharge]) -> dpa.DpEvent:
    """``charges`` (each its event × count) as one composed dp_accounting event."""
    return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(c.event, c.count) for c in charges])


def region_fingerprint(data: PandemicData, r: Region) -> str:
    """A short hash of the region's persons and states, recorded with its charges so a
    change of the data shows in the (silo-internal) budget store."""
    return array_digest(data.pids[r.persons], data.states[r.persons])


def reserve_regions(store: BudgetStore, regions: list[Region], cfg: PandemicConfig,
                    plans: list[SiloPlan], *, command: str,
                    charges: dict[str, list[PlannedCharge]] | None = None,
                    fingerprints: dict[str, str] | None = None) -> Job:
    """`runtime.job.open_job` for the regions: register each region's lifetime target
    (``cfg``'s, unless the store already holds one) and reserve ``charges`` (default: the
    whole run, `planned_charges`: labels "preprocess"/"node-dpsgd", which must cover the
    ``plans``' declared rounds) in one transaction — BudgetExceeded, nothing reserved, if
    any region's lifetime budget cannot pay.  Each region then gets the job's ledger
    (``r.ledger``), which may spend only what was reserved; `simulate` is handed the same
    ledgers through the job."""
    charges = charges if charges is not None else {r.name: planned_charges(r, cfg)
                                                   for r in regions}
    job = open_job(store, {cfg.method: plans},
                   lifetime={r.name: PrivacyTarget(cfg.epsilon, r.delta) for r in regions},
                   command=command, noise=cfg.noise, accountant="rdp",
                   fingerprints=fingerprints,
                   reserve={cfg.method: [c for r in regions for c in charges[r.name]]})
    for r, led in zip(regions, job.ledgers(cfg.method)):
        r.ledger = led
    return job


def node_unit(names, cfg: PandemicConfig) -> TS.NodeUnit:
    return TS.NodeUnit(cfg.S, cfg.adjacency, tuple(names), cfg.seed)


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


#: Declared (centre, scale) of every `SUMMARY_FEATURES` column (preprocessing="declared"):
#: public numbers, rounded from the per-region statistics of three outbreaks of the public
#: generator (`synth`: 4k seed 7, 10k seed 3, 20k seed 1 — the first two are the test
#: outbreaks, so test figures may flatter them), never from a real silo's data.  Their
#: reasoning: almost everyone is still
#: susceptible; a fraction of occupied slots lies in [0, 1]; about e^3.5 ≈ 30 contact
#: hours per person; infection around a person is rare, so the infection columns are
#: near 0 with small spreads (the scale of a rare event), which gives them the weight
#: they need in the equal-weight prior.  On real data they are a public guess.
SUMMARY_DECLARED: dict[str, tuple[float, float]] = {
    "own_susceptible": (1.0, 0.1), "occupied_slots": (0.5, 0.3),
    "log_contact_hours": (3.5, 1.0),
    "log_n_infectious": (0.0, 0.1), "log_n_recent": (0.0, 0.1), "log_n_new": (0.0, 0.1),
    "log_hours_infectious": (0.0, 0.2), "log_hours_recent": (0.0, 0.2),
    "log_hours_new": (0.0, 0.2),
    "n_home_infectious": (0.0, 0.05), "n_home_recent": (0.0, 0.05), "n_home_new": (0.0, 0.05),
}
SUMMARY_DECLARED_SOURCE = (
    "centre/scale per summary column rounded from synthetic outbreaks of the public "
    "generator (silofl pandemic synth), not from the data trained on: own_susceptible "
    "1/0.1, occupied_slots 0.5/0.3, log_contact_hours 3.5/1, infection counts 0/0.1, "
    "infection hours 0/0.2, household infections 0/0.05")

#: Clipping bounds (lo, hi) of the summary columns in a private release (declared; values
#: outside are clipped for the statistic only, never in the model's inputs)
SUMMARY_BOUNDS: dict[str, tuple[float, float]] = {
    "own_susceptible": (0.0, 1.0), "occupied_slots": (0.0, 1.0),
    "log_contact_hours": (0.0, 6.0),
    "log_n_infectious": (0.0, math.log(6.0)), "log_n_recent": (0.0, math.log(6.0)),
    "log_n_new": (0.0, math.log(6.0)),
    "log_hours_infectious": (0.0, 3.0), "log_hours_recent": (0.0, 3.0),
    "log_hours_new": (0.0, 3.0),
    "n_home_infectious": (0.0, 3.0), "n_home_recent": (0.0, 3.0), "n_home_new": (0.0, 3.0),
}
#: a private standard deviation is at least this share of its half-range: noise can
#: never blow an input column up by more than 1/this
MIN_PRIVATE_STD = 0.02


def declared_input_scaling(F: NeighbourhoodFeatures,
                           pooling: str) -> tuple[np.ndarray, np.ndarray]:
    """(shift, scale) of the model inputs from declared constants: `SUMMARY_DECLARED`
    for summary inputs; for "mean"/"concat" the identity (their columns are already
    normalized by the feature constants, or one-hot)."""
    if pooling == "summary":
        c = np.array([SUMMARY_DECLARED[k] for k in SUMMARY_FEATURES], dtype=np.float64)
        return c[:, 0].copy(), c[:, 1].copy()
    d = input_dim(F, pooling)
    return np.zeros(d), np.ones(d)


_SCALING_SAMPLE = 20_000


def fit_input_scaling(F: NeighbourhoodFeatures, pooling: str, seed: int,
                      max_persons: int = _SCALING_SAMPLE,
                      batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation (1 where a column is constant) of each model-input
    column over the region's examples, at one random training window per person (up to
    ``max_persons`` persons, a seeded sample).  Features only, no labels — and **not
    charged** to any accountant: preprocessing="uncharged" only, listed as such."""
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


# --- private preprocessing -----------------------------------------------------------------

def _unit(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """x clipped to [lo, hi] and mapped linearly onto [−1, 1]."""
    c, h = (lo + hi) / 2.0, (hi - lo) / 2.0
    return (np.clip(x, lo, hi) - c) / h


def _decode(s_u: float, s_q: float, count: float, lo: float, hi: float) -> tuple[float, float]:
    """(mean, std) in raw units from noisy Σu and Σu² over ``count`` values (u ∈ [−1, 1]);
    clamped: mean into the bounds, variance into [MIN_PRIVATE_STD², 1] half-ranges²."""
    c, h = (lo + hi) / 2.0, (hi - lo) / 2.0
    count = max(count, 1.0)
    m = float(np.clip(s_u / count, -1.0, 1.0))
    q = float(np.clip(s_q / count, m * m, 1.0))
    sd = math.sqrt(min(max(q - m * m, MIN_PRIVATE_STD ** 2), 1.0))
    return c + h * m, h * sd


def release_vectors(F: NeighbourhoodFeatures, persons: np.ndarray, *, age: np.ndarray,
                    household_size: np.ndarray, windows: np.ndarray, pooling: str,
                    standardize: bool, batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """(B, d) per-person vectors of a private release and (d,) the width of each
    coordinate's range.  Every vector is a function of the person's own example only
    (their attributes, their ≤ S − 1 kept edges, their summary inputs at a seeded window):

    * age, log household size: (u, u²), u ∈ [−1, 1] from `features.PRIVATE_BOUNDS`;
    * kept edges e of the person (k1 = S − 1 slots): (deg/k1, Σu_dur/k1, Σu_dur²/k1,
      Σu_cnt/k1, Σu_cnt²/k1) with u of log1p(seconds) and log1p(contacts);
    * with summary inputs and ``standardize``: (u_j, u_j²) per column (`SUMMARY_BOUNDS`).

    A coordinate ranges over an interval of width 2 (u, Σu/k1) or 1 (u², deg/k1), so
    replacing the example moves the vector by at most ‖widths‖₂ = 2C."""
    cols, widths = [], []

    def pair(x, lo, hi):
        u = _unit(np.asarray(x, dtype=np.float64), lo, hi)
        cols.extend([u, u * u])
        widths.extend([2.0, 1.0])

    pair(age[persons], *PRIVATE_BOUNDS["age"])
    pair(np.log(np.maximum(household_size[persons].astype(np.float64), 1.0)),
         *PRIVATE_BOUNDS["household"])
    idx, k1 = F.index, max(F.k1, 1)
    owner = np.repeat(np.arange(idx.num_nodes), idx.degree)
    deg = idx.degree.astype(np.float64)
    cols.append(deg[persons] / k1)
    widths.append(1.0)
    for key, raw in (("dur", idx.duration), ("cnt", idx.n_contacts)):
        u = _unit(np.log1p(raw.astype(np.float64)), *PRIVATE_BOUNDS[key])
        cols.append(np.bincount(owner, u, idx.num_nodes)[persons] / k1)
        cols.append(np.bincount(owner, u * u, idx.num_nodes)[persons] / k1)
        widths.extend([2.0, 1.0])
    if pooling == "summary" and standardize:
        Z = np.empty((persons.size, len(SUMMARY_FEATURES)))
        for lo in range(0, persons.size, batch_size):
            p = persons[lo:lo + batch_size]
            Z[lo:lo + p.size] = summary_inputs(F, F.gather(p, windows[p], labels=False)[0])
        for j, k in enumerate(SUMMARY_FEATURES):
            pair(Z[:, j], *SUMMARY_BOUNDS[k])
    return np.stack(cols, axis=1), np.asarray(widths)


def private_release(r: Region, cfg: PandemicConfig, inputs: dict) -> None:
    """``r``'s private preprocessing: charge `preprocess_event` to ``r.ledger`` (refused,
    nothing read, if the run did not reserve it), then release the Gaussian sum of
    `release_vectors` over ``r.pre_batch`` persons (all, or a uniform sample drawn from
    the round-0 DP randomness) with noise N(0, σ²C²) per coordinate, C = ½‖widths‖.
    Replacing one person changes ≤ `node_dp.affected_examples` vectors, each by ≤ 2C:
    one step of the node-level mechanism.  Post-processing sets the feature constants
    (age, household, contact statistics; location stays declared: it describes places,
    not persons) and, with summary inputs, the model-input standardization."""
    if r.ledger is None or r.pre_sigma is None:
        raise PrivacyError(f"{r.name}: private preprocessing needs a planned and reserved "
                           "budget (use pipeline.train)")
    r.ledger.charge(preprocess_event(r, cfg), round=0, label=PREPROCESS_LABEL)
    F = r.features
    # round 0 of the core trainer's node-level streams (secure: fresh OS entropy)
    sampler, noise = TS.node_streams(node_unit([r.name], cfg), 0, 0, r.n,
                                     cfg.noise == "secure")
    persons = np.arange(r.n) if r.pre_batch >= r.n else np.sort(sampler.draw(r.pre_batch))
    windows = F.sample_windows(np.random.default_rng([int(cfg.seed), 0x5CA1E]), r.n)
    V, widths = release_vectors(F, persons, age=inputs["age"],
                                household_size=inputs["household_size"], windows=windows,
                                pooling=cfg.pooling, standardize=cfg.standardize)
    C = 0.5 * float(np.linalg.norm(widths))
    sums = V.sum(axis=0) + noise.normal(V.shape[1]) * r.pre_sigma * C
    b = float(persons.size)
    am, asd = _decode(sums[0], sums[1], b, *PRIVATE_BOUNDS["age"])
    hm, hsd = _decode(sums[2], sums[3], b, *PRIVATE_BOUNDS["household"])
    edges = sums[4] * max(F.k1, 1)  # noisy number of kept edge entries
    base = declared_constants(cfg)
    if F.k1 > 0:
        dm, dsd = _decode(sums[5] * F.k1, sums[6] * F.k1, edges, *PRIVATE_BOUNDS["dur"])
        cm, csd = _decode(sums[7] * F.k1, sums[8] * F.k1, edges, *PRIVATE_BOUNDS["cnt"])
    else:  # no edges at all (S = 1): nothing to normalize
        dm, dsd, cm, csd = base.dur_mean, base.dur_std, base.cnt_mean, base.cnt_std
    consts = base.replace(age_mean=am, age_std=asd, household_lambda=0.0, household_mean=hm,
                          household_std=hsd, dur_mean=dm, dur_std=dsd, cnt_mean=cm,
                          cnt_std=csd, source="private")
    set_constants(F, consts, inputs)
    if cfg.pooling == "summary" and cfg.standardize:
        stats_ = [_decode(sums[9 + 2 * j], sums[10 + 2 * j], b, *SUMMARY_BOUNDS[k])
                  for j, k in enumerate(SUMMARY_FEATURES)]
        r.shift = np.array([m for m, _ in stats_])
        r.scale = np.array([sd for _, sd in stats_])


def set_constants(F: NeighbourhoodFeatures, constants: FeatureConstants, inputs: dict) -> None:
    """Re-normalize ``F``'s node table and contact features with ``constants``."""
    table, names, fitted = build_node_table(
        age=inputs["age"], sex=inputs["sex"], household_size=inputs["household_size"],
        activities=inputs["activities"], frac_out_of_home=inputs["frac_out_of_home"],
        activity_names=inputs.get("activity_names"), constants=constants)
    if names != F.node_names:
        raise PrivacyError("re-normalizing changed the node table's columns")
    F.node_table = table
    F.edge_stats = constants.edge_stats()
    F.fitted = {**fitted, "constants": constants.to_dict()}
    # locations keep the constants they were built with (declared in every private run)


def fold_scaling(w: np.ndarray, shift: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Weights [v, c] acting on (x − shift) / scale → weights acting on raw x."""
    v = w[:-1] / scale
    return np.concatenate([v, [w[-1] - v @ shift]])


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
    """Set ``r.shift``/``r.scale`` (model-input standardization) when ``cfg.standardize``:
    declared constants, the region's own statistics (uncharged), or — private — what
    `private_release` already set."""
    if not cfg.standardize:
        r.shift = r.scale = None
    elif cfg.preprocessing == "uncharged":
        r.shift, r.scale = fit_input_scaling(r.features, cfg.pooling, cfg.seed)
    elif cfg.preprocessing == "private" and r.shift is not None:
        pass  # released privately with the feature constants
    else:  # declared (and private with mean/concat pooling: identity, declared)
        r.shift, r.scale = declared_input_scaling(r.features, cfg.pooling)


def region_inputs(r: Region, cfg: PandemicConfig, X: np.ndarray) -> np.ndarray:
    """Gathered examples (B, D) of ``r`` → the model's inputs (B, P − 1) float32:
    `model_inputs`, then the region's standardization (if any)."""
    X = model_inputs(r.features, X, cfg.pooling)
    if r.shift is not None:
        X = ((X - r.shift) / r.scale).astype(np.float32)
    return X


def region_source(regions: list[Region], cfg: PandemicConfig) -> GraphSource:
    """The core trainer's data source over the regions' features."""
    return GraphSource(regions, lambda k, X: region_inputs(regions[k], cfg, X), cfg.seed)


def region_trainer(model: FocalLoss, regions: list[Region],
                   cfg: PandemicConfig) -> LocalTrainer:
    """The core `LocalTrainer` hosting ``regions`` under the node-level unit, charging
    each region's ledger (label `ROUND_LABEL`) before its pass reads anything."""
    private = cfg.private
    secure = private and cfg.noise == "secure"
    return LocalTrainer(
        model=model, data=region_source(regions, cfg),
        rule=GradientRule(cfg.clip, np.array([r.sigma for r in regions]) if private else None),
        batch_size=cfg.batch_size,
        steps_per_round=np.array([r.steps_per_round for r in regions]),
        lr=cfg.lr, l2=0.0, rng=Randomness.os_entropy() if secure else Randomness.seeded(cfg.seed),
        ledgers=[r.ledger for r in regions] if private else None,
        node=node_unit([r.name for r in regions], cfg), label=ROUND_LABEL)


def server_step(W: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The MR-MTL server step: the mean of the region models (K, P) weighted by region
    size (K,) (`engine.exact_mean`: exactly rounded, independent of arrival order)."""
    return exact_mean(W, sizes)


def uncharged_items(cfg: PandemicConfig) -> list[str]:
    """The data-dependent constants this config reads without any charge (by name)."""
    if cfg.preprocessing != "uncharged":
        return []
    return list(UNCHARGED_ITEMS if cfg.standardize else UNCHARGED_ITEMS[:-1])


def run_notes(cfg: PandemicConfig, scratch: bool) -> list[str]:
    """What every reader of this run's outputs must be told."""
    if not cfg.private:
        return ["NON-PRIVATE run: no differential privacy; no budget was charged"] + [
            f"uncharged: {u}" for u in uncharged_items(cfg)]
    out = []
    if cfg.noise == "seeded":
        out.append(SEEDED_NOTE)
    if scratch:
        out.append(SCRATCH_NOTE)
    out += [f"uncharged: {u}" for u in uncharged_items(cfg)]
    return out


def preprocessing_entry(r: Region, cfg: PandemicConfig) -> dict:
    """How ``r``'s data-dependent constants were obtained."""
    out = {"mode": cfg.preprocessing,
           "items": {"feature constants": (r.constants.source if r.constants else
                                           cfg.preprocessing),
                     "model-input standardization": (
                         "none" if not cfg.standardize else
                         "identity (declared)" if cfg.pooling != "summary"
                         and cfg.preprocessing != "uncharged" else cfg.preprocessing),
                     "location standardization": (
                         "uncharged" if cfg.preprocessing == "uncharged" else "declared")},
           "uncharged": uncharged_items(cfg)}
    if cfg.preprocessing != "uncharged":  # where the declared numbers come from
        out["declared_sources"] = {**DECLARED_SOURCES,
                                   "model inputs": SUMMARY_DECLARED_SOURCE}
        if cfg.declared:
            out["declared_overrides"] = dict(cfg.declared)
    if cfg.private_preprocessing and r.pre_sigma is not None:
        ev = preprocess_event(r, cfg)
        out.update(noise_multiplier=r.pre_sigma, batch=r.pre_batch,
                   epsilon_alone=ev.epsilon(r.delta), event=ev.to_dict())
    return out


def privacy_entry(r: Region, cfg: PandemicConfig, rounds: int,
                  store: BudgetStore | None = None, run_id: str | None = None) -> dict:
    """What the model records about one region's privacy after ``rounds`` rounds: the
    guarantee, its adjacency and assumptions, the noise mode, the preprocessing, and —
    with a ``store`` — the region's lifetime position."""
    entry = {"region": r.name, "method": cfg.method, "n": r.n, "S": r.S,
             "batch_size": cfg.batch_size,
             "steps": r.steps_per_round * rounds * passes_per_round(cfg),
             "noise_multiplier": r.sigma, "private": cfg.private, "noise": cfg.noise}
    if cfg.private:
        entry.update(adjacency=cfg.adjacency, adjacency_text=ADJACENCY_TEXT[cfg.adjacency],
                     affected_examples=affected_examples(r.n, r.S, cfg.adjacency),
                     assumptions=[PRUNING_ASSUMPTION, SIZES_ASSUMPTION],
                     preprocessing=preprocessing_entry(r, cfg),
                     notes=run_notes(cfg, store is None or store.scratch))
        sel = selection_summary(method_of(cfg), r.n, r.S, cfg.adjacency, cfg.epsilon, rounds)
        if sel:  # the IFCA family's cluster selections (in epsilon_spent)
            entry["selections"] = sel
    if r.ledger:
        entry.update(target_epsilon=cfg.epsilon, delta=r.ledger.target.delta,
                     epsilon_spent=r.ledger.epsilon("rdp"), accountant="rdp")
    if store is not None:
        life = store.spent(r.name)
        entry.update(budget_store=None if store.path is None else str(store.path),
                     run_id=run_id, lifetime_target_epsilon=life["target_epsilon"],
                     lifetime_delta=life["delta"], lifetime_epsilon_spent=life["epsilon"])
    return entry


def raw_weights(w: np.ndarray, r: Region) -> np.ndarray:
    """(P,) weights acting on the raw model inputs (undoes the region's scaling)."""
    return w if r.shift is None else fold_scaling(w, r.shift, r.scale)


def train(data: PandemicData, cfg: PandemicConfig,
          on_round: Callable[[int, int], None] | None = None, *,
          store: BudgetStore | None = None,
          command: str = "silofl.pandemic.train", tuning=None) -> PandemicModel:
    """MR-MTL over regions (or one centralized model) with node-level DP-SGD.

    Private runs charge ``store`` (None: an in-memory scratch store, flagged in the
    model): everything the run will spend is reserved per region before any record is
    read (BudgetExceeded, nothing read, if a region's lifetime budget cannot pay), the
    ledgers spend only that, and the store is settled to what executed — also when the
    run fails.

    ``tuning`` (a `silofl.config.TuningConfig` with mode "private"): ``cfg.method``
    (mrmtl or ditto) tuned privately per region (`tuned_method`; README "Private tuning
    on graph data"), the whole RepeatAndSelect release reserved and charged; the pivot's
    public λ̄ is ``tuning.pivot_lam`` (the CLI passes ``--lam``), and
    ``validation_fraction`` does not apply (the score reads every person's example at a
    public window, `tuning.graph.NodeValidation`)."""
    cfg.validate()
    t0 = time.perf_counter()
    tc = tuning if tuning is not None and tuning.mode != "none" else None
    if tc is not None:
        check_setting(tc, cfg)  # fail before anything is reserved
    check_t_window(cfg.t_window, data.num_days)  # fail before anything is reserved
    regions = region_groups(data, cfg)  # membership and sizes only (public)
    alg = tuned_method(regions, cfg, tc) if tc is not None else None
    plans = plan_regions(regions, cfg, alg)
    job = None
    if cfg.private:
        store = store if store is not None else BudgetStore(None)
        fps = {r.name: region_fingerprint(data, r) for r in regions}
        charges = None if alg is None else {r.name: tuned_charges(r, cfg, alg)
                                            for r in regions}
        job = reserve_regions(store, regions, cfg, plans, command=command, fingerprints=fps,
                              charges=charges)
    try:
        pm = _train_reserved(data, cfg, regions, on_round, t0, plans, job, alg)
        if job is not None:
            job.settle()
    except BaseException:
        if job is not None:
            job.settle("failed")
        raise
    scratch = store is None or store.scratch
    pm.notes = run_notes(cfg, scratch)
    pm.privacy = [privacy_entry(r, cfg, cfg.rounds, store if cfg.private else None,
                                job.run_id if job else None)
                  for r in regions]
    if alg is not None:  # the pivot's steps, the tuned release, the released setting
        for k, (r, entry) in enumerate(zip(regions, pm.privacy)):
            entry.update(method=alg.name, steps=r.steps_per_round * cfg.rounds,
                         tuning=tuning_entry(r, k, cfg, alg))
    return pm


def _train_reserved(data: PandemicData, cfg: PandemicConfig, regions: list[Region],
                    on_round, t0: float, plans: list | None = None,
                    job: Job | None = None, algorithm=None) -> PandemicModel:
    """Features (a private preprocessing release charged first), input scaling, then
    ``cfg.method`` on the core engine (`runtime.simulator.simulate` with the regions as
    a `GraphSource` and the node-level unit), spending the regions' ledgers."""
    for r in regions:
        build_features(data, r, cfg)
    t_feat = time.perf_counter() - t0
    t_scale = time.perf_counter()
    for r in regions:
        fit_region_scaling(r, cfg)
    t_scale = time.perf_counter() - t_scale
    model = new_model(regions[0].features, cfg)
    t1 = time.perf_counter()
    res = simulate(graph_federation(regions, cfg), model,
                   algorithm or method_of(cfg, [r.name for r in regions]),
                   training_config(cfg), plans=plans, job=job, method=cfg.method,
                   source=region_source(regions, cfg), params0=initial_weights(model, cfg),
                   on_round=(lambda t, _: on_round(t, cfg.rounds)) if on_round else None)
    W = np.stack([raw_weights(res.params[k], r) for k, r in enumerate(regions)])
    return PandemicModel(cfg, [r.name for r in regions], W, [],
                         {"features_s": t_feat, "scaling_s": t_scale,
                          "train_s": time.perf_counter() - t1},
                         constants={} if cfg.preprocessing == "uncharged" else
                         {r.name: r.constants.to_dict() for r in regions})


def predict(data: PandemicData, pm: PandemicModel, batch_size: int = 8192) -> np.ndarray:
    """(P,) risk of becoming infected in the 7 days after the history, for every person.
    Features are normalized with the constants the model was trained with (saved in it;
    uncharged ones are refit on ``data``, as they were in training)."""
    cfg = pm.config
    saved = pm.constants if cfg.preprocessing == "private" else None
    regions = region_groups(data, cfg)
    if [r.name for r in regions] != pm.regions:
        raise ConfigError(f"the data's regions {[r.name for r in regions]} differ from the "
                          f"model's {pm.regions}; predict on the dataset the model was "
                          "trained for")
    scores = np.zeros(data.num_persons)
    for k, r in enumerate(regions):
        c = None if saved is None else saved.get(r.name)
        if cfg.preprocessing == "private" and c is None:
            raise ConfigError(f"the model holds no private constants for {r.name}; it was "
                              "saved by an older silofl: retrain it")
        build_features(data, r, cfg, None if c is None else _as_constants(c))
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
        config: PandemicConfig | None = None, store: BudgetStore | None = None) -> None:
    """Mirror of the challenge's centralized `fit`: trains on the seven input files (any
    names and folders; see `partition.input_directory`) and saves the model to
    ``model_dir``.  ``config`` defaults to the centralized recipe; a private run charges
    ``store`` (default: the user's default lifetime store,
    ``silofl.privacy.store_paths.default_store_path()``, so fitting again — into any
    folder — composes with, and is limited by, what was spent before)."""
    paths = (person_data_path, household_data_path, residence_location_data_path,
             activity_location_data_path, activity_location_assignment_data_path,
             population_network_data_path, disease_outcome_data_path)
    model_dir = Path(model_dir)
    data = read_dataset(input_directory(paths, model_dir / "inputs"))
    cfg = config or PandemicConfig(federated=False)
    if store is None and cfg.private:
        with BudgetStore(default_store_path()) as st:
            pm = train(data, cfg, store=st, command="silofl.pandemic.fit")
    else:
        pm = train(data, cfg, store=store, command="silofl.pandemic.fit")
    pm.save(model_dir)


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
    if np.any(idx < 0):  # no pid in the message: ids are record values
        raise ConfigError(f"{preds_format_path} lists {int((idx < 0).sum())} pids that are "
                          "not in the data; pass the format file of this dataset")
    fmt["score"] = scores[idx]
    fmt.to_csv(preds_dest_path, index=False)

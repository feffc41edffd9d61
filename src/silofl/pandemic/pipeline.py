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
`engine.NODE_METHODS`).  What lives here: the configuration, planning (`plan_regions`,
`tuned_method`), the model file, `train`, `predict` and `evaluate`.  Around it, one idea
each: `regions` (silos and their features), `inputs` (what the model sees),
`constants` (declared constants and the private preprocessing release), `charges` (what
a run reserves and records: `planned_charges`, labels `ROUND_LABEL`/`PREPROCESS_LABEL`,
`reserve_regions`, `tuned_charges`, `privacy_entry`) and `challenge` (the challenge's
entry points).  Results equal the previous
stand-alone pipeline bit for bit (seeded noise; tests/pandemic/test_engine.py).

**What is guaranteed, and what is assumed** (every model states it, `charges.privacy_entry`):

* *Adjacency* (``adjacency``).  ``"node+edges"`` (default): neighbouring datasets differ
  in one person *including their contacts* (the contact graph is private, the challenge's
  threat model), so up to 2S − 1 examples change.  ``"node"``: one person's attributes
  and states differ on a fixed, public contact graph: up to S examples.  Accounting:
  `node_dp` (Theorem 2.4.4, replacement, sensitivity 2ρC, ρ ~ Hypergeometric(n, S or
  2S − 1, b)).  Assumed, not charged: the degree-bounding pruning is data-dependent (a
  replaced person's edges can change which edges of others are kept,
  `privacy.node_level.PRUNING_ASSUMPTION`), and region sizes n are public (they set σ and b/n).
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
  (default: fixed public numbers, `tables.DECLARED_CONSTANTS` and
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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from silofl.errors import ConfigError
from silofl.io import write_bytes_atomic, write_json_atomic
from silofl.models.glm import FocalLoss
from silofl.pandemic import metrics as PM
from silofl.pandemic.baseline import sir_baseline_scores
from silofl.pandemic.charges import (
    ROUND_LABEL,
    charged_event,
    node_unit,
    planned_charges,
    preprocess_event,
    privacy_entry,
    region_fingerprint,
    reserve_regions,
    run_notes,
    tuned_charges,
    tuning_entry,
)
from silofl.pandemic.config import PandemicConfig
from silofl.pandemic.constants import PRIVATE_SAMPLE
from silofl.pandemic.dataset import PandemicData
from silofl.pandemic.engine import (
    GraphFederation,
    GraphSilo,
    exact_mean,
    method_of,
)
from silofl.pandemic.features import (
    NeighbourhoodFeatures,
    check_t_window,
)
from silofl.pandemic.inputs import input_dim, model_inputs
from silofl.pandemic.regions import (
    Region,
    as_constants,
    build_features,
    fit_region_scaling,
    raw_weights,
    region_groups,
    region_inputs,
    region_source,
)
from silofl.pandemic.tuning import DEFAULT_LOSS_BOUND, NodeValidation, check_setting
from silofl.privacy.budget import BudgetStore
from silofl.privacy.ledger import Ledger
from silofl.privacy.node_level import (
    affected_examples,
    calibrate_node_sigma,
)
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.job import Job
from silofl.runtime.plan import TrainingConfig, plan_job
from silofl.runtime.simulator import simulate
from silofl.training.dpsgd import GradientRule
from silofl.training.trainer import LocalTrainer
from silofl.tuning.private import TunedPersonalization
from silofl.tuning.setup import distribution


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
    def load(cls, directory: Path) -> PandemicModel:
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


# --- planning ----------------------------------------------------------------------------


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


# --- private tuning (silofl.tuning on graph data; README "Private tuning on graph data") ---


def tuned_method(regions: list[Region], cfg: PandemicConfig, tc):
    """``cfg.method`` (MR-MTL or Ditto) privately tuned per region (`TuningConfig` ``tc``,
    checked by `pandemic.tuning.check_setting`): `TunedPersonalization` with one node-level
    `NodeValidation` score per region (read only after its charge)."""
    val = [NodeValidation(r, (lambda X, r=r: region_inputs(r, cfg, X)),
                          affected=affected_examples(r.n, r.S, cfg.adjacency),
                          loss_bound=DEFAULT_LOSS_BOUND, seed=cfg.seed) for r in regions]
    # graph tuning runs select = "random" (`check_setting`): its η is the config's own
    return TunedPersonalization(list(tc.lam), distribution(tc.model_copy(
                                    update={"select": "random"})), val,
                                lrs=list(tc.lr) or None, pivot=cfg.method,
                                pivot_lam=tc.pivot_lam, score_ratio=tc.score_ratio,
                                loss_bound=DEFAULT_LOSS_BOUND)


    # locations keep the constants they were built with (declared in every private run)


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


def train(data: PandemicData, cfg: PandemicConfig,
          on_round: Callable[[int, int], None] | None = None, *,
          store: BudgetStore | None = None,
          command: str = "silofl.pandemic.train", tuning=None,
          probe=None) -> PandemicModel:
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
    public window, `pandemic.tuning.NodeValidation`).

    ``probe`` (audits only, `pandemic.whitebox.NodeCanaries`): trains the model widened
    by the probe's auditing-only coordinates with the probe on the DP-SGD rule; the saved
    weights keep only the model's own."""
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
        pm = _train_reserved(data, cfg, regions, on_round, t0, plans, job, alg, probe)
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
                    job: Job | None = None, algorithm=None, probe=None) -> PandemicModel:
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
    P, trained, params0 = model.num_params, model, initial_weights(model, cfg)
    if probe is not None:  # an audit's canary coordinates (pandemic.whitebox)
        trained, params0 = probe.widen(model, params0)
    t1 = time.perf_counter()
    res = simulate(graph_federation(regions, cfg), trained,
                   algorithm or method_of(cfg, [r.name for r in regions]),
                   training_config(cfg), plans=plans, job=job, method=cfg.method,
                   source=region_source(regions, cfg), params0=params0,
                   on_round=(lambda t, _: on_round(t, cfg.rounds)) if on_round else None,
                   probe=probe)
    W = np.stack([raw_weights(res.params[k][:P], r) for k, r in enumerate(regions)])
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
        build_features(data, r, cfg, None if c is None else as_constants(c))
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

"""The run configuration: a TOML file with sections [data], [model], [training],
[privacy] (+ [privacy.silos.NAME] overrides), [budget] and [output]. Every key has a default, so an
empty file — or no file — runs the main job on the built-in heart-disease data.
Unknown keys are errors that suggest the nearest valid key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from silofl.config.base import Section, did_you_mean, read_toml, validate
from silofl.errors import ConfigError

__all__ = [
    "AuditSection",
    "BudgetConfig",
    "Config",
    "DataConfig",
    "ErosionSection",
    "ModelConfig",
    "OutputConfig",
    "PrivacyConfig",
    "SiloPrivacy",
    "TrainingSection",
    "TreesConfig",
    "TuningConfig",
    "check_privacy_target",
    "config_from_dict",
    "read_toml",
]


class DataConfig(Section):
    section: ClassVar[str] = "data"
    source: str = "heart"          # heart | table | school | exam | titanic | mnist | synthetic
    path: str = ""                 # file for table/school
    silo_column: str = ""          # table: column naming each row's silo (or use `split`)
    label_column: str = ""         # table: the target column
    task: str = "auto"             # table: auto | binary | multiclass | regression
    features: list = Field(default_factory=list)  # table: feature columns (default: all)
    missing: str = "impute"        # impute | drop | error (see silofl.data.tabular)
    test_fraction: float = 0.2
    sep: str = ""                  # table (CSV): column separator ("" = ","), e.g. ";"
    encoding: str = ""             # table (CSV): text encoding ("" = utf-8), e.g. "latin-1"
    drop: list = Field(default_factory=list)  # table: columns to leave out (dates, ids)
    person_column: str = ""        # table: the person of each row (never a feature); with
                                   # [privacy] unit = "person" DP protects persons, not rows
    schema: str = ""  # type: ignore[assignment]  # declared schema (TOML): bounds, levels…
    lazy: bool = False             # table (Parquet, with a schema): larger than memory, read in
                                   # batches to memory-mapped row files, only sampled rows
                                   # read (silofl.data.lazy); without silo_column, path is a
                                   # directory of <silo>.parquet files or <silo>/ directories
    cache_dir: str = ""            # lazy: where the row files go ("" = a temporary directory)
    # preprocessing (silofl.data.preprocess): auto | declared | private | uncharged | none
    standardize: str = "auto"      # auto = declared from the schema (no cost)
    impute: str = "auto"           # auto | declared | private | uncharged
    preprocess_share: float = 0.1  # share of each silo's ε for private statistics
    seed: int = 0
    generator: str = "linear"      # synthetic: linear | mean | vehicle | ehr
    options: dict = Field(default_factory=dict)  # synthetic: generator keyword arguments
    # table without silo_column, heart (pooled) or titanic: simulate silos
    # (silofl.data.splitters)
    split: str = ""                # iid | dirichlet | quantity | feature_range | shared_range
                                   # | age_strict | age_some | by_category | by_label
    num_silos: int = 0             # split (default 10) and mnist (default 40)
    alpha: float = 0.5             # dirichlet label skew / quantity sizes: small = skewed
    size_law: str = "dirichlet"    # quantity: dirichlet | power
    power: float = 1.0             # quantity with size_law = "power": n_k ∝ (k + 1)^-power
    split_feature: str = ""        # feature_range / shared_range / age_strict / age_some:
                                   # the (encoded) column; by_category: the column (`sex`)
    group_size: int = 2            # shared_range / age_some: silos per shared value range
    split_bins: list = Field(default_factory=list)  # age_strict / age_some: declared bin
                                   # edges of split_feature, e.g. [0, 40, 60, 120]
    label_purity: float = 0.8      # by_label: share of each class kept by its own silo
    min_silo_size: int = 0         # split: fewest rows per silo (0 = 10); exam: leave
                                   # out schools with fewer students (0 = keep all 65)
    min_silo_rows: int = 0         # every silo: fewest training rows and fewest test rows
                                   # (0 = off; silofl.data.silo_size)
    small_silos: str = "refuse"    # a silo below min_silo_rows: refuse (error) | drop (listed)
    # mnist: Rotated & Masked MNIST (silofl.data.mnist)
    train_per_silo: int = 0        # 0 = the source's default: mnist 1500, mnist_dirichlet 600
    test_per_silo: int = 0         # 0 = mnist 250, mnist_dirichlet 125
    mask_prob: float = 0.1         # probability of each 2x2 patch being white
    # mnist_dirichlet (PrivateKT's setting, silofl.data.mnist.load_dirichlet_mnist): also
    # num_silos (default 80), train_per_silo, test_per_silo, alpha (label skew)
    public_fraction: float = 0.2   # share of the training pool made the unlabeled public set
    public_size: int = 0           # cap on the public set (0 = public_fraction of the pool)
    flatten: bool = False          # mnist, mnist_dirichlet: images as (784,) rows (MLPs, GLMs)

    @field_validator("standardize", mode="before")
    @classmethod
    def _older_standardize(cls, value: Any) -> Any:
        if isinstance(value, bool):  # older configs: standardize = true/false
            return "auto" if value else "none"
        return value

    @field_validator("test_fraction")
    @classmethod
    def _keep_test_rows(cls, tf: float) -> float:
        if not 0 < tf < 1:
            # every reported metric is a test metric: without test rows nothing is reported
            raise ConfigError(f"'data.test_fraction' must be in (0, 1), got {tf}; runs report "
                              "metrics on each silo's held-out test rows, so keep some "
                              "(e.g. test_fraction = 0.2)")
        return tf


class ModelConfig(Section):
    section: ClassVar[str] = "model"
    name: str = "logistic"         # linear | logistic | focal | svm | softmax | mlp | mlp_norm | convnet
    gamma: float = 2.0             # focal loss only
    alpha: float = 0.25            # focal loss only
    metric: str = ""               # accuracy | mse | auprc | roc_auc (default by task)
    hidden: list = Field(default_factory=list)  # mlp only: hidden layer widths ([] → [64])


class TrainingSection(Section):
    section: ClassVar[str] = "training"
    methods: list = Field(default_factory=lambda: ["local", "fedavg", "mrmtl"])
    lam: float | str = 0.3         # MR-MTL / Ditto λ ≥ 0, or "auto" (from released updates)
    weighted: bool = True          # weight model updates by training counts
    rounds: int = 30
    local_epochs: float = 1.0
    batch_size: int = 16
    lr: float = 0.03                # chosen on the public built-in heart data (README)
    clip: float | str = 1.0         # C, or "auto": private adaptive clipping (quantile of
                                    # per-example gradient norms, Andrew et al. 2021)
    clip_quantile: float | str = 0.7  # clip = "auto": γ, target fraction unclipped;
                                    # "auto": from each silo's noise level (public)
    clip_lr: float = 0.2            # clip = "auto": η_C, geometric step of the clip
    clip_init: float = 0.3          # clip = "auto": C₀, the starting clip
    clip_max: float = 10.0          # clip = "auto": public ceiling of C_k (stops a runaway)
    clip_count_noise: float | str = "auto"  # clip = "auto": σ_b of each step's noisy count
    l2: float = 0.0
    seed: int = 0
    eval_every: int = 1
    device: str = "cpu"              # torch models: cpu | cuda | cuda:N | auto (GPU if present)
    finetune_fraction: float = 0.5   # finetune, ifca_finetune: share of rounds federated
    clusters: int = 2                # ifca*: number of cluster models
    selection_fraction: float = 0.03  # ifca*: share of a silo's ε per cluster selection
    selection_rounds: float = 0.1    # ifca*: share of rounds with selection (≥ 1 round)
    we_user: str = ""                # weight_erosion: name of the user silo u_0 (required)
    we_p_s: float = 0.2              # weight_erosion: size penalty p_s (≥ 0)
    we_p_d: float = 0.01             # weight_erosion: distance penalty p_d (≥ 0)
    # weight_erosion options (README "Weight Erosion"; validated by the algorithm):
    we_update: str = "gradient"      # gradient | local_sgd (a local pass: local_epochs)
    we_participation: float = 1.0    # (0, 1]: each round a non-user silo takes part w.p. p
    we_join_round: dict = Field(default_factory=dict)   # {"silo" = r}: takes part from r
    we_leave_round: dict = Field(default_factory=dict)  # {"silo" = r}: gone from round r
    we_count: str = "rounds"         # rounds | participated: r in the size penalty
    we_newcomer: str = "one"         # one | mean | median: a late joiner's first α
    # privatekt, fedavg_ldp: a fixed local-DP mechanism per upload (algorithms.privatekt)
    ldp_epsilon: float = 5.0         # per-round ε of each client's upload (ε-LDP)
    client_fraction: float = 0.5     # share of clients selected per round
    max_participation: int = 0       # rounds per client at most (0 = as the target allows)
    ldp_mechanism: str = "gaussian"  # fedavg_ldp: gaussian | laplace on the clipped update
    ldp_delta: float = 1e-5          # fedavg_ldp, gaussian: δ of one upload
    kt_samples: int = 2              # privatekt: K knowledge-transfer samples per round
    kt_buffer: int = 25              # privatekt: B, FIFO knowledge buffer (samples)
    kt_self_train: float = 0.1       # privatekt: M/|D_p| self-trained on per round
    kt_server_epochs: int = 5        # privatekt: server fine-tuning epochs on the buffer
    kt_server_lr: float = 0.0        # privatekt: server learning rate (0 = training.lr)
    # fedavg, mrmtl, weight_erosion: server aggregation (silofl.algorithms.robust)
    aggregation: str = "mean"        # mean | median | trimmed_mean | krum | multi_krum |
                                     # centered_clipping
    attackers: int = 0               # f, assumed attackers (krum's f; limits are checked)
    trim_fraction: float = 0.1       # trimmed_mean: share trimmed from each end, [0, 0.5)
    clip_radius: float = 1.0         # centered_clipping: radius τ (> 0)
    prox_mu: float = 0.01            # fedprox: proximal strength μ ≥ 0 (0 = FedAvg)
    apfl_alpha: float = 0.5          # apfl: initial mixing weight α in [0, 1]
    apfl_alpha_lr: float = 0.0       # apfl: step size of α ≥ 0 (0 = training.lr)
    uldp_weighting: str = "uniform"  # uldp: uniform (1/M, M = privacy.persons_in_silos) |
                                     # linked (record proportions from keyed pseudonyms)
    uldp_sample_rate: float = 1.0    # uldp: persons' sampling rate per round, (0, 1]


    @field_validator("lam", mode="before")
    @classmethod
    def _lam_or_auto(cls, value: Any) -> Any:
        # the rule of silofl.algorithms.auto_lambda.check_lam (config sits below algorithms)
        if value == "auto":
            return value
        if isinstance(value, str):
            hint = ("did you mean \"auto\"? write it exactly as \"auto\" (lower case, no spaces)"
                    if did_you_mean(value.strip().lower(), ["auto"], cutoff=0.7) else
                    "give a number ≥ 0 (0: Local; larger federates more) or \"auto\" (λ "
                    "from the released updates, no privacy cost)")
            raise ConfigError(f"'training.lam' must be a number ≥ 0 or \"auto\", got "
                              f"{value!r}: {hint}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not value >= 0 or value == float("inf"):
            raise ConfigError(f"'training.lam' must be a number ≥ 0 or \"auto\", got {value!r}")
        return float(value)


class TreesConfig(Section):
    """[trees]: the settings of method ``dp_gbdt`` (DP federated gradient-boosted trees,
    `silofl.algorithms.dp_gbdt`); validated where the method is built."""

    section: ClassVar[str] = "trees"
    trees: int | str = "auto"      # T shared trees; auto: 2 passes over the features
                                   # (2·d) for cyclic splits, else 20
    depth: int | str = "auto"      # D, depth of every tree; auto: log2(n_bins) cyclic, else 3
    n_bins: int | str = "auto"     # bins per feature; auto: from the rows and the noise
                                   # (cyclic; gbdt_splits.auto_bins), else 16
    bins: str = "schema"           # schema (declared bounds: free) | private (quantiles, charged)
    bins_share: float = 0.1        # bins = "private": the bins release's share of each
                                   # silo's budget (training.private_bins.bins_sigma)
    lr: float = 0.3                # η, shrinkage of every leaf
    lam: float = 30.0              # λ, L2 regularisation of the leaves
    clip_g: float = 1.0            # G: per-example gradient clipped to [-G, G]
    clip_h: float | str = "auto"   # H: hessian clipped to [0, H]; auto: 1/4 binary, 1 regression
    subsample: float = 1.0         # Poisson row-sampling rate per tree (amplification counted)
    colsample: float = 1.0         # share of features per tree (public randomness)
    min_child_hessian: float = 1.0  # smallest noisy Σh of a child
    max_leaf: float | str = "auto"  # leaf clamp before η; auto: 4 binary, G regression
    base_score: float = 0.0        # public starting margin
    splits: str = "cyclic"         # cyclic (tree t: feature t mod d, leaves = its bins) |
                                   # histogram (noisy level histograms) | random (public)
    local_trees: int = 0           # personalization: trees each silo grows alone afterwards
    shrink: float | str = "off"    # personal leaves: off | μ ≥ 0 (MR-MTL shrinkage of each
                                   # silo's own leaf values towards the shared ones) | auto


class SiloPrivacy(Section):
    section: ClassVar[str] = "privacy.silos"
    epsilon: float | None = None
    delta: float | None = None


class PrivacyConfig(Section):
    section: ClassVar[str] = "privacy"
    enabled: bool = True
    epsilon: float = 1.0
    delta: float = 1e-4
    accountant: str = "pld"        # the accountant σ is calibrated against: pld | rdp
                                   # (events PLD cannot handle fall back to rdp)
    noise: str = "secure"          # secure (CSPRNG from OS entropy) | seeded (reproducible
                                   # experiments: not a privacy guarantee)
    silos: dict[str, SiloPrivacy] = Field(default_factory=dict)  # silo name -> its own target
    unit: str = "example"          # example (one row) | person (all rows of one person of a
                                   # silo: needs [data] person_column)
    max_rows_per_person: int = 0   # person: the most rows of a sampled person a step reads
                                   # (a random subset; 0 = all); contribution ≤ C either way
    persons_in_silos: int = 0      # person: the most silos one person appears in (declared,
                                   # public; 0 = every silo) for the consortium-wide figure
    linkage_key_file: str = ""     # person: the consortium's linkage key (HMAC pseudonyms,
                                   # silofl.data.pseudonyms; "" = env SILOFL_LINKAGE_KEY)
    overlap_epsilon: float | None = None  # person, with a linkage key: ε of the private
                                   # overlap histogram charged to every silo (default 0.05·ε;
                                   # 0 = no release); training σ is calibrated with it composed

    @field_validator("silos", mode="before")
    @classmethod
    def _silos_table(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ConfigError("[privacy.silos] must map silo names to {epsilon, delta}")
        return value

    @model_validator(mode="after")
    def _targets_in_range(self) -> PrivacyConfig:
        _check_privacy_section(self)
        return self


class BudgetConfig(Section):
    section: ClassVar[str] = "budget"
    """The lifetime budget store (`silofl.privacy.budget`). [privacy] epsilon/delta are
    this job's target; the store keeps each silo's lifetime target and every charge."""
    store: str = ""                # SQLite file ("" = the deployment's store in the silofl
                                   # home: <home>/stores/<deployment>.sqlite, see
                                   # silofl.privacy.store_paths)
    deployment: str = "default"    # names the default store (one per user and deployment)
    scratch: bool = False          # in-memory store: an experiment, not a release
    epsilon: float | None = None   # lifetime ε per silo when first seen (default: the job's)
    delta: float | None = None     # lifetime δ (default: the job's)


class OutputConfig(Section):
    section: ClassVar[str] = "output"
    dir: str = "runs"
    name: str = ""                 # run directory name (default: timestamp)
    checkpoint_every: int = 1      # rounds between checkpoints for `--resume` (0 = none)


class TuningConfig(Section):
    section: ClassVar[str] = "tuning"
    """[tuning]: hyperparameter tuning under silo-specific DP (silofl.tuning; README
    "Private tuning"). `silofl run`: mode none | private; `silofl sweep` reads the mode
    from sweep.tuning and the other keys from here."""
    mode: str = "none"             # none | private (random h, best-only release) | proxy
    method: str = "mrmtl"          # mrmtl | ditto: the method whose λ is tuned
    lam: list = Field(default_factory=list)   # λ grid (sweep: default sweep.lam)
    lr: list = Field(default_factory=list)    # lr grid ([]: the run's lr, not tuned)
    distribution: str = "tnb"      # tnb (eta with gamma or mean_trials) | poisson (mu)
    eta: float = 1.0               # TNB shape η > −1 (1: geometric, 0: logarithmic; < 0
                                   # charged by privacy.tnb_select; select = subsample: 0
                                   # unless set)
    gamma: float | None = None     # TNB γ in (0, 1) (or give mean_trials)
    mean_trials: float | None = None  # E[h] (default 10 when gamma is not given)
    mu: float | None = None        # Poisson mean (default 10)
    pivot_lam: float = 0.1         # public λ̄ of the pivot model (and the fixed-λ baseline)
    score_ratio: float = 2.0       # score noise multiplier relative to a trial's (module
                                   # doc); select = subsample: 4 unless set
    validation_fraction: float = 0.2  # run: share of each silo's training rows for scoring
    select: str = "subsample"      # random (h ~ distribution, RepeatAndSelect) | em (every
                                   # grid setting once, exponential-mechanism choice) |
                                   # subsample (random h on a γ-subsample, then one full run;
                                   # the default: ≤ 1.4× one run's ε, docs/guides/tuning.md;
                                   # method = ditto without select: random)
    em_fraction: float = 0.05      # em: share of each silo's ε for the choice
    subsample_fraction: float = 0.1  # subsample: γ, trials sample rows at rate γ·q
    proxy_source: str = ""         # mode proxy: built-in source declared public ("table":
    proxy_path: str = ""           # proxy_path, with [data]'s columns); never the silos' own
    proxy_noise: str = "simulated"  # proxy: simulated (the run's ε on the proxy) | none


class AuditSection(Section):
    """[audit]: `silofl audit`'s settings (its command-line options override them; checked
    by `silofl.audit.engine.audit`)."""

    section: ClassVar[str] = "audit"
    view: str = "server"           # server (white box: every round's update) | model | release
    kind: str = "one-run"          # one-run | multi-run
    silo: str | None = None        # audit one silo (default: every silo)
    canaries: int | None = None    # per silo (default: server 50000; model min(1000, n_k))
    runs: int | None = None        # multi-run jobs (default: server 4 pooled; model 200 per side)
    confidence: float = 0.95       # of the lower bound, in [0.5, 1)
    init: str = "worst-case"       # model view of a torch model: worst-case | default start


class ErosionSection(Section):
    """[erosion]: `silofl erosion`'s settings (its command-line options override them)."""

    section: ClassVar[str] = "erosion"
    users: list[str] = Field(default_factory=list)  # user silos ([] = every silo in turn)
    contributions: bool = True     # make each user's contribution report now


class Config(Section):
    """A job's configuration: the sections of a TOML file, with defaults.

    ``Config()`` is every default; ``Config(data={...})``, `config_from_dict` (parsed
    TOML) and `load_config` (a file + ``--set SECTION.KEY=VALUE``) validate the same keys
    with the same messages (`ConfigError`).

    Attributes
    ----------
    data : DataConfig
        [data]: the source (built-in, table, split, ...), its columns and schema.
    model : ModelConfig
        [model]: the model's name and options.
    training : TrainingSection
        [training]: rounds, batch size, lr, clip, methods and their settings.
    privacy : PrivacyConfig
        [privacy]: enabled, ε, δ, per-silo targets, accountant, noise.
    budget : BudgetConfig
        [budget]: the lifetime store, deployment, lifetime targets.
    output : OutputConfig
        [output]: the run directory, checkpoints.
    tuning : TuningConfig
        [tuning]: private hyperparameter tuning.
    audit : AuditSection
        [audit]: `silofl audit`'s options.
    erosion : ErosionSection
        [erosion]: `silofl erosion`'s options.
    trees : TreesConfig
        [trees]: the settings of method ``dp_gbdt`` (federated trees).
    """

    section: ClassVar[str] = ""
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    training: TrainingSection = Field(default_factory=TrainingSection)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    tuning: TuningConfig = Field(default_factory=TuningConfig)
    audit: AuditSection = Field(default_factory=AuditSection)
    erosion: ErosionSection = Field(default_factory=ErosionSection)
    trees: TreesConfig = Field(default_factory=TreesConfig)

    @model_validator(mode="after")
    def _lifetime_in_range(self) -> Config:
        b = self.budget  # a lifetime target: δ ≥ 0.5 would compose every charge to ε ≈ 0
        if b.epsilon is not None or b.delta is not None:
            pc = self.privacy
            check_privacy_target(pc.epsilon if b.epsilon is None else b.epsilon,
                                 pc.delta if b.delta is None else b.delta, "budget.")
        return self

    def to_dict(self) -> dict:
        """The configuration as plain data (a run directory's config.toml, a sweep's
        fingerprint).

        Returns
        -------
        dict
            Section name to key/value dict; optional keys and sections left at their
            defaults are omitted, so fingerprints of older runs hold.
        """
        d = self.model_dump()
        for key, cls in (("tuning", TuningConfig), ("audit", AuditSection),
                         ("erosion", ErosionSection), ("trees", TreesConfig)):
            if getattr(self, key) == cls():  # older configs (and fingerprints) lack them
                d.pop(key)
        for key in ("sep", "encoding", "drop"):  # likewise the table reading options
            if not d["data"][key]:
                d["data"].pop(key)
        d["privacy"]["silos"] = {k: {kk: vv for kk, vv in v.items() if vv is not None}
                                 for k, v in d["privacy"]["silos"].items()}
        return d


def config_from_dict(raw: dict, source: str | Callable[[str], str] = "") -> Config:
    """Validate a nested dict (e.g. parsed TOML) into a Config.

    Parameters
    ----------
    raw : section -> {key: value}.
    source : the file it came from (named in error messages), or a function of the
        dotted key at fault that names where that key was set.

    Returns
    -------
    The validated Config; ConfigError naming the key, the value and what is allowed.
    """
    return validate(Config, raw, "", source)


def check_privacy_target(epsilon, delta, where: str = "") -> tuple[float, float]:
    """The one range check of a job's (ε, δ) (silofl.privacy.targets: 0 < ε ≤ 100,
    0 < δ < 0.5), shared by configs and `deploy init`; ConfigError naming `where`."""
    from silofl.errors import PrivacyError
    from silofl.privacy.targets import check_target
    try:
        return check_target(epsilon, delta, where)
    except PrivacyError as e:
        raise ConfigError(str(e)) from None


def _check_privacy_section(pc: PrivacyConfig) -> None:
    if not pc.enabled:
        return
    check_privacy_target(pc.epsilon, pc.delta, "privacy.")
    for name, sp in pc.silos.items():
        check_privacy_target(pc.epsilon if sp.epsilon is None else sp.epsilon,
                             pc.delta if sp.delta is None else sp.delta,
                             f"privacy.silos.{name}.")
    oe = pc.overlap_epsilon
    if oe is not None and (isinstance(oe, bool) or not isinstance(oe, (int, float))
                           or not 0 <= oe < pc.epsilon):
        raise ConfigError(f"[privacy] overlap_epsilon (the share of each silo's ε spent on "
                          f"the private overlap histogram; 0 = no release) must be ≥ 0 and "
                          f"below privacy.epsilon = {pc.epsilon:g}, got {oe!r}")

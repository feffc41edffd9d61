"""From a validated Config to the objects a run needs: federation, model, algorithms.
Everything here happens before any training data is touched."""

from __future__ import annotations

import difflib
import inspect

import silofl.data as D
from silofl.algorithms import make_algorithm
from silofl.algorithms.base import Algorithm
from silofl.config import Config, DataConfig
from silofl.data import heart as _heart
from silofl.data.federation import Federation
from silofl.data.mnist import load_dirichlet_mnist
from silofl.data.preprocess import PreprocessSpec, plan_preprocessing, preprocess_without_budget
from silofl.data.raw import RawFederation
from silofl.data.schema import load_schema
from silofl.data.silo_size import check_settings, limit_federation
from silofl.errors import ConfigError
from silofl.experiments.run_trees import trees_kwargs
from silofl.models import TORCH_MODELS, check_input, make_model
from silofl.models.base import Model
from silofl.models.metrics import METRICS, default_metric
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig
from silofl.runtime.sources import require_persons

SOURCES = ("heart", "table", "school", "exam", "titanic", "mnist", "synthetic",
           "mnist_dirichlet")
# DataConfig keys that only one source reads: setting them for another source is an error.
SOURCE_KEYS = {
    "mnist": ("train_per_silo", "test_per_silo", "mask_prob"),
    "mnist_dirichlet": ("public_fraction", "public_size", "flatten"),
    "table": ("sep", "encoding", "drop", "person_column",  # how its CSV is read; persons
              "lazy", "cache_dir"),  # a Parquet table larger than memory (data.lazy)
}
#: [privacy] unit values a config may name ("node" is the pandemic engine's own unit)
CONFIG_UNITS = ("example", "person")
#: keys two MNIST sources share (allowed under either)
MNIST_SHARED = {"train_per_silo": ("mnist", "mnist_dirichlet"),
                "test_per_silo": ("mnist", "mnist_dirichlet"),
                "flatten": ("mnist", "mnist_dirichlet")}
# Sources whose table can be split into simulated silos (data.split and its keys).
SPLIT_SOURCES = ("table", "heart", "titanic")
SPLIT_KEYS = ("split", "alpha", "size_law", "power", "split_feature", "group_size",
              "split_bins", "label_purity")
MIN_SIZE_SOURCES = (*SPLIT_SOURCES, "exam")  # data.min_silo_size: split minimum / exam filter
DEFAULT_SILOS = {"table": 10, "mnist": 40, "mnist_dirichlet": 80}  # data.num_silos = 0 means these
GENERATORS = {"linear": D.linear_silos, "mean": D.mean_estimation, "vehicle": D.vehicle_like,
              "ehr": D.ehr_silos_raw}


def _check_own_table_keys(dc: DataConfig) -> None:
    """A table's keys under a built-in source: the source would train on its own data while
    the user believes their table was used (the default source is the heart demo)."""
    used = [k for k in ("path", "label_column", "silo_column")
            if getattr(dc, k) and not (k == "path" and dc.source in ("table", "school"))
            and dc.source != "table"]
    if used:
        keys = ", ".join(f"data.{k}" for k in used)
        raise ConfigError(f"{keys} name your own table, but data.source is {dc.source!r} "
                          "(the default is the built-in heart data), which ignores them; add "
                          "source = \"table\" under [data] to train on your table (or "
                          f"remove {keys})")


def _check_source_keys(dc: DataConfig) -> None:
    """Refuse source-specific keys (set away from their defaults) under another source."""
    default = DataConfig()
    if dc.source not in SPLIT_SOURCES:
        for key in SPLIT_KEYS:
            if key == "alpha" and dc.source == "mnist_dirichlet":  # its label skew
                continue
            if getattr(dc, key) != getattr(default, key):
                raise ConfigError(f"data.{key} applies only to data.source = 'table', 'heart' "
                                  f"or 'titanic' (simulated silos), but the source is "
                                  f"{dc.source!r}; remove data.{key}")
    _check_own_table_keys(dc)
    for source, keys in SOURCE_KEYS.items():
        if dc.source == source:
            continue
        for key in keys:
            if dc.source in MNIST_SHARED.get(key, ()):
                continue
            if getattr(dc, key) != getattr(default, key):
                raise ConfigError(f"data.{key} applies only to data.source = {source!r}, but "
                                  f"the source is {dc.source!r}; remove data.{key}")
    if dc.num_silos and dc.source not in (*SPLIT_SOURCES, "mnist", "mnist_dirichlet"):
        raise ConfigError(f"data.num_silos applies only to data.source = 'table', 'heart' or "
                          f"'titanic' (with data.split) or 'mnist', but the source is "
                          f"{dc.source!r}; remove it")
    if dc.min_silo_size and dc.source not in MIN_SIZE_SOURCES:
        raise ConfigError(f"data.min_silo_size applies only to data.source = 'table', 'heart' "
                          f"or 'titanic' (with data.split) or 'exam', but the source is "
                          f"{dc.source!r}; remove it")
    if dc.min_silo_size < 0:
        raise ConfigError(f"data.min_silo_size must be >= 0, got {dc.min_silo_size}")
    if dc.num_silos < 0:
        raise ConfigError(f"data.num_silos must be positive (0 = the source's default), "
                          f"got {dc.num_silos}")


def _refuse_split_keys(dc: DataConfig, why: str) -> None:
    """Split keys set where no split happens (silos named by a column or by hospital)."""
    default = DataConfig()
    for key in (*SPLIT_KEYS, "num_silos", "min_silo_size"):
        if getattr(dc, key) != getattr(default, key):
            raise ConfigError(f"data.{key} applies only when silos are simulated with "
                              f"data.split, but {why}; remove data.{key} (or set data.split)")


def _heart_pooled_frame():
    """The heart table with its label derived as in `load_heart_disease_raw`, hospitals
    pooled (the schema leaves the hospital column out of the features)."""
    df = D.heart_disease_frame()
    df[_heart.TARGET] = (df["num"] > 0).astype("int64")
    return df.drop(columns=["id", "num"])


def _split_table(dc: DataConfig) -> RawFederation:
    """data.split for data.source 'table', 'heart' or 'titanic': one pooled table cut into
    simulated silos."""
    if dc.silo_column:
        raise ConfigError(f"data.silo_column ({dc.silo_column!r}) and data.split "
                          f"({dc.split!r}) both say how to form silos; give only one")
    if dc.split not in D.SPLITS:
        near = difflib.get_close_matches(dc.split, D.SPLITS, n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"unknown data.split {dc.split!r}; choose one of "
                          f"{', '.join(D.SPLITS)}.{hint}")
    if dc.split in ("feature_range", "shared_range", "age_strict", "age_some") and \
            not dc.split_feature:
        raise ConfigError(f"data.split = {dc.split!r} needs data.split_feature, the column "
                          "whose value ranges define the silos")
    if dc.split == "by_category" and not dc.split_feature:
        raise ConfigError("data.split = 'by_category' needs data.split_feature, the "
                          "categorical column whose levels define the silos (e.g. 'sex')")
    kw = dict(num_silos=dc.num_silos or (None if dc.split in D.SEED_SPLITS
                                         else DEFAULT_SILOS["table"]),
              alpha=dc.alpha, size_law=dc.size_law, power=dc.power,
              feature=dc.split_feature or None, group_size=dc.group_size,
              bins=dc.split_bins or None, label_purity=dc.label_purity,
              min_size=dc.min_silo_size or 10, test_fraction=dc.test_fraction, seed=dc.seed)
    if dc.source == "heart":
        raw = D.split_frame_raw(_heart_pooled_frame(), _heart.TARGET, dc.split,
                                schema=_schema(dc) or D.heart_schema(), missing=dc.missing,
                                name="heart-disease", **kw)
        raw.meta["source"] = f"silofl.data/builtin/{_heart.HEART_FILE} (hospitals pooled)"
        return raw
    if dc.source == "titanic":
        return D.load_titanic_raw(dc.split, missing=dc.missing, schema=_schema(dc), **kw)
    return D.split_table_raw(dc.path, dc.label_column, dc.split, schema=_schema(dc),
                             task=dc.task, features=dc.features or None, missing=dc.missing,
                             read_options=_read_options(dc),
                             person_column=dc.person_column or None, **kw)


def _lazy_table(dc: DataConfig) -> RawFederation:
    """[data] lazy = true: a Parquet dataset read batch by batch into row files, per silo
    by silo_column or one dataset per silo (`silofl.data.lazy.load_table_lazy`)."""
    if not dc.path or not dc.label_column or not dc.schema:
        raise ConfigError("data.lazy = true needs data.path (a Parquet file or directory), "
                          "data.label_column and data.schema (a declared schema: nothing is "
                          "read from the pooled data)")
    others = [k for k in ("split", "person_column", "sep", "encoding", "drop")
              if getattr(dc, k) != getattr(DataConfig(), k)]
    if others:
        raise ConfigError(f"data.lazy = true reads Parquet silos as they are; remove "
                          f"{', '.join('data.' + k for k in others)}")
    return D.load_table_lazy(dc.path, dc.silo_column, dc.label_column, schema=_schema(dc),
                           task=dc.task, features=dc.features or None, missing=dc.missing,
                           test_fraction=dc.test_fraction, seed=dc.seed,
                           cache_dir=dc.cache_dir or None)


def _read_options(dc: DataConfig) -> dict:
    """[data] sep, encoding and drop: how `read_table` reads a CSV table."""
    return {"sep": dc.sep, "encoding": dc.encoding, "drop": dc.drop}


def _schema(dc: DataConfig):
    return load_schema(dc.schema) if dc.schema else None


def preprocess_spec(dc: DataConfig, unit: str = "example") -> PreprocessSpec:
    """The preprocessing of [data] at privacy `unit` ("person": each person's rows count
    as one contribution to the private statistics, `silofl.data.preprocess`)."""
    return PreprocessSpec(dc.standardize, dc.impute, dc.preprocess_share, unit=unit)


def load_federation(dc: DataConfig) -> Federation:
    """The finished federation for preprocessing that needs no budget (declared,
    uncharged or none); private preprocessing goes through `load_raw` and
    `plan_preprocessing` so that it is charged first (see `experiments.run`)."""
    return preprocess_without_budget(load_raw(dc), preprocess_spec(dc), f"data.source "
                                     f"{dc.source!r}")


def plan_data(dc: DataConfig, raw: RawFederation, accountant: str | None,
              unit: str = "example"):
    """The preprocessing plan of `raw` at privacy `unit` (reads only public things:
    schema, silo sizes and targets); its events must be charged before
    `apply_preprocessing`."""
    return plan_preprocessing(raw, preprocess_spec(dc, unit), accountant=accountant)


def load_raw(dc: DataConfig) -> RawFederation:
    """The encoded, split silos before any data-dependent preprocessing, without the silos
    that [data] min_silo_rows drops (listed in ``meta["dropped_silos"]``; refused unless
    [data] small_silos = "drop")."""
    check_settings(dc.min_silo_rows, dc.small_silos)
    return limit_federation(_load_raw(dc), dc.min_silo_rows, dc.small_silos)


def _load_raw(dc: DataConfig) -> RawFederation:
    common = dict(test_fraction=dc.test_fraction, seed=dc.seed)
    if dc.schema and dc.source not in ("heart", "table", "school", "exam", "titanic"):
        raise ConfigError(f"data.schema applies to tables (heart, table, school, exam, "
                          f"titanic), not to "
                          f"data.source = {dc.source!r}; remove it")
    if dc.source in SOURCES:  # an unknown source gets its nearest-name hint below
        _check_source_keys(dc)
    if dc.options and dc.source in ("exam", "mnist", "mnist_dirichlet"):
        raise ConfigError(f"data.options applies only to data.source = 'synthetic'; for "
                          f"{dc.source!r} set its keys directly under [data]")
    if dc.source == "heart":
        if dc.split:
            return _split_table(dc)
        _refuse_split_keys(dc, "data.source = 'heart' has its 4 hospitals as silos")
        return D.load_heart_disease_raw(missing=dc.missing, schema=_schema(dc), **common)
    if dc.source == "titanic":
        if not dc.split:
            raise ConfigError("data.source = 'titanic' has no natural silos; set data.split "
                              "(" + " | ".join(D.SPLITS) + "), e.g. split = 'age_strict' "
                              "with split_feature = 'age' and split_bins = [0, 18, 40, 100]")
        return _split_table(dc)
    if dc.source == "table":
        return _table_raw(dc)
    if dc.source == "exam":
        return D.load_exam_raw(min_size=dc.min_silo_size, schema=_schema(dc), **common)
    if dc.source == "mnist":  # images: pixels share the public [0, 1] scale
        return RawFederation.from_federation(D.load_rotated_masked_mnist(
            num_silos=dc.num_silos or DEFAULT_SILOS["mnist"],
            train_per_silo=dc.train_per_silo or 1500,
            test_per_silo=dc.test_per_silo or 250, mask_prob=dc.mask_prob, seed=dc.seed,
            flatten=dc.flatten))
    if dc.source == "mnist_dirichlet":  # PrivateKT's setting: Dirichlet label mixes + D_p
        return RawFederation.from_federation(load_dirichlet_mnist(
            num_silos=dc.num_silos or DEFAULT_SILOS["mnist_dirichlet"],
            train_per_silo=dc.train_per_silo or 600,
            test_per_silo=dc.test_per_silo or 125,
            alpha=dc.alpha, public_fraction=dc.public_fraction, public_size=dc.public_size,
            flatten=dc.flatten, seed=dc.seed))
    if dc.source == "school":
        # data.path is optional: the School data ships with silofl
        return D.load_school_raw(dc.path or None, schema=_schema(dc), **common)
    if dc.source == "synthetic":
        return _synthetic_raw(dc)
    near = difflib.get_close_matches(dc.source, SOURCES, n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise ConfigError(f"unknown data.source {dc.source!r}; choose one of {', '.join(SOURCES)}.{hint}")


def _table_raw(dc: DataConfig) -> RawFederation:
    """data.source = "table": a CSV/Parquet file, its silos named by a column or
    simulated by data.split (lazy: read silo by silo)."""
    if dc.lazy:
        return _lazy_table(dc)
    if not dc.path or not dc.label_column or not (dc.silo_column or dc.split):
        raise ConfigError("data.source = 'table' needs data.path, data.label_column and "
                          "either data.silo_column (a column naming each row's silo) or "
                          "data.split (simulate silos: " + " | ".join(D.SPLITS) + ")")
    if dc.split:
        return _split_table(dc)
    _refuse_split_keys(dc, f"data.silo_column = {dc.silo_column!r} names the silos")
    return D.load_table_raw(dc.path, dc.silo_column, dc.label_column, task=dc.task,
                            features=dc.features or None, missing=dc.missing,
                            schema=_schema(dc), min_silo_rows=dc.min_silo_rows,
                            small_silos=dc.small_silos, read_options=_read_options(dc),
                            person_column=dc.person_column or None,
                            test_fraction=dc.test_fraction, seed=dc.seed)


def _synthetic_raw(dc: DataConfig) -> RawFederation:
    """data.source = "synthetic": the generator data.generator with data.options
    (unknown options refused with the nearest name)."""
    gen = GENERATORS.get(dc.generator)
    if gen is None:
        raise ConfigError(f"unknown data.generator {dc.generator!r}; choose one of "
                          f"{', '.join(GENERATORS)}")
    params = inspect.signature(gen).parameters
    for key in dc.options:
        if key not in params:
            near = difflib.get_close_matches(key, list(params), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"unknown option data.options.{key} for generator "
                              f"{dc.generator!r}{hint}")
    kw = dict(dc.options)
    if "seed" in params:
        kw.setdefault("seed", dc.seed)
    if "test_fraction" in params:
        kw.setdefault("test_fraction", dc.test_fraction)
    if "standardize" in kw:
        raise ConfigError("data.options.standardize: set data.standardize instead (it "
                          "applies to every source)")
    out = gen(**kw)  # a generator with declared columns returns them (RawFederation)
    return out if isinstance(out, RawFederation) else \
        RawFederation.from_federation(out, simulated=True)


def check_unit(cfg: Config, fed=None) -> None:
    """Check [privacy] unit, max_rows_per_person and persons_in_silos against [data]
    person_column, and against the loaded silos where given.

    Parameters
    ----------
    cfg : Config
        The job.
    fed : Federation or RawFederation, optional
        The loaded silos (person ids, the number of silos); None: the keys alone, before a
        large table is read.

    Raises
    ------
    ConfigError
        Naming the keys and the fix (silos without person ids: `require_persons`).
    """
    pc, dc = cfg.privacy, cfg.data
    if pc.unit not in CONFIG_UNITS:
        near = difflib.get_close_matches(str(pc.unit), CONFIG_UNITS, n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"unknown [privacy] unit {pc.unit!r}; choose \"example\" (DP per "
                          f"row) or \"person\" (DP per person: all rows of one person of a "
                          f"silo; needs [data] person_column).{hint}")
    for key in ("max_rows_per_person", "persons_in_silos"):
        v = getattr(pc, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"[privacy] {key} must be a whole number ≥ 0 (0 = "
                              f"{'all rows' if key[0] == 'm' else 'every silo'}), got {v!r}")
        if v and pc.unit != "person":
            raise ConfigError(f"[privacy] {key} applies only with [privacy] unit = "
                              f"\"person\", but unit is {pc.unit!r}; remove {key} or set "
                              "unit = \"person\" (with [data] person_column)")
    if pc.unit == "person" and pc.enabled and not dc.person_column:
        raise ConfigError("[privacy] unit = \"person\" needs [data] person_column, the "
                          "column naming the person of each row (data.source = \"table\"); "
                          f"data.source {dc.source!r} names no persons. Set [data] "
                          "person_column, or use [privacy] unit = \"example\" (DP per row)")
    if pc.unit == "person" and pc.enabled and fed is not None:
        require_persons(fed.silos)  # the one check the trainer and the planner make too
    if fed is not None:
        _check_declared_m(pc.persons_in_silos, fed)


def _check_declared_m(m: int, fed) -> None:
    """A declared M above the number of silos is a mistake (a wrong count of hospitals, a
    silo missing from the table), not a bound: refuse it rather than cap it silently."""
    dropped = [d["silo"] for d in fed.meta.get("dropped_silos", [])
               if d["silo"] not in fed.names]
    k = len(fed.names) + len(dropped)
    if m > k:
        raise ConfigError(f"[privacy] persons_in_silos = {m}, but this job has {k} silo(s) "
                          f"({', '.join(list(fed.names) + dropped)}): a person can be seen by "
                          f"at most {k}. Set it to the most silos one person is seen by "
                          f"(1..{k}), or 0 for every silo")


def require_row_unit(cfg: Config, command: str) -> None:
    """ConfigError for [privacy] unit = "person" under a command whose releases are
    bounded per row only (`command`, e.g. "silofl erosion")."""
    if cfg.privacy.enabled and cfg.privacy.unit != "example":
        raise ConfigError(f"{command} bounds its releases per row (add/remove one record) "
                          f"only; [privacy] unit = {cfg.privacy.unit!r} is for `silofl run`. "
                          "Set [privacy] unit = \"example\" for this command")


def apply_privacy(fed, cfg: Config):
    """Attach each silo's (ε_k, δ_k): the default target unless overridden by name.
    Checks [privacy] unit against the silos first (`check_unit`)."""
    pc = cfg.privacy
    if not pc.enabled:
        return fed
    check_unit(cfg, fed)
    default = PrivacyTarget(pc.epsilon, pc.delta)
    overrides = {}
    dropped = {d["silo"] for d in fed.meta.get("dropped_silos", [])}  # listed in the output
    for name, sp in pc.silos.items():
        if name in dropped and name not in fed.names:
            continue
        if name not in fed.names:
            near = difflib.get_close_matches(name, fed.names, n=1)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"[privacy.silos.{name}] names no silo; silos are "
                              f"{', '.join(fed.names)}.{hint}")
        overrides[name] = PrivacyTarget(pc.epsilon if sp.epsilon is None else sp.epsilon,
                                        pc.delta if sp.delta is None else sp.delta)
    return fed.with_targets(default, overrides)


def build_model(cfg: Config, fed: Federation) -> Model:
    mc = cfg.model
    opts = {"gamma": mc.gamma, "alpha": mc.alpha} if mc.name == "focal" else {}
    x_shape = fed.silos[0].X_train.shape
    if mc.name in TORCH_MODELS:  # neural nets: loss from the task, shape from the data
        opts = {"task": fed.task, "input_shape": x_shape[1:], "hidden": mc.hidden or None,
                "seed": cfg.training.seed, "device": cfg.training.device}
    elif cfg.training.device not in ("cpu", "auto"):  # GLMs are NumPy: they run on the CPU
        dev = str(cfg.training.device)
        if dev != "cuda" and not (dev.startswith("cuda:") and dev[5:].isdigit()):
            raise ConfigError(f"unknown [training] device {dev!r}; choose cpu, cuda, cuda:N or "
                              "auto")
        raise ConfigError(f"[training] device = {cfg.training.device!r} only applies to the "
                          f"torch models ({', '.join(TORCH_MODELS)}); model {mc.name!r} is a "
                          "NumPy GLM that runs on the CPU: remove the key or set it to \"cpu\"")
    if mc.hidden and mc.name not in TORCH_MODELS:
        raise ConfigError(f"model.hidden only applies to model 'mlp', not {mc.name!r}; remove it")
    model = make_model(mc.name, fed.dim, max(fed.num_classes, 2), **opts)
    check_input(model, x_shape)
    model.check_task(fed.task)
    check_metric(mc.metric, fed.task)
    return model


def check_metric(metric: str, task: str) -> None:
    """ConfigError for a [model] metric unknown or unfit for `task` ("" = the default)."""
    if metric and metric not in METRICS:
        raise ConfigError(f"unknown model.metric {metric!r}; choose one of "
                          f"{', '.join(METRICS)}")
    if metric == "mse" and task != "regression" or \
            metric in ("accuracy", "auprc", "roc_auc") and task == "regression":
        raise ConfigError(f"metric {metric!r} does not fit a {task} task; use "
                          f"{default_metric(task)!r}")
    if metric in ("auprc", "roc_auc") and task != "binary":
        raise ConfigError(f"metric {metric!r} needs binary labels")


def build_algorithms(cfg: Config) -> list[Algorithm]:
    tc = cfg.training
    if not tc.methods:
        raise ConfigError("training.methods is empty; list at least one of local, fedavg, mrmtl")
    dup = sorted({m for m in tc.methods if tc.methods.count(m) > 1})
    if dup:
        raise ConfigError(f"training.methods lists {', '.join(dup)} more than once; list each "
                          "method once (each would spend the silos' budget again)")
    if "scaffold" in tc.methods:  # before the budget store is opened
        from silofl.algorithms.scaffold import check_step_size
        check_step_size(tc.lr)
    return [make_algorithm(m, lam=tc.lam, weighted=tc.weighted,
                           finetune_fraction=tc.finetune_fraction, clusters=tc.clusters,
                           selection_fraction=tc.selection_fraction,
                           selection_rounds=tc.selection_rounds, we_user=tc.we_user,
                           we_p_s=tc.we_p_s, we_p_d=tc.we_p_d, aggregation=tc.aggregation,
                           attackers=tc.attackers, trim_fraction=tc.trim_fraction,
                           clip_radius=tc.clip_radius, we_options=we_options(tc),
                           prox_mu=tc.prox_mu, apfl_alpha=tc.apfl_alpha,
                           apfl_alpha_lr=tc.apfl_alpha_lr,
                           persons_in_silos=cfg.privacy.persons_in_silos,
                           uldp_weighting=tc.uldp_weighting,
                           uldp_sample_rate=tc.uldp_sample_rate,
                           trees=trees_kwargs(cfg), **ldp_options(tc))
            for m in tc.methods]


def ldp_options(tc) -> dict:
    """The [training] settings of the local-DP methods (privatekt, fedavg_ldp) as
    `make_algorithm` keyword arguments (selection's public seed is training.seed)."""
    return dict(ldp_epsilon=tc.ldp_epsilon, ldp_mechanism=tc.ldp_mechanism,
                ldp_delta=tc.ldp_delta, client_fraction=tc.client_fraction,
                max_participation=tc.max_participation, kt_samples=tc.kt_samples,
                kt_buffer=tc.kt_buffer, kt_self_train=tc.kt_self_train,
                kt_server_epochs=tc.kt_server_epochs, kt_server_lr=tc.kt_server_lr,
                public_seed=tc.seed)


def we_options(tc) -> dict:
    """The [training] we_* options of Weight Erosion as `WeightErosion` keyword arguments
    (the participation schedule's public seed is training.seed)."""
    return dict(update=tc.we_update, participation=tc.we_participation,
                join_round=dict(tc.we_join_round), leave_round=dict(tc.we_leave_round),
                count=tc.we_count, newcomer=tc.we_newcomer, seed=tc.seed)


def training_config(cfg: Config) -> TrainingConfig:
    tc, pc = cfg.training, cfg.privacy
    out = TrainingConfig(rounds=tc.rounds, local_epochs=tc.local_epochs, batch_size=tc.batch_size,
                         lr=tc.lr, clip=tc.clip, l2=tc.l2, private=pc.enabled,
                         accountant=pc.accountant, noise=pc.noise, seed=tc.seed,
                         eval_every=tc.eval_every, clip_quantile=tc.clip_quantile,
                         clip_lr=tc.clip_lr, clip_init=tc.clip_init, clip_max=tc.clip_max,
                         clip_count_noise=tc.clip_count_noise,
                         privacy_unit=pc.unit if pc.enabled else "example",
                         max_rows_per_person=pc.max_rows_per_person)
    check_unit(cfg)
    out.validate()
    return out

"""Graph data on the networked runtime: one pandemic region as a silo program.

The networked silo program (`runtime.network.silo.SiloProgram`) keeps every check, the
reservation of each round in the silo's lifetime store, the algorithm's silo step and its
state on disk; `RegionSiloProgram` supplies only what is specific to a region's persons
and contacts (its data hooks):

* the region is read from the folder of its seven challenge files (``[silo] data``,
  ``data_kind = "graph"``); its features are built with declared constants, the
  "uncharged" ones, or — ``preprocessing = "private"`` — the private release;
* σ is planned by `pipeline.plan_regions` (node-level unit, the release composed in) from
  the silo's own (ε, δ) and the job's public settings;
* every round's local pass is the core trainer under the node-level unit
  (`pipeline.region_trainer`); one pass costs `charges.round_event`;
* the private preprocessing release is reserved with the first round it runs in and
  charged (label "preprocess") before it reads a record; its result is kept in the state
  dir (post-processing afterwards).

The job's public settings travel as ``job["graph"]`` (`GRAPH_KEYS` of `PandemicConfig`, as
JSON); the silo's own (ε, δ) and noise mode never come from the server. The PETs
challenge's federated entry points (`silofl.pandemic.federated`) are presets over this
program and the networked server (`flower_app`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from silofl.config.base import did_you_mean
from silofl.errors import ConfigError
from silofl.io import write_json_atomic
from silofl.models.glm import FocalLoss
from silofl.pandemic.charges import preprocess_event, region_fingerprint, round_event
from silofl.pandemic.constants import declared_constants, private_release
from silofl.pandemic.dataset import PandemicData
from silofl.pandemic.engine import NODE_METHODS, method_of
from silofl.pandemic.inputs import input_dim
from silofl.pandemic.metrics import average_precision
from silofl.pandemic.partition import partition_by_region
from silofl.pandemic.pipeline import (
    PandemicConfig,
    initial_weights,
    plan_regions,
    predict_region,
    region_trainer,
)
from silofl.pandemic.readers import read_dataset
from silofl.pandemic.regions import Region, build_features, fit_region_scaling, raw_weights
from silofl.pandemic.schema import TARGET
from silofl.pandemic.tables import FeatureConstants
from silofl.privacy.ledger import Ledger
from silofl.runtime.network import messages as W
from silofl.runtime.network.hosting import silo_randomness
from silofl.runtime.network.jobspec import check_job as check_job_keys
from silofl.runtime.network.jobspec import job_silos
from silofl.runtime.network.server import JOB_DEFAULTS
from silofl.runtime.network.silo import SiloProgram

#: the settings of a `PandemicConfig` that travel in ``job["graph"]``: the public recipe
#: every region trains with (the rest are the job's own keys, or the silo's: ε, δ, noise)
GRAPH_KEYS = ("S", "priority", "pooling", "t_window", "standardize", "bias_init",
              "prior_weight", "gamma", "alpha", "adjacency", "preprocessing",
              "preprocessing_share", "declared")
#: method settings of a job that a graph job leaves at `JOB_DEFAULTS` (its method is
#: built from the `PandemicConfig`: clusters, we_user and we_update travel)
FIXED_METHOD_KEYS = ("selection_fraction", "selection_rounds", "we_p_s", "we_p_d",
                     "we_participation", "we_join_round", "we_leave_round", "we_count",
                     "we_newcomer", "finetune_fraction")
#: the region's released preprocessing and the input scaling its training used
REGION_FILE = "region.json"


def graph_job(cfg: PandemicConfig, names: list[str], dim: int) -> dict:
    """The public job description of training ``cfg`` over regions ``names`` (silo k =
    names[k]) with models of ``dim`` inputs."""
    cfg.validate()
    if not cfg.private:
        raise ConfigError("the networked runtime runs private jobs only (each silo enforces "
                          "its budget); train a non-private baseline in process "
                          "(`silofl pandemic train --no-private`)")
    job = {**JOB_DEFAULTS, "method": cfg.method, "lam": float(cfg.lam), "rounds": cfg.rounds,
           "local_epochs": float(cfg.local_epochs), "batch_size": cfg.batch_size,
           "lr": float(cfg.lr), "clip": float(cfg.clip), "l2": 0.0, "accountant": "rdp",
           "noise": cfg.noise, "seed": cfg.seed, "model": "focal", "task": "binary",
           "num_classes": 2, "dim": int(dim), "weighted": True,
           "silos": json.dumps(list(names)), "data_kind": "graph",
           "graph": json.dumps({k: getattr(cfg, k) for k in GRAPH_KEYS}, sort_keys=True),
           "clusters": int(cfg.clusters), "we_user": cfg.we_user or "",
           "we_update": cfg.we_update}
    job = check_job_keys(job)
    check_job(job)
    return job


def job_pandemic_config(job: dict, *, epsilon: float = 1.0, delta: float | None = None,
                        noise: str | None = None) -> PandemicConfig:
    """The `PandemicConfig` of a graph job, with a silo's own ε, δ and noise mode."""
    try:
        g = json.loads(job["graph"])
    except json.JSONDecodeError:
        g = None
    if not isinstance(g, dict) or set(g) - set(GRAPH_KEYS):
        raise W.ProtocolError(f"job: 'graph' must be a JSON object with keys among "
                              f"{', '.join(GRAPH_KEYS)}, got {job['graph'][:200]!r}")
    cfg = PandemicConfig(
        federated=True, **g, rounds=job["rounds"], local_epochs=job["local_epochs"],
        batch_size=job["batch_size"], lr=job["lr"], clip=job["clip"], lam=job["lam"],
        method=job["method"], seed=job["seed"], noise=job["noise"] if noise is None else noise,
        private=True, epsilon=epsilon, delta=delta, clusters=job["clusters"],
        we_user=job["we_user"] or None, we_update=job["we_update"])
    cfg.validate()
    return cfg


def check_job(job: dict) -> None:
    """ConfigError unless ``job`` is a graph job the node-level engine runs."""
    fixed = {"model": "focal", "task": "binary", "num_classes": 2, "accountant": "rdp",
             "l2": 0.0, "weighted": True}
    wrong = [f"{k} = {job[k]!r} (must be {v!r})" for k, v in fixed.items() if job[k] != v]
    if wrong:
        raise ConfigError("graph job: " + "; ".join(wrong) + " — the pandemic models are "
                          "focal-loss GLMs accounted by RDP, averaged by region size")
    if job["method"] not in NODE_METHODS:
        raise ConfigError(f"graph job: method {job['method']!r} cannot run on graph data; "
                          f"choose one of {', '.join(NODE_METHODS)}")
    # the method settings a graph job carries are `PandemicConfig`'s (clusters, we_user,
    # we_update), which plan and run alike; the others keep their defaults
    other = [f"{k} = {job[k]!r}" for k in FIXED_METHOD_KEYS if job[k] != JOB_DEFAULTS[k]]
    if other:
        raise ConfigError("graph job: " + "; ".join(other) + " — on graph data these keep "
                          "their defaults (settable: clusters, we_user, we_update)")
    cfg = job_pandemic_config(job)
    if cfg.pooling == "summary" and job["dim"] != input_dim(None, "summary"):
        raise ConfigError(f"graph job: summary pooling gives {input_dim(None, 'summary')} "
                          f"model inputs, the job says dim = {job['dim']}")


def job_algorithm(job: dict):
    check_job(job)
    alg = method_of(job_pandemic_config(job), job_silos(job))
    alg.check_plan(len(job_silos(job)), job["rounds"], job["accountant"])
    return alg


def job_model(job: dict):
    cfg = job_pandemic_config(job)
    return FocalLoss(job["dim"], gamma=cfg.gamma, alpha=cfg.alpha)


def job_params0(job: dict, model) -> np.ndarray:
    return initial_weights(model, job_pandemic_config(job))


def region_name(data: PandemicData, cid: str) -> str:
    """The silo's name, which also keys its seeded streams: ``region-<county>`` when every
    person of the data lives in one county (the name the in-process federated mode gives
    that region, so a seeded networked run reproduces `pipeline.train`), else
    ``client-<cid>``."""
    if data.num_regions == 1 and np.all(data.region == 0):
        return f"region-{int(data.region_codes[0])}"
    return f"client-{cid}"


class RegionSiloProgram(SiloProgram):
    """The silo program of one region (all persons of its data, contacts among them).

    ``data``: the region's `PandemicData` when already read (else read from the config's
    folder); ``recipe``: a `PandemicConfig` whose layout (pooling, S, …) sets `dim` before a
    job is known (the PETs challenge preset's roster asks for it)."""

    def __init__(self, cfg, key=None, *, data: PandemicData | None = None,
                 recipe: PandemicConfig | None = None):
        self._preloaded, self.recipe = data, recipe
        super().__init__(cfg, key)

    # -- data hooks -----------------------------------------------------------------------
    def _data_open(self) -> None:
        data = self._preloaded
        if data is None:
            folder = Path(self.cfg.data)
            if not folder.is_dir():
                raise ConfigError(f"silo {self.cfg.name!r}: [silo] data must be the folder of "
                                  f"the region's seven challenge files, got {str(folder)!r}")
            data = read_dataset(folder)
        self.data = data
        self.region = Region(self.cfg.name, np.arange(data.num_persons))
        self.n_train = self.region.n
        self.fingerprint = region_fingerprint(data, self.region)
        self._built = None   # the graph settings the features were built for
        self.pcfg = None

    @property
    def dim(self) -> int:
        """Model inputs under the job's settings (or the recipe's before a job)."""
        if self.pcfg is None and self.recipe is None:
            return 0  # unknown until a job states the layout
        cfg = self.pcfg or self.recipe
        if cfg.pooling == "summary":
            return input_dim(None, "summary")
        self._build(cfg)
        return input_dim(self.region.features, cfg.pooling)

    def _region_file(self) -> Path:
        return Path(self.cfg.state_dir) / REGION_FILE

    def _saved(self) -> dict | None:
        path = self._region_file()
        return json.loads(path.read_text()) if path.is_file() else None

    def _build(self, cfg: PandemicConfig) -> None:
        """Features for ``cfg`` (once per setting): the privately released constants when
        the state dir holds them, else declared constants (a pending private release
        re-normalizes them in its round) or the "uncharged" fit; input scaling likewise."""
        key = json.dumps({k: getattr(cfg, k) for k in GRAPH_KEYS}, sort_keys=True)
        if self._built == key:
            return
        r, saved = self.region, self._saved()
        r.S = cfg.S
        released = saved is not None and saved["constants"].get("source") == "private"
        constants = FeatureConstants(**saved["constants"]) if released else \
            declared_constants(cfg) if cfg.preprocessing == "private" else None
        build_features(self.data, r, cfg, constants)
        if saved is not None:  # the scaling training used (also for prediction)
            r.shift = None if saved["shift"] is None else np.asarray(saved["shift"], float)
            r.scale = None if saved["scale"] is None else np.asarray(saved["scale"], float)
        elif not (cfg.private_preprocessing and not released):
            fit_region_scaling(r, cfg)
        self._built = key

    @property
    def release_pending(self) -> bool:
        saved = self._saved()
        return self.pcfg.private_preprocessing and (
            saved is None or saved["constants"].get("source") != "private")

    def _data_check(self, job: dict) -> None:
        c = self.cfg
        if job["data_kind"] != "graph":
            raise ConfigError(f"silo {c.name!r} holds graph data (a pandemic region), the job "
                              f"trains on {job['data_kind']!r} data")
        cfg = job_pandemic_config(job, epsilon=c.epsilon, delta=c.delta, noise=c.noise)
        if cfg.preprocessing == "uncharged":  # the silo's guarantee would not hold
            raise ConfigError(f"silo {c.name!r} does not run preprocessing = 'uncharged' (its "
                              "region's statistics, read without any charge, would shape "
                              "the model); use 'declared' or 'private'")
        self._build(cfg)
        got = input_dim(self.region.features, cfg.pooling)
        if job["dim"] != got:
            raise ConfigError(f"silo {c.name!r}: its features give {got} model inputs under "
                              f"pooling {cfg.pooling!r}, the job's model expects {job['dim']}")
        self.pcfg = cfg

    def _data_plan(self, job, algorithm, tcfg):
        """This region's plan from its own (ε, δ). Methods that name or count regions
        (the IFCA family: clusters ≤ regions; Weight Erosion: the user region) are planned
        over the job's regions, the others being stand-ins of this one (σ depends on the
        region's own n, S and target only), as the tabular silo does."""
        names = job_silos(job)
        if job["method"] not in ("weight_erosion",) and not job["method"].startswith("ifca"):
            return plan_regions([self.region], self.pcfg)[0]
        regions = [self.region if n == self.cfg.name else
                   Region(n, self.region.persons, S=self.pcfg.S) for n in names]
        return plan_regions(regions, self.pcfg)[names.index(self.cfg.name)]

    def _data_trainer(self):
        r, c = self.region, self.cfg
        trainer = region_trainer(self.model, [r], self.pcfg)
        trainer.rng = silo_randomness(c.noise, self.job["seed"], c.name)  # its secure flag
        trainer.ledgers = [Ledger(c.name, c.target, "rdp", None, allowance={})]
        return trainer

    def _data_pass_event(self):
        return round_event(self.region, self.pcfg)

    def _data_extra_events(self, t: int) -> list:
        return [preprocess_event(self.region, self.pcfg)] if self.release_pending else []

    def _data_before_step(self, t: int, ledger) -> None:
        """The private release (charged to this round's ledger first), once; then the
        region's constants and scaling are kept for every later round and prediction."""
        r, release = self.region, self.release_pending
        if release:
            r.ledger = ledger
            private_release(r, self.pcfg, self.data.feature_inputs(r.persons))
            fit_region_scaling(r, self.pcfg)
            r.constants = FeatureConstants(**r.features.fitted["constants"])
        if release or self._saved() is None:
            self._keep_region()

    def _keep_region(self) -> None:
        r = self.region
        Path(self.cfg.state_dir).mkdir(parents=True, exist_ok=True)
        write_json_atomic(self._region_file(), {
            "region": r.name, "constants": r.constants.to_dict(),
            "shift": None if r.shift is None else r.shift.tolist(),
            "scale": None if r.scale is None else r.scale.tolist()})

    def _data_evaluate(self, w: np.ndarray) -> float:
        """AUPRC of the region's predictions against its own target file (the challenge's
        score; stays in the silo); ConfigError when its folder holds no target."""
        folder = Path(self.cfg.data)
        if not any((folder / f).is_file() for f in TARGET.filenames()):
            raise ConfigError(f"silo {self.cfg.name!r}: no target file in {folder} to score "
                              "its predictions against")
        y = read_dataset(folder, with_target=True).target.astype(np.int64)
        return average_precision(y, predict_region(self.region, raw_weights(w, self.region),
                                                   self.pcfg))

    # -- prediction -----------------------------------------------------------------------
    def predict(self, message: np.ndarray | None = None) -> np.ndarray:
        """(n,) risk scores of the region's persons (in the data's order) from the silo's
        personal model (`final_model`) folded to raw inputs with the training scaling."""
        if self.plan is None:
            raise ConfigError(f"silo {self.cfg.name!r} has accepted no job; train first")
        w = raw_weights(self.final_model(message), self.region)
        return predict_region(self.region, w, self.pcfg)



def deploy_regions(dataset: Path, data_dir: Path, job: dict) -> tuple[dict, dict]:
    """For `silofl deploy init --regions`: split ``dataset`` (the seven files) into one
    folder per region under ``data_dir`` (`partition.partition_by_region`) and build the
    graph job from ``job``'s settings (`PandemicConfig` field names, e.g. S, pooling,
    method, rounds). Returns ({silo name: its folder}, the job)."""
    from dataclasses import fields

    known = {f.name for f in fields(PandemicConfig)} - {"federated", "private", "epsilon",
                                                         "delta"}
    settings = {k: v for k, v in job.items() if k in known}
    bad = sorted(set(job) - known - {"noise"})
    if bad:
        near = [n for n in (did_you_mean(k, sorted(known)) for k in bad) if n]
        hint = f"; did you mean {', '.join(map(repr, near))}?" if near else ""
        raise ConfigError(f"graph job: unknown setting(s) {bad}{hint}; known: "
                          f"{', '.join(sorted(known))}")
    cfg = PandemicConfig(**settings)
    cfg.validate()
    method_of(cfg)  # the method's own settings (clusters, we_user) fail before any write
    parts = partition_by_region(dataset, data_dir)
    first = read_dataset(next(iter(parts.values())))
    r = Region("probe", np.arange(first.num_persons), S=cfg.S)
    dim = input_dim(None, "summary") if cfg.pooling == "summary" else None
    if dim is None:  # the layout (not the values) of the features gives the inputs
        build_features(first, r, cfg, declared_constants(cfg))
        dim = input_dim(r.features, cfg.pooling)
    return parts, graph_job(cfg, list(parts), dim)

"""Turning a federation + training settings into a per-silo privacy plan.

Before any data is touched we validate the settings, compute each silo's sampling rate
q_k = b/n_k and steps per local pass, calibrate its noise multiplier σ_k from its own
(ε_k, δ_k) for the algorithms' *declared* privacy events, and check the declaration fits.

A *job* may run several methods on the same data (and private preprocessing before
them): everything it releases composes, so one σ_k per silo is calibrated for the whole
composition — each method gets an equal share of the silo's target for this job.
A method with its own releases (dp_gbdt) declares its whole run as ``run_event(σ)`` and
its per-tree row sample as q; it is composed into the same σ_k (example level only).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass, field

import dp_accounting as dpa
import numpy as np

from silofl.algorithms.base import Algorithm
from silofl.config.base import section_dataclass
from silofl.data.federation import Federation
from silofl.errors import CalibrationError, ConfigError, PrivacyError
from silofl.privacy import accounting, events
from silofl.privacy import selection as tuning_accounting
from silofl.privacy.adaptive_clip import (
    DEFAULT_CLIP_INIT,
    DEFAULT_CLIP_LR,
    DEFAULT_CLIP_MAX,
    DEFAULT_QUANTILE,
    RELEASE_TEXT,
    adaptive_event,
    count_noise,
    gradient_noise,
)
from silofl.privacy.node_level import (
    ADJACENCY_TEXT,
    DEFAULT_ORDERS,
    NodeLevelDpEvent,
    affected_examples,
    calibrate_node_sigma,
    node_steps,
)
from silofl.privacy.targets import PERSON_ADJACENCY, PrivacyTarget
from silofl.runtime.clip_check import check_clip
from silofl.runtime.job import accountant_kind
from silofl.runtime.sources import require_persons
from silofl.runtime.uldp_plan import plan_consortium

NOISE_MODES = ("secure", "seeded")
#: the privacy unit: "example" (one training row, Poisson-sampled DP-SGD), "person" (all
#: rows of one person of a silo, `[data] person_column`: persons Poisson-sampled, each
#: sampled person's rows' clipped gradients averaged, the same events with n = persons) or
#: "node" (one person of a graph who appears in ≤ S examples; fixed-size batches without
#: replacement, `privacy.node_level` accounting)
PRIVACY_UNITS = ("example", "person", "node")
#: methods whose private accesses are accounted at example level only (local-DP uploads);
#: the IFCA family's selections and Weight Erosion's one-step gradients have node-level
#: versions (`training.selection.node_sensitivity`, `LocalTrainer.gradients`)
EXAMPLE_LEVEL_ONLY = frozenset({"privatekt", "fedavg_ldp"})
#: what every output of a run with reproducible noise says
SEEDED_NOTE = "reproducible noise — not a privacy guarantee"
#: calibrate to slightly below the target, so that re-evaluating the same composition
#: (in another order, in the budget store) can never land a hair above it
_CALIBRATION_MARGIN = 1e-7


@section_dataclass("TrainingConfig", frozen=True)
class TrainingConfig:
    """Training settings shared by all silos (each silo's σ comes from its own target).

    A checked dataclass on the configuration model's rules (`silofl.config`): wrong types
    and unknown keys are `ConfigError`s. `silofl run` builds it from [training] and
    [privacy] (`silofl.experiments.build.training_config`), whose defaults are the CLI's.

    Attributes
    ----------
    rounds : int, default 100
        Federated rounds.
    local_epochs : float, default 1.0
        Expected passes over a silo's training data per round.
    batch_size : int, default 32
        Expected batch size b; each silo samples with Poisson rate q_k = b / n_k.
    lr : float, default 0.1
        Learning rate, per step.
    clip : float or "auto", default 1.0
        C, the L2 norm bound of each per-example gradient; "auto": each silo tracks the
        `clip_quantile` of its per-example gradient norms privately (Andrew et al. 2021,
        `privacy.adaptive_clip`), a noisy count per step composed into its σ.
    clip_quantile : float or "auto", default 0.7
        clip = "auto": γ in (0, 1), the target fraction of unclipped examples; "auto":
        each silo's γ_k from its public noise level σ_Δ,k√P/m_k, the clipped sum's
        bias-variance balance (`adaptive_clip.auto_quantile`).
    clip_lr : float, default 0.2
        clip = "auto": η_C > 0, the geometric step C ← C·exp(−η_k(b̃ − γ)), η_k =
        min(η_C, ·) smaller where the count is noisy (`adaptive_clip.clip_step`).
    clip_init : float, default 0.3
        clip = "auto": C₀ > 0, every silo's starting clip.
    clip_max : float, default 10.0
        clip = "auto": a public ceiling on C_k (≥ clip_init). Without it a diverging model
        (large gradients → larger C → more noise) can run the clip away (seen on torch
        models at 20–50,000).
    clip_count_noise : float or "auto", default "auto"
        clip = "auto": σ_b, the std of the noise on each step's centred count (examples);
        "auto" = max(expected batch / 20, σ/(2√0.05)) (`adaptive_clip.count_noise`).
    l2 : float, default 0.0
        L2 regularization of the loss.
    private : bool, default True
        DP-SGD with calibrated noise and budget charges (False: no guarantee, no charge).
    accountant : {"pld", "rdp"}, default "pld"
        The accountant σ is calibrated and ε reported with.
    noise : {"secure", "seeded"}, default "secure"
        "secure": a CSPRNG keyed from OS entropy; "seeded": reproducible experiments
        only, not a privacy guarantee (every output says so).
    seed : int, default 0
        Seed of the seeded noise and of model initialization.
    eval_every : int, default 1
        Evaluate the test metric every this many rounds.
    noise_multiplier : float or None, default None
        A fixed σ instead of calibrating it (the ledgers still refuse anything over the
        target).
    privacy_unit : {"example", "person", "node"}, default "example"
        One training row, all rows of one person of a silo, or one person of a contact
        graph.
    max_rows_per_person : int, default 0
        Person level: the most rows of one sampled person a step reads (a uniformly
        random subset; 0 = all of them). The person's contribution is the average of the
        rows' clipped gradients either way, so its norm is ≤ C.
    node_S : int, default 1
        Node level: the most examples one person appears in.
    adjacency : {"node+edges", "node"}, default "node+edges"
        Node level: a person and their contacts, or a fixed public graph.
    """

    rounds: int = 100
    local_epochs: float = 1.0
    batch_size: int = 32
    lr: float = 0.1
    clip: float | str = 1.0
    l2: float = 0.0
    private: bool = True
    accountant: str = accounting.DEFAULT_ACCOUNTANT
    noise: str = "secure"  # "secure" (CSPRNG keyed from OS entropy) or "seeded" (reproducible
                           # experiments only: not a privacy guarantee)
    seed: int = 0
    eval_every: int = 1
    #: fix σ instead of calibrating it (ledgers still refuse anything over the target)
    noise_multiplier: float | None = None
    #: "example" (default) or "node": see `PRIVACY_UNITS`; node level needs `node_S` (each
    #: person appears in ≤ node_S examples) and `adjacency` ("node+edges" | "node")
    privacy_unit: str = "example"
    max_rows_per_person: int = 0
    node_S: int = 1
    adjacency: str = "node+edges"
    #: clip = "auto" (`privacy.adaptive_clip`): γ, η_C, C₀, σ_b
    clip_quantile: float | str = DEFAULT_QUANTILE
    clip_lr: float = DEFAULT_CLIP_LR
    clip_init: float = DEFAULT_CLIP_INIT
    clip_max: float = DEFAULT_CLIP_MAX
    clip_count_noise: float | str = "auto"

    @property
    def adaptive_clip(self) -> bool:
        """Whether clip = "auto" (private adaptive clipping)."""
        return self.clip == "auto"

    def validate(self) -> None:
        """Check every setting.

        Raises
        ------
        ConfigError
            The first invalid setting, with its valid range.
        """
        def bad(msg):
            raise ConfigError(msg)
        if not (isinstance(self.rounds, int) and self.rounds >= 1):
            bad(f"rounds must be a positive integer, got {self.rounds}")
        if not self.local_epochs > 0:
            bad(f"local_epochs must be positive, got {self.local_epochs}")
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            bad(f"batch_size must be a positive integer, got {self.batch_size}")
        if not (math.isfinite(self.lr) and self.lr >= 0):
            bad(f"learning rate lr must be a non-negative number, got {self.lr}")
        check_clip(self, bad)
        if not (math.isfinite(self.l2) and self.l2 >= 0):
            bad(f"l2 must be non-negative, got {self.l2}")
        if self.accountant not in accounting.ACCOUNTANTS:
            bad(f"accountant must be one of {', '.join(accounting.ACCOUNTANTS)}, "
                f"got {self.accountant!r}")
        if self.noise not in NOISE_MODES:
            bad(f"noise must be 'secure' (OS entropy, the default) or 'seeded' "
                f"(reproducible, not a privacy guarantee), got {self.noise!r}")
        if self.noise_multiplier is not None and not self.noise_multiplier > 0:
            bad(f"noise_multiplier must be positive, got {self.noise_multiplier}")
        if not (isinstance(self.eval_every, int) and self.eval_every >= 1):
            bad(f"eval_every must be a positive integer, got {self.eval_every}")
        if self.privacy_unit not in PRIVACY_UNITS:
            bad(f"privacy_unit must be 'example' (one training row), 'person' (all rows of "
                f"one person, [data] person_column) or 'node' (one person of a contact "
                f"graph), got {self.privacy_unit!r}")
        if not (isinstance(self.max_rows_per_person, int) and self.max_rows_per_person >= 0):
            bad(f"max_rows_per_person (the most rows of one person a step reads; 0 = all) "
                f"must be a non-negative integer, got {self.max_rows_per_person!r}")
        if self.privacy_unit == "node":
            if not (isinstance(self.node_S, int) and self.node_S >= 1):
                bad(f"node_S (the most examples one person appears in) must be a positive "
                    f"integer, got {self.node_S!r}")
            if self.adjacency not in ("node+edges", "node"):
                bad(f"adjacency must be 'node+edges' (a person and their contacts) or "
                    f"'node' (a fixed, public graph), got {self.adjacency!r}")


@dataclass
class SiloPlan:
    name: str
    n: int
    q: float
    steps_per_pass: int
    target: PrivacyTarget | None
    noise_multiplier: float | None = None
    declared: object = field(default=None, repr=False)  # this method's DpEvent for the run
    #: how σ was calibrated: methods sharing the job's target, preprocessing composed in
    calibrated_for: str = ""
    #: node-level unit: {"S", "adjacency", "batch_size"} (None: example level)
    node: dict | None = None
    #: clip = "auto": σ_b, the noise std of each step's count (None: a fixed clip)
    count_noise: float | None = None
    #: "example" (n counts rows) or "person" (n counts persons; node level: see `node`)
    unit: str = "example"
    #: clip = "auto": the silo's clip after training (a function of its noisy releases)
    final_clip: float | None = None
    #: clip = "auto": the target quantile γ_k of the silo's last clip update (public)
    clip_target: float | None = None
    #: a consortium-wide mechanism (uldp): its report (`privacy.uldp.consortium_report`)
    consortium: dict | None = None
    #: a method with its own releases (dp_gbdt, `run_event`): {"trees", "releases"}
    trees: dict | None = None

    def to_dict(self) -> dict:
        out = {"silo": self.name, "n_train": self.n, "sampling_rate": self.q,
               "steps_per_pass": self.steps_per_pass, "noise_multiplier": self.noise_multiplier,
               "target_epsilon": self.target.epsilon if self.target else None,
               "delta": self.target.delta if self.target else None,
               "calibrated_for": self.calibrated_for}
        if self.count_noise is not None and self.noise_multiplier is not None:
            out.update(clip="auto", count_noise=self.count_noise, final_clip=self.final_clip,
                       clip_target_quantile=self.clip_target,
                       gradient_noise_multiplier=gradient_noise(self.noise_multiplier,
                                                                self.count_noise),
                       clip_release=RELEASE_TEXT)
        if self.unit == "person":
            out.update(privacy_unit="person", n_persons=out.pop("n_train"),
                       adjacency_text=PERSON_ADJACENCY)
        if self.consortium is not None:
            out["consortium"] = self.consortium
        if self.trees is not None:  # q is the per-tree row sample; no DP-SGD steps
            out.update(trees=self.trees, steps_per_pass=None)
        if self.node is not None:
            adj = self.node["adjacency"]
            out.update(privacy_unit="node", S=self.node["S"], adjacency=adj,
                       adjacency_text=ADJACENCY_TEXT[adj],
                       affected_examples=affected_examples(self.n, self.node["S"], adj))
        return out


def job_targets(plans: list[SiloPlan]) -> dict[str, PrivacyTarget]:
    """The job target of each private plan's silo.

    Parameters
    ----------
    plans : the plans of a private run (one per silo).

    Returns
    -------
    Silo name → its `PrivacyTarget` for this job.

    Raises
    ------
    PrivacyError
        A plan carries no target (a non-private plan: nothing to reserve against).
    """
    out = {}
    for p in plans:
        if p.target is None:
            raise PrivacyError(f"silo {p.name!r}: the plan has no privacy target (a "
                               "non-private plan), so there is nothing to reserve against")
        out[p.name] = p.target
    return out


def plan_silos(fed: Federation, algorithm: Algorithm, cfg: TrainingConfig) -> list[SiloPlan]:
    """Validate, then calibrate σ_k per silo for `algorithm`'s declared events alone."""
    return plan_job(fed, [algorithm], cfg)[0]


def plan_job(fed: Federation, algorithms: list[Algorithm], cfg: TrainingConfig,
             extra: dict[str, object] | None = None) -> list[list[SiloPlan]]:
    """Plans for running every algorithm of a job on `fed`: per silo one σ_k such that
    `extra[silo]` (events spent before training, e.g. private preprocessing) composed with
    every algorithm's declared events meets the silo's target. Returns one plan list per
    algorithm (same σ_k in each, `declared` = that algorithm's own events)."""
    per_alg = [_base_plans(fed, alg, cfg) for alg in algorithms]
    if any(getattr(a, "consortium", False) for a in algorithms):  # ULDP: one σ for all
        plan_consortium(algorithms, per_alg[0], cfg, extra)
        return per_alg
    if not cfg.private:
        return per_alg
    if any(not getattr(a, "calibrated", True) for a in algorithms):
        return _plan_local_dp(algorithms, per_alg, cfg, extra)
    extra = extra or {}
    parts = [f"{len(algorithms)} methods composed" if len(algorithms) > 1 else "1 method"]
    if cfg.adaptive_clip:
        parts.append(f"clip auto: quantile γ = {_gamma_text(cfg.clip_quantile)}, each step's noisy count "
                     "(σ_b) composed in")
    for k, p in enumerate(per_alg[0]):
        pre = extra.get(p.name)
        where = ", ".join(parts + (["preprocessing"] if pre is not None else []))
        sigma = cfg.noise_multiplier or _calibrate(algorithms, [ps[k] for ps in per_alg],
                                                   cfg, pre)
        sb = count_noise(cfg.clip_count_noise, sigma, p.q * p.n) if cfg.adaptive_clip \
            else None
        if sb is not None:
            gradient_noise(sigma, sb)  # ConfigError now when σ_b leaves no gradient noise
        for alg, ps in zip(algorithms, per_alg):
            ps[k].noise_multiplier, ps[k].count_noise = sigma, sb
            ps[k].declared = _declared(alg, ps[k], sigma, cfg)
            ps[k].calibrated_for = where
    return per_alg


# --- methods with a fixed local mechanism per upload (PrivateKT, FedAvg-LDP) ---------------
def _plan_local_dp(algorithms, per_alg, cfg: TrainingConfig, extra) -> list[list[SiloPlan]]:
    """No σ to calibrate: each client's declared event is its uploads at the method's fixed
    per-round ε, for as many rounds as fit its target (`privacy_events`). Such a method
    spends up to the whole target, so it runs as a job of its own."""
    if cfg.adaptive_clip:
        raise ConfigError(f"{algorithms[0].name}: clip = \"auto\" is for DP-SGD methods; a "
                          "local-DP upload is clipped to a fixed bound: set [training] clip "
                          "to a number")
    if len(algorithms) > 1 or extra:
        names = ", ".join(a.name for a in algorithms)
        raise ConfigError(
            f"{names}: a local-DP method (privatekt, fedavg_ldp) spends a fixed ε per round "
            "until the client's target is used up, so it cannot share a job with other "
            "methods or private preprocessing; run it as a job of its own (training.methods "
            "= ['privatekt']) — `silofl sweep` runs every method separately")
    alg, plans = algorithms[0], per_alg[0]
    for p in plans:
        p.declared = alg.privacy_events(None, cfg.rounds, target=p.target)
        p.calibrated_for = f"{alg.name}: fixed local ε per round, no DP-SGD"
    if all(isinstance(p.declared, dpa.NoOpDpEvent) for p in plans):
        raise PrivacyError(
            f"{alg.name}: no client's target covers even one round's upload (ε = "
            f"{alg.epsilon:g} per round); raise privacy.epsilon (the per-client total for the "
            "job) or lower training.ldp_epsilon")
    return per_alg


def _base_plans(fed: Federation, algorithm: Algorithm, cfg: TrainingConfig) -> list[SiloPlan]:
    cfg.validate()
    algorithm.bind_silos(fed.names)
    algorithm.check_plan(fed.num_silos, cfg.rounds, cfg.accountant if cfg.private else None)
    if getattr(algorithm, "run_event", None) is not None:  # dp_gbdt: its own releases
        return _own_release_plans(fed, algorithm, cfg)
    if cfg.privacy_unit == "node":
        return _node_plans(fed, algorithm, cfg)
    person = cfg.privacy_unit == "person"
    if person:
        _check_person_unit(fed, algorithm)
    plans, full_batch = [], []
    for s in fed.silos:
        n = s.n_persons if person else s.n_train  # the unit sampled: persons or rows
        # b ≥ n_k: every step uses the whole silo (q_k = 1, no amplification by sampling;
        # thesis setting for small schools) — allowed, with a notice
        q = min(1.0, cfg.batch_size / n)
        if q == 1.0:
            full_batch.append(f"{s.name} (n = {n})")
        steps = algorithm.fixed_steps_per_pass or \
            accounting.steps_for_epochs(n, cfg.batch_size, cfg.local_epochs)
        plans.append(SiloPlan(s.name, n, q, steps, s.target,
                              unit="person" if person else "example"))
    if full_batch:
        warnings.warn(
            f"batch_size {cfg.batch_size} ≥ the training examples of {len(full_batch)} "
            f"silo(s): {', '.join(full_batch[:5])}{' …' if len(full_batch) > 5 else ''}. "
            "They take full-batch steps (sampling rate q = 1, no privacy amplification by "
            "sampling); each silo's q is in the privacy report", stacklevel=2)
    if not cfg.private:
        return plans
    for p in plans:
        if p.target is None:
            raise PrivacyError(f"silo {p.name!r} has no privacy target; set privacy.epsilon "
                               "and privacy.delta (or disable privacy for a non-private run)")
        if p.target.delta >= 1.0 / p.n:
            warnings.warn(
                f"silo {p.name!r}: delta = {p.target.delta:g} ≥ 1/n = {1 / p.n:.3g}. A "
                "mechanism that publishes one random record outright satisfies such a δ, so "
                "the guarantee is weak; use δ well below 1/n (e.g. n^-1.1)", stacklevel=2)
    return plans


def _own_release_plans(fed: Federation, algorithm, cfg: TrainingConfig) -> list[SiloPlan]:
    """Plans of a method whose run is one event of σ (`run_event`; dp_gbdt): q is its
    per-tree row sample; example level only (`algorithm.unit_error` otherwise)."""
    if cfg.privacy_unit != "example":
        raise ConfigError(algorithm.unit_error)
    trees = {"trees": algorithm.total_trees, "releases_per_tree": algorithm.releases}
    plans = [SiloPlan(s.name, s.n_train, algorithm.sampling_rate, 0, s.target, trees=trees)
             for s in fed.silos]
    if cfg.private and any(p.target is None for p in plans):
        raise PrivacyError("every silo needs a privacy target; set privacy.epsilon and "
                           "privacy.delta (or disable privacy for a non-private run)")
    return plans


def _check_person_unit(fed: Federation, algorithm: Algorithm) -> None:
    """Refuse the person-level unit where it cannot hold: silos without person ids, and
    methods whose private accesses are accounted per example only (local-DP uploads)."""
    require_persons(fed.silos)
    if algorithm.name in EXAMPLE_LEVEL_ONLY or not getattr(algorithm, "calibrated", True):
        raise ConfigError(
            f"{algorithm.name} is not available with [privacy] unit = \"person\": its "
            "local-DP uploads are accounted per example; use a DP-SGD method (local, fedavg, "
            "mrmtl, ditto, finetune, mocha, the ifca family, weight_erosion, fedprox, "
            "scaffold, apfl, fedper, fedrep, fedbn)")
    # private tuning (`tuning.private`) scores (X, y) validation rows with a per-row Δ: a
    # person with k validation rows would move the score k times as far as charged
    rows = [v for v in getattr(algorithm, "validation", None) or [] if not hasattr(v, "scores")]
    if rows:
        raise ConfigError(
            f"{algorithm.name} scores its validation rows one row at a time, so it is not "
            "available with [privacy] unit = \"person\": give one person-level `Validation` "
            "per silo (its scores and sensitivity over persons), or choose λ with "
            "training.lam = \"auto\" (free) or tuning.mode = 'proxy' (declared-public data)")


def _node_plans(fed: Federation, algorithm: Algorithm, cfg: TrainingConfig) -> list[SiloPlan]:
    """Plans under the node-level unit: every step a batch of exactly b of the silo's n
    persons (b ≤ n), `privacy.node_level.node_steps` steps per epoch (Weight Erosion's
    gradient: one step per round); refused for methods whose private accesses are
    accounted at example level only (local-DP uploads). σ is calibrated in
    `_calibrate_node` for everything composed: the passes, the IFCA family's selections
    (zCDP) and any preprocessing."""
    if algorithm.name in EXAMPLE_LEVEL_ONLY or not getattr(algorithm, "calibrated", True):
        raise ConfigError(
            f"{algorithm.name} is not available with privacy_unit = 'node': its local-DP "
            "uploads are accounted at example level only; use local, fedavg, mrmtl, "
            "finetune, ditto, mocha, the ifca family or weight_erosion")
    plans = []
    for s in fed.silos:
        if cfg.batch_size > s.n_train:
            raise ConfigError(
                f"batch_size {cfg.batch_size} is larger than silo {s.name!r} ({s.n_train} "
                "persons); node-level batches are drawn without replacement: use "
                f"batch_size ≤ {min(x.n_train for x in fed.silos)}")
        if cfg.node_S > s.n_train:
            raise ConfigError(f"node_S = {cfg.node_S} exceeds silo {s.name!r}'s "
                              f"{s.n_train} persons")
        steps = algorithm.fixed_steps_per_pass or \
            node_steps(s.n_train, cfg.batch_size, cfg.local_epochs)
        plans.append(SiloPlan(s.name, s.n_train, cfg.batch_size / s.n_train, steps, s.target,
                              node={"S": cfg.node_S, "adjacency": cfg.adjacency,
                                    "batch_size": cfg.batch_size}))
    if cfg.private:
        for p in plans:
            if p.target is None:
                raise PrivacyError(f"silo {p.name!r} has no privacy target; set epsilon "
                                   "(or disable privacy for a non-private run)")
    return plans


def pass_event(p: SiloPlan, sigma: float):
    """What one local pass of `p`'s silo costs at noise multiplier `sigma`: a
    Poisson-sampled Gaussian (example level) or a `NodeLevelDpEvent` (node level)."""
    if p.node is None:
        if p.count_noise is not None:  # clip = "auto": each step also releases a count
            return adaptive_event(p.q, sigma, p.count_noise, p.steps_per_pass)
        return accounting.dpsgd_event(p.q, sigma, p.steps_per_pass)
    return NodeLevelDpEvent(p.n, p.node["S"], p.node["batch_size"], sigma, p.steps_per_pass,
                            p.node["adjacency"])


def _declared(algorithm: Algorithm, p: SiloPlan, sigma: float, cfg: TrainingConfig):
    if p.trees is not None:  # a method with its own releases (dp_gbdt)
        return algorithm.run_event(sigma)  # type: ignore[attr-defined]
    return algorithm.privacy_events(pass_event(p, sigma), cfg.rounds, target=p.target)


def _job_event(algorithms: list[Algorithm], plans: list[SiloPlan], cfg: TrainingConfig,
               sigma: float, pre):
    parts = [_declared(a, p, sigma, cfg) for a, p in zip(algorithms, plans)]
    if pre is not None:
        parts.append(pre)
    return parts[0] if len(parts) == 1 else dpa.ComposedDpEvent(parts)


def _calibrate(algorithms: list[Algorithm], plans: list[SiloPlan], cfg: TrainingConfig,
               pre) -> float:
    p = plans[0]
    probe = _job_event(algorithms, plans, cfg, 1.0, pre)
    counts = events.flatten(probe)
    target = p.target
    if target is None:  # plan_silos calibrates private plans only, and those carry a target
        raise PrivacyError(f"silo {p.name!r}: no privacy target to calibrate σ for")
    eps, delta = target.epsilon * (1 - _CALIBRATION_MARGIN), target.delta
    if p.node is not None:
        sigma = _calibrate_node(algorithms, plans, cfg, pre, eps, delta)
        if sigma is not None:
            return sigma
    # events the preferred accountant cannot handle (zCDP selections) are calibrated with RDP
    preferred = accountant_kind(cfg.accountant)
    kind = preferred if accounting.make_accountant(preferred).supports(probe) else "rdp"
    # --- private tuning (silofl.tuning): RepeatAndSelect's σ from its closed-form RDP
    guess = None
    if tuning_accounting.is_tuned(probe):
        guess = tuning_accounting.sigma_guess(
            lambda s: _job_event(algorithms, plans, cfg, s, pre), eps, delta)
    try:
        if len(counts) == 1 and isinstance(next(iter(counts)), dpa.PoissonSampledDpEvent) \
                and all(q.trees is None for q in plans):
            # pure DP-SGD: fast, exact path
            return accounting.calibrate_dpsgd(eps, delta, p.q, next(iter(counts.values())),
                                              kind)
        return accounting.calibrate(lambda s: _job_event(algorithms, plans, cfg, s, pre),
                                    eps, delta, kind, guess=guess,
                                    guess_is_minimal=guess is not None)
    except CalibrationError:
        raise CalibrationError(
            f"silo {p.name!r} (n = {p.n}, q = {p.q:.3g}): no noise multiplier up to 1e4 "
            f"reaches ε = {target.epsilon:g} at δ = {delta:g} for {where_of(algorithms, pre)};"
            " the target is too strict for this many steps. Raise epsilon or delta, train "
            "for fewer rounds or methods, or use a smaller batch (lower sampling rate)"
        ) from None
    except PrivacyError as e:
        raise type(e)(f"silo {p.name!r} (n = {p.n}, q = {p.q:.3g}): {e}") from None


def _calibrate_node(algorithms, plans, cfg, pre, eps: float, delta: float) -> float | None:
    """The node-level fast path: the methods' σ-dependent events are one node-level step
    repeated (any number of passes and rounds); the rest — `pre` (if any) and the IFCA
    family's selections (zCDP: RDP ξ + ρα) — bring fixed RDP curves composed in as
    `base_rdp`: `privacy.node_level.calibrate_node_sigma` bisects σ for the total steps — the
    calibration the pandemic pipeline always used. None: use the generic search."""
    p = plans[0]
    counts = events.flatten(_job_event(algorithms, plans, cfg, 1.0, None))
    fixed = {e: c for e, c in counts.items() if isinstance(e, dpa.ZCDpEvent)}
    varying = {e: c for e, c in counts.items() if e not in fixed}
    if any(type(e).__name__ != "NodeLevelDpEvent" for e in varying):
        return None
    parts = Counter(fixed)
    if pre is not None:
        parts.update(events.flatten(pre))  # Counter: adds counts of repeated events
    orders = np.asarray(DEFAULT_ORDERS, dtype=float)
    base = None
    if parts:
        if any(not (hasattr(e, "rdp") or isinstance(e, dpa.ZCDpEvent)) for e in parts):
            return None
        base = sum(c * (e.xi + e.rho * orders if isinstance(e, dpa.ZCDpEvent)
                        else e.rdp(DEFAULT_ORDERS)) for e, c in parts.items())
    total = sum(e.steps * c for e, c in varying.items())
    try:
        return calibrate_node_sigma(eps, p.n, p.node["S"], p.node["batch_size"], total, delta,
                                    adjacency=p.node["adjacency"], base_rdp=base)
    except CalibrationError as e:
        raise CalibrationError(f"silo {p.name!r} (n = {p.n}): {e}") from None


def where_of(algorithms: list[Algorithm], pre) -> str:
    names = ", ".join(a.name for a in algorithms)
    return names + (" and private preprocessing" if pre is not None else "")


def noise_multipliers(plans: list[SiloPlan]) -> np.ndarray | None:
    if plans[0].noise_multiplier is None:
        return None
    return np.array([p.noise_multiplier for p in plans])


def _gamma_text(quantile: float | str) -> str:
    """How a report names the target quantile setting."""
    if quantile == "auto":
        return "auto (each silo's from its noise level σ_Δ√P/m, public)"
    return f"{float(quantile):g}"

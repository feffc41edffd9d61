"""Preprocessing in two phases, so that every silo's budget is charged before any statistic
of its data is computed.

1. A loader's ``*_raw`` variant returns a `RawFederation`: features encoded by the schema
   (values clipped to declared bounds, NaN where a value is missing), labels encoded and a
   seeded train/test split -- no statistic of the data computed.
2. `plan_preprocessing(raw, spec, targets)` reads only public things (the schema, each
   silo's training size n_k, its (ε_k, δ_k)) and returns a `PreprocessPlan`: per silo the
   dp_accounting event of its private statistics (or None), the steps, and the names of
   everything *uncharged*. The caller charges ``plan.events[silo]`` to each ledger.
3. `apply_preprocessing(raw, plan, rng)` computes the statistics and returns the finished
   `Federation`, with ``meta["preprocessing"]`` (the steps) and ``meta["uncharged"]``.

Modes (`PreprocessSpec`; per step, standardization of numeric columns and imputation of
nullable numeric/binary columns):

* ``"declared"`` -- from the schema alone: standardize with declared mean/scale, else map
  [lower, upper] to [-1, 1]; impute with the declared fill, else the bounds' midpoint (the
  ``col__missing`` indicator lets the model correct). Costs nothing.
* ``"private"`` -- per silo, ONE Gaussian-mechanism release over its training rows of, for
  every released column j, the vector (Σ o, Σ o·u, Σ o·(u² − 1)) with o = 1 if the value is
  observed and u ∈ [-1, 1] the value clipped to the declared bounds and mapped linearly.
  Sensitivity (add/remove one record): the record adds o·(1, u, u² − 1) per column, whose
  squared norm is o·(2 − u² + u⁴) ≤ 2 for u² ∈ [0, 1] (convex in u², equal to 2 at u = 0
  and |u| = 1), so Δ₂ = √(2·d) for d released columns, attained by a record observed
  everywhere at u ∈ {-1, 0, 1}. (The plain (count, Σu, Σu²) would need √(3·d); Σu² is
  recovered as Σ(u² − 1) + count by post-processing.) Noise N(0, σ²Δ²) per coordinate, σ
  calibrated so the release alone costs ``share``·ε_k at δ_k (default 10 %); the event is
  ``GaussianDpEvent(σ)``. Means, variances and fills are post-processed (count clamped to
  [1, n_k], mean to [-1, 1], second moment to [mean², 1], standard deviation floored at
  `column_stats.MIN_STD` half-ranges); the private fill is the noisy mean.
* ``"uncharged"`` -- per-silo training mean/std and training medians, read without any
  charge (a silo that never observed a value gets the declared fill, the bounds' midpoint
  or 0 -- never another silo's statistic). Every such item is listed by name.
* ``"none"`` -- standardization only: leave values in their (clipped) units.
* ``"auto"`` (default) -- declared wherever the schema gives what the step needs (mean and
  scale or bounds; fill or bounds); where it does not, refuse with the fix -- except where
  uncharged preprocessing was opted into or the data are simulated, which use
  ``"uncharged"`` there (listed).

No statistic ever crosses silos. One-hot and missing-indicator columns are left as 0/1.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn, TypedDict

import numpy as np

from silofl.data.column_stats import (
    SENSITIVITY_PER_COLUMN,
    NoiseSource,
    ReleaseProbe,
    center_scale,
    declared_bounds,
    fill_value,
    moments_from_statistics,
    release_statistics,
)
from silofl.data.federation import Federation, Silo
from silofl.data.lazy import is_lazy
from silofl.data.lazy_stats import check_lazy_plan, preprocess_lazy_silo
from silofl.data.raw import RawFederation
from silofl.data.schema import ColumnSpec
from silofl.errors import ConfigError, PrivacyError
from silofl.privacy import accounting
from silofl.privacy.targets import PrivacyTarget

STANDARDIZE_MODES = ("auto", "declared", "private", "uncharged", "none")
IMPUTE_MODES = ("auto", "declared", "private", "uncharged")
DEFAULT_SHARE = 0.1


# --- spec, steps, plan ------------------------------------------------------------------------

def _standardize_mode(value: str | bool) -> str:
    """A standardization mode; old configs wrote a bool (True: "auto", False: "none")."""
    if isinstance(value, bool):
        return "auto" if value else "none"
    return value


@dataclass(frozen=True)
class PreprocessSpec:
    """What to do: `standardize` in STANDARDIZE_MODES, `impute` in IMPUTE_MODES (bools are
    read as "auto" / "none" for old configs), `share` ∈ (0, 1) of each silo's ε spent on
    private statistics, `allow_uncharged` to accept uncharged items (also implied by a
    mode "uncharged"). See the module docstring."""

    standardize: str = "auto"
    impute: str = "auto"
    share: float = DEFAULT_SHARE
    allow_uncharged: bool = False
    unit: str = "example"  # "person": each person's rows are one contribution (per person)

    def __post_init__(self) -> None:
        if isinstance(self.standardize, bool):  # old configs: standardize = true/false
            object.__setattr__(self, "standardize", _standardize_mode(self.standardize))
        if isinstance(self.impute, bool):
            raise ConfigError("impute must be a mode name, one of " + ", ".join(IMPUTE_MODES))
        for key, modes in (("standardize", STANDARDIZE_MODES), ("impute", IMPUTE_MODES)):
            v = getattr(self, key)
            if v not in modes:
                near = difflib.get_close_matches(str(v), modes, n=1)
                hint = f" Did you mean {near[0]!r}?" if near else ""
                raise ConfigError(f"{key} must be one of {', '.join(modes)}; got {v!r}.{hint}")
        if self.unit not in ("example", "person"):
            raise ConfigError(f"preprocessing unit must be 'example' or 'person': {self.unit!r}")
        share = self.share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or \
                not 0 < share < 1:
            raise ConfigError(f"preprocessing share must be a fraction of ε in (0, 1), got "
                              f"{share!r}; e.g. 0.1 spends 10% of each silo's ε on it")

    @classmethod
    def of(cls, standardize: str | bool = "auto", impute: str = "auto") -> PreprocessSpec:
        """The loaders' form: `standardize` may also be a bool (True: "auto", False: "none").

        Parameters
        ----------
        standardize : str or bool
            A mode of STANDARDIZE_MODES, or a bool as old configs wrote it.
        impute : str
            A mode of IMPUTE_MODES.

        Returns
        -------
        PreprocessSpec
            With the default `share` and no uncharged opt-in beyond the modes.
        """
        return cls(_standardize_mode(standardize), impute)

    @property
    def uncharged_ok(self) -> bool:
        return self.allow_uncharged or "uncharged" in (self.standardize, self.impute)


@dataclass(frozen=True)
class Step:
    """One preprocessing step on one column. `noise` (private steps) maps each silo to the
    standard deviation σ_k·Δ of the Gaussian noise on every released coordinate (in units
    of u ∈ [-1, 1] per record)."""

    what: str           # "impute" | "standardize"
    column: str
    mode: str           # "declared" | "private" | "uncharged"
    mechanism: str
    noise: Mapping[str, float] | None = None

    def to_dict(self) -> dict:
        return {"what": self.what, "column": self.column, "mode": self.mode,
                "mechanism": self.mechanism,
                "noise": dict(self.noise) if self.noise is not None else None}


@dataclass
class PreprocessPlan:
    """Everything preprocessing will do, fixed before the data is read (see the module
    docstring). `events[silo]` is the DpEvent to charge (None: nothing private);
    `released` are the encoded column ids of the private release, `sensitivity` its L2
    sensitivity Δ and `noise_multipliers[silo]` σ_k; `uncharged` names every item read
    from the data without a charge."""

    spec: PreprocessSpec
    steps: list[Step]
    events: dict[str, object | None]
    uncharged: list[str]
    released: list[int]
    sensitivity: float
    noise_multipliers: dict[str, float]
    silos: list[str]
    dim: int

    @property
    def private(self) -> bool:
        return bool(self.released)

    def to_meta(self) -> dict:
        """A JSON-ready record of the plan (no statistic of the data in it)."""
        return {"standardize": self.spec.standardize, "impute": self.spec.impute,
                "unit": self.spec.unit,
                "share": self.spec.share if self.private else 0.0,
                "sensitivity": self.sensitivity, "noise_multiplier": dict(self.noise_multipliers),
                "steps": [s.to_dict() for s in self.steps]}


def _resolve(raw: RawFederation, spec: PreprocessSpec) -> tuple[list[Step], list[int], list[str]]:
    """(steps without noise, released column ids, uncharged items); raises ConfigError
    where a step cannot be done as asked."""
    ok = spec.uncharged_ok or raw.simulated
    uncharged = list(raw.uncharged)
    if uncharged and not ok:
        _refuse_uncharged(raw, uncharged)
    steps: list[Step] = []
    released: list[int] = []
    lacking: dict[str, list[str]] = {"standardize": [], "impute": []}
    for j in sorted(raw.specs):
        col = raw.specs[j]
        asked: list[tuple[str, Step | None]] = []
        if col.nullable:
            asked.append(("impute", _impute_step(col, spec.impute, ok)))
        if col.kind == "numeric" and spec.standardize != "none":
            asked.append(("standardize", _standardize_step(col, spec.standardize, ok)))
        private = False
        for what, step in asked:
            if step is None:  # "auto" without what the step needs: refused below, all at once
                lacking[what].append(col.name)
                continue
            steps.append(step)
            private |= step.mode == "private"
            if step.mode == "uncharged":
                uncharged.append(_UNCHARGED_ITEM[what].format(col.name))
        if private:
            released.append(j)
    if lacking["standardize"] or lacking["impute"]:
        _refuse_lacking(raw, lacking)
    return steps, released, uncharged


_UNCHARGED_ITEM = {
    "impute": "per-silo training median of {!r} (imputation)",
    "standardize": "per-silo training mean and standard deviation of {!r} (standardization)",
}


def _impute_step(col: ColumnSpec, asked: str, uncharged_ok: bool) -> Step | None:
    """The imputation step of nullable column `col` (None: "auto" lacks a declared fill)."""
    has = col.fill is not None or col.bounds is not None
    mode = _mode(asked, has, uncharged_ok)
    if mode is None:
        return None
    if mode == "declared" and not has:
        raise ConfigError(f"impute='declared' needs a declared fill or bounds for "
                          f"column {col.name!r}; declare them in the schema")
    if mode == "private" and col.bounds is None:
        raise ConfigError(f"impute='private' needs declared lower/upper bounds for "
                          f"column {col.name!r}; declare them in the schema")
    mech = {"declared": "declared fill" if col.fill is not None
            else "midpoint of the declared bounds",
            "private": "noisy mean from the Gaussian release",
            "uncharged": "per-silo training median"}[mode]
    return Step("impute", col.name, mode, mech)


def _standardize_step(col: ColumnSpec, asked: str, uncharged_ok: bool) -> Step | None:
    """The standardization step of numeric column `col` (None: "auto" lacks declared
    mean/scale or bounds)."""
    has = col.mean is not None or col.bounds is not None
    mode = _mode(asked, has, uncharged_ok)
    if mode is None:
        return None
    if mode == "declared" and not has:
        raise ConfigError(f"standardize='declared' needs declared mean/scale or "
                          f"lower/upper for column {col.name!r}; declare them in the "
                          "schema, or use standardize='none'")
    if mode == "private" and col.bounds is None:
        raise ConfigError(f"standardize='private' needs declared lower/upper bounds "
                          f"for column {col.name!r}: the private statistics clip to "
                          "them; declare them in the schema")
    mech = {"declared": "declared mean and scale" if col.mean is not None
            else "declared bounds mapped to [-1, 1]",
            "private": "Gaussian release of (count, Σu, Σ(u²-1)) over the "
                       "training rows",  # `_per_person` rewrites it at the person unit
            "uncharged": "per-silo training mean and standard deviation"}[mode]
    return Step("standardize", col.name, mode, mech)


def _refuse_uncharged(raw: RawFederation, uncharged: list[str]) -> NoReturn:
    """The encoding read items from the data without a charge, and nobody opted in."""
    if raw.meta.get("schema_from_data"):
        raise ConfigError(
            f"{raw.name}: no schema was given, so the feature kinds, category levels, "
            f"missing-value columns and label classes were read from the pooled table -- "
            f"{len(uncharged)} item(s) that no silo's budget is charged for (e.g. "
            f"{uncharged[0]}). Fix: write a schema of public facts -- draft one with "
            f"silofl.data.draft_schema(df, silo_column, label_column), check every value "
            f"against public documentation, delete `drafted = true` and pass "
            f"schema=<file> -- or opt into uncharged preprocessing with "
            f"standardize='uncharged' (every report then names the uncharged items)")
    raise ConfigError(f"{raw.name}: the encoding read {len(uncharged)} item(s) from the "
                      f"data uncharged (e.g. {uncharged[0]}); declare them in a schema, "
                      "or opt in with standardize='uncharged'")


def _refuse_lacking(raw: RawFederation, lacking: dict[str, list[str]]) -> NoReturn:
    """Columns whose "auto" step has neither declared facts nor an opt-in."""
    parts = []
    if lacking["standardize"]:
        parts.append(f"standardization needs declared lower/upper (or mean/scale) for "
                     f"{_names(lacking['standardize'])}")
    if lacking["impute"]:
        parts.append(f"imputation needs a declared fill or lower/upper for "
                     f"{_names(lacking['impute'])}")
    raise ConfigError(f"{raw.name}: " + "; ".join(parts) + ". Declare them in the schema "
                      "(from public documentation), or choose standardize='none' (raw "
                      "units), or opt into 'uncharged' per-silo statistics (listed as "
                      "uncharged in every report)")


def _mode(asked: str, declared_ok: bool, uncharged_ok: bool) -> str | None:
    if asked != "auto":
        return asked
    if declared_ok:
        return "declared"
    return "uncharged" if uncharged_ok else None


def _names(cols: list[str]) -> str:
    shown = ", ".join(repr(c) for c in cols[:8])
    return shown + (f" and {len(cols) - 8} more" if len(cols) > 8 else "")


def plan_preprocessing(raw: RawFederation, spec: PreprocessSpec | None = None,
                       targets: Mapping[str, PrivacyTarget] | None = None,
                       accountant: accounting.Accountant | None = None) -> PreprocessPlan:
    """Fix every step before the data is read; reads only the schema, each silo's training
    size and targets (`targets[silo]`, else the silo's own ``target``; needed only when a
    step is private). σ_k is calibrated under `accountant` ("rdp" | "pld": the run's;
    default `silofl.privacy.accounting.DEFAULT_ACCOUNTANT`) so
    that ``GaussianDpEvent(σ_k)`` costs ``spec.share``·ε_k at δ_k. Raises ConfigError for
    steps that cannot be done as asked and PrivacyError for a private step without a silo
    target."""
    spec = spec or PreprocessSpec()
    steps, released, uncharged = _resolve(raw, spec)
    check_lazy_plan(raw.silos, steps, spec.unit)
    if released and spec.unit == "person":
        steps = _per_person(raw, steps)
    events: dict[str, object | None] = {name: None for name in raw.names}
    sigmas: dict[str, float] = {}
    delta_l2 = SENSITIVITY_PER_COLUMN * math.sqrt(len(released)) if released else 0.0
    if released:
        import dp_accounting as dpa  # local: dp_accounting is slow to import

        kind = accountant or accounting.DEFAULT_ACCOUNTANT
        cache: dict[tuple[float, float], float] = {}
        for s in raw.silos:
            target = (targets or {}).get(s.name, s.target)
            if target is None:
                raise PrivacyError(f"private preprocessing needs silo {s.name!r}'s privacy "
                                   "target (ε, δ): pass targets= or attach them to the silos")
            key = (spec.share * target.epsilon, target.delta)
            if key not in cache:
                cache[key] = accounting.calibrate(lambda sg: dpa.GaussianDpEvent(sg), *key,
                                                  kind=kind)
            sigmas[s.name] = cache[key]
            events[s.name] = dpa.GaussianDpEvent(cache[key])
        noise = {name: sg * delta_l2 for name, sg in sigmas.items()}
        steps = [dataclasses.replace(st, noise=noise) if st.mode == "private" else st
                 for st in steps]
    return PreprocessPlan(spec, steps, events, uncharged, released, delta_l2, sigmas,
                          raw.names, raw.dim)


def _per_person(raw: RawFederation, steps: list[Step]) -> list[Step]:
    """Private steps at the person unit: each person adds the mean of their rows
    (`column_stats.sufficient_statistics`), so Δ is unchanged and the charge is per person."""
    if not raw.has_persons:
        raise ConfigError("private preprocessing per person ([privacy] unit = \"person\") "
                          "needs [data] person_column; or use [privacy] unit = \"example\"")
    return [dataclasses.replace(st, mechanism=st.mechanism.replace(
        "over the training rows", "per person (each person: the mean of their rows)"))
        if st.mode == "private" else st for st in steps]


def weakened_for_audit(plan: PreprocessPlan, noise_factor: float = 0.0) -> PreprocessPlan:
    """AUDIT SELF-TESTS ONLY: a deliberately broken copy of `plan` whose private release
    draws its noise × `noise_factor` (0: none, i.e. an uncharged standardization) while
    `events` still claim the honest cost -- the mechanism an audit must flag. Its meta
    (``noise_multiplier``, the steps' ``noise``) states the weakened noise. Never release
    what it computes; nothing in the library calls it outside `silofl.audit` and tests.

    Parameters
    ----------
    plan : PreprocessPlan
        A plan with a private release (``plan.private``).
    noise_factor : float, default 0.0
        In [0, 1): the factor on every silo's noise standard deviation.

    Returns
    -------
    PreprocessPlan
        The copy; `plan` is unchanged.
    """
    if not plan.private:
        raise ConfigError("this preprocessing plan releases nothing private (no "
                          "standardize/impute step is 'private'), so there is no noise to "
                          "weaken; audit a plan with a private release")
    if isinstance(noise_factor, bool) or not 0 <= noise_factor < 1:
        raise ConfigError(f"noise_factor must be in [0, 1) (a weakened release), got "
                          f"{noise_factor!r}")
    sigmas = {k: v * noise_factor for k, v in plan.noise_multipliers.items()}
    noise = {k: v * plan.sensitivity for k, v in sigmas.items()}
    steps = [dataclasses.replace(st, noise=noise) if st.mode == "private" else st
             for st in plan.steps]
    return dataclasses.replace(plan, steps=steps, noise_multipliers=sigmas)


# --- applying ---------------------------------------------------------------------------------

class SiloConstants(TypedDict):
    """What new rows of one silo need: its fills and (center, scale) per column."""

    fill: dict[str, float]
    standardize: dict[str, list[float]]


class Constants(TypedDict):
    """``meta["constants"]`` of a preprocessed federation (saved with the models)."""

    feature_names: list[str]
    clip: dict[str, list[float]]
    silos: dict[str, SiloConstants]


def apply_preprocessing(raw: RawFederation, plan: PreprocessPlan,
                        rng: NoiseSource | None = None,
                        probe: ReleaseProbe | None = None) -> Federation:
    """Compute the planned statistics per silo (training rows only; test rows are only
    transformed) and return the finished Federation.

    Parameters
    ----------
    raw : RawFederation
        The encoded silos the plan was made for.
    plan : PreprocessPlan
        From `plan_preprocessing`; its events must already be charged.
    rng : NoiseSource, optional
        Draws the noise (``rng.normal``); needed only when the plan is private.
    probe : ReleaseProbe, optional
        Audits only (`silofl.audit.release`): canary rows in each silo's private release.

    Returns
    -------
    Federation
        ``meta["preprocessing"]`` holds `plan.to_meta()`, ``meta["uncharged"]`` the
        uncharged items (empty if none) and ``meta["constants"]`` what new rows need
        (`Constants`: ``feature_names``, ``clip`` {column: [lower, upper]} and per silo
        ``{"fill": {column: value}, "standardize": {column: [center, scale]}}``; private
        ones are post-processed DP releases, uncharged ones raw statistics, listed in
        ``uncharged``).
    """
    if plan.silos != raw.names or plan.dim != raw.dim:
        raise ConfigError("this plan was made for another federation (silos or features "
                          "differ); plan again with plan_preprocessing(raw, ...)")
    if plan.private and rng is None:
        raise PrivacyError("the plan has private statistics: pass rng (a "
                           "silofl.privacy.randomness.Randomness) to draw their noise")
    bounded = [j for j, c in raw.specs.items() if c.bounds is not None and c.kind == "numeric"]
    # what applying this to new rows needs (saved with the models): declared bounds, and per
    # silo its fills and (center, scale) -- declared, or post-processed private releases
    constants: Constants = {
        "feature_names": list(raw.feature_names),
        "clip": {raw.feature_names[j]: list(declared_bounds(raw.specs[j])) for j in bounded},
        "silos": {}}
    silos = []
    for s in raw.silos:
        if s.X_train.ndim > 2:  # images: no value columns; keep their arrays and dtype
            silos.append(s)
            continue
        own = constants["silos"][s.name] = {"fill": {}, "standardize": {}}
        silos.append(_apply_silo(raw, plan, s, bounded, rng, own, probe))
    meta = {**raw.meta, "preprocessing": plan.to_meta(), "uncharged": list(plan.uncharged),
            "constants": constants}
    meta.pop("schema_from_data", None)
    return Federation(silos, list(raw.feature_names), raw.task, raw.num_classes, raw.name, meta)


def _apply_silo(raw: RawFederation, plan: PreprocessPlan, s: Silo, bounded: list[int],
                rng: NoiseSource | None, own: SiloConstants,
                probe: ReleaseProbe | None = None) -> Silo:
    """One tabular silo, preprocessed as planned; its constants are written to `own`."""
    if is_lazy(s.X_train):  # rows on disk: the same statistics summed chunk by chunk
        return preprocess_lazy_silo(raw.specs, raw.feature_names, plan, s, bounded, rng, own,
                                    probe)
    Xtr = np.array(s.X_train, dtype=np.float64)
    Xte = np.array(s.X_test, dtype=np.float64)
    for j in bounded:  # idempotent after schema encoding; keeps this path data-independent
        lo_j, hi_j = declared_bounds(raw.specs[j])
        Xtr[:, j] = np.clip(Xtr[:, j], lo_j, hi_j)
        Xte[:, j] = np.clip(Xte[:, j], lo_j, hi_j)
    orig = Xtr.copy()  # uncharged statistics: observed training values, before filling
    priv: dict[int, tuple[float, float]] = {}  # column -> (mean, std) of u, released
    rel = plan.released
    if rel:
        assert rng is not None  # apply_preprocessing refuses a private plan without one
        bounds = [declared_bounds(raw.specs[j]) for j in rel]
        lo = np.array([b[0] for b in bounds])
        hi = np.array([b[1] for b in bounds])
        per = s.person_train if plan.spec.unit == "person" else None
        stats = release_statistics(orig[:, rel], lo, hi,
                                   plan.noise_multipliers[s.name] * plan.sensitivity, rng,
                                   probe, s.name, **({} if per is None else {"persons": per}))
        mean_u, std_u = moments_from_statistics(stats, s.n_train if per is None
                                                else s.n_persons)
        priv = {j: (m, sd) for j, m, sd in zip(rel, mean_u, std_u)}
    index = {raw.feature_names[j]: j for j in raw.specs}
    for st in plan.steps:
        if st.what == "impute":
            j = index[st.column]
            fill = fill_value(raw.specs[j], st.mode, priv.get(j), orig[:, j])
            own["fill"][st.column] = float(fill)
            for X in (Xtr, Xte):
                X[np.isnan(X[:, j]), j] = fill
    for st in plan.steps:
        if st.what == "standardize":
            j = index[st.column]
            center, scale = center_scale(raw.specs[j], st.mode, priv.get(j), orig[:, j])
            own["standardize"][st.column] = [float(center), float(scale)]
            Xtr[:, j] = (Xtr[:, j] - center) / scale
            Xte[:, j] = (Xte[:, j] - center) / scale
    return dataclasses.replace(s, X_train=Xtr, X_test=Xte)


def preprocess_without_budget(raw: RawFederation, spec: PreprocessSpec | None = None,
                              loader: str = "this loader") -> Federation:
    """Plan and apply preprocessing that needs no budget (declared, uncharged, none): what
    the convenience loaders return. A private step is refused with a pointer to the
    two-phase API, which charges it first."""
    spec = spec or PreprocessSpec()
    _, released, _ = _resolve(raw, spec)
    if released:
        raise ConfigError(
            f"{loader} cannot compute private statistics (standardize={spec.standardize!r}, "
            f"impute={spec.impute!r}): they cost each silo {spec.share:g} of its ε, which must "
            "be charged to its ledger before the data is read. Use the two-phase API: "
            "raw = <loader>_raw(...); plan = silofl.data.plan_preprocessing(raw, spec, "
            "targets); charge plan.events[silo] to each silo's ledger; "
            "fed = silofl.data.apply_preprocessing(raw, plan, rng)")
    return apply_preprocessing(raw, plan_preprocessing(raw, spec))

"""Streaming preprocessing of lazy silos (`silofl.data.lazy`): the statistics that
`silofl.data.preprocess.apply_preprocessing` computes, summed over chunks of a silo's
training rows on disk — the same release with the same noise and the same charge — and
turned into the `Transform` that `LazyRows.take` applies to sampled rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from silofl.data.federation import Silo
from silofl.data.lazy import LazyRows, Transform, is_lazy
from silofl.errors import ConfigError

if TYPE_CHECKING:
    from silofl.data.column_stats import NoiseSource, ReleaseProbe
    from silofl.data.schema import ColumnSpec

__all__ = ["preprocess_lazy_silo", "check_lazy_plan", "PlanLike"]


class PlanLike(Protocol):
    """What streaming preprocessing reads of a `silofl.data.preprocess.PreprocessPlan`
    (a protocol: that module imports this one)."""

    spec: Any
    steps: list[Any]
    released: list[int]
    noise_multipliers: dict[str, float]
    sensitivity: float


def preprocess_lazy_silo(specs: dict[int, ColumnSpec], feature_names: list[str],
                         plan: PlanLike, s: Silo, bounded: list[int],
                         rng: NoiseSource | None, own: Any,
                         probe: ReleaseProbe | None = None) -> Silo:
    """`silofl.data.preprocess.apply_preprocessing` for one lazy silo: the planned
    statistics summed over chunks of its training rows (the same release, the same charge,
    already paid by the caller), turned into a `Transform` that `take` applies.

    Parameters
    ----------
    specs : dict of int to ColumnSpec
        The raw federation's value columns.
    feature_names : list of str
        The encoded columns (d).
    plan : PreprocessPlan
        The charged plan.
    s : Silo
        The silo; ``X_train`` a `LazyRows`.
    bounded : list of int
        Columns with declared bounds (clipped first).
    rng : NoiseSource or None
        The noise of a private release.
    own : SiloConstants
        The silo's constants, filled in (``fill``, ``standardize``).
    probe : ReleaseProbe, optional
        Audits only.

    Returns
    -------
    Silo
        ``X_train`` the same rows under the transform, ``X_test`` transformed in memory.
    """
    from silofl.data.column_stats import (
        center_scale,
        declared_bounds,
        fill_value,
        moments_from_statistics,
        noisy_release,
    )
    X = cast(LazyRows, s.X_train)
    check_lazy_plan([s], plan.steps, plan.spec.unit)
    d = X.file.d
    t = Transform.identity(d)
    for j in bounded:
        t.lo[j], t.hi[j] = declared_bounds(specs[j])
    rel = list(plan.released)
    read = rel or any(st.mode == "uncharged" for st in plan.steps)
    sums = _stream_sums(X, t, rel, specs) if read else {}  # declared: nothing to read
    priv: dict[int, tuple[float, float]] = {}
    if rel:
        assert rng is not None  # apply_preprocessing refuses a private plan without one
        stats = noisy_release(sums["private"], plan.noise_multipliers[s.name]
                              * plan.sensitivity, rng, probe, s.name)
        mean_u, std_u = moments_from_statistics(stats, s.n_train)
        priv = {j: (m, sd) for j, m, sd in zip(rel, mean_u, std_u)}
    index = {feature_names[j]: j for j in specs}
    none = np.empty(0)
    for st in plan.steps:
        j = index[st.column]
        if st.what == "impute":
            t.fill[j] = fill_value(specs[j], st.mode, priv.get(j), none)
            own["fill"][st.column] = float(t.fill[j])
    for st in plan.steps:
        j = index[st.column]
        if st.what == "standardize":
            if st.mode == "uncharged":
                c, sc = _moments(sums, j, specs[j])
            else:
                c, sc = center_scale(specs[j], st.mode, priv.get(j), none)
            t.center[j], t.scale[j] = c, sc
            own["standardize"][st.column] = [float(c), float(sc)]
    Xte = t.apply(np.array(s.X_test, dtype=np.float64))
    return dataclasses.replace(s, X_train=cast(np.ndarray, X.with_transform(t)), X_test=Xte)


def check_lazy_plan(silos: Sequence[Silo], steps: Sequence[Any], unit: str) -> None:
    """Refuse, before anything is charged, what lazy silos cannot preprocess: a median
    (uncharged imputation) does not stream, and the person unit needs the table in memory.

    Parameters
    ----------
    silos : sequence of Silo
        The silos to preprocess (nothing is checked unless one is lazy).
    steps : sequence of Step
        The planned steps (``what``, ``column``, ``mode``).
    unit : str
        The privacy unit of the preprocessing ("example" or "person").

    Raises
    ------
    ConfigError
        Naming the setting that fixes it.
    """
    if not any(is_lazy(s.X_train) for s in silos):
        return
    if unit == "person":
        raise ConfigError("a lazy (larger than memory) table trains at example level; "
                          "[privacy] unit = \"person\" needs the table in memory (data.lazy "
                          "= false)")
    for st in steps:
        if st.what == "impute" and st.mode == "uncharged":
            raise ConfigError(f"impute = \"uncharged\" fills {st.column!r} with a median, "
                              "which a lazy (larger than memory) table cannot stream; use "
                              "[data] impute = \"declared\" or \"private\"")


def _stream_sums(X: LazyRows, t: Transform, rel: list[int],
                 specs: dict[int, ColumnSpec]) -> dict[str, np.ndarray]:
    """One pass over the training rows (clipped to declared bounds): the private release's
    sufficient statistics of columns `rel`, and per column the count, Σx and Σx² of the
    observed values (uncharged standardization)."""
    from silofl.data.column_stats import declared_bounds, sufficient_statistics
    d = X.file.d
    out = {"private": np.zeros((len(rel), 3)), "count": np.zeros(d), "sum": np.zeros(d),
           "sumsq": np.zeros(d)}
    lo = np.array([declared_bounds(specs[j])[0] for j in rel])
    hi = np.array([declared_bounds(specs[j])[1] for j in rel])
    for chunk in X.raw_chunks():
        np.clip(chunk, t.lo, t.hi, out=chunk)
        if rel:
            out["private"] += sufficient_statistics(chunk[:, rel], lo, hi)
        obs = ~np.isnan(chunk)
        x0 = np.where(obs, chunk, 0.0)
        out["count"] += obs.sum(axis=0)
        out["sum"] += x0.sum(axis=0)
        out["sumsq"] += (x0 * x0).sum(axis=0)
    return out


def _moments(sums: dict[str, np.ndarray], j: int, col: ColumnSpec) -> tuple[float, float]:
    """Uncharged (center, scale) of column j from streamed sums (as `center_scale`)."""
    from silofl.data.column_stats import fallback_fill
    n = sums["count"][j]
    if not n:
        return fallback_fill(col), 1.0
    mean = sums["sum"][j] / n
    sd = float(np.sqrt(max(sums["sumsq"][j] / n - mean * mean, 0.0)))
    return float(mean), sd if sd > 1e-12 else 1.0


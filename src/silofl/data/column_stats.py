"""The per-column statistics of preprocessing (`silofl.data.preprocess`): the private
Gaussian release of (count, Σu, Σ(u² − 1)) per released column, its post-processing into
a mean and standard deviation, and the fill and (center, scale) each planned step uses.
The sensitivity argument is in the module docstring of `silofl.data.preprocess`."""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from silofl.data.schema import ColumnSpec
from silofl.errors import ConfigError

MIN_STD = 0.1  # floor on a private std, in half-ranges: noise cannot blow features up > 20x
SENSITIVITY_PER_COLUMN = math.sqrt(2.0)


class NoiseSource(Protocol):
    """What the release draws its noise from (a `silofl.privacy.randomness.Randomness`)."""

    def normal(self, shape: tuple[int, ...]) -> np.ndarray: ...


def to_unit(X: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """u = values clipped to [lower, upper] and mapped linearly to [-1, 1] (NaN kept);
    X (n, d), lower/upper (d,)."""
    mid, half = (upper + lower) / 2, (upper - lower) / 2
    return (np.clip(X, lower, upper) - mid) / half


def sufficient_statistics(X: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                          persons: np.ndarray | None = None) -> np.ndarray:
    """Noiseless (d, 3) statistics of X (n, d) (NaN = missing): per column
    (Σ o, Σ o·u, Σ o·(u² - 1)) with o = 1 where observed and u = `to_unit(X)`.
    One record changes the flattened vector by at most √(2·d) in L2 (see
    `silofl.data.preprocess`). With `persons` ((n,) the person of each row) the sums run
    over persons, each contributing the mean of their rows' vectors: a mean of vectors of
    norm ≤ √(2·d) has norm ≤ √(2·d), so adding or removing all rows of one person moves
    the statistics by at most what one row did; the counts are then of persons."""
    u = to_unit(np.asarray(X, dtype=np.float64), lower, upper)
    o = ~np.isnan(u)
    u0 = np.where(o, u, 0.0)
    rows = np.stack([o, u0, o * (u0 ** 2 - 1.0)], axis=2).astype(np.float64)  # (n, d, 3)
    if persons is None:
        return rows.sum(axis=0)
    _, pid, per = np.unique(np.asarray(persons).astype(str), return_inverse=True,
                            return_counts=True)
    weight = 1.0 / per[pid.reshape(-1)]  # each person's rows average to one contribution
    return np.einsum("n,ndk->dk", weight, rows)


class ReleaseProbe(Protocol):
    """An auditor's instrument on a private release (`silofl.audit.release`): it appends
    auditing-only rows (canaries) to a silo's statistics before the noise and sees them
    after it. Only audits attach one."""

    def extend(self, silo: str, stats: np.ndarray) -> np.ndarray:
        """(d, 3) → (d + r, 3): the statistics with the auditor's r rows appended."""
        ...

    def observe(self, silo: str, released: np.ndarray) -> None:
        """See the noisy (d + r, 3) release."""


def release_statistics(X: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                       noise_std: float, rng: NoiseSource, probe: ReleaseProbe | None = None,
                       silo: str = "", persons: np.ndarray | None = None) -> np.ndarray:
    """`sufficient_statistics` + N(0, noise_std²) on each of the (d, 3) coordinates, drawn
    with ``rng.normal`` (a `silofl.privacy.randomness.Randomness`); noise_std = σ·Δ.
    `probe` (audits only): rows appended before the noise, in the same draw, and seen after
    it; the (d, 3) release is returned without them. `persons` (n,): per person (see
    `sufficient_statistics`)."""
    return noisy_release(sufficient_statistics(X, lower, upper, persons), noise_std, rng,
                         probe, silo)


def noisy_release(stats: np.ndarray, noise_std: float, rng: NoiseSource,
                  probe: ReleaseProbe | None = None, silo: str = "") -> np.ndarray:
    """The Gaussian release of already summed statistics (`release_statistics` after the
    sums; a larger-than-memory silo sums them chunk by chunk, `silofl.data.lazy`).

    Parameters
    ----------
    stats : numpy.ndarray
        (d, 3) noiseless `sufficient_statistics`.
    noise_std : float
        σ·Δ, the standard deviation of the noise on every coordinate.
    rng : NoiseSource
        Draws the noise.
    probe : ReleaseProbe, optional
        Audits only (see `release_statistics`).
    silo : str, default ""
        The silo's name (for the probe).

    Returns
    -------
    numpy.ndarray
        (d, 3) the noisy statistics.
    """
    d = stats.shape[0]
    if probe is not None:
        stats = probe.extend(silo, stats)
    released = stats + noise_std * np.asarray(rng.normal(stats.shape), dtype=np.float64)
    if probe is not None:
        probe.observe(silo, released)
    return released[:d]


def moments_from_statistics(stats: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Post-process released (d, 3) statistics of a silo with n training rows (persons,
    for a per-person release) into (mean, std) of u per column, each (d,): count clamped
    to [1, n], mean to [-1, 1], second moment to [mean², 1], std floored at MIN_STD."""
    count = np.clip(stats[:, 0], 1.0, max(float(n), 1.0))
    mean = np.clip(stats[:, 1] / count, -1.0, 1.0)
    second = np.clip(stats[:, 2] / count + 1.0, mean ** 2, 1.0)
    std = np.sqrt(np.maximum(second - mean ** 2, MIN_STD ** 2))
    return mean, std


def fallback_fill(col: ColumnSpec) -> float:
    """A silo's fill when it has no statistic of its own: declared, midpoint, or 0."""
    if col.fill is not None:
        return float(col.fill)
    b = col.bounds
    return (b[0] + b[1]) / 2 if b is not None else 0.0


def declared_bounds(col: ColumnSpec) -> tuple[float, float]:
    """The declared (lower, upper) of a column whose planned step needs them.

    Parameters
    ----------
    col : ColumnSpec
        A schema column.

    Returns
    -------
    tuple of float
        (lower, upper) in the column's units; ConfigError when the schema declares none.
    """
    b = col.bounds
    if b is None:  # plan_preprocessing never plans such a step; a hand-made plan might
        raise ConfigError(f"column {col.name!r} has no declared lower/upper bounds, which its "
                          "planned step needs; plan again with plan_preprocessing(raw, ...)")
    return b


def fill_value(col: ColumnSpec, mode: str, released: tuple[float, float] | None,
               train: np.ndarray) -> float:
    """The value that replaces a missing one in `col` under an imputation step.

    Parameters
    ----------
    col : ColumnSpec
        The nullable column.
    mode : str
        The step's mode: "declared", "private" or "uncharged".
    released : tuple of float or None
        The silo's released (mean, std) of u for this column (private steps).
    train : numpy.ndarray
        (n,) the silo's training values of the column, NaN where missing.

    Returns
    -------
    float
        The fill, in the column's units.
    """
    if mode == "declared":
        return fallback_fill(col)
    if mode == "private":
        b, (mean_u, _) = declared_bounds(col), _released(col, released)
        return (b[0] + b[1]) / 2 + mean_u * (b[1] - b[0]) / 2
    obs = train[~np.isnan(train)]
    return float(np.median(obs)) if obs.size else fallback_fill(col)


def center_scale(col: ColumnSpec, mode: str, released: tuple[float, float] | None,
                 train: np.ndarray) -> tuple[float, float]:
    """(center, scale) that standardizes `col` as (x - center) / scale.

    Parameters
    ----------
    col : ColumnSpec
        The numeric column.
    mode : str
        The step's mode: "declared", "private" or "uncharged".
    released : tuple of float or None
        The silo's released (mean, std) of u for this column (private steps).
    train : numpy.ndarray
        (n,) the silo's training values of the column (after imputation's NaN were
        recorded: NaN where missing).

    Returns
    -------
    tuple of float
        (center, scale) in the column's units; scale > 0.
    """
    if mode == "declared":
        if col.mean is not None and col.scale is not None:
            return col.mean, col.scale
        b = declared_bounds(col)
        return (b[0] + b[1]) / 2, (b[1] - b[0]) / 2
    if mode == "private":
        b, (mean_u, std_u) = declared_bounds(col), _released(col, released)
        half = (b[1] - b[0]) / 2
        return (b[0] + b[1]) / 2 + mean_u * half, std_u * half
    obs = train[~np.isnan(train)]
    center = float(obs.mean()) if obs.size else fallback_fill(col)
    sd = float(obs.std()) if obs.size else 0.0
    return center, sd if sd > 1e-12 else 1.0  # constant columns: centred, unit scale


def _released(col: ColumnSpec, released: tuple[float, float] | None) -> tuple[float, float]:
    """The released (mean, std) of u for a column with a private step."""
    if released is None:  # plan.released lists every column with a private step
        raise ConfigError(f"column {col.name!r} has a private step but is not in the plan's "
                          "release; plan again with plan_preprocessing(raw, ...)")
    return released

"""Private per-silo statistics of declared columns (`silofl stats`): the release and its
post-processing into counts, means, standard deviations, histograms and quantiles.

The release extends the one of private preprocessing (`silofl.data.column_stats`): per silo,
ONE Gaussian-mechanism release over its rows of, for every released column j, the vector

    (Σ o, Σ o·u, Σ o·(u² − 1), Σ o·[u in bin 1], ..., Σ o·[u in bin B])

with o = 1 where the value is observed, u ∈ [-1, 1] the value clipped to the column's
DECLARED bounds [lower, upper] and mapped linearly, and B equal-width bins of [lower, upper].

Sensitivity (add/remove one record, L2): the record adds o·(1, u, u² − 1) per column, of
squared norm ≤ 2 (`silofl.data.preprocess`), and o·e_b, a one-hot bin indicator, of squared
norm ≤ 1; over d columns the squared norm is ≤ 3·d, so Δ₂ = √(3·d), attained by a record
observed everywhere at u ∈ {-1, 0, 1}. At the person unit each person contributes the mean
of their rows' vectors: a mean of vectors of norm ≤ √(3·d) has norm ≤ √(3·d) (triangle
inequality), so Δ₂ is unchanged and the counts are of persons. Noise N(0, σ²Δ²) per
coordinate; the release is ``GaussianDpEvent(σ)``.

Everything shown is post-processing of the noisy release (no further charge):

* count of observed values: clamped to [0, n] (n: the silo's rows -- or persons --, public
  by the project's assumption that silo sizes are public);
* mean and standard deviation: as `column_stats.moments_from_statistics` (count clamped to
  [1, n], mean to the bounds, second moment to [mean², 1]) but without its floor on the
  std, mapped back to the column's units;
* histogram: the noisy bin counts clamped at 0;
* quantiles: **noisy histogram + linear interpolation** (not the exponential mechanism):
  the clamped histogram's cumulative sum, inverted linearly inside the bin where it crosses
  q·total. Its error is the noise's (σΔ per bin, accumulated over the bins below) plus the
  within-bin interpolation error, at most one bin width (hi − lo)/B.

Pooled figures (all silos) sum the silos' noisy releases: post-processing, free.
"""

from __future__ import annotations

import math

import numpy as np

from silofl.data.column_stats import NoiseSource, moments_from_statistics, sufficient_statistics

DEFAULT_BINS = 20
DEFAULT_QUANTILES = (0.25, 0.5, 0.75)
MOMENTS = 3  # (count, Σu, Σ(u² − 1)) before the bins


def sensitivity(d: int) -> float:
    """Δ₂ of one silo's release of `d` columns: √(3·d) (module docstring)."""
    return math.sqrt(3.0 * d)


def bin_indicators(X: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                   bins: int) -> np.ndarray:
    """One-hot bin memberships of X's values.

    Parameters
    ----------
    X : numpy.ndarray
        (n, d) values in the columns' units, NaN where missing.
    lower, upper : numpy.ndarray
        (d,) declared bounds; values outside are clipped to them.
    bins : int
        B, equal-width bins of [lower, upper] (the upper bound falls in the last).

    Returns
    -------
    numpy.ndarray
        (n, d, B) float64: 1 in the bin of each observed value, 0 elsewhere.
    """
    X = np.asarray(X, dtype=np.float64)
    obs = ~np.isnan(X)
    frac = (np.clip(np.where(obs, X, lower), lower, upper) - lower) / (upper - lower)
    idx = np.minimum((frac * bins).astype(np.int64), bins - 1)
    return (np.arange(bins) == idx[..., None]) * obs[..., None].astype(np.float64)


def noiseless_statistics(X: np.ndarray, lower: np.ndarray, upper: np.ndarray, bins: int,
                         persons: np.ndarray | None = None) -> np.ndarray:
    """The (d, 3 + B) vector the release adds noise to (module docstring).

    Parameters
    ----------
    X : numpy.ndarray
        (n, d) values, NaN where missing.
    lower, upper : numpy.ndarray
        (d,) declared bounds.
    bins : int
        B.
    persons : numpy.ndarray, optional
        (n,) the person of each row: each person contributes the mean of their rows.

    Returns
    -------
    numpy.ndarray
        (d, 3 + B): per column the moments of `column_stats.sufficient_statistics`, then
        the bin counts.
    """
    moments = sufficient_statistics(X, lower, upper, persons)
    onehot = bin_indicators(X, lower, upper, bins)
    if persons is None:
        hist = onehot.sum(axis=0)
    else:
        _, pid, per = np.unique(np.asarray(persons).astype(str), return_inverse=True,
                                return_counts=True)
        hist = np.einsum("n,ndb->db", 1.0 / per[pid.reshape(-1)], onehot)
    return np.concatenate([moments, hist], axis=1)


def release(X: np.ndarray, lower: np.ndarray, upper: np.ndarray, bins: int,
            noise_std: float, rng: NoiseSource,
            persons: np.ndarray | None = None) -> np.ndarray:
    """`noiseless_statistics` + N(0, noise_std²) per coordinate (noise_std = σ·Δ), drawn
    with ``rng.normal``. The caller has charged ``GaussianDpEvent(σ)`` first.

    Returns
    -------
    numpy.ndarray
        (d, 3 + B) the noisy release.
    """
    stats = noiseless_statistics(X, lower, upper, bins, persons)
    return stats + noise_std * np.asarray(rng.normal(stats.shape), dtype=np.float64)


def quantiles_from_histogram(hist: np.ndarray, lower: float, upper: float,
                             qs: tuple[float, ...] | list[float]) -> list[float]:
    """Quantiles of a (noisy) histogram by linear interpolation inside bins.

    Parameters
    ----------
    hist : numpy.ndarray
        (B,) bin counts of equal-width bins of [lower, upper]; negatives count as 0.
    lower, upper : float
        The declared bounds.
    qs : sequence of float
        Levels in [0, 1].

    Returns
    -------
    list of float
        One value per level, in [lower, upper]; the midpoint when the histogram is empty.
    """
    h = np.clip(np.asarray(hist, dtype=np.float64), 0.0, None)
    total = float(h.sum())
    if total <= 0.0:
        return [(lower + upper) / 2] * len(qs)
    edges = np.linspace(lower, upper, len(h) + 1)
    cum = np.concatenate([[0.0], np.cumsum(h)])
    out = []
    for q in qs:
        target = q * total
        # the first non-empty bin whose cumulative count reaches the target
        hit = np.nonzero((cum[1:] >= target) & (h > 0))[0]
        b = int(hit[0]) if hit.size else int(np.nonzero(h > 0)[0][-1])
        inside = (target - cum[b]) / h[b]
        out.append(float(edges[b] + np.clip(inside, 0.0, 1.0) * (edges[b + 1] - edges[b])))
    return out


def summarize(released: np.ndarray, lower: np.ndarray, upper: np.ndarray, n: int,
              qs: tuple[float, ...] | list[float] = DEFAULT_QUANTILES) -> list[dict]:
    """Post-process a (d, 3 + B) release (one silo's, or the sum of several) into figures.

    Parameters
    ----------
    released : numpy.ndarray
        (d, 3 + B) noisy statistics.
    lower, upper : numpy.ndarray
        (d,) declared bounds.
    n : int
        The public number of rows (persons at the person unit) behind the release.
    qs : sequence of float
        Quantile levels.

    Returns
    -------
    list of dict
        Per column: ``count`` (observed values, noisy, clamped to [0, n]), ``mean`` and
        ``std`` (column units), ``histogram`` (B noisy counts clamped at 0), ``quantiles``
        {level: value}.
    """
    mean_u, _ = moments_from_statistics(released[:, :MOMENTS], n)
    # the std without preprocessing's floor (a first look shows small spreads as they are)
    count = np.clip(released[:, 0], 1.0, max(float(n), 1.0))
    std_u = np.sqrt(np.clip(released[:, 2] / count + 1.0, mean_u ** 2, 1.0) - mean_u ** 2)
    half = (upper - lower) / 2
    out = []
    for j in range(released.shape[0]):
        hist = np.clip(released[j, MOMENTS:], 0.0, None)
        qv = quantiles_from_histogram(hist, float(lower[j]), float(upper[j]), qs)
        out.append({"count": float(np.clip(released[j, 0], 0.0, max(n, 0))),
                    "mean": float((lower[j] + upper[j]) / 2 + mean_u[j] * half[j]),
                    "std": float(std_u[j] * half[j]),
                    "histogram": [float(v) for v in hist],
                    "quantiles": {f"{q:g}": v for q, v in zip(qs, qv)}})
    return out

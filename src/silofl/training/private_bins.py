"""Private quantile bins for DP federated trees (``[trees] bins = "private"``).

Equal-width bins over declared bounds are free but waste bins where a feature has no mass.
Quantile bins follow the data; here they are computed privately:

1. **Silo** (the BINS message of `silofl.algorithms.gbdt_programs`): charges
   ``GaussianDpEvent(σ_b)`` to its ledger, then releases a noisy *fine* histogram
   (`fine_histogram` plus noise) of every feature over its declared bounds: ``fine``
   equal-width bins, the binning of `silofl.data.fed_stats.bin_indicators` (values clipped
   to the bounds). Sensitivity (add/remove one example, L2): the example adds one count to
   one bin of each of the d features, so Δ₂ = √d; noise N(0, (σ_b·√d)²) per bin.
2. **Server** (`edges_from_histograms`): sums the silos' releases (post-processing) and
   takes, per feature, the quantiles at levels k/B, k = 1..B−1, by
   `silofl.data.fed_stats.quantiles_from_histogram` (clamped noisy histogram, linear
   interpolation inside a fine bin); rounded to float32 and forced strictly increasing.

Budget. The bins release is tied to the trees' noise multiplier σ so that one event
factory σ ↦ event describes the whole run (a job calibrates it for all its methods,
`silofl.algorithms.gbdt_method`): with R = the trees' Gaussian releases (T·(D + 1) for
histogram splits, T otherwise), the bins are released at

    σ_b = σ · √((1 − s) / (s · R))        (s = bins_share)

— the noise at which the one bins release costs, in zCDP (ρ = 1/(2σ²) per Gaussian), the
share s of the run's ρ when the trees are not subsampled (with row subsampling the trees
cost less than their ρ, so the bins' share of the ε is larger). σ is calibrated so that
``GaussianDpEvent(σ_b) ∘ trees`` meets the silo's whole target (ε_k, δ_k); everything is
preflighted before the first charge, and the bins charge is made before any row is read.
"""

from __future__ import annotations

from collections.abc import Callable

import dp_accounting as dpa
import numpy as np

from silofl.data.fed_stats import quantiles_from_histogram
from silofl.errors import ConfigError

#: fine histogram bins per final bin (resolution of the quantile search)
FINE_PER_BIN = 4


def fine_bins(n_bins: int) -> int:
    """The fine histogram's bins for `n_bins` final bins: FINE_PER_BIN·n_bins, ≥ 32."""
    return max(32, FINE_PER_BIN * int(n_bins))


def fine_histogram(X: np.ndarray, bounds: np.ndarray, fine: int) -> np.ndarray:
    """Exact (d, fine) counts of X's values in equal-width bins of the declared bounds.

    Parameters
    ----------
    X : numpy.ndarray
        (n, d) values (NaN counts nowhere).
    bounds : numpy.ndarray
        (d, 2) declared [lower, upper]; values outside are clipped to them.
    fine : int
        Equal-width bins per feature (the upper bound falls in the last).

    Returns
    -------
    numpy.ndarray
        (d, fine) float64 counts — the binning of `fed_stats.bin_indicators`, summed,
        without its (n, d, fine) one-hot array.
    """
    X = np.asarray(X, dtype=np.float64)
    lo, hi = bounds[:, 0], bounds[:, 1]
    obs = ~np.isnan(X)
    frac = (np.clip(np.where(obs, X, lo), lo, hi) - lo) / (hi - lo)
    idx = np.minimum((frac * fine).astype(np.int64), fine - 1)
    d = X.shape[1]
    cells = (idx + np.arange(d)[None, :] * fine)[obs]
    return np.bincount(cells, minlength=d * fine).astype(np.float64).reshape(d, fine)


def edges_from_histograms(total: np.ndarray, bounds: np.ndarray, n_bins: int) -> np.ndarray:
    """The server's bin edges from the summed fine histograms (post-processing).

    Parameters
    ----------
    total : numpy.ndarray
        (d, fine) summed noisy counts.
    bounds : numpy.ndarray
        (d, 2) declared bounds.
    n_bins : int
        B, the trees' bins per feature.

    Returns
    -------
    numpy.ndarray
        (d, B − 1) strictly increasing edges, each a float32 value (the contract of
        `silofl.training.histograms.bin_edges`): the quantiles at k/B, k = 1..B−1.
    """
    levels = [k / n_bins for k in range(1, n_bins)]
    out = np.empty((total.shape[0], n_bins - 1))
    for j in range(total.shape[0]):
        lo, hi = float(bounds[j, 0]), float(bounds[j, 1])
        q = np.asarray(quantiles_from_histogram(total[j], lo, hi, levels), dtype=np.float32)
        for k in range(1, q.size):  # tied quantiles (a point mass): empty bins, still ordered
            if q[k] <= q[k - 1]:
                q[k] = np.nextafter(q[k - 1], np.float32(np.inf))
        out[j] = q.astype(np.float64)
    return out


def check_edges(edges: np.ndarray, d: int) -> np.ndarray:
    """Validate caller-given edges: (d, B − 1), finite, strictly increasing, float32 values.

    Returns
    -------
    numpy.ndarray
        The edges as float64; raises ConfigError (what, how to fix) otherwise.
    """
    e = np.asarray(edges, dtype=np.float64)
    if e.ndim != 2 or e.shape[0] != d or e.shape[1] < 1:
        raise ConfigError(f"edges must be a ({d}, n_bins - 1) array of inner bin edges, "
                          f"got shape {e.shape}")
    if not np.all(np.isfinite(e)) or np.any(np.diff(e, axis=1) <= 0):
        raise ConfigError("edges must be finite and strictly increasing per feature")
    if np.any(e.astype(np.float32).astype(np.float64) != e):
        raise ConfigError("edges must be float32 values (XGBoost compares in float32); "
                          "pass edges.astype(np.float32)")
    return e


def bins_sigma(sigma: float, share: float, releases: int) -> float:
    """σ_b of the bins release for trees at σ with `releases` Gaussian releases (module
    docstring): σ·√((1 − share)/(share·releases))."""
    return float(sigma * np.sqrt((1.0 - share) / (share * releases)))


def run_event(sigma: float, share: float, releases: int,
              trees_event: Callable[[float], dpa.DpEvent]) -> dpa.DpEvent:
    """Everything one silo releases at σ: the bins, then the trees.

    Parameters
    ----------
    sigma : float
        The trees' noise multiplier σ.
    share : float
        bins_share in (0, 1).
    releases : int
        The trees' Gaussian releases R (T·(D + 1) histogram splits, T otherwise).
    trees_event : callable σ -> DpEvent
        Everything the trees release at σ.

    Returns
    -------
    dp_accounting.DpEvent
        ``ComposedDpEvent([GaussianDpEvent(σ_b), trees_event(σ)])``.
    """
    return dpa.ComposedDpEvent([dpa.GaussianDpEvent(bins_sigma(sigma, share, releases)),
                                trees_event(sigma)])


def check_share(share: float) -> None:
    """bins_share must be in (0, 1) (ConfigError otherwise)."""
    if not (np.isfinite(share) and 0.0 < share < 1.0):
        raise ConfigError(f"bins_share must be in (0, 1), got {share}")

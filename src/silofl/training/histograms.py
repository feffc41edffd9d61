"""The private release of DP federated gradient-boosted trees: per silo, noisy gradient and
hessian histograms of one tree level, charged to the silo's ledger before any row is read.

Bins come from public, declared bounds only: feature j's ``n_bins`` bins are equal width
over [lo_j, hi_j] (values outside fall in the end bins), so binning reveals nothing.
Per example, the gradient is clipped to [−G, G] and the hessian to [0, H].

Sensitivity (example level, add/remove one example of this silo). At one level every
example sits in exactly one node, and, per feature, in exactly one bin; it adds (g, h) to
one cell of the g histogram and one of the h histogram for each of the m released
features. The L2 norm of what it adds to the level's release is therefore at most

    Δ² = m · (G² + H²)      (m = features released this tree; m = d without column sampling)

The leaf release (per leaf: Σg, Σh) has Δ² = G² + H². Each release adds N(0, σ²Δ²) to every
cell, so each is a Gaussian mechanism with noise multiplier σ: a dp_accounting
``GaussianDpEvent(σ)``. One tree of depth D is D + 1 such releases (levels 0..D−1 and the
leaves), adaptively composed; that composition is exactly a Gaussian mechanism with
multiplier σ/√(D+1) (Gaussian DP composes in quadrature, adaptively too), which is what is
charged, Poisson-subsampled at rate q, when the tree uses a row subsample
(``PoissonSampledDpEvent(q, GaussianDpEvent(σ/√(D+1)))``, one charge per tree before its
first level). Without subsampling each release is charged on its own, before it.
With random splits (drawn by the server from public randomness, as in DP-EBM) a tree is
the leaf release alone: one Gaussian release per tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dp_accounting as dpa
import numpy as np

from silofl.errors import ConfigError
from silofl.privacy.critical import deferred_signals
from silofl.privacy.ledger import Ledger


def bin_edges(bounds: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-width inner bin edges from public bounds, rounded to float32.

    Parameters
    ----------
    bounds : numpy.ndarray
        (d, 2) declared [lower, upper] per feature, lower < upper.
    n_bins : int
        Bins per feature (≥ 2), public.

    Returns
    -------
    numpy.ndarray
        (d, n_bins − 1) float64 increasing edges, each exactly a float32 value (so XGBoost,
        which compares in float32, routes float32 inputs identically).
    """
    b = np.asarray(bounds, dtype=np.float64)
    if b.ndim != 2 or b.shape[1] != 2 or not np.all(np.isfinite(b)) or np.any(b[:, 0] >= b[:, 1]):
        raise ConfigError(f"bounds must be a (d, 2) array of finite [lower, upper] with "
                          f"lower < upper per feature, got shape {b.shape}; declare lower/upper "
                          "for every feature in the schema")
    if int(n_bins) != n_bins or n_bins < 2 or n_bins > 4096:
        raise ConfigError(f"n_bins must be an integer in [2, 4096], got {n_bins}")
    k = np.arange(1, n_bins) / n_bins
    edges = b[:, :1] + (b[:, 1:] - b[:, :1]) * k[None, :]
    edges = edges.astype(np.float32).astype(np.float64)
    if np.any(np.diff(edges, axis=1) <= 0):
        raise ConfigError("bins too narrow for float32 thresholds; use fewer bins or wider bounds")
    return edges


def bin_features(X: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(n, d) int32 bin of every value: the number of edges ≤ x, so that
    ``x < edges[j, k − 1]`` exactly when ``bin < k`` (splits at edges are exact).

    Equal-width arithmetic gives the bin up to rounding; one comparison with the float32
    edges on each side makes it exact (off by at most one before)."""
    X = np.asarray(X, dtype=np.float64)
    n_bins = edges.shape[1] + 1
    lo = 2 * edges[:, 0] - edges[:, 1] if n_bins > 2 else edges[:, 0] - 1.0
    width = (edges[:, -1] - edges[:, 0]) / max(n_bins - 2, 1) if n_bins > 2 else np.ones(len(lo))
    b = np.floor((X - lo) / width).clip(0, n_bins - 1).astype(np.int32)
    E = np.concatenate([np.full((len(lo), 1), -np.inf), edges,
                        np.full((len(lo), 1), np.inf)], axis=1)  # bin k is [E[k], E[k+1])
    cols = np.arange(X.shape[1])[None, :]
    b -= (X < E[cols, b]).astype(np.int32)
    b += (X >= E[cols, b + 1]).astype(np.int32)
    bad = np.flatnonzero(((X < E[cols, b]) | (X >= E[cols, b + 1])).any(axis=0))
    for j in bad:  # rounding moved some value by more than one bin: search exactly
        b[:, j] = np.searchsorted(edges[j], X[:, j], side="right")
    return b


def tree_event(sigma: float, releases: int, q: float) -> dpa.DpEvent:
    """Everything one tree releases from one silo: `releases` Gaussian releases at noise
    multiplier σ (D + 1 for histogram splits, 1 for random splits), all charged one by one
    without subsampling, or as one Poisson-subsampled Gaussian with σ/√releases."""
    if q >= 1.0:
        return dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(sigma), releases)
    return dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(float(sigma / np.sqrt(releases))))


def ensemble_event(sigma: float, trees: int, releases: int, q: float) -> dpa.DpEvent:
    """The whole ensemble's releases from one silo: `trees` × `tree_event`."""
    return dpa.SelfComposedDpEvent(tree_event(sigma, releases, q), trees)


@dataclass
class SiloHistograms:
    """One silo's private side of one boosting run: binned rows, clipped g/h, node slots.

    Parameters
    ----------
    ledger : Ledger
        The silo's ledger (charged before each release reads rows).
    bins : numpy.ndarray
        (n, d) int32 bin ids (`bin_features`).
    sigma : float
        The silo's noise multiplier σ (in units of the sensitivity Δ).
    n_bins : int
    clip_g, clip_h : float
        G and H: g is clipped to [−G, G], h to [0, H].
    """

    ledger: Ledger | None
    bins: np.ndarray
    sigma: float
    n_bins: int
    clip_g: float
    clip_h: float
    g: np.ndarray = field(init=False, repr=False)
    h: np.ndarray = field(init=False, repr=False)
    pos: np.ndarray = field(init=False, repr=False)  # node slot of each row in its level; −1 out
    features: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n = self.bins.shape[0]
        self.g = np.zeros(n)
        self.h = np.zeros(n)
        self.pos = np.zeros(n, dtype=np.int64)
        self.features = np.arange(self.bins.shape[1])

    def start_tree(self, g: np.ndarray, h: np.ndarray, rows: np.ndarray,
                   features: np.ndarray) -> None:
        """Set this tree's clipped g, h (n,), its row subsample (n,) bool and the (m,)
        features it releases (sorted column indices)."""
        self.g = np.clip(g, -self.clip_g, self.clip_g) * rows
        self.h = np.clip(h, 0.0, self.clip_h) * rows
        self.pos = np.where(rows, 0, -1).astype(np.int64)
        self.features = np.asarray(features)
        m, B = self.features.size, self.n_bins
        cols = self.bins if m == self.bins.shape[1] else self.bins[:, self.features]
        self._cells = cols + (np.arange(m, dtype=np.int32) * B)[None, :]  # (n, m) cell ids
        self._exact: tuple[np.ndarray, np.ndarray] | None = None

    def _exact_level(self, level: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact (slots, m, B) g and h sums of this level, never released as such.

        Below the root only the smaller child of each node is summed from its rows; its
        sibling is the parent's exact sums minus it (the same numbers, half the work)."""
        slots, m, B = 2 ** level, self.features.size, self.n_bins
        live = self.pos >= 0
        if level == 0 or self._exact is None:
            pick = live
            small = np.ones(slots, dtype=bool)
        else:
            cnt = np.bincount(self.pos[live], minlength=slots).reshape(-1, 2)
            small = np.zeros((slots // 2, 2), dtype=bool)
            left_small = cnt[:, 0] <= cnt[:, 1]
            small[:, 0], small[:, 1] = left_small, ~left_small
            small = small.ravel()
            pick = live & small[np.maximum(self.pos, 0)]
        rows = np.flatnonzero(pick)
        cells = self._cells[rows] + (self.pos[rows] * (m * B)).astype(np.int32)[:, None]
        flat, size = cells.ravel(), slots * m * B
        hg = np.bincount(flat, np.repeat(self.g[rows], m), minlength=size).reshape(slots, m, B)
        hh = np.bincount(flat, np.repeat(self.h[rows], m), minlength=size).reshape(slots, m, B)
        if not small.all():
            assert self._exact is not None
            big = np.flatnonzero(~small)
            hg[big] = self._exact[0][big // 2] - hg[big ^ 1]
            hh[big] = self._exact[1][big // 2] - hh[big ^ 1]
        self._exact = (hg, hh)
        return hg, hh

    def level_histograms(self, level: int,
                         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Noisy (2^level, m, n_bins) g and h histograms of the tree's released features.

        The caller has charged the release. Noise std σ·Δ with Δ² = m·(G² + H²)."""
        hg, hh = self._exact_level(level)
        std = self.sigma * np.sqrt(self.features.size * (self.clip_g ** 2 + self.clip_h ** 2))
        return hg + rng.normal(0.0, std, hg.shape), hh + rng.normal(0.0, std, hh.shape)

    def leaf_sums(self, depth: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Noisy (2^depth,) Σg and Σh per leaf slot; noise std σ·√(G² + H²)."""
        slots = 2 ** depth
        live = self.pos >= 0
        sg = np.bincount(self.pos[live], self.g[live], minlength=slots)
        sh = np.bincount(self.pos[live], self.h[live], minlength=slots)
        std = self.sigma * np.sqrt(self.clip_g ** 2 + self.clip_h ** 2)
        return sg + rng.normal(0.0, std, slots), sh + rng.normal(0.0, std, slots)

    def descend(self, feature: np.ndarray, split_bin: np.ndarray) -> None:
        """Move every row to its child slot: (slots,) chosen feature (original column
        index) and split bin k per slot (row goes left when its bin < k)."""
        live = np.flatnonzero(self.pos >= 0)
        p = self.pos[live]
        b = self.bins[live, feature[p]]
        self.pos[live] = 2 * p + (b >= split_bin[p])


def charge_all(ledgers: list[Ledger | None], events: list[dpa.DpEvent], round: int,
               label: str) -> None:
    """Charge every silo its event, all or none (every ledger is checked first).
    Silos with no ledger (the non-private mode) are skipped."""
    pairs = [(led, ev) for led, ev in zip(ledgers, events, strict=True) if led is not None]
    for led, ev in pairs:
        led.check(ev, round=round, label=label)
    with deferred_signals():  # all the silos' charges, or a signal waits until they are
        for led, ev in pairs:
            led.charge(ev, round=round, label=label)

"""The white-box and black-box scores of the trees' membership audit (`audit.gbdt`).

What the server receives from the audited silo (`GbdtRelease`) is, in every cell that only
canaries can populate, u = A x + noise: x (m,) the canaries' inclusion, A what canary i
adds when in — its clipped gradient g_it to its g cell and hessian h_it to its h cell
(known: the canary's margin follows from the released trees). Such cells are

* at a level release (noise std σ√(P(G² + H²)), P released features): bins ≥ 1 of the
  auditing columns (real records sit in bin 0 there), and every cell of a node that only
  canaries reach (its path turns right at a split on an auditing column);
* at the leaf release (noise std σ√(G² + H²)): the sums of such canary-only leaves —
  with random splits, drawn among mostly auditing columns, most leaves are; with cyclic
  splits, a tree on an auditing column has its bins as leaves: bins ≥ 1 hold canaries
  only;
* at the private bins' release (bins = "private"; noise std σ_b√D per count, D released
  columns): the auditing columns' fine bins ≥ 1.

The least-squares x̂ of every such equation (weighted by the inverse noise variance; all
trees pooled without row subsampling — one inclusion for all) and its variance v give
the score (x̂ − ½)/v, the Gaussian likelihood ratio of x̂. With a subsample rate q < 1
each tree has its own Poisson draw: per tree x̂_t, v_t and the score
Σ_t log(1 − q + q·e^{λ_t}), λ_t = (x̂_t − ½)/(σ²(G² + H²)·v_t) at the claimed σ.
Every number here comes from the releases, the released ensemble, the canaries and
public settings — never from a real record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from silofl.algorithms.dp_gbdt import GbdtRelease
from silofl.models.trees import TreeEnsemble


@dataclass(frozen=True)
class ScoreSettings:
    """What the scores need of the run: task, clips G and H, row sampling rate q, depth
    D, d, the number of real features, where the auditing columns are: after the real
    features (None) or at the columns `audit_cols` (cyclic splits interleave them), and
    private bins' σ_b / σ (`GbdtSettings.sigma_bins`; 0: bins over the schema)."""

    task: str
    clip_g: float
    clip_h: float
    q: float
    depth: int
    d: int
    audit_cols: tuple[int, ...] | None = None
    bins_ratio: float = 0.0

    def auditing(self, f: np.ndarray) -> np.ndarray:
        """Whether each column index in `f` is an auditing column (same shape, bool)."""
        if self.audit_cols is None:
            return np.asarray(f) >= self.d
        return np.isin(f, self.audit_cols)


def gradients(task: str, margin: np.ndarray, y: np.ndarray, G: float,
              H: float) -> tuple[np.ndarray, np.ndarray]:
    """Clipped (g, h), (m,) each, as the silo computes them at `margin`."""
    if task == "binary":
        p = 1.0 / (1.0 + np.exp(-margin))
        g, h = p - y, p * (1.0 - p)
    else:
        g, h = margin - y, np.ones_like(margin)
    return np.clip(g, -G, G), np.clip(h, 0.0, H)


def route(X: np.ndarray, r: GbdtRelease, level: int,
          st: ScoreSettings) -> tuple[np.ndarray, np.ndarray]:
    """(slot at `level` (m,), canary-only (m,) bool) of each row of X: routed by the
    release's heap splits; canary-only when the path turns right at a split on an
    auditing column (`ScoreSettings.auditing`), where every real record goes left (bin 0)."""
    node = np.zeros(X.shape[0], dtype=np.int64)
    rows = np.arange(X.shape[0])
    only = np.zeros(X.shape[0], dtype=bool)
    for _ in range(level):
        f, t = r.split_feature[node], r.split_threshold[node]
        left = X[rows, f] < t  # +inf: a pass-through node, every row left
        only |= ~left & st.auditing(f)
        node = 2 * node + np.where(left, 1, 2)
    return node - (2 ** level - 1), only


def _overlap(E: np.ndarray, b: np.ndarray, n_bins: int) -> np.ndarray:
    """(m, m) K_ij = Σ_p E_ip E_jp [b_ip = b_jp]: the canary-only cells i and j share."""
    m, P = b.shape
    i, p = np.nonzero(E)
    one_hot = sparse.csr_matrix((np.ones(i.size), (i, p * n_bins + b[i, p])),
                                shape=(m, P * n_bins))
    return (one_hot @ one_hot.T).toarray()


def _level(r: GbdtRelease, st: ScoreSettings, X: np.ndarray, bins: np.ndarray,
           g: np.ndarray, h: np.ndarray,
           cache: dict[bytes, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A level release's normal equations (M (m, m), b (m,)), in units of σ²(G² + H²)."""
    slot, only = route(X, r, r.level, st)
    b = bins[:, r.features]  # (m, P) each canary's bin of each released feature
    E = only[:, None] | (st.auditing(r.features)[None, :] & (b >= 1))
    P, B = r.features.size, r.g.shape[-1]
    key = r.features.tobytes()
    if only.any():  # a node only canaries reach: rare with histogram splits
        K = _overlap(E, b, B)
    else:  # E depends on the released features only
        if key not in cache:
            cache[key] = _overlap(E, b, B)
        K = cache[key]
    same = slot[:, None] == slot[None, :]
    M = (np.outer(g, g) + np.outer(h, h)) * K * same
    s = slot[:, None]
    p = np.arange(P)[None, :]
    rhs = g * np.where(E, r.g[s, p, b], 0).sum(1) + h * np.where(E, r.h[s, p, b], 0).sum(1)
    return M / P, rhs / P


def _leaves(r: GbdtRelease, st: ScoreSettings, X: np.ndarray, g: np.ndarray,
            h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The leaf release's normal equations over canary-only leaves, units σ²(G² + H²)."""
    slot, only = route(X, r, st.depth, st)
    w = only.astype(float)
    same = slot[:, None] == slot[None, :]
    M = (np.outer(g, g) + np.outer(h, h)) * same * np.outer(w, w)
    return M, w * (g * r.g[slot] + h * r.h[slot])


def _bins(r: GbdtRelease, st: ScoreSettings,
          X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The private bins' release's normal equations, units σ²(G² + H²): each canary adds
    1 to the fine bin of its value in every auditing column (bounds [0, 1]; real records
    sit in fine bin 0), noise std σ_b·√D per count (D released columns)."""
    D, fine = r.g.shape
    cols = np.flatnonzero(st.auditing(np.arange(D)))
    f = np.clip(np.floor(X[:, cols] * fine).astype(np.int64), 0, fine - 1)
    E = f >= 1
    w = (st.clip_g ** 2 + st.clip_h ** 2) / max(st.bins_ratio ** 2 * D, 1e-300)
    K = _overlap(E, f, fine)
    rhs = np.where(E, r.g[cols[None, :], f], 0.0).sum(1)
    return w * K, w * rhs


def _solve(M: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares x̂ = (M + τI)⁻¹b and diag((M + τI)⁻¹), τ a tiny ridge (canaries never
    observed get x̂ = 0 with a huge variance)."""
    tau = 1e-9 * max(float(np.max(np.diag(M), initial=0.0)), 1e-12)
    inv = np.linalg.inv(M + tau * np.eye(M.shape[0]))
    return inv @ b, np.diag(inv)


def white_box(st: ScoreSettings, releases: list[GbdtRelease], ensemble: TreeEnsemble,
              X: np.ndarray, bins: np.ndarray, y: np.ndarray, sigma: float) -> np.ndarray:
    """(m,) the white-box score (module docstring) of m canaries.

    Parameters
    ----------
    st : ScoreSettings
    releases : list of GbdtRelease
        The audited silo's releases (levels and leaves of every shared tree; the
        private bins' counts, tree −1).
    ensemble : TreeEnsemble
        The released shared trees (the canaries' margins, hence g and h).
    X, bins : numpy.ndarray
        (m, d + C) the canaries' rows as trained, and their bins.
    y : numpy.ndarray
        (m,) their labels.
    sigma : float
        The claimed noise multiplier σ (the subsampled mixture's scale).

    Returns
    -------
    numpy.ndarray
        (m,) higher: more likely "in".
    """
    m = X.shape[0]
    margin = np.full(m, ensemble.base_score)
    grads = []
    for tree in ensemble.trees:
        grads.append(gradients(st.task, margin, y, st.clip_g, st.clip_h))
        margin = margin + tree.value[tree.apply(X)]
    per_tree: dict[int, list[np.ndarray]] = {}
    cache: dict[bytes, np.ndarray] = {}
    for r in releases:
        if r.tree < 0:  # the private bins (before any tree, not subsampled)
            M, b = _bins(r, st, X)
        else:
            g, h = grads[r.tree]
            M, b = (_leaves(r, st, X, g, h) if r.level >= st.depth
                    else _level(r, st, X, bins, g, h, cache))
        acc = per_tree.setdefault(r.tree, [np.zeros((m, m)), np.zeros(m)])
        acc[0] += M
        acc[1] += b
    if not per_tree:
        return np.zeros(m)
    if st.q >= 1.0:  # one inclusion for every tree: pool the equations
        x, v = _solve(np.sum([M for M, _ in per_tree.values()], axis=0),
                      np.sum([b for _, b in per_tree.values()], axis=0))
        return (x - 0.5) / v  # ∝ the Gaussian log-likelihood ratio of x̂
    sd2 = max(sigma ** 2 * (st.clip_g ** 2 + st.clip_h ** 2), 1e-300)
    score = np.zeros(m)
    for t, (M, b) in per_tree.items():  # one Poisson draw per tree: the mixture per tree
        x, v = _solve(M, b)
        lam = (x - 0.5) / (v * sd2)
        score += lam if t < 0 else np.logaddexp(math.log1p(-st.q), math.log(st.q) + lam)
    return score


def black_box(task: str, ensemble: TreeEnsemble, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(m,) minus the released ensemble's loss on each canary (log-loss or squared error)."""
    margin = ensemble.predict_margin(X)
    if task == "binary":
        return -(np.logaddexp(0.0, margin) - y * margin)
    return -(margin - y) ** 2

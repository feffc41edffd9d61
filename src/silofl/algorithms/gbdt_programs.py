"""DP federated GBDT as two explicit programs (Flower-style): the silo program answers the
server's messages with its noisy releases, the server program sums them, picks the splits
and the leaf values, builds the ensemble and says what to ask next. The in-process driver
(`silofl.algorithms.dp_gbdt.train_dp_gbdt`) and the networked runtime
(`silofl.runtime.network.gbdt_host`) run exactly these programs.

Messages are plain data: a server message (`Ask`) and a silo's release are flat float64
arrays of public length, decoded and checked by the receiver (nothing is pickled).

The protocol (exchange t = 1, 2, …; R = D + 1 releases per tree for histogram splits, 1
for random splits; exchange T·R + 1 is the last):

==========  ====================================================  =========================
op          server → silo (`Ask`)                                 silo → server (release)
==========  ====================================================  =========================
LEVEL L     tree, level L, the tree's features F (m,), the        noisy g, h histograms
            splits of level L − 1 (L > 0), at level 0 the          (2, 2^L, m, B)
            previous tree's leaf values (2^D,)
LEAVES      tree, the splits of level D − 1 (random splits: of     noisy Σg, Σh per leaf
            every level, and at tree start the previous tree's     (2, 2^D)
            leaf values)
MODEL       the last tree's leaf values and the summed noisy      nothing
            (Σg, Σh) of every tree's leaves (T, 2, 2^D): a silo
            may compute personal leaves from them and its own
==========  ====================================================  =========================

A silo charges its ledger for a release before it reads a row for it (the tree's first
release also before computing g, h from its margins).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dp_accounting as dpa
import numpy as np

from silofl.errors import ConfigError, SiloflError
from silofl.models.trees import Tree, TreeEnsemble
from silofl.privacy import accounting
from silofl.privacy.ledger import Ledger
from silofl.training.histograms import SiloHistograms, bin_features, ensemble_event, tree_event

OP_LEVEL, OP_LEAVES, OP_MODEL = 1, 2, 3
_HEADER = 8  # op, tree, level, m, |splits|, |leaves|, |sums|, reserved


class MessageError(SiloflError):
    """A server message or a silo release that does not follow the protocol."""


@dataclass(frozen=True)
class GbdtSettings:
    """The public settings of one DP-GBDT run (resolved and checked: `gbdt_settings`)."""

    task: str
    d: int
    trees: int = 20
    depth: int = 3
    n_bins: int = 16
    lr: float = 0.3
    lam: float = 1.0
    clip_g: float = 1.0
    clip_h: float = 0.25
    subsample: float = 1.0
    colsample: float = 1.0
    min_child_hessian: float = 1.0
    max_leaf: float = 4.0
    base_score: float = 0.0
    splits: str = "histogram"
    local_trees: int = 0

    @property
    def releases(self) -> int:
        """Releases per tree: D + 1 (histogram splits) or 1 (random splits)."""
        return self.depth + 1 if self.splits == "histogram" else 1

    @property
    def m(self) -> int:
        """Features released per tree."""
        return max(1, int(round(self.colsample * self.d))) if self.colsample < 1 else self.d

    @property
    def exchanges(self) -> int:
        """Messages of the shared phase: T·R releases and the final MODEL."""
        return self.trees * self.releases + 1

    def ensemble_event(self, sigma: float) -> dpa.DpEvent:
        """What one silo spends over the whole run (shared and local trees)."""
        return ensemble_event(sigma, self.trees + self.local_trees, self.releases,
                              self.subsample)


def gbdt_settings(task: str, d: int, *, trees: int = 20, depth: int = 3, n_bins: int = 16,
                  lr: float = 0.3, lam: float = 1.0, clip_g: float = 1.0,
                  clip_h: float | None = None, subsample: float = 1.0, colsample: float = 1.0,
                  min_child_hessian: float = 1.0, max_leaf: float | None = None,
                  base_score: float = 0.0, splits: str = "histogram",
                  local_trees: int = 0) -> GbdtSettings:
    """Checked settings of a run (ConfigError naming the bad one).

    Parameters
    ----------
    task : {"binary", "regression"}
    d : int
        Number of features.
    trees, depth, n_bins, lr, lam, clip_g, clip_h, subsample, colsample,
    min_child_hessian, max_leaf, base_score, splits, local_trees
        As `silofl.algorithms.dp_gbdt.train_dp_gbdt` (clip_h, max_leaf: None = the
        task's default).

    Returns
    -------
    GbdtSettings
    """
    if task not in ("binary", "regression"):
        raise ConfigError(f"dp_gbdt needs a binary or regression task, got {task!r}")
    clip_h = (0.25 if task == "binary" else 1.0) if clip_h is None else clip_h
    max_leaf = (4.0 if task == "binary" else clip_g) if max_leaf is None else max_leaf
    for name, v, lo, hi in (("trees", trees, 1, 10_000), ("depth", depth, 1, 12),
                            ("local_trees", local_trees, 0, 10_000), ("n_bins", n_bins, 2, 4096)):
        if int(v) != v or not lo <= v <= hi:
            raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {v}")
    for name, frac in (("subsample", subsample), ("colsample", colsample)):
        if not 0.0 < frac <= 1.0:
            raise ConfigError(f"{name} must be in (0, 1], got {frac}")
    for name, pos in (("lr", lr), ("lam", lam), ("clip_g", clip_g), ("clip_h", clip_h),
                      ("max_leaf", max_leaf)):
        if not (np.isfinite(pos) and pos > 0):
            raise ConfigError(f"{name} must be a positive number, got {pos}")
    if not np.isfinite(base_score):
        raise ConfigError(f"base_score must be a finite number, got {base_score}")
    if not np.isfinite(min_child_hessian):
        raise ConfigError(f"min_child_hessian must be a finite number, got {min_child_hessian}")
    if splits not in ("histogram", "random"):
        raise ConfigError(f"splits must be 'histogram' or 'random', got {splits!r}")
    return GbdtSettings(task, int(d), int(trees), int(depth), int(n_bins), float(lr),
                        float(lam), float(clip_g), float(clip_h), float(subsample),
                        float(colsample), float(min_child_hessian), float(max_leaf),
                        float(base_score), splits, int(local_trees))


def calibrate_sigma(s: GbdtSettings, ledger: Ledger, given: float | None = None) -> float:
    """The silo's σ for its own target over the whole ensemble (or `given`, a job's
    calibration for several methods composed), preflighted against what its ledger has
    spent (BudgetExceeded before any row is read).

    Parameters
    ----------
    s : GbdtSettings
    ledger : Ledger
        The silo's ledger: its target (ε, δ) and accountant.
    given : float, optional
        σ already calibrated by the caller (checked by the preflight only).

    Returns
    -------
    float
        σ, the noise multiplier (noise std = σ·Δ of each release).
    """
    sigma = given if given is not None else accounting.calibrate(
        lambda x: s.ensemble_event(x), ledger.target.epsilon, ledger.target.delta,
        ledger.accountant)
    ledger.preflight(s.ensemble_event(sigma))
    return float(sigma)


def best_splits(hg: np.ndarray, hh: np.ndarray, lam: float,
                min_child_hessian: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The best split of every node from its (summed, noisy) histograms.

    Parameters
    ----------
    hg, hh : numpy.ndarray
        (slots, m, B) gradient and hessian sums per node, released feature and bin.
    lam : float
        L2 leaf regularisation λ.
    min_child_hessian : float
        Smallest Σh allowed in either child.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray, numpy.ndarray)
        Per slot: the index into the released features (int), the split bin k in 1..B−1
        (a row goes left when its bin < k; B when the node does not split) and the gain
        (−inf when it does not split).
    """
    GL = np.cumsum(hg, axis=2)[:, :, :-1]  # (slots, m, B−1): bins < k for k = 1..B−1
    HL = np.cumsum(hh, axis=2)[:, :, :-1]
    G = hg.sum(axis=2, keepdims=True)
    H = hh.sum(axis=2, keepdims=True)
    GR, HR = G - GL, H - HL
    ok = (HL >= min_child_hessian) & (HR >= min_child_hessian) & (H + lam > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = GL ** 2 / (HL + lam) + GR ** 2 / (HR + lam) - G ** 2 / (H + lam)
    gain = np.where(ok, gain, -np.inf)
    slots, m, K = gain.shape
    flat = gain.reshape(slots, m * K)
    best = np.argmax(flat, axis=1)
    top = flat[np.arange(slots), best]
    j, k = best // K, best % K + 1
    split = top > 0
    B = K + 1
    return j, np.where(split, k, B), np.where(split, top, -np.inf)


# --- messages --------------------------------------------------------------------------

@dataclass
class Ask:
    """A server message. `split_feature` / `split_bin`: (n,) the original column and
    split bin of every node of the levels the silo is to apply, in heap order (bin B: no
    split); `leaves`: (2^D,) the previous tree's leaf values (empty: none); `sums`: the
    MODEL message's summed (T, 2, 2^D) leaf sums, flat."""

    op: int
    tree: int
    level: int
    features: np.ndarray
    split_feature: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    split_bin: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    leaves: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sums: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def to_array(self) -> np.ndarray:
        """The message as one flat float64 vector (the wire form)."""
        head = [self.op, self.tree, self.level, self.features.size, self.split_feature.size,
                self.leaves.size, self.sums.size, 0]
        return np.concatenate([np.asarray(head, float), self.features, self.split_feature,
                               self.split_bin, self.leaves, self.sums]).astype(np.float64)

    @classmethod
    def from_array(cls, a: np.ndarray) -> Ask:
        """Decode `to_array`'s vector (MessageError for a malformed one)."""
        a = np.asarray(a, dtype=np.float64).ravel()
        if a.size < _HEADER or not np.all(np.isfinite(a)):
            raise MessageError("gbdt message is shorter than its header or not finite")
        head = a[:_HEADER]
        if np.any(head != np.floor(head)) or np.any(head < 0):
            raise MessageError("gbdt message header holds non-integers")
        op, tree, level, m, ns, nl, nsum, _ = (int(v) for v in head)
        if a.size != _HEADER + m + 2 * ns + nl + nsum:
            raise MessageError(f"gbdt message has {a.size} numbers, its header states "
                               f"{_HEADER + m + 2 * ns + nl + nsum}")
        parts = np.split(a[_HEADER:], np.cumsum([m, ns, ns, nl]))
        ints = np.concatenate(parts[:3])
        if np.any(ints != np.floor(ints)):
            raise MessageError("gbdt message: features and splits must be integers")
        return cls(op, tree, level, parts[0].astype(np.int64), parts[1].astype(np.int64),
                   parts[2].astype(np.int64), parts[3], parts[4])


def release_size(s: GbdtSettings, ask: Ask) -> int:
    """Length of a silo's flat release answering `ask`.

    Parameters
    ----------
    s : GbdtSettings
    ask : Ask

    Returns
    -------
    int
        2·2^L·m·B for a LEVEL L message (g then h histograms), 2·2^D for LEAVES (Σg then
        Σh per leaf), 0 for MODEL (no release).
    """
    if ask.op == OP_LEVEL:
        return 2 * 2 ** ask.level * ask.features.size * s.n_bins
    return 2 * 2 ** s.depth if ask.op == OP_LEAVES else 0


def _apply_level(feature: np.ndarray, threshold: np.ndarray, level: int, chosen: np.ndarray,
                 k_bin: np.ndarray, edges: np.ndarray) -> None:
    """Write level `level`'s splits into heap arrays (bin B: pass-through, threshold ∞)."""
    B = edges.shape[1] + 1
    nodes = 2 ** level - 1 + np.arange(2 ** level)
    split = k_bin < B
    feature[nodes] = np.where(split, chosen, 0)
    threshold[nodes] = np.where(split, edges[chosen, np.minimum(k_bin, B - 1) - 1], np.inf)


def _heap(depth: int) -> tuple[np.ndarray, np.ndarray]:
    n = 2 ** (depth + 1) - 1
    return np.full(n, -1, dtype=np.int32), np.full(n, np.inf)


# --- the server program ----------------------------------------------------------------

class GbdtServer:
    """The server side: sums the silos' releases, picks splits (or draws random ones from
    the public `rng`) and leaf values, builds the ensemble. Never sees a row.

    Parameters
    ----------
    s : GbdtSettings
    edges : numpy.ndarray
        (d, B − 1) public bin edges.
    rng : numpy.random.Generator
        Public randomness: the column sample and random splits.
    first_tree, n_trees : int
        Tree indices grown (a silo's local trees continue after the shared ones).
    feature_names : list of str, optional
    """

    def __init__(self, s: GbdtSettings, edges: np.ndarray, rng: np.random.Generator, *,
                 first_tree: int = 0, n_trees: int | None = None,
                 feature_names: list[str] | None = None):
        self.s, self.edges, self.rng = s, edges, rng
        self.first, self.n_trees = first_tree, s.trees if n_trees is None else n_trees
        self.ensemble = TreeEnsemble(s.d, s.task, s.base_score, [], feature_names or None)
        self.sums: list[np.ndarray] = []  # per tree: (2, 2^D) summed noisy Σg, Σh
        self.done = False
        self.current = self._start(first_tree, np.zeros(0))

    def _start(self, t: int, leaves: np.ndarray) -> Ask:
        """The first message of tree t (features drawn now), or MODEL after the last."""
        s = self.s
        if t == self.first + self.n_trees:
            return Ask(OP_MODEL, t, 0, np.zeros(0, np.int64), leaves=leaves,
                       sums=np.concatenate([x.ravel() for x in self.sums]))
        self.features = np.sort(self.rng.choice(s.d, s.m, replace=False)) if s.m < s.d \
            else np.arange(s.d)
        self.feature, self.threshold = _heap(s.depth)
        if s.splits == "histogram":
            return Ask(OP_LEVEL, t, 0, self.features, leaves=leaves)
        B, fs, ks = s.n_bins, [], []
        for level in range(s.depth):  # public randomness only: nothing is released
            j = self.rng.integers(0, self.features.size, 2 ** level)
            k = self.rng.integers(1, B, 2 ** level)
            _apply_level(self.feature, self.threshold, level, self.features[j], k, self.edges)
            fs.append(self.features[j])
            ks.append(k)
        return Ask(OP_LEAVES, t, s.depth, self.features, np.concatenate(fs),
                   np.concatenate(ks), leaves)

    def release_size(self) -> int:
        """Length of each silo's release answering the current message."""
        return release_size(self.s, self.current)

    def receive(self, releases: list[np.ndarray]) -> None:
        """Sum the releases answering the current message (silos in job order) and move on.

        Parameters
        ----------
        releases : list of numpy.ndarray
            One flat float64 (`release_size`,) array per silo that answered.
        """
        ask, s = self.current, self.s
        if ask.op == OP_MODEL:
            self.done = True
            return
        if not releases:
            raise SiloflError(f"gbdt tree {ask.tree}: no silo answered")
        size = self.release_size()
        if any(np.shape(r) != (size,) for r in releases):
            raise MessageError(f"gbdt tree {ask.tree}: a release has not {size} numbers")
        total = np.sum([np.asarray(r, float) for r in releases], axis=0)
        if ask.op == OP_LEVEL:
            hg, hh = total.reshape(2, 2 ** ask.level, self.features.size, s.n_bins)
            j, k, _ = best_splits(hg, hh, s.lam, s.min_child_hessian)
            chosen = self.features[j]
            _apply_level(self.feature, self.threshold, ask.level, chosen, k, self.edges)
            nxt = ask.level + 1
            self.current = Ask(OP_LEVEL if nxt < s.depth else OP_LEAVES, ask.tree, nxt,
                               self.features, chosen, k)
            return
        G, H = total.reshape(2, 2 ** s.depth)
        value = np.zeros(self.feature.shape)
        leaf = -G / np.maximum(H + s.lam, s.lam)  # noisy H may be < 0
        value[2 ** s.depth - 1:] = s.lr * np.clip(leaf, -s.max_leaf, s.max_leaf)
        self.ensemble.trees.append(Tree.from_complete(self.feature, self.threshold, value))
        self.sums.append(total.reshape(2, 2 ** s.depth))
        self.current = self._start(ask.tree + 1, value[2 ** s.depth - 1:])


# --- the silo program ------------------------------------------------------------------

def _gradients(task: str, margin: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if task == "binary":
        p = 1.0 / (1.0 + np.exp(-margin))
        return p - y, p * (1.0 - p)
    return margin - y, np.ones_like(margin)


class GbdtSilo:
    """One silo's side: its binned rows, margins, noise stream, ledger and σ; `answer`
    charges the ledger for a release, then reads its rows for it.

    Parameters
    ----------
    s : GbdtSettings
    edges : numpy.ndarray
        (d, B − 1) bin edges (public, or privately computed and charged by the caller).
    X, y : numpy.ndarray
        (n, d) features and (n,) labels of the silo's training rows.
    sigma : float
        The silo's noise multiplier (0 with ledger None: the non-private reference).
    ledger : Ledger or None
    rng : numpy.random.Generator
        The silo's own stream (row subsample and noise; anything with ``random(n)`` and
        ``normal(loc, scale, size)``).
    name : str
    """

    def __init__(self, s: GbdtSettings, edges: np.ndarray, X: np.ndarray, y: np.ndarray,
                 sigma: float, ledger: Ledger | None, rng: Any, name: str = ""):
        self.s, self.edges, self.X, self.name = s, edges, np.asarray(X), name
        self.y = np.asarray(y, dtype=np.float64)
        self.sigma, self.ledger, self.rng = sigma, ledger, rng
        self.hist = SiloHistograms(ledger, bin_features(self.X, edges), sigma, s.n_bins,
                                   s.clip_g, s.clip_h)
        self.margins = np.full(self.X.shape[0], s.base_score)
        self.ensemble = TreeEnsemble(s.d, s.task, s.base_score, [])
        self.end = s.trees  # MODEL follows this tree index (then local trees, if any)
        self.expect = self._first(0)
        self.open_tree = False
        self.own_sums: list[np.ndarray] = []     # per tree: this silo's (2, 2^D) release
        self.shared_sums: np.ndarray | None = None  # MODEL: (T, 2, 2^D) summed releases
        self.shared_ensemble: TreeEnsemble | None = None  # the shared trees (after MODEL)

    def cost(self, ask: Ask) -> tuple[dpa.DpEvent, str] | None:
        """What answering `ask` charges a private silo (None: nothing) and its label."""
        s = self.s
        if ask.op == OP_MODEL:
            return None
        t = ask.tree
        if s.subsample < 1.0:  # one subsampled charge per tree, before its first release
            start = ask.level == 0 or s.splits == "random"
            return (tree_event(self.sigma, s.releases, s.subsample), f"gbdt tree {t}") \
                if start else None
        if s.splits == "random":
            return dpa.GaussianDpEvent(self.sigma), f"gbdt tree {t}"
        return dpa.GaussianDpEvent(self.sigma), f"gbdt tree {t} level {ask.level}"

    def check(self, ask: Ask) -> None:
        """Validate `ask` against what this silo expects next and its budget (nothing
        charged, nothing read): MessageError / BudgetExceeded."""
        self.validate(ask)
        what = self.cost(ask) if self.ledger is not None else None
        if what is not None and self.ledger is not None:
            self.ledger.check(what[0], round=ask.tree, label=what[1])

    def validate(self, ask: Ask) -> None:
        """MessageError unless `ask` is the message this silo expects next, well formed."""
        s, B = self.s, self.s.n_bins
        if (ask.op, ask.tree, ask.level) != self.expect:
            raise MessageError(f"silo {self.name!r} expected gbdt message {self.expect} "
                               f"(op, tree, level), got {(ask.op, ask.tree, ask.level)}")
        start = ask.op == OP_MODEL or ask.level == 0 or s.splits == "random"
        n_leaves = 2 ** s.depth if start and self.open_tree else 0
        n_split = 0 if ask.op == OP_MODEL or ask.level == 0 else \
            2 ** s.depth - 1 if s.splits == "random" else 2 ** (ask.level - 1)
        f = ask.features
        bad = ask.leaves.size != n_leaves or ask.split_feature.size != n_split
        if ask.op != OP_MODEL:
            bad |= bool(f.size != s.m or np.any(np.diff(f) <= 0) or f[0] < 0
                        or f[-1] >= s.d)
            if not start and not np.array_equal(f, self.hist.features):
                bad = True
        if ask.split_feature.size:
            bad |= not (np.all(np.isin(ask.split_feature, f)) and np.all(ask.split_bin >= 1)
                        and np.all(ask.split_bin <= B))
        if ask.op == OP_MODEL:  # the summed sums of this phase's trees (shared or local)
            first = 0 if self.shared_sums is None else s.trees
            bad |= ask.sums.size != (ask.tree - first) * 2 * 2 ** s.depth
        elif ask.sums.size:
            bad = True
        if bad:
            raise MessageError(f"silo {self.name!r}: malformed gbdt message for tree "
                               f"{ask.tree} level {ask.level}; nothing was run")

    def answer(self, ask: Ask) -> np.ndarray | None:
        """Charge, then release.

        Parameters
        ----------
        ask : Ask
            The server's next message.

        Returns
        -------
        numpy.ndarray or None
            The flat (`release_size`,) float64 noisy release; None for MODEL.

        Raises
        ------
        MessageError, BudgetExceeded
            Before anything is charged or read.
        """
        self.check(ask)
        if ask.leaves.size:
            self._finish_tree(ask.leaves)
        if ask.op == OP_MODEL:
            if self.shared_sums is None:  # the shared model: local trees may follow
                self.shared_sums = ask.sums.reshape(-1, 2, 2 ** self.s.depth)
                self.shared_ensemble = TreeEnsemble(self.s.d, self.s.task, self.s.base_score,
                                                    list(self.ensemble.trees))
                self.end = self.s.trees + self.s.local_trees
            self.expect = self._first(ask.tree)
            return None
        what = self.cost(ask) if self.ledger is not None else None
        if what is not None and self.ledger is not None:
            self.ledger.charge(what[0], round=ask.tree, label=what[1])
        h, s = self.hist, self.s
        if ask.level == 0 or s.splits == "random":  # a new tree: g, h from our margins
            g, hess = _gradients(s.task, self.margins, self.y)
            n = self.margins.size
            rows = self.rng.random(n) < s.subsample if s.subsample < 1.0 \
                else np.ones(n, dtype=bool)
            h.start_tree(g, hess, rows, ask.features)
            self.feature, self.threshold = _heap(s.depth)
            self.open_tree = True
        self._descend(ask)
        if ask.op == OP_LEVEL:
            out = np.concatenate([x.ravel() for x in h.level_histograms(ask.level, self.rng)])
            self.expect = (OP_LEVEL if ask.level + 1 < s.depth else OP_LEAVES, ask.tree,
                           ask.level + 1)
            return out
        sums = h.leaf_sums(s.depth, self.rng)
        self.own_sums.append(np.stack(sums))
        t = ask.tree + 1
        self.expect = (OP_MODEL, t, 0) if t == self.end else self._first(t)
        return np.concatenate(sums)

    def _first(self, t: int) -> tuple[int, int, int]:
        """(op, tree, level) of tree t's first message."""
        return (OP_LEVEL, t, 0) if self.s.splits == "histogram" else (OP_LEAVES, t,
                                                                      self.s.depth)

    def _descend(self, ask: Ask) -> None:
        if not ask.split_feature.size:
            return
        levels = range(self.s.depth) if self.s.splits == "random" else [ask.level - 1]
        start = 0
        for level in levels:
            n = 2 ** level
            f, k = ask.split_feature[start:start + n], ask.split_bin[start:start + n]
            _apply_level(self.feature, self.threshold, level, f, k, self.edges)
            self.hist.descend(f, k)
            start += n

    def _finish_tree(self, leaves: np.ndarray) -> None:
        value = np.zeros(self.feature.shape)
        value[2 ** self.s.depth - 1:] = leaves
        tree = Tree.from_complete(self.feature, self.threshold, value)
        self.ensemble.trees.append(tree)
        self.margins += tree.value[tree.apply(self.X)]
        self.open_tree = False


def drive(server: GbdtServer, silos: list[GbdtSilo],
          show: Callable[[Ask, GbdtServer, list], None] | None = None) -> None:
    """Run the programs in-process until the server is done: each message to every silo
    (all checked first, so a release is charged to all silos or none), their releases to
    the server.

    Parameters
    ----------
    server : GbdtServer
    silos : list of GbdtSilo
        In the job's order (the server sums their releases in this order).
    show : callable, optional
        Auditing (`train_dp_gbdt`'s ``observe``): called with (message, server, the
        silos' releases) before the server receives them.
    """
    while not server.done:
        ask = server.current
        for silo in silos:
            silo.check(ask)
        out = [silo.answer(ask) for silo in silos]
        if show is not None:
            show(ask, server, out)
        server.receive([r for r in out if r is not None])


def grow_local(silo: GbdtSilo, rng: np.random.Generator,
               shared: TreeEnsemble | None = None) -> TreeEnsemble:
    """After the shared MODEL: the silo's personal ensemble, the shared trees (`shared`'s
    objects when given, else the silo's own copies) and then `local_trees` more grown from
    its own releases alone (a one-silo server over the public `rng`), charged to its
    ledger like the shared ones.

    Parameters
    ----------
    silo : GbdtSilo
        A silo that has answered the shared MODEL message.
    rng : numpy.random.Generator
        Public randomness for its local trees' column samples and random splits.
    shared : TreeEnsemble, optional

    Returns
    -------
    TreeEnsemble
        trees + local_trees trees.
    """
    s = silo.s
    local = GbdtServer(s, silo.edges, rng, first_tree=s.trees, n_trees=s.local_trees)
    drive(local, [silo])
    base = silo.shared_ensemble if shared is None else shared
    assert base is not None, "grow_local runs after the shared MODEL message"
    return TreeEnsemble(s.d, s.task, s.base_score, [*base.trees, *local.ensemble.trees],
                        base.feature_names)

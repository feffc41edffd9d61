"""DP federated GBDT as two explicit programs (Flower-style): the silo program answers the
server's messages with its noisy releases, the server program sums them, picks the splits
and the leaf values, builds the ensemble and says what to ask next. The in-process driver
(`silofl.algorithms.dp_gbdt.train_dp_gbdt`) and the networked runtime
(`silofl.runtime.network.gbdt_host`) run exactly these programs.

Messages are plain data (`silofl.algorithms.gbdt_messages`): a server message (`Ask`) and
a silo's release are flat float64 arrays of public length, decoded and checked by the
receiver (nothing is pickled).

The protocol (R = D + 1 releases per tree for histogram splits, 1 for random and cyclic
splits; exchanges: [BINS,] T·R releases, MODEL):

==========  ====================================================  =========================
op          server → silo (`Ask`)                                 silo → server (release)
==========  ====================================================  =========================
BINS        (bins = "private" only, first) the fine bins per      noisy fine counts
            feature F (in `level`)                                (d, F)
LEVEL L     tree, level L, the tree's features F (m,), the        noisy g, h histograms
            splits of level L − 1 (L > 0), at level 0 the          (2, 2^L, m, B)
            previous tree's leaf values (2^D,)
LEAVES      tree, the splits of level D − 1 (random and cyclic     noisy Σg, Σh per leaf
            splits: of every level, and at tree start the          (2, 2^D)
            previous tree's leaf values)
MODEL       the last tree's leaf values and the summed noisy      nothing
            (Σg, Σh) of every tree's leaves (T, 2, 2^D) [and τ²   (a silo computes its
            for shrink = "auto"]                                  personal leaves)
==========  ====================================================  =========================

The first tree's first message also carries the bin edges (d, B − 1): public ones over the
declared bounds, or the server's quantiles of the summed BINS release, with B chosen from
public quantities (`gbdt_settings.resolve_bins`). A silo charges its ledger for a release
before it reads a row for it (the tree's first release also before computing g, h from its
margins). Its noise comes from its own stream: a seeded NumPy generator (reproducible
experiments) or `noise_stream`'s CSPRNG (`silofl.privacy.randomness`, noise = "secure").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dp_accounting as dpa
import numpy as np

from silofl.algorithms.gbdt_messages import (
    OP_BINS,
    OP_LEAVES,
    OP_LEVEL,
    OP_MODEL,
    Ask,
    MessageError,
    release_size,
)
from silofl.algorithms.gbdt_personal import auto_tau2, mu_from_tau2, personal_trees
from silofl.algorithms.gbdt_settings import GbdtSettings, resolve_bins, with_bins
from silofl.algorithms.gbdt_splits import PublicSplits, best_splits, public_features
from silofl.errors import ConfigError, SiloflError
from silofl.models.trees import Tree, TreeEnsemble
from silofl.privacy.ledger import Ledger
from silofl.training.histograms import SiloHistograms, bin_edges, bin_features, tree_event
from silofl.training.private_bins import (
    check_edges,
    edges_from_histograms,
    fine_bins,
    fine_histogram,
)


class NoiseStream:
    """A `silofl.privacy.randomness.Randomness` (the CSPRNG of noise = "secure") posing as
    the NumPy generator the silo program draws its row samples and noise from."""

    def __init__(self, r: Any):
        self.r = r

    def random(self, size: int) -> np.ndarray:
        return 1.0 - self.r.uniform(size)  # (0, 1] → [0, 1)

    def normal(self, loc: float, scale: float, size: Any) -> np.ndarray:
        return loc + scale * self.r.normal(size)


def noise_stream(noise: str, seeded: np.random.Generator) -> Any:
    """A silo's stream: the CSPRNG for noise = "secure" (a fresh `Randomness.secure()`,
    nothing follows from the seed), else the reproducible `seeded` generator.

    Parameters
    ----------
    noise : {"secure", "seeded"}
    seeded : numpy.random.Generator
        The silo's seeded stream (`dp_gbdt.program_rngs`).

    Returns
    -------
    NoiseStream or numpy.random.Generator
    """
    if noise == "secure":
        from silofl.privacy.randomness import Randomness
        return NoiseStream(Randomness.secure())
    if noise != "seeded":
        raise ConfigError(f"noise must be 'secure' or 'seeded', got {noise!r}")
    return seeded


def _apply_level(feature: np.ndarray, threshold: np.ndarray, level: int, chosen: np.ndarray,
                 k_bin: np.ndarray, edges: np.ndarray) -> None:
    """Write level `level`'s splits into heap arrays (bin B: pass-through, threshold ∞)."""
    B = edges.shape[1] + 1
    nodes = 2 ** level - 1 + np.arange(2 ** level)
    split = k_bin < B
    feature[nodes] = np.where(split, chosen, 0)
    threshold[nodes] = np.where(split, edges[chosen, np.minimum(k_bin, B - 1) - 1], np.inf)


#: `GbdtSilo.expect` after its last MODEL message: no message matches it
DONE = (0, -1, -1)


def _heap(depth: int) -> tuple[np.ndarray, np.ndarray]:
    n = 2 ** (depth + 1) - 1
    return np.full(n, -1, dtype=np.int32), np.full(n, np.inf)


# --- the server program ----------------------------------------------------------------

class GbdtServer:
    """The server side: sums the silos' releases, picks splits (or draws random / cyclic
    ones from public randomness) and leaf values, builds the ensemble. Never sees a row.

    Parameters
    ----------
    s : GbdtSettings
        Automatic bins are resolved here from `n_rows` and `sigmas` (public).
    rng : numpy.random.Generator
        Public randomness: the column sample and random splits.
    bounds : numpy.ndarray, optional
        (d, 2) declared bounds: equal-width bins over them, or private quantile bins.
    edges : numpy.ndarray, optional
        (d, B − 1) bin edges to use instead (public, or the silo's own for local trees).
    sigmas : list of float, optional
        Every silo's σ_k in job order (public): automatic bins and shrink = "auto".
    n_rows : int
        The silos' training rows in all (automatic bins).
    first_tree, n_trees : int
        Tree indices grown (a silo's local trees continue after the shared ones).
    feature_names : list of str, optional
    send_edges : bool
        The first tree's first message carries the edges (False: the silos have them).
    """

    def __init__(self, s: GbdtSettings, rng: np.random.Generator, *,
                 bounds: np.ndarray | None = None, edges: np.ndarray | None = None,
                 sigmas: list[float] | None = None, n_rows: int = 0, first_tree: int = 0,
                 n_trees: int | None = None, feature_names: list[str] | None = None,
                 send_edges: bool = True):
        self.sigmas = [float(x) for x in sigmas or []]
        s = resolve_bins(s, n_rows, self.sigmas)
        if edges is not None:
            edges = np.asarray(edges, dtype=np.float64)
            s = with_bins(s, edges.shape[1] + 1)
        self.s, self.rng, self.bounds, self.edges = s, rng, bounds, edges
        self.splitter = PublicSplits(s.splits, rng)
        self.first, self.n_trees = first_tree, s.trees if n_trees is None else n_trees
        self.send_edges = send_edges
        self.ensemble = TreeEnsemble(s.d, s.task, s.base_score, [], feature_names or None)
        self.sums: list[np.ndarray] = []  # per tree: (2, 2^D) summed noisy Σg, Σh
        #: shrink = "auto": per shared tree, (σ_k, Σg, Σh) of every silo that answered
        self.per_silo: list[list[tuple[float, np.ndarray, np.ndarray]]] = []
        self.done = False
        if edges is None and s.private_bins:
            self.current = Ask(OP_BINS, first_tree, s.fine)
        else:
            if edges is None:
                if bounds is None:
                    raise ConfigError("GbdtServer needs the bounds or the edges of the bins")
                self.edges = bin_edges(np.asarray(bounds, np.float64), s.n_bins)
            self.current = self._start(first_tree, np.zeros(0))

    @property
    def auto_shrink(self) -> bool:
        return self.s.shrink == "auto" and self.first == 0

    def _model(self, t: int, leaves: np.ndarray) -> Ask:
        s = self.s
        sums = np.concatenate([x.ravel() for x in self.sums]) if self.sums else np.zeros(0)
        if self.auto_shrink:  # post-processing of the releases received
            tau2 = auto_tau2(self.per_silo, self.ensemble.trees, s.lam, s.clip_g, s.clip_h)
            sums = np.append(sums, tau2)
        return Ask(OP_MODEL, t, 0, leaves=leaves, sums=sums)

    def _start(self, t: int, leaves: np.ndarray) -> Ask:
        """The first message of tree t (features drawn now), or MODEL after the last."""
        s = self.s
        if t == self.first + self.n_trees:
            return self._model(t, leaves)
        assert self.edges is not None
        self.features = public_features(s.splits, t, s.d, s.m, self.rng)
        self.feature, self.threshold = _heap(s.depth)
        edges = self.edges.ravel() if t == self.first and self.send_edges else np.zeros(0)
        if s.splits == "histogram":
            return Ask(OP_LEVEL, t, 0, self.features, leaves=leaves, edges=edges)
        fs, ks = [], []
        for level in range(s.depth):  # public randomness / a public rule: nothing released
            j, k = self.splitter.choose(level, self.features.size, s.n_bins)
            _apply_level(self.feature, self.threshold, level, self.features[j], k, self.edges)
            fs.append(self.features[j])
            ks.append(k)
        return Ask(OP_LEAVES, t, s.depth, self.features, np.concatenate(fs),
                   np.concatenate(ks), leaves, edges=edges)

    def release_size(self) -> int:
        """Length of each silo's release answering the current message."""
        return release_size(self.s, self.current)

    def receive(self, releases: list[np.ndarray | None]) -> None:
        """Sum the releases answering the current message and move on.

        Parameters
        ----------
        releases : list of numpy.ndarray or None
            Per silo in job order: its flat float64 (`release_size`,) release, None for a
            silo that did not answer.
        """
        ask, s = self.current, self.s
        if ask.op == OP_MODEL:
            self.done = True
            return
        got = [(k, np.asarray(r, float)) for k, r in enumerate(releases) if r is not None]
        if not got:
            raise SiloflError(f"gbdt tree {ask.tree}: no silo answered")
        size = self.release_size()
        if any(r.shape != (size,) for _, r in got):
            raise MessageError(f"gbdt tree {ask.tree}: a release has not {size} numbers")
        total = np.sum([r for _, r in got], axis=0)
        if ask.op == OP_BINS:  # post-processing: quantiles of the summed noisy counts
            self.edges = edges_from_histograms(total.reshape(s.d, ask.level),
                                               np.asarray(self.bounds, np.float64), s.n_bins)
            self.current = self._start(self.first, np.zeros(0))
        elif ask.op == OP_LEVEL:
            assert self.edges is not None
            hg, hh = total.reshape(2, 2 ** ask.level, self.features.size, s.n_bins)
            j, k, _ = best_splits(hg, hh, s.lam, s.min_child_hessian)
            chosen = self.features[j]
            _apply_level(self.feature, self.threshold, ask.level, chosen, k, self.edges)
            nxt = ask.level + 1
            self.current = Ask(OP_LEVEL if nxt < s.depth else OP_LEAVES, ask.tree, nxt,
                               self.features, chosen, k)
        else:
            self._leaves(ask, total, got)

    def _leaves(self, ask: Ask, total: np.ndarray, got: list[tuple[int, np.ndarray]]) -> None:
        s, L = self.s, 2 ** self.s.depth
        G, H = total.reshape(2, L)
        value = np.zeros(self.feature.shape)
        leaf = -G / np.maximum(H + s.lam, s.lam)  # noisy H may be < 0
        value[L - 1:] = s.lr * np.clip(leaf, -s.max_leaf, s.max_leaf)
        self.ensemble.trees.append(Tree.from_complete(self.feature, self.threshold, value))
        self.sums.append(total.reshape(2, L))
        if self.auto_shrink:
            if len(self.sigmas) <= max(k for k, _ in got):
                raise ConfigError("shrink = \"auto\" needs every silo's σ_k at the server")
            self.per_silo.append([(self.sigmas[k], *r.reshape(2, L)) for k, r in got])
        self.current = self._start(ask.tree + 1, value[L - 1:])


# --- the silo program ------------------------------------------------------------------

def _gradients(task: str, margin: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if task == "binary":
        p = 1.0 / (1.0 + np.exp(-margin))
        return p - y, p * (1.0 - p)
    return margin - y, np.ones_like(margin)


class GbdtSilo:
    """One silo's side: its rows, margins, noise stream, ledger and σ; `answer` charges
    the ledger for a release, then reads its rows for it.

    Parameters
    ----------
    s : GbdtSettings
    X, y : numpy.ndarray
        (n, d) features and (n,) labels of the silo's training rows.
    sigma : float
        The silo's noise multiplier of the trees (0 with ledger None: the non-private
        reference); the private bins' σ_b follows from it (`GbdtSettings.sigma_bins`).
    ledger : Ledger or None
    rng : numpy.random.Generator or NoiseStream
        The silo's own stream (row subsample and noise; `noise_stream`).
    name : str
    bounds : numpy.ndarray, optional
        (d, 2) declared bounds (bins = "private": its fine histograms span them).
    edges : numpy.ndarray, optional
        (d, B − 1) bin edges it already holds (else the server's first tree message
        brings them).
    """

    def __init__(self, s: GbdtSettings, X: np.ndarray, y: np.ndarray, sigma: float,
                 ledger: Ledger | None, rng: Any, name: str = "", *,
                 bounds: np.ndarray | None = None, edges: np.ndarray | None = None):
        self.s, self.X, self.name = s, np.asarray(X), name
        self.y = np.asarray(y, dtype=np.float64)
        self.sigma, self.ledger, self.rng, self.bounds = sigma, ledger, rng, bounds
        self.edges: np.ndarray | None = None
        self.hist: SiloHistograms | None = None
        #: auditing only (the audit self-test's "noise off"): released noise σ·noise_scale,
        #: the ledger still charges σ; set before the first message
        self.noise_scale = 1.0
        if edges is not None:
            self.set_edges(edges)
        self.margins = np.full(self.X.shape[0], s.base_score)
        self.ensemble = TreeEnsemble(s.d, s.task, s.base_score, [])
        self.end = s.trees  # MODEL follows this tree index (then local trees, if any)
        self.expect = (OP_BINS, 0, 0) if s.private_bins and edges is None else self._first(0)
        self.open_tree = False
        self.own_sums: list[np.ndarray] = []     # per tree: this silo's (2, 2^D) release
        self.shared_sums: np.ndarray | None = None  # MODEL: (T, 2, 2^D) summed releases
        self.shared_ensemble: TreeEnsemble | None = None  # the shared trees (after MODEL)
        self.mu: float | None = None  # shrink: μ of its personal leaves
        self.personal_base: TreeEnsemble | None = None  # the shared trees, personal leaves

    def set_edges(self, edges: np.ndarray) -> None:
        """Take the (d, B − 1) bin edges (B then fixes n_bins and an automatic depth)."""
        self.edges = np.asarray(edges, dtype=np.float64).reshape(self.s.d, -1)
        s = self.s = with_bins(self.s, self.edges.shape[1] + 1)
        self.hist = SiloHistograms(self.ledger, bin_features(self.X, self.edges),
                                   self.sigma * self.noise_scale, s.n_bins, s.clip_g, s.clip_h)

    def cost(self, ask: Ask) -> tuple[dpa.DpEvent, str] | None:
        """What answering `ask` charges a private silo (None: nothing) and its label."""
        s = self.s
        if ask.op == OP_MODEL:
            return None
        if ask.op == OP_BINS:
            return dpa.GaussianDpEvent(s.sigma_bins(self.sigma)), "gbdt private bins"
        t = ask.tree
        if s.subsample < 1.0:  # one subsampled charge per tree, before its first release
            start = ask.level == 0 or s.splits != "histogram"
            return (tree_event(self.sigma, s.releases, s.subsample), f"gbdt tree {t}") \
                if start else None
        if s.splits != "histogram":
            return dpa.GaussianDpEvent(self.sigma), f"gbdt tree {t}"
        return dpa.GaussianDpEvent(self.sigma), f"gbdt tree {t} level {ask.level}"

    def check(self, ask: Ask) -> None:
        """Validate `ask` against what this silo expects next and its budget (nothing
        charged, nothing read): MessageError / BudgetExceeded."""
        self.validate(ask)
        what = self.cost(ask) if self.ledger is not None else None
        if what is not None and self.ledger is not None:
            self.ledger.check(what[0], round=ask.tree, label=what[1])

    def _settings_for(self, ask: Ask) -> GbdtSettings:
        """The settings once `ask`'s edges are taken (MessageError for bad edges)."""
        if self.edges is not None or ask.op not in (OP_LEVEL, OP_LEAVES):
            if ask.edges.size:
                raise MessageError(f"silo {self.name!r}: unexpected bin edges in a gbdt "
                                   "message; nothing was run")
            return self.s
        d, n = self.s.d, ask.edges.size
        B = n // d + 1
        if n == 0 or n % d or (not self.s.auto_bins and B != self.s.n_bins) or B > 4096:
            raise MessageError(f"silo {self.name!r}: the first tree's message must carry "
                               f"({d}, n_bins − 1) bin edges, got {n} numbers")
        try:
            check_edges(ask.edges.reshape(d, -1), d)
        except ConfigError as e:
            raise MessageError(f"silo {self.name!r}: bad bin edges: {e}") from None
        return with_bins(self.s, B)

    def validate(self, ask: Ask) -> None:
        """MessageError unless `ask` is the message this silo expects next, well formed."""
        s = self._settings_for(ask)
        exp = self.expect
        if exp[0] == OP_BINS:
            if (ask.op, ask.tree) != exp[:2] or not fine_bins(2) <= ask.level <= \
                    fine_bins(4096) or ask.features.size or ask.split_feature.size \
                    or ask.leaves.size or ask.sums.size:
                raise MessageError(f"silo {self.name!r} expected a well-formed gbdt BINS "
                                   f"message, got {(ask.op, ask.tree, ask.level)}")
            return
        if self.edges is None:  # the first tree's depth may follow from its edges
            exp = self._first(exp[1], s)
        if (ask.op, ask.tree, ask.level) != exp:
            raise MessageError(f"silo {self.name!r} expected gbdt message {exp} "
                               f"(op, tree, level), got {(ask.op, ask.tree, ask.level)}")
        if self._malformed(ask, s):
            raise MessageError(f"silo {self.name!r}: malformed gbdt message for tree "
                               f"{ask.tree} level {ask.level}; nothing was run")

    def _malformed(self, ask: Ask, s: GbdtSettings) -> bool:
        B = s.n_bins
        start = ask.op == OP_MODEL or ask.level == 0 or s.splits != "histogram"
        n_leaves = 2 ** s.depth if start and self.open_tree else 0
        n_split = 0 if ask.op == OP_MODEL or ask.level == 0 else \
            2 ** s.depth - 1 if s.splits != "histogram" else 2 ** (ask.level - 1)
        f = ask.features
        bad = ask.leaves.size != n_leaves or ask.split_feature.size != n_split
        if ask.op != OP_MODEL:
            bad |= bool(f.size != s.m or np.any(np.diff(f) <= 0) or f[0] < 0
                        or f[-1] >= s.d)
            if not start and self.hist is not None and \
                    not np.array_equal(f, self.hist.features):
                bad = True
        if ask.split_feature.size:
            bad |= not (np.all(np.isin(ask.split_feature, f)) and np.all(ask.split_bin >= 1)
                        and np.all(ask.split_bin <= B))
        if ask.op == OP_MODEL:  # the summed sums of this phase's trees (shared or local)
            shared = self.shared_sums is None
            first = 0 if shared else s.trees
            extra = int(shared and s.shrink == "auto")  # τ²
            bad |= ask.sums.size != (ask.tree - first) * 2 * 2 ** s.depth + extra
            bad |= bool(extra and ask.sums[-1] < 0)
        elif ask.sums.size:
            bad = True
        return bad

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
        if ask.edges.size:
            self.set_edges(ask.edges)
        if ask.leaves.size:
            self._finish_tree(ask.leaves)
        if ask.op == OP_MODEL:
            self._model(ask)
            # after the last MODEL nothing more is answered (no tree beyond the plan)
            self.expect = self._first(ask.tree) if ask.tree < self.end else DONE
            return None
        what = self.cost(ask) if self.ledger is not None else None
        if what is not None and self.ledger is not None:
            self.ledger.charge(what[0], round=ask.tree, label=what[1])
        if ask.op == OP_BINS:
            return self._bins(ask.level)
        h, s = self.hist, self.s
        assert h is not None
        if ask.level == 0 or s.splits != "histogram":  # a new tree: g, h from our margins
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

    def _bins(self, fine: int) -> np.ndarray:
        """The private-bins release (already charged): noisy (d, fine) counts over the
        declared bounds; one example adds 1 to one bin per feature, Δ₂ = √d."""
        if self.bounds is None:
            raise ConfigError(f"silo {self.name!r}: private bins need the declared bounds")
        counts = fine_histogram(self.X, np.asarray(self.bounds, np.float64), fine)
        std = self.s.sigma_bins(self.sigma) * np.sqrt(self.s.d) * self.noise_scale \
            if self.sigma > 0 else 0.0
        self.expect = self._first(0)
        return (counts + self.rng.normal(0.0, std, counts.shape)).ravel()

    def _model(self, ask: Ask) -> None:
        """MODEL: keep the shared trees; personal leaves from its own released sums."""
        s = self.s
        if self.shared_sums is not None:
            return
        n = ask.tree * 2 * 2 ** s.depth
        self.shared_sums = ask.sums[:n].reshape(-1, 2, 2 ** s.depth)
        trees = list(self.ensemble.trees)
        self.shared_ensemble = TreeEnsemble(s.d, s.task, s.base_score, trees)
        if s.shrink is not None:  # free: post-processing of its own releases
            self.mu = mu_from_tau2(float(ask.sums[n])) if s.shrink == "auto" \
                else float(s.shrink)
            self.personal_base = TreeEnsemble(s.d, s.task, s.base_score, personal_trees(
                trees, np.stack(self.own_sums), self.mu, lr=s.lr, lam=s.lam,
                max_leaf=s.max_leaf, shared_sums=self.shared_sums))
        self.end = s.trees + s.local_trees

    def _first(self, t: int, s: GbdtSettings | None = None) -> tuple[int, int, int]:
        """(op, tree, level) of tree t's first message."""
        s = s or self.s
        return (OP_LEVEL, t, 0) if s.splits == "histogram" else (OP_LEAVES, t, s.depth)

    def _descend(self, ask: Ask) -> None:
        if not ask.split_feature.size:
            return
        assert self.edges is not None and self.hist is not None
        levels = range(self.s.depth) if self.s.splits != "histogram" else [ask.level - 1]
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
        server.receive(out)


def grow_local(silo: GbdtSilo, rng: np.random.Generator,
               shared: TreeEnsemble | None = None) -> TreeEnsemble:
    """After the shared MODEL: the silo's personal ensemble, the shared trees (its
    personal leaves with shrink; else `shared`'s objects when given, else the silo's own
    copies) and then `local_trees` more grown from its own releases alone (a one-silo
    server over the public `rng`), charged to its ledger like the shared ones.

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
    local = GbdtServer(s, rng, edges=silo.edges, first_tree=s.trees, n_trees=s.local_trees,
                       send_edges=False)
    drive(local, [silo])
    base = silo.personal_base if silo.personal_base is not None else \
        shared if shared is not None else silo.shared_ensemble
    assert base is not None, "grow_local runs after the shared MODEL message"
    return TreeEnsemble(s.d, s.task, s.base_score, [*base.trees, *local.ensemble.trees],
                        base.feature_names)

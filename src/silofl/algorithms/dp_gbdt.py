"""DP federated gradient-boosted trees (horizontal: every silo holds the same columns),
example-level DP with each silo's own (ε_k, δ_k).

Each tree is grown level by level. At every level each silo releases noisy histograms of
its clipped gradients g and hessians h over public bins (`silofl.training.histograms`,
charged to its ledger before its rows are read); the server sums them and picks, per node,
the split of largest gain

    G_L²/(H_L+λ) + G_R²/(H_R+λ) − G²/(H+λ)      (both children with H ≥ min_child_hessian)

or none (the node passes its rows on unsplit and becomes a leaf). After the last level each
silo releases noisy per-leaf Σg, Σh and the leaf values are −η·G/(H+λ). Everything the
server sees is a noisy release or public (bounds, bins, hyperparameters, the column sample
drawn from public randomness); each silo's σ_k is calibrated so that the whole ensemble
meets its own target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import dp_accounting as dpa
import numpy as np

from silofl.algorithms.gbdt_personal import check_shrink, shrink_personal
from silofl.algorithms.gbdt_splits import (
    PublicSplits,
    auto_bins,
    cyclic_depth,
    public_features,
)
from silofl.errors import ConfigError
from silofl.models.trees import Tree, TreeEnsemble
from silofl.privacy import accounting
from silofl.privacy.ledger import Ledger
from silofl.training.histograms import (
    SiloHistograms,
    bin_edges,
    bin_features,
    charge_all,
    ensemble_event,
    tree_event,
)
from silofl.training.private_bins import check_edges, plan_private_bins, private_edges

if TYPE_CHECKING:
    from silofl.data.federation import Federation, Silo


@dataclass
class GbdtResult:
    """What `train_dp_gbdt` returns.

    ensemble : TreeEnsemble — the shared model.
    ledgers : list of Ledger or None — one per silo (None entries in the non-private mode).
    report : list of dict — per silo: name, σ, target, ε spent, the charged events.
    personal : list of TreeEnsemble or None — per silo: the shared trees plus its own
        local trees (``local_trees > 0``).
    """

    ensemble: TreeEnsemble
    ledgers: list[Ledger | None]
    report: list[dict[str, Any]] = field(default_factory=list)
    personal: list[TreeEnsemble] | None = None


def _gradients(task: str, margin: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if task == "binary":
        p = 1.0 / (1.0 + np.exp(-margin))
        return p - y, p * (1.0 - p)
    return margin - y, np.ones_like(margin)


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


def _check_args(fed: Federation, trees: int, depth: int, subsample: float, colsample: float,
                lr: float, lam: float, clip_g: float, clip_h: float, unit: str) -> None:
    if unit != "example":
        raise ConfigError(f"dp_gbdt supports [privacy] unit = \"example\" only, got {unit!r}; "
                          "person-level trees are not implemented yet")
    if fed.task not in ("binary", "regression"):
        raise ConfigError(f"dp_gbdt needs a binary or regression task, got {fed.task!r}")
    if fed.is_image:
        raise ConfigError("dp_gbdt needs tabular (n, d) features, not images")
    for name, v, lo, hi in (("trees", trees, 1, 10_000), ("depth", depth, 1, 12)):
        if int(v) != v or not lo <= v <= hi:
            raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {v}")
    for name, frac in (("subsample", subsample), ("colsample", colsample)):
        if not 0.0 < frac <= 1.0:
            raise ConfigError(f"{name} must be in (0, 1], got {frac}")
    for name, pos in (("lr", lr), ("lam", lam), ("clip_g", clip_g), ("clip_h", clip_h)):
        if not (np.isfinite(pos) and pos > 0):
            raise ConfigError(f"{name} must be a positive number, got {pos}")


def _check_more(max_leaf: float, base_score: float, splits: str, local_trees: int) -> None:
    if not (np.isfinite(max_leaf) and max_leaf > 0):
        raise ConfigError(f"max_leaf must be a positive number, got {max_leaf}")
    if not np.isfinite(base_score):
        raise ConfigError(f"base_score must be a finite number, got {base_score}")
    if splits not in ("histogram", "random", "cyclic"):
        raise ConfigError(f"splits must be 'histogram', 'random' or 'cyclic', got {splits!r}")
    if int(local_trees) != local_trees or not 0 <= local_trees <= 10_000:
        raise ConfigError(f"local_trees must be an integer in [0, 10000], got {local_trees}")


def _bounds_array(bounds: Any, d: int) -> np.ndarray:
    b = np.asarray(bounds, dtype=np.float64)
    if b.shape == (2,):
        b = np.tile(b, (d, 1))
    if b.shape != (d, 2):
        raise ConfigError(f"bounds must be (lower, upper) or a ({d}, 2) array, got {b.shape}")
    return b


def _sigmas(fed: Federation, ledgers: list[Ledger | None], trees: int, releases: int,
            q: float, private: bool, given: list[float] | None = None) -> list[float]:
    """Each silo's σ_k for its own target over the whole ensemble (or `given`, a job's
    calibration for several methods composed); preflighted."""
    if not private:
        return [0.0] * fed.num_silos
    if given is not None and len(given) != fed.num_silos:
        raise ConfigError(f"got {len(given)} noise multipliers for {fed.num_silos} silos")
    out = []
    for k, led in enumerate(ledgers):
        assert led is not None
        sigma = given[k] if given is not None else accounting.calibrate(
            lambda s: ensemble_event(s, trees, releases, q),
            led.target.epsilon, led.target.delta, led.accountant)
        led.preflight(ensemble_event(sigma, trees, releases, q))  # fails before any row is read
        out.append(float(sigma))
    return out


def _make_ledgers(fed: Federation, ledgers: list[Ledger] | None,
                  private: bool) -> list[Ledger | None]:
    if not private:
        return [None] * fed.num_silos
    if ledgers is not None:
        if len(ledgers) != fed.num_silos:
            raise ConfigError(f"got {len(ledgers)} ledgers for {fed.num_silos} silos")
        return list(ledgers)
    missing = [s.name for s in fed.silos if s.target is None]
    if missing:
        raise ConfigError(f"silos {missing} have no privacy target; set them with "
                          "Federation.with_targets(...) or pass ledgers")
    return [Ledger(s.name, s.target) for s in fed.silos]  # type: ignore[arg-type]


def _bin_settings(n_bins: int | str, edges: np.ndarray | None,
                  d: int) -> tuple[int, np.ndarray | None]:
    """Validate n_bins / edges: (B before "auto" is resolved, checked edges or None)."""
    if isinstance(n_bins, str) and n_bins != "auto":
        raise ConfigError(f"n_bins must be an integer or \"auto\", got {n_bins!r}")
    nb = 16 if isinstance(n_bins, str) else int(n_bins)
    if edges is not None:
        edges = check_edges(edges, d)
        nb = edges.shape[1] + 1
    return nb, edges


def _edges_and_sigmas(fed: Federation, leds: list[Ledger | None], ev: Any, *,
                      edges: np.ndarray | None, nb: int, bounds: np.ndarray, bins: str,
                      bins_share: float, auto: bool, clip: tuple[float, float], seed: int,
                      private: bool, releases: int, q: float, trees: int,
                      given: list[float] | None) -> tuple[np.ndarray, int, list[float]]:
    """Each silo's σ_k (with the private bins' release composed in when bins = "private";
    `given`: a job's σ_k), then B ("auto": from σ_k, `gbdt_splits.auto_bins`) and the edges
    (private ones charged and released here). Returns (edges (d, B − 1), B, σ per silo)."""
    private_bins = edges is None and bins == "private"
    if private_bins:  # charged first; σ_k calibrated with them
        plan = plan_private_bins(leds, bins_share, ev, trees * releases, given)
        sigmas = plan.sigmas
    else:
        sigmas = _sigmas(fed, leds, trees, releases, q, private, given)
    if auto:  # cyclic leaves' noise does not depend on B: choose B from σ_k (public)
        nb = auto_bins(sum(s.n_train for s in fed.silos), sigmas, *clip)
    if private_bins:
        rngs = [np.random.default_rng(s)
                for s in np.random.SeedSequence([seed, 24]).spawn(fed.num_silos)]
        edges = private_edges([s.X_train for s in fed.silos], leds, plan, bounds, nb, rngs)
    elif edges is None:
        edges = bin_edges(bounds, nb)
    return edges, nb, sigmas


def train_dp_gbdt(fed: Federation, *, trees: int | None = None, depth: int | None = None,
                  n_bins: int | str = "auto", bounds: Any = (-1.0, 1.0), lr: float = 0.3,
                  lam: float = 30.0,
                  clip_g: float = 1.0, clip_h: float | None = None, subsample: float = 1.0,
                  colsample: float = 1.0, min_child_hessian: float = 1.0,
                  base_score: float = 0.0, splits: str = "cyclic",
                  local_trees: int = 0, max_leaf: float | None = None, seed: int = 0,
                  ledgers: list[Ledger] | None = None, private: bool = True,
                  unit: str = "example",
                  noise_multipliers: list[float] | None = None,
                  edges: np.ndarray | None = None, bins: str = "schema",
                  bins_share: float = 0.1,
                  shrink: float | str | None = None) -> GbdtResult:
    """Train a DP federated GBDT; every silo spends at most its own (ε_k, δ_k).

    Parameters
    ----------
    fed : Federation
        Tabular, binary or regression; each silo's ``target`` is its (ε, δ) (or pass
        `ledgers`).
    trees, depth : int
        T trees of depth D (complete; nodes without a useful split pass rows through).
        T = None: two passes over the features (2·d) for cyclic splits, else 20.
        The defaults (cyclic, η = 0.3, λ = 30, 2 passes, auto bins) were chosen on a
        development set (Titanic, ε ∈ {0.3, 1}), not on the benchmarks reported in
        docs/benchmarks/gbdt/table.md (docs/guides/trees.md says how).
    n_bins : int or "auto"
        Equal-width bins per feature over the declared `bounds` (public). "auto": for
        cyclic splits from the rows and the leaves' noise (`gbdt_splits.auto_bins`),
        else 16. depth = None: log2(n_bins) for cyclic splits (leaves = bins), else 3.
    bounds : (2,) or (d, 2) array-like
        Declared [lower, upper] per feature (the default suits features the schema's
        declared bounds map to [−1, 1]).
    lr, lam : float
        Shrinkage η and L2 leaf regularisation λ.
    clip_g, clip_h : float
        G, H: per-example g ∈ [−G, G], h ∈ [0, H]. Binary: |g| ≤ 1 and h ≤ 1/4 always, so
        the defaults 1 and 1/4 clip nothing; regression (squared loss: g = prediction −
        label, h = 1): H defaults to 1, and G should cover the residuals' scale.
    subsample : float
        Poisson row-sampling rate q per tree (amplification accounted).
    colsample : float
        Share of features released per tree, drawn with public randomness (sensitivity
        scales with √m, the accounting does not change).
    min_child_hessian : float
        Smallest noisy Σh in each child of a split.
    max_leaf : float, optional
        Leaf values (before shrinkage η) are clamped to [−max_leaf, max_leaf]: noisy Σh
        near zero otherwise gives wild leaves. Default: G for regression (|Σg/Σh| ≤ G
        holds exactly there, h = 1), 4 for binary (log-odds).
    base_score : float
        Public starting margin (log-odds for binary).
    splits : {"histogram", "random", "cyclic"}
        "histogram": the best split per node from the level's noisy histograms (D + 1
        releases per tree); "random": each node's feature and bin edge drawn by the server
        from public randomness; "cyclic": tree t uses feature t mod d and halves its bin
        range at every level (`silofl.algorithms.gbdt_splits`). Random and cyclic release
        only the leaf sums: 1 release per tree.
    local_trees : int
        Personalization (the analogue of Finetune): after the shared trees, each silo
        grows this many more trees alone, from its own noisy histograms, starting from the
        shared model; σ_k covers shared and local trees together.
    seed : int
        Seeds the silos' sampling and noise and the server's column draws.
    ledgers : list of Ledger, optional
        One per silo (default: fresh in-memory ledgers from the silos' targets).
    private : bool
        False: no noise, no ledgers (a non-private reference run).
    unit : str
        Only "example" (person-level trees are refused with ConfigError).
    noise_multipliers : list of float, optional
        Each silo's σ_k as a job calibrated it for all its methods composed
        (`silofl.runtime.plan`; default: calibrated here for the ensemble alone); the
        ledgers' preflight still refuses one that does not fit.
    edges : (d, n_bins − 1) array, optional
        Public inner bin edges (float32 values, increasing) instead of equal-width bins.
    bins : {"schema", "private"}
        "private": quantile bins from each silo's noisy fine histogram, charged, its cost
        composed into σ_k (`silofl.training.private_bins`).
    bins_share : float
        bins = "private": the bins release's share of each silo's budget
        (`silofl.training.private_bins.bins_sigma`).
    shrink : float or "auto" or None
        Personal leaves (`silofl.algorithms.gbdt_personal`, free post-processing): μ ≥ 0
        pulls each silo's own leaves towards the shared ones; ``personal`` gets them.

    Returns
    -------
    GbdtResult
        The ensemble, the ledgers and a per-silo report (σ, events, ε spent).
    """
    if trees is None:
        trees = 2 * fed.dim if splits == "cyclic" else 20
    if clip_h is None:
        clip_h = 0.25 if fed.task == "binary" else 1.0
    if max_leaf is None:
        max_leaf = 4.0 if fed.task == "binary" else clip_g
    d = fed.dim
    nb, edges = _bin_settings(n_bins, edges, d)
    depth_given = depth
    depth = depth if depth is not None else 3 if splits != "cyclic" else cyclic_depth(nb)
    _check_args(fed, trees, depth, subsample, colsample, lr, lam, clip_g, clip_h, unit)
    _check_more(max_leaf, base_score, splits, local_trees)
    mu = check_shrink(shrink, fed.task)
    if bins not in ("schema", "private"):
        raise ConfigError(f"bins must be 'schema' or 'private', got {bins!r}")
    if edges is None:  # checks the bounds and nb before any charge
        bin_edges(_bounds_array(bounds, d), nb)
    leds = _make_ledgers(fed, ledgers, private)
    releases = depth + 1 if splits == "histogram" else 1
    ev = lambda s: ensemble_event(s, trees + local_trees, releases, subsample)  # noqa: E731
    edges, nb, sigmas = _edges_and_sigmas(
        fed, leds, ev, edges=edges, nb=nb, bounds=_bounds_array(bounds, d), bins=bins,
        bins_share=bins_share, auto=n_bins == "auto" and edges is None and splits == "cyclic",
        clip=(clip_g, clip_h), seed=seed, private=private, releases=releases, q=subsample,
        trees=trees + local_trees, given=noise_multipliers)
    if depth_given is None and splits == "cyclic":
        depth = cyclic_depth(nb)  # leaves = bins
    ss = np.random.SeedSequence(seed)
    server_rng, *silo_rngs = [np.random.default_rng(s) for s in ss.spawn(fed.num_silos + 1)]
    hists = [SiloHistograms(led, bin_features(s.X_train, edges), sig, nb, clip_g, clip_h)
             for s, led, sig in zip(fed.silos, leds, sigmas, strict=True)]
    margins = [np.full(s.n_train, float(base_score)) for s in fed.silos]
    ens = TreeEnsemble(d, fed.task, float(base_score), [], list(fed.feature_names) or None)
    m = max(1, int(round(colsample * d)))
    grow: dict[str, Any] = dict(depth=depth, lr=lr, lam=lam, q=subsample,
                                mch=min_child_hessian, max_leaf=max_leaf,
                                server_rng=(None if splits == "histogram" else
                                            PublicSplits(splits, server_rng)))
    for t in range(trees):
        features = public_features(splits, t, d, m, server_rng)
        tree = _grow_tree(fed.task, fed.silos, hists, leds, sigmas, margins, silo_rngs,
                          features, edges, t, **grow)
        ens.trees.append(tree)
        for k, s in enumerate(fed.silos):
            margins[k] += tree.value[tree.apply(s.X_train)]
    personal = None
    if local_trees:  # Finetune analogue: each silo grows on, alone, from the shared model
        personal = []
        for k, s in enumerate(fed.silos):
            own = TreeEnsemble(d, fed.task, float(base_score), list(ens.trees),
                               ens.feature_names)
            for t in range(trees, trees + local_trees):
                features = public_features(splits, t, d, m, server_rng)
                own.trees.append(_grow_tree(fed.task, [s], [hists[k]], [leds[k]],
                                            [sigmas[k]], [margins[k]], [silo_rngs[k]],
                                            features, edges, t, **grow))
                margins[k] += own.trees[-1].value[own.trees[-1].apply(s.X_train)]
            personal.append(own)
    if mu is not None:  # personal leaves from each silo's own released sums: free
        mu, personal = shrink_personal(ens, [h.released_leaves for h in hists], mu, sigmas,
                                       personal, lr=lr, lam=lam, max_leaf=max_leaf,
                                       clip=(clip_g, clip_h))
    report = [{"silo": s.name, "sigma": sig, **({} if mu is None else {"shrink_mu": mu}),
               **({} if led is None else led.report())}
              for s, led, sig in zip(fed.silos, leds, sigmas, strict=True)]
    return GbdtResult(ens, leds, report, personal)


def _grow_tree(task: str, silos: list[Silo], hists: list[SiloHistograms],
               leds: list[Ledger | None],
               sigmas: list[float], margins: list[np.ndarray],
               rngs: list[np.random.Generator], features: np.ndarray, edges: np.ndarray,
               t: int, *, depth: int, lr: float, lam: float, q: float, mch: float,
               max_leaf: float,
               server_rng: PublicSplits | None = None) -> Tree:
    """One boosting round: every silo's releases for tree `t`, the server's splits
    (random ones drawn from `server_rng` when given: then only the leaves are released)."""
    releases = depth + 1 if server_rng is None else 1
    private = leds[0] is not None
    per_level = q >= 1.0  # without subsampling each release is charged just before it
    # level 0 (subsampled: the whole tree; random splits: the leaf release) is charged
    # before g, h are computed from the silo's rows
    if private:
        first = [dpa.GaussianDpEvent(s) if per_level else tree_event(s, releases, q)
                 for s in sigmas]
        what = " level 0" if per_level and server_rng is None else ""
        charge_all(leds, first, t, f"gbdt tree {t}{what}")
    B = edges.shape[1] + 1
    n_inner = 2 ** depth - 1
    feature = np.full(2 ** (depth + 1) - 1, -1, dtype=np.int32)
    threshold = np.full(feature.shape, np.inf)
    for k, (h, s) in enumerate(zip(hists, silos, strict=True)):
        g, hess = _gradients(task, margins[k], s.y_train.astype(np.float64))
        rows = rngs[k].random(s.n_train) < q if q < 1.0 else np.ones(s.n_train, dtype=bool)
        h.start_tree(g, hess, rows, features)
    for level in range(depth + 1):
        if private and per_level and level > 0 and server_rng is None:
            charge_all(leds, [dpa.GaussianDpEvent(s) for s in sigmas], t,
                       f"gbdt tree {t} level {level}")
        if level == depth:
            sums = [h.leaf_sums(depth, r) for h, r in zip(hists, rngs, strict=True)]
            G = np.sum([a for a, _ in sums], axis=0)
            H = np.sum([b for _, b in sums], axis=0)
            value = np.zeros(feature.shape)
            leaf = -G / np.maximum(H + lam, lam)  # noisy H may be < 0
            value[n_inner:] = lr * np.clip(leaf, -max_leaf, max_leaf)
            return Tree.from_complete(feature, threshold, value)
        if server_rng is None:
            rel = [h.level_histograms(level, r)
                   for h, r in zip(hists, rngs, strict=True)]
            hg = np.sum([a for a, _ in rel], axis=0)
            hh = np.sum([b for _, b in rel], axis=0)
            j, k_bin, _ = best_splits(hg, hh, lam, mch)
        else:  # public randomness only: nothing is released at this level
            j, k_bin = server_rng.choose(level, features.size, B)
        chosen = features[j]
        nodes = 2 ** level - 1 + np.arange(2 ** level)
        split = k_bin < B
        feature[nodes] = np.where(split, chosen, 0)
        threshold[nodes] = np.where(split, edges[chosen, np.minimum(k_bin, B - 1) - 1], np.inf)
        for h in hists:
            h.descend(chosen, k_bin)
    raise AssertionError("unreachable")

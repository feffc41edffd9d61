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

The silo and server sides are explicit programs (`silofl.algorithms.gbdt_programs`,
its message table); `train_dp_gbdt` drives them in-process, the networked runtime over
the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.gbdt_programs import (
    OP_LEVEL,
    OP_MODEL,
    Ask,
    GbdtServer,
    GbdtSettings,
    GbdtSilo,
    best_splits,
    calibrate_sigma,
    drive,
    gbdt_settings,
    grow_local,
)
from silofl.errors import ConfigError
from silofl.models.trees import TreeEnsemble
from silofl.privacy.ledger import Ledger
from silofl.training.histograms import bin_edges

if TYPE_CHECKING:
    from silofl.data.federation import Federation

__all__ = ["GbdtRelease", "GbdtResult", "best_splits", "bounds_array", "program_rngs",
           "train_dp_gbdt"]


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


@dataclass(frozen=True)
class GbdtRelease:
    """One silo's noisy release as the server receives it (what `train_dp_gbdt`'s
    ``observe`` hook is shown; the white-box view of `silofl.audit.gbdt`).

    silo : int — the silo's index in the federation.
    tree, level : int — the shared tree and its level (level == depth: the leaf sums).
    features : numpy.ndarray — (m,) the released feature columns (sorted).
    split_feature, split_threshold : numpy.ndarray — (2^(D+1) − 1,) the tree's splits so
        far in heap layout (children of i at 2i+1, 2i+2; threshold +inf: every row goes
        left), filled for the levels above this one: how a record reaches its slot.
    g, h : numpy.ndarray — level < depth: (2^level, m, n_bins) noisy histograms; leaves:
        (2^depth,) noisy Σg, Σh per leaf slot.
    """

    silo: int
    tree: int
    level: int
    features: np.ndarray
    split_feature: np.ndarray
    split_threshold: np.ndarray
    g: np.ndarray
    h: np.ndarray


def _shower(observe: Callable[[GbdtRelease], None] | None
            ) -> Callable[[Ask, GbdtServer, list], None] | None:
    """`drive`'s hook showing `observe` each silo's release (decoded) as the server is
    about to receive it; None without an observer."""
    if observe is None:
        return None

    def show(ask: Ask, server: GbdtServer, releases: list[np.ndarray | None]) -> None:
        if ask.op == OP_MODEL:
            return
        shape = (2, 2 ** ask.level, ask.features.size, -1) if ask.op == OP_LEVEL else (2, -1)
        for k, r in enumerate(releases):
            g, h = np.asarray(r).reshape(shape)
            observe(GbdtRelease(k, ask.tree, ask.level, server.features.copy(),
                                server.feature.copy(), server.threshold.copy(), g, h))
    return show


def _check_fed(fed: Federation, unit: str) -> None:
    if unit != "example":
        raise ConfigError(f"dp_gbdt supports [privacy] unit = \"example\" only, got {unit!r}; "
                          "person-level trees are not implemented yet")
    if fed.task not in ("binary", "regression"):
        raise ConfigError(f"dp_gbdt needs a binary or regression task, got {fed.task!r}")
    if fed.is_image:
        raise ConfigError("dp_gbdt needs tabular (n, d) features, not images")


def bounds_array(bounds: Any, d: int) -> np.ndarray:
    """(d, 2) declared [lower, upper] per feature from (2,) or (d, 2) `bounds`."""
    b = np.asarray(bounds, dtype=np.float64)
    if b.shape == (2,):
        b = np.tile(b, (d, 1))
    if b.shape != (d, 2):
        raise ConfigError(f"bounds must be (lower, upper) or a ({d}, 2) array, got {b.shape}")
    return b


def program_rngs(seed: int, K: int) -> tuple[np.random.Generator, list[np.random.Generator],
                                              list[np.random.Generator]]:
    """The seeded streams of a run: the server's public one, each silo's own (sampling
    and noise) and each silo's public one for its local trees. Silo k's streams depend on
    (seed, k) only, so a networked silo draws them itself."""
    ss = np.random.SeedSequence(seed)
    server, *rest = [np.random.default_rng(c) for c in ss.spawn(2 * K + 1)]
    return server, rest[:K], rest[K:]


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


def train_dp_gbdt(fed: Federation, *, trees: int = 20, depth: int = 3, n_bins: int = 16,
                  bounds: Any = (-1.0, 1.0), lr: float = 0.3, lam: float = 1.0,
                  clip_g: float = 1.0, clip_h: float | None = None, subsample: float = 1.0,
                  colsample: float = 1.0, min_child_hessian: float = 1.0,
                  base_score: float = 0.0, splits: str = "histogram",
                  local_trees: int = 0, max_leaf: float | None = None, seed: int = 0,
                  ledgers: list[Ledger] | None = None, private: bool = True,
                  unit: str = "example", edges: np.ndarray | None = None,
                  noise_multipliers: list[float] | None = None, noise_scale: float = 1.0,
                  observe: Callable[[GbdtRelease], None] | None = None) -> GbdtResult:
    """Train a DP federated GBDT; every silo spends at most its own (ε_k, δ_k).

    Parameters
    ----------
    fed : Federation
        Tabular, binary or regression; each silo's ``target`` is its (ε, δ) (or pass
        `ledgers`).
    trees, depth : int
        T trees of depth D (complete; nodes without a useful split pass rows through).
    n_bins : int
        Equal-width bins per feature over the declared `bounds` (public).
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
    splits : {"histogram", "random"}
        "histogram": the best split per node from the level's noisy histograms (D + 1
        releases per tree); "random": each node's feature and bin edge drawn by the server
        from public randomness (only the leaf sums are released: 1 release per tree, the
        better choice for small silos at small ε).
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
    edges : numpy.ndarray, optional
        (d, n_bins − 1) bin edges to use instead of equal-width ones over `bounds` (e.g.
        private quantiles, computed and charged by the caller).
    noise_multipliers : list of float, optional
        Each silo's σ_k as a job calibrated it for all its methods composed
        (`silofl.runtime.plan`; default: calibrated here for the ensemble alone); the
        ledgers' preflight still refuses one that does not fit.
    noise_scale : float
        Auditing only, never set by a run (the audit self-test's broken variant "noise
        off" sets 0): the released noise is σ_k·noise_scale while the ledgers charge σ_k.
    observe : callable, optional
        Auditing: called with every silo's release of the shared trees (`GbdtRelease`),
        as the server receives it.

    Returns
    -------
    GbdtResult
        The ensemble, the ledgers and a per-silo report (σ, events, ε spent).
    """
    _check_fed(fed, unit)
    if not (np.isfinite(noise_scale) and noise_scale >= 0):
        raise ConfigError(f"noise_scale must be a number >= 0, got {noise_scale}")
    st: GbdtSettings = gbdt_settings(
        fed.task, fed.dim, trees=trees, depth=depth, n_bins=n_bins, lr=lr, lam=lam,
        clip_g=clip_g, clip_h=clip_h, subsample=subsample, colsample=colsample,
        min_child_hessian=min_child_hessian, max_leaf=max_leaf, base_score=base_score,
        splits=splits, local_trees=local_trees)
    edges = bin_edges(bounds_array(bounds, fed.dim), n_bins) if edges is None \
        else np.asarray(edges, dtype=np.float64)
    leds = _make_ledgers(fed, ledgers, private)
    # every silo's σ for its own target, preflighted before any silo reads a row
    if noise_multipliers is not None and len(noise_multipliers) != fed.num_silos:
        raise ConfigError(f"got {len(noise_multipliers)} noise multipliers for "
                          f"{fed.num_silos} silos")
    given = noise_multipliers or [None] * fed.num_silos
    sigmas = [0.0 if led is None else calibrate_sigma(st, led, g)
              for led, g in zip(leds, given, strict=True)]
    server_rng, silo_rngs, local_rngs = program_rngs(seed, fed.num_silos)
    names = list(fed.feature_names) or None
    silos = [GbdtSilo(st, edges, s.X_train, s.y_train, sig, led, rng, s.name)
             for s, led, sig, rng in zip(fed.silos, leds, sigmas, silo_rngs, strict=True)]
    for silo in silos:  # auditing only: the released noise, never the charged σ
        silo.hist.sigma = silo.sigma * noise_scale
    server = GbdtServer(st, edges, server_rng, feature_names=names)
    drive(server, silos, _shower(observe))
    personal = [grow_local(s, r, server.ensemble) for s, r in zip(silos, local_rngs, strict=True)] \
        if local_trees else None
    report = [{"silo": s.name, "sigma": sig,
               **({} if led is None else led.report())}
              for s, led, sig in zip(fed.silos, leds, sigmas, strict=True)]
    return GbdtResult(server.ensemble, leds, report, personal)

"""DP federated gradient-boosted trees (horizontal: every silo holds the same columns),
example-level DP with each silo's own (ε_k, δ_k).

Splits (`splits`): "cyclic" (the default: tree t uses feature t mod d, its leaves are that
feature's bins, so each silo releases once per tree), "random" (drawn from public
randomness, one release per tree) or "histogram", where each tree is grown level by
level: at every level each silo releases noisy histograms of
its clipped gradients g and hessians h over public bins (`silofl.training.histograms`,
charged to its ledger before its rows are read); the server sums them and picks, per node,
the split of largest gain

    G_L²/(H_L+λ) + G_R²/(H_R+λ) − G²/(H+λ)      (both children with H ≥ min_child_hessian)

or none (the node passes its rows on unsplit and becomes a leaf). After the last level each
silo releases noisy per-leaf Σg, Σh and the leaf values are −η·G/(H+λ). Everything the
server sees is a noisy release or public (bounds, bins, hyperparameters, the column sample
drawn from public randomness); each silo's σ_k is calibrated so that the whole ensemble
meets its own target.

Options: private quantile bins (`bins = "private"`, a first charged release), personal
leaves (`shrink`, free post-processing in each silo), local trees, secure noise (`noise`).
The silo and server sides are explicit programs (`silofl.algorithms.gbdt_programs`,
its message table); `train_dp_gbdt` drives them in-process, the networked runtime over
the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.gbdt_messages import OP_BINS, OP_LEAVES, OP_LEVEL, Ask
from silofl.algorithms.gbdt_programs import GbdtServer, GbdtSilo, drive, grow_local, noise_stream
from silofl.algorithms.gbdt_settings import GbdtSettings, calibrate_sigma, gbdt_settings
from silofl.algorithms.gbdt_splits import best_splits
from silofl.errors import ConfigError
from silofl.models.trees import TreeEnsemble
from silofl.privacy.ledger import Ledger
from silofl.training.histograms import bin_edges
from silofl.training.private_bins import check_edges

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
    """One silo's noisy tree release as the server receives it (what `train_dp_gbdt`'s
    ``observe`` hook is shown; the white-box view of `silofl.audit.gbdt`).

    silo : int — the silo's index in the federation.
    tree, level : int — the shared tree and its level (level == depth: the leaf sums).
    features : numpy.ndarray — (m,) the released feature columns (sorted).
    split_feature, split_threshold : numpy.ndarray — (2^(D+1) − 1,) the tree's splits so
        far in heap layout (children of i at 2i+1, 2i+2; threshold +inf: every row goes
        left), filled for the levels above this one: how a record reaches its slot.
    g, h : numpy.ndarray — level < depth: (2^level, m, n_bins) noisy histograms; leaves:
        (2^depth,) noisy Σg, Σh per leaf slot.

    The private bins' release (bins = "private") is shown as tree = level = −1: g the
    (d, fine) noisy fine counts, h and the splits empty.
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
    """`drive`'s hook showing `observe` each silo's release (decoded) as the server is about
    to receive it: tree releases and the private bins' counts; None without an observer."""
    if observe is None:
        return None

    def show(ask: Ask, server: GbdtServer, releases: list[np.ndarray | None]) -> None:
        if ask.op == OP_BINS:
            none = np.zeros(0)
            for k, r in enumerate(releases):
                counts = np.asarray(r).reshape(server.s.d, -1)
                observe(GbdtRelease(k, -1, -1, np.arange(server.s.d), none.astype(np.int64),
                                    none, counts, none))
            return
        if ask.op not in (OP_LEVEL, OP_LEAVES):
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


def train_dp_gbdt(fed: Federation, *, trees: int | None = None, depth: int | None = None,
                  n_bins: int | str = "auto", bounds: Any = (-1.0, 1.0), lr: float = 0.3,
                  lam: float = 30.0, clip_g: float = 1.0, clip_h: float | None = None,
                  subsample: float = 1.0, colsample: float = 1.0,
                  min_child_hessian: float = 1.0, base_score: float = 0.0,
                  splits: str = "cyclic", local_trees: int = 0, max_leaf: float | None = None,
                  seed: int = 0, ledgers: list[Ledger] | None = None, private: bool = True,
                  unit: str = "example", edges: np.ndarray | None = None,
                  noise_multipliers: list[float] | None = None, bins: str = "schema",
                  bins_share: float = 0.1, shrink: float | str | None = None,
                  noise: str = "secure", noise_scale: float = 1.0,
                  observe: Callable[[GbdtRelease], None] | None = None) -> GbdtResult:
    """Train a DP federated GBDT; every silo spends at most its own (ε_k, δ_k).

    Parameters
    ----------
    fed : Federation
        Tabular, binary or regression; each silo's ``target`` is its (ε, δ) (or pass
        `ledgers`).
    trees, depth : int, optional
        T trees of depth D (complete; nodes without a useful split pass rows through).
        T = None: two passes over the features (2·d) for cyclic splits, else 20;
        D = None: ⌈log2 B⌉ for cyclic splits (leaves = bins), else 3. The defaults
        (cyclic, η = 0.3, λ = 30, 2 passes, auto bins) were chosen on a development set
        (Titanic, ε ∈ {0.3, 1}), not on the benchmarks of docs/benchmarks/gbdt/table.md
        (docs/guides/trees.md says how).
    n_bins : int or "auto"
        Bins per feature over the declared `bounds` (public). "auto": for cyclic splits
        from the rows and the leaves' noise (`gbdt_splits.auto_bins`), else 16.
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
        Share of features released per tree, drawn with public randomness (histogram and
        random splits).
    min_child_hessian : float
        Smallest noisy Σh in each child of a split.
    base_score : float
        Public starting margin (log-odds for binary).
    splits : {"cyclic", "histogram", "random"}
        "histogram": the best split per node from the level's noisy histograms (D + 1
        releases per tree); "random": each node's feature and bin edge drawn by the server
        from public randomness; "cyclic": tree t uses feature t mod d and halves its bin
        range at every level (`silofl.algorithms.gbdt_splits`). Random and cyclic release
        only the leaf sums: 1 release per tree.
    local_trees : int
        Personalization (the analogue of Finetune): after the shared trees, each silo
        grows this many more trees alone, from its own noisy releases, starting from the
        shared model; σ_k covers shared and local trees together.
    max_leaf : float, optional
        Leaf values (before η) are clamped to [−max_leaf, max_leaf]. Default: G for
        regression, 4 for binary (log-odds).
    seed : int
        Seeds the public streams (column draws, random splits) and, with noise =
        "seeded", the silos' sampling and noise.
    ledgers : list of Ledger, optional
        One per silo (default: fresh in-memory ledgers from the silos' targets).
    private : bool
        False: no noise, no ledgers (a non-private reference run).
    unit : str
        Only "example" (person-level trees are refused with ConfigError).
    edges : numpy.ndarray, optional
        (d, B − 1) public inner bin edges (float32 values, increasing) instead of bins
        over `bounds`.
    noise_multipliers : list of float, optional
        Each silo's σ_k as a job calibrated it for all its methods composed
        (`silofl.runtime.plan`; default: calibrated here); the preflight still refuses
        one that does not fit.
    bins : {"schema", "private"}
        "private": quantile bins from each silo's noisy fine histogram, released first
        (the protocol's BINS message), charged, composed into σ_k
        (`silofl.training.private_bins`).
    bins_share : float
        bins = "private": the bins release's share of each silo's budget.
    shrink : float or "auto" or None
        Personal leaves (`silofl.algorithms.gbdt_personal`, free post-processing, each
        silo computing its own): μ ≥ 0 pulls its leaves towards the shared ones;
        ``personal`` gets them.
    noise : {"secure", "seeded"}, default "secure"
        The silos' streams: the CSPRNG of `silofl.privacy.randomness`
        (`gbdt_programs.noise_stream`; the default: a private run's noise must not follow
        from a public seed), or "seeded", reproducible from `seed` (experiments only, not
        a privacy guarantee). The non-private mode (private = False) draws nothing secret.
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
    b = bounds_array(bounds, fed.dim)
    if edges is not None:
        edges = check_edges(edges, fed.dim)
        n_bins = edges.shape[1] + 1
    st: GbdtSettings = gbdt_settings(
        fed.task, fed.dim, trees=trees, depth=depth, n_bins=n_bins, lr=lr, lam=lam,
        clip_g=clip_g, clip_h=clip_h, subsample=subsample, colsample=colsample,
        min_child_hessian=min_child_hessian, max_leaf=max_leaf, base_score=base_score,
        splits=splits, local_trees=local_trees, bins="schema" if edges is not None else bins,
        bins_share=bins_share, shrink=shrink)
    if edges is None:  # checks the bounds before any charge
        bin_edges(b, st.n_bins)
    leds = _make_ledgers(fed, ledgers, private)
    # every silo's σ for its own target, preflighted before any silo reads a row
    if noise_multipliers is not None and len(noise_multipliers) != fed.num_silos:
        raise ConfigError(f"got {len(noise_multipliers)} noise multipliers for "
                          f"{fed.num_silos} silos")
    given: list[float | None] = list(noise_multipliers) if noise_multipliers \
        else [None] * fed.num_silos
    sigmas = [0.0 if led is None else calibrate_sigma(st, led, g)
              for led, g in zip(leds, given, strict=True)]
    server_rng, silo_rngs, local_rngs = program_rngs(seed, fed.num_silos)
    names = list(fed.feature_names) or None
    # non-private (σ = 0): no noise; its row subsample stays reproducible from the seed
    silos = [GbdtSilo(st, s.X_train, s.y_train, sig, led,
                      noise_stream(noise if private else "seeded", rng), s.name, bounds=b)
             for s, led, sig, rng in zip(fed.silos, leds, sigmas, silo_rngs, strict=True)]
    for silo in silos:  # auditing only: the released noise, never the charged σ
        silo.noise_scale = noise_scale
    server = GbdtServer(st, server_rng, bounds=b, edges=edges, sigmas=sigmas,
                        n_rows=sum(s.n_train for s in fed.silos), feature_names=names)
    drive(server, silos, _shower(observe))
    personal: list[TreeEnsemble] | None = None
    if local_trees:
        personal = [grow_local(s, r, server.ensemble)
                    for s, r in zip(silos, local_rngs, strict=True)]
    elif st.shrink is not None:  # each silo's personal leaves (computed silo-side at MODEL)
        personal = [s.personal_base for s in silos if s.personal_base is not None]
    for e in personal or []:
        e.feature_names = names
    report = [{"silo": s.name, "sigma": sig, **({} if p.mu is None else {"shrink_mu": p.mu}),
               **({} if led is None else led.report())}
              for s, p, led, sig in zip(fed.silos, silos, leds, sigmas, strict=True)]
    return GbdtResult(server.ensemble, leds, report, personal)

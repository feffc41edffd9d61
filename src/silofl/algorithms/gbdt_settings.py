"""The public settings of a DP-GBDT run (`GbdtSettings`): checked by `gbdt_settings`,
their automatic values resolved from public quantities only (`resolve_bins`), and each
silo's noise multiplier (`calibrate_sigma`). Shared by the silo and server programs
(`silofl.algorithms.gbdt_programs`), the in-process driver and the network host.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np

from silofl.algorithms.gbdt_personal import check_shrink
from silofl.algorithms.gbdt_splits import auto_bins, cyclic_depth
from silofl.errors import ConfigError
from silofl.privacy import accounting
from silofl.privacy.ledger import Ledger
from silofl.training.histograms import ensemble_event
from silofl.training.private_bins import bins_sigma, check_share, fine_bins
from silofl.training.private_bins import run_event as bins_run_event

SPLITS = ("cyclic", "histogram", "random")


@dataclass(frozen=True)
class GbdtSettings:
    """The public settings of one DP-GBDT run (resolved and checked: `gbdt_settings`).

    ``auto_bins`` / ``auto_depth``: n_bins / depth are still to be chosen from the silos'
    rows and noise (cyclic splits, `resolve_bins`); until then n_bins holds 16.
    ``shrink``: None (off), "auto" or μ ≥ 0 (personal leaves, `gbdt_personal`).
    """

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
    bins: str = "schema"
    bins_share: float = 0.1
    shrink: float | str | None = None
    auto_bins: bool = False
    auto_depth: bool = False

    @property
    def releases(self) -> int:
        """Tree releases per tree: D + 1 (histogram splits) or 1 (random, cyclic)."""
        return self.depth + 1 if self.splits == "histogram" else 1

    @property
    def m(self) -> int:
        """Features released per tree (1 for cyclic splits)."""
        if self.splits == "cyclic":
            return 1
        return max(1, int(round(self.colsample * self.d))) if self.colsample < 1 else self.d

    @property
    def private_bins(self) -> bool:
        return self.bins == "private"

    @property
    def exchanges(self) -> int:
        """Messages of the shared phase: [BINS], T·R releases and the final MODEL."""
        return int(self.private_bins) + self.trees * self.releases + 1

    @property
    def fine(self) -> int:
        """Fine bins per feature of the private-bins release."""
        return fine_bins(self.n_bins)

    def ensemble_event(self, sigma: float) -> dpa.DpEvent:
        """What one silo's tree releases spend (shared and local trees)."""
        return ensemble_event(sigma, self.trees + self.local_trees, self.releases,
                              self.subsample)

    def sigma_bins(self, sigma: float) -> float:
        """σ_b of the private-bins release for trees at σ (`private_bins.bins_sigma`)."""
        return bins_sigma(sigma, self.bins_share, (self.trees + self.local_trees)
                          * self.releases)

    def run_event(self, sigma: float) -> dpa.DpEvent:
        """Everything one silo spends over the run: [the bins release, then] the trees."""
        if not self.private_bins:
            return self.ensemble_event(sigma)
        return bins_run_event(sigma, self.bins_share, (self.trees + self.local_trees)
                              * self.releases, self.ensemble_event)


def _whole(name: str, v: int, lo: int, hi: int) -> None:
    if isinstance(v, bool) or int(v) != v or not lo <= v <= hi:
        raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {v}")


def _check_numbers(lr: float, lam: float, clip_g: float, clip_h: float, max_leaf: float,
                   subsample: float, colsample: float, base_score: float,
                   min_child_hessian: float) -> None:
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


def gbdt_settings(task: str, d: int, *, trees: int | None = 20, depth: int | None = 3,
                  n_bins: int | str = 16, lr: float = 0.3, lam: float = 1.0,
                  clip_g: float = 1.0, clip_h: float | None = None, subsample: float = 1.0,
                  colsample: float = 1.0, min_child_hessian: float = 1.0,
                  max_leaf: float | None = None, base_score: float = 0.0,
                  splits: str = "histogram", local_trees: int = 0, bins: str = "schema",
                  bins_share: float = 0.1, shrink: float | str | None = None) -> GbdtSettings:
    """Checked settings of a run (ConfigError naming the bad one).

    Parameters
    ----------
    task : {"binary", "regression"}
    d : int
        Number of features.
    trees, depth, n_bins, lr, lam, clip_g, clip_h, subsample, colsample,
    min_child_hessian, max_leaf, base_score, splits, local_trees, bins, bins_share, shrink
        As `silofl.algorithms.dp_gbdt.train_dp_gbdt` (trees, depth None and n_bins
        "auto": chosen from public quantities; clip_h, max_leaf None: the task's default).

    Returns
    -------
    GbdtSettings
    """
    if task not in ("binary", "regression"):
        raise ConfigError(f"dp_gbdt needs a binary or regression task, got {task!r}")
    if splits not in SPLITS:
        raise ConfigError(f"splits must be 'histogram', 'random' or 'cyclic', got {splits!r}")
    if isinstance(n_bins, str) and n_bins != "auto":
        raise ConfigError(f"n_bins must be an integer or \"auto\", got {n_bins!r}")
    if bins not in ("schema", "private"):
        raise ConfigError(f"bins must be 'schema' or 'private', got {bins!r}")
    if bins == "private":
        check_share(bins_share)
    mu = check_shrink(shrink, task)
    auto_b = n_bins == "auto" and splits == "cyclic"
    nb = 16 if isinstance(n_bins, str) else n_bins
    trees = (2 * int(d) if splits == "cyclic" else 20) if trees is None else trees
    auto_d = depth is None and splits == "cyclic"
    if depth is None:
        depth = cyclic_depth(int(nb)) if splits == "cyclic" else 3
    clip_h = (0.25 if task == "binary" else 1.0) if clip_h is None else clip_h
    max_leaf = (4.0 if task == "binary" else clip_g) if max_leaf is None else max_leaf
    for name, v, lo, hi in (("trees", trees, 1, 10_000), ("depth", depth, 1, 12),
                            ("local_trees", local_trees, 0, 10_000), ("n_bins", nb, 2, 4096)):
        _whole(name, v, lo, hi)
    _check_numbers(lr, lam, clip_g, clip_h, max_leaf, subsample, colsample, base_score,
                   min_child_hessian)
    return GbdtSettings(task, int(d), int(trees), int(depth), int(nb), float(lr),
                        float(lam), float(clip_g), float(clip_h), float(subsample),
                        float(colsample), float(min_child_hessian), float(max_leaf),
                        float(base_score), splits, int(local_trees), bins,
                        float(bins_share), mu, auto_b, auto_d)


def with_bins(s: GbdtSettings, n_bins: int) -> GbdtSettings:
    """The settings with B = `n_bins` chosen (depth ⌈log2 B⌉ when it was automatic: a
    cyclic tree's leaves are the feature's bins)."""
    depth = cyclic_depth(n_bins) if s.auto_depth else s.depth
    return dataclasses.replace(s, n_bins=int(n_bins), depth=depth, auto_bins=False,
                               auto_depth=False)


def resolve_bins(s: GbdtSettings, n_rows: int, sigmas: list[float]) -> GbdtSettings:
    """Automatic bins chosen from public quantities: Σ_k n_k and the silos' σ_k
    (`gbdt_splits.auto_bins`); the settings unchanged when B was given.

    Parameters
    ----------
    s : GbdtSettings
    n_rows : int
        The silos' training rows in all (public by the project's assumption).
    sigmas : list of float
        Every silo's σ_k (0: non-private).

    Returns
    -------
    GbdtSettings
        With n_bins (and an automatic depth) fixed.
    """
    if not s.auto_bins:
        return with_bins(s, s.n_bins) if s.auto_depth else s
    return with_bins(s, auto_bins(n_rows, sigmas, s.clip_g, s.clip_h))


def calibrate_sigma(s: GbdtSettings, ledger: Ledger, given: float | None = None) -> float:
    """The silo's σ for its own target over the whole run (`GbdtSettings.run_event`: the
    private bins, if any, and every tree), or `given` (a job's calibration for several
    methods composed), preflighted against what its ledger has spent (BudgetExceeded
    before any row is read).

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
        σ, the trees' noise multiplier (noise std = σ·Δ of each release).
    """
    sigma = given if given is not None else accounting.calibrate(
        lambda x: s.run_event(x), ledger.target.epsilon, ledger.target.delta,
        ledger.accountant)
    ledger.preflight(s.run_event(sigma))
    return float(sigma)

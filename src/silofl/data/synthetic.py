"""Synthetic federations for tests and benchmarks; every generator is deterministic in `seed`.

Sizes given to these generators are TRAINING rows per silo: test rows are generated on top
so that `split_silo` with `test_fraction` leaves exactly that many rows for training.
Data come from ``default_rng([seed, 0])``, the train/test split from ``default_rng([seed, 1])``.
Simulated data are not standardized by default (``standardize="none"``); asking for it
(True or "uncharged") z-scores per silo on its training rows, listed in
``meta["uncharged"]`` like every uncharged statistic (here of simulated records).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from silofl.data.federation import Federation, split_silo
from silofl.data.preprocess import PreprocessSpec, preprocess_without_budget
from silofl.data.raw import RawFederation
from silofl.errors import ConfigError


def _finish(fed: Federation, standardize: str | bool) -> Federation:
    """Preprocess simulated data: columns have no declared bounds, so "auto"/True mean the
    (listed) uncharged per-silo z-scoring; "none"/False leaves them as generated."""
    if standardize is True:
        standardize = "uncharged"
    raw = RawFederation.from_federation(fed, simulated=True)
    return preprocess_without_budget(raw, PreprocessSpec.of(standardize, "auto"),
                                     fed.name)


def total_rows_for_train(n_train: int, test_fraction: float) -> int:
    """Smallest N with N - round(test_fraction * N) == n_train (what split_silo keeps)."""
    if not 0 <= test_fraction < 1:
        raise ConfigError(f"test_fraction must be in [0, 1), got {test_fraction}")
    n = int(np.floor(n_train / (1 - test_fraction)))
    while n - int(round(test_fraction * n)) > n_train:
        n -= 1
    while n - int(round(test_fraction * n)) < n_train:  # each step adds 0 or 1 train row
        n += 1
    return n


def _rngs(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    return np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])


def _sizes(sizes: tuple[int, int] | Sequence[int], num_silos: int | None, default_k: int,
           rng: np.random.Generator) -> list[int]:
    """(lo, hi) tuple -> uniform integers in [lo, hi]; a list/array -> used as given."""
    if isinstance(sizes, tuple):
        if len(sizes) != 2 or sizes[0] > sizes[1]:
            raise ConfigError(f"sizes as a tuple must be (lo, hi) with lo <= hi, got {sizes}; "
                              "pass a list to give each silo's size")
        k = default_k if num_silos is None else num_silos
        out = rng.integers(int(sizes[0]), int(sizes[1]) + 1, size=k).tolist()
    else:
        out = [int(s) for s in sizes]
        if num_silos is not None and num_silos != len(out):
            raise ConfigError(f"num_silos={num_silos} but sizes lists {len(out)} silos; "
                              "give one or make them agree")
    if not out or min(out) < 2:
        raise ConfigError(f"every silo needs at least 2 training rows, got sizes {out}")
    return out


def mean_estimation(num_silos: int | None = None, n: int = 50, dim: int = 1, sigma: float = 1.0,
                    tau: float = 0.5, theta: float = 0.0, seed: int = 0,
                    test_fraction: float = 0.2, sizes: Sequence[int] | None = None) -> Federation:
    """The mean-estimation model of section 1.6: silo centres w_k = θ + N(0, τ²), points
    x = w_k + N(0, σ²). Encoded as regression with NO features (X has shape (n_k, 0)) and
    y = x, so a linear model with only a bias term, trained on 0.5·MSE, estimates w_k.

    num_silos defaults to 10 (or len(sizes)); n (or sizes[k]) is the number of TRAINING
    points per silo. meta: "centers" (K,), "sigma", "tau", "theta".
    """
    if dim != 1:
        raise ConfigError(f"mean_estimation supports dim=1 only, got dim={dim}")
    if sigma < 0 or tau < 0:
        raise ConfigError(f"sigma and tau must be >= 0, got sigma={sigma}, tau={tau}")
    gen, split = _rngs(seed)
    ns = _sizes(sizes if sizes is not None else [n] * (num_silos or 10), num_silos, 10, gen)
    centers = theta + tau * gen.standard_normal(len(ns))
    silos = []
    for k, (n_k, w) in enumerate(zip(ns, centers)):
        m = total_rows_for_train(n_k, test_fraction)
        y = w + sigma * gen.standard_normal(m)
        silos.append(split_silo(f"silo-{k:02d}", np.zeros((m, 0)), y, test_fraction, split))
    fed = Federation(silos, [], "regression", name="mean-estimation",
                     meta={"centers": centers, "sigma": sigma, "tau": tau, "theta": theta,
                           "seed": seed, "test_fraction": test_fraction})
    return _finish(fed, "none")


def linear_silos(num_silos: int | None = None, sizes: tuple[int, int] | Sequence[int] = (200, 400),
                 dim: int = 10, heterogeneity: float = 0.5, noise: float = 0.1,
                 task: Literal["regression", "binary"] = "regression", seed: int = 0,
                 test_fraction: float = 0.2,
                 standardize: str | bool = "none") -> Federation:
    """Heterogeneous linear silos. Shared w* ~ N(0, I/dim); silo weights
    w_k = w* + heterogeneity·N(0, I/dim); features X ~ N(m_k, I) with a silo-specific mean
    m_k ~ 0.2·heterogeneity·N(0, I). Labels: y = X w_k + noise·N(0, 1) ("regression"), or
    y ~ Bernoulli(sigmoid(3·X w_k)) in {0, 1} ("binary"; `noise` unused).

    num_silos defaults to 8 (or len(sizes)); sizes (lo, hi) draws each silo's TRAINING size
    uniformly in [lo, hi], a list gives them. meta: "weights" (K, dim), "w_star" (dim,),
    "shifts" (K, dim). `standardize`: "none" (default) or True/"uncharged" (see the
    module docstring).
    """
    if task not in ("regression", "binary"):
        raise ConfigError(f"task must be 'regression' or 'binary', got {task!r}")
    if dim < 1:
        raise ConfigError(f"dim must be >= 1, got {dim}")
    gen, split = _rngs(seed)
    ns = _sizes(sizes, num_silos, 8, gen)
    k_silos, scale = len(ns), 1.0 / np.sqrt(dim)
    w_star = scale * gen.standard_normal(dim)
    weights = w_star + heterogeneity * scale * gen.standard_normal((k_silos, dim))
    shifts = 0.2 * heterogeneity * gen.standard_normal((k_silos, dim))
    silos = []
    for k, n_k in enumerate(ns):
        m = total_rows_for_train(n_k, test_fraction)
        X = gen.standard_normal((m, dim)) + shifts[k]
        z = X @ weights[k]
        if task == "regression":
            y = z + noise * gen.standard_normal(m)
        else:
            y = (gen.random(m) < 1.0 / (1.0 + np.exp(-3.0 * z))).astype(np.int64)
        silos.append(split_silo(f"silo-{k:02d}", X, y, test_fraction, split))
    fed = Federation(silos, [f"x{j:02d}" for j in range(dim)], task,
                     num_classes=2 if task == "binary" else 0, name="linear-silos",
                     meta={"weights": weights, "w_star": w_star, "shifts": shifts,
                           "heterogeneity": heterogeneity, "noise": noise, "seed": seed,
                           "test_fraction": test_fraction})
    return _finish(fed, standardize)


VEHICLE_SILOS, VEHICLE_MIN, VEHICLE_MAX, VEHICLE_DIM = 23, 872, 1933, 100


def vehicle_like(seed: int = 0) -> Federation:
    """Stand-in for the Vehicle sensor benchmark: 23 binary silos whose TRAINING sizes are
    evenly spaced integers from 872 to 1933, d = 100, heterogeneity 0.5, 20% test rows on
    top (so the total per silo is about n_k / 0.8)."""
    sizes = np.round(np.linspace(VEHICLE_MIN, VEHICLE_MAX, VEHICLE_SILOS)).astype(int).tolist()
    fed = linear_silos(sizes=sizes, dim=VEHICLE_DIM, heterogeneity=0.5, task="binary",
                       seed=seed, test_fraction=0.2)
    fed.name = "vehicle-like"
    return fed

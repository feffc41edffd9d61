"""Where a region's data-dependent feature constants come from.

Declared (public numbers, `tables.DECLARED_CONSTANTS` with the config's overrides) or a
private release: one Gaussian sum over the region's persons, charged to the region's ledger
before anything is read (`private_release`).  The "uncharged" mode fits them on the region
inside `features` and is listed as uncharged (`charges.uncharged_items`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from silofl.errors import PrivacyError
from silofl.pandemic.charges import PREPROCESS_LABEL, node_unit, preprocess_event
from silofl.pandemic.features import NeighbourhoodFeatures
from silofl.pandemic.inputs import SUMMARY_FEATURES, summary_inputs
from silofl.pandemic.tables import (
    PRIVATE_BOUNDS,
    FeatureConstants,
    build_node_table,
    declared_constants,
)
from silofl.training import sampling as TS

if TYPE_CHECKING:
    from silofl.pandemic.config import PandemicConfig
    from silofl.pandemic.region import Region


#: Clipping bounds (lo, hi) of the summary columns in a private release (declared; values
#: outside are clipped for the statistic only, never in the model's inputs)
SUMMARY_BOUNDS: dict[str, tuple[float, float]] = {
    "own_susceptible": (0.0, 1.0), "occupied_slots": (0.0, 1.0),
    "log_contact_hours": (0.0, 6.0),
    "log_n_infectious": (0.0, math.log(6.0)), "log_n_recent": (0.0, math.log(6.0)),
    "log_n_new": (0.0, math.log(6.0)),
    "log_hours_infectious": (0.0, 3.0), "log_hours_recent": (0.0, 3.0),
    "log_hours_new": (0.0, 3.0),
    "n_home_infectious": (0.0, 3.0), "n_home_recent": (0.0, 3.0), "n_home_new": (0.0, 3.0),
}


#: a private standard deviation is at least this share of its half-range: noise can
#: never blow an input column up by more than 1/this
MIN_PRIVATE_STD = 0.02




#: persons a private release sums over at most (a secret uniform sample above that)
PRIVATE_SAMPLE = 50_000


def _unit(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """x clipped to [lo, hi] and mapped linearly onto [−1, 1]."""
    c, h = (lo + hi) / 2.0, (hi - lo) / 2.0
    return (np.clip(x, lo, hi) - c) / h


def _decode(s_u: float, s_q: float, count: float, lo: float, hi: float) -> tuple[float, float]:
    """(mean, std) in raw units from noisy Σu and Σu² over ``count`` values (u ∈ [−1, 1]);
    clamped: mean into the bounds, variance into [MIN_PRIVATE_STD², 1] half-ranges²."""
    c, h = (lo + hi) / 2.0, (hi - lo) / 2.0
    count = max(count, 1.0)
    m = float(np.clip(s_u / count, -1.0, 1.0))
    q = float(np.clip(s_q / count, m * m, 1.0))
    sd = math.sqrt(min(max(q - m * m, MIN_PRIVATE_STD ** 2), 1.0))
    return c + h * m, h * sd


def release_vectors(F: NeighbourhoodFeatures, persons: np.ndarray, *, age: np.ndarray,
                    household_size: np.ndarray, windows: np.ndarray, pooling: str,
                    standardize: bool, batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """(B, d) per-person vectors of a private release and (d,) the width of each
    coordinate's range.  Every vector is a function of the person's own example only
    (their attributes, their ≤ S − 1 kept edges, their summary inputs at a seeded window):

    * age, log household size: (u, u²), u ∈ [−1, 1] from `tables.PRIVATE_BOUNDS`;
    * kept edges e of the person (k1 = S − 1 slots): (deg/k1, Σu_dur/k1, Σu_dur²/k1,
      Σu_cnt/k1, Σu_cnt²/k1) with u of log1p(seconds) and log1p(contacts);
    * with summary inputs and ``standardize``: (u_j, u_j²) per column (`SUMMARY_BOUNDS`).

    A coordinate ranges over an interval of width 2 (u, Σu/k1) or 1 (u², deg/k1), so
    replacing the example moves the vector by at most ‖widths‖₂ = 2C."""
    cols, widths = [], []

    def pair(x, lo, hi):
        u = _unit(np.asarray(x, dtype=np.float64), lo, hi)
        cols.extend([u, u * u])
        widths.extend([2.0, 1.0])

    pair(age[persons], *PRIVATE_BOUNDS["age"])
    pair(np.log(np.maximum(household_size[persons].astype(np.float64), 1.0)),
         *PRIVATE_BOUNDS["household"])
    idx, k1 = F.index, max(F.k1, 1)
    owner = np.repeat(np.arange(idx.num_nodes), idx.degree)
    deg = idx.degree.astype(np.float64)
    cols.append(deg[persons] / k1)
    widths.append(1.0)
    for key, raw in (("dur", idx.duration), ("cnt", idx.n_contacts)):
        u = _unit(np.log1p(raw.astype(np.float64)), *PRIVATE_BOUNDS[key])
        cols.append(np.bincount(owner, u, idx.num_nodes)[persons] / k1)
        cols.append(np.bincount(owner, u * u, idx.num_nodes)[persons] / k1)
        widths.extend([2.0, 1.0])
    if pooling == "summary" and standardize:
        Z = np.empty((persons.size, len(SUMMARY_FEATURES)))
        for lo in range(0, persons.size, batch_size):
            p = persons[lo:lo + batch_size]
            Z[lo:lo + p.size] = summary_inputs(F, F.gather(p, windows[p], labels=False)[0])
        for j, k in enumerate(SUMMARY_FEATURES):
            pair(Z[:, j], *SUMMARY_BOUNDS[k])
    return np.stack(cols, axis=1), np.asarray(widths)


def private_release(r: Region, cfg: PandemicConfig, inputs: dict) -> None:
    """``r``'s private preprocessing: charge `preprocess_event` to ``r.ledger`` (refused,
    nothing read, if the run did not reserve it), then release the Gaussian sum of
    `release_vectors` over ``r.pre_batch`` persons (all, or a uniform sample drawn from
    the round-0 DP randomness) with noise N(0, σ²C²) per coordinate, C = ½‖widths‖.
    Replacing one person changes ≤ `privacy.node_level.affected_examples` vectors, each by ≤ 2C:
    one step of the node-level mechanism.  Post-processing sets the feature constants
    (age, household, contact statistics; location stays declared: it describes places,
    not persons) and, with summary inputs, the model-input standardization."""
    if r.ledger is None or r.pre_sigma is None:
        raise PrivacyError(f"{r.name}: private preprocessing needs a planned and reserved "
                           "budget (use pipeline.train)")
    r.ledger.charge(preprocess_event(r, cfg), round=0, label=PREPROCESS_LABEL)
    F = r.features
    # round 0 of the core trainer's node-level streams (secure: fresh OS entropy)
    sampler, noise = TS.node_streams(node_unit([r.name], cfg), 0, 0, r.n,
                                     cfg.noise == "secure")
    persons = np.arange(r.n) if r.pre_batch >= r.n else np.sort(sampler.draw(r.pre_batch))
    windows = F.sample_windows(np.random.default_rng([int(cfg.seed), 0x5CA1E]), r.n)
    V, widths = release_vectors(F, persons, age=inputs["age"],
                                household_size=inputs["household_size"], windows=windows,
                                pooling=cfg.pooling, standardize=cfg.standardize)
    C = 0.5 * float(np.linalg.norm(widths))
    sums = V.sum(axis=0) + noise.normal(V.shape[1]) * r.pre_sigma * C
    b = float(persons.size)
    am, asd = _decode(sums[0], sums[1], b, *PRIVATE_BOUNDS["age"])
    hm, hsd = _decode(sums[2], sums[3], b, *PRIVATE_BOUNDS["household"])
    edges = sums[4] * max(F.k1, 1)  # noisy number of kept edge entries
    base = declared_constants(cfg)
    if F.k1 > 0:
        dm, dsd = _decode(sums[5] * F.k1, sums[6] * F.k1, edges, *PRIVATE_BOUNDS["dur"])
        cm, csd = _decode(sums[7] * F.k1, sums[8] * F.k1, edges, *PRIVATE_BOUNDS["cnt"])
    else:  # no edges at all (S = 1): nothing to normalize
        dm, dsd, cm, csd = base.dur_mean, base.dur_std, base.cnt_mean, base.cnt_std
    consts = base.replace(age_mean=am, age_std=asd, household_lambda=0.0, household_mean=hm,
                          household_std=hsd, dur_mean=dm, dur_std=dsd, cnt_mean=cm,
                          cnt_std=csd, source="private")
    set_constants(F, consts, inputs)
    if cfg.pooling == "summary" and cfg.standardize:
        stats_ = [_decode(sums[9 + 2 * j], sums[10 + 2 * j], b, *SUMMARY_BOUNDS[k])
                  for j, k in enumerate(SUMMARY_FEATURES)]
        r.shift = np.array([m for m, _ in stats_])
        r.scale = np.array([sd for _, sd in stats_])


def set_constants(F: NeighbourhoodFeatures, constants: FeatureConstants, inputs: dict) -> None:
    """Re-normalize ``F``'s node table and contact features with ``constants``."""
    table, names, fitted = build_node_table(
        age=inputs["age"], sex=inputs["sex"], household_size=inputs["household_size"],
        activities=inputs["activities"], frac_out_of_home=inputs["frac_out_of_home"],
        activity_names=inputs.get("activity_names"), constants=constants)
    if names != F.node_names:
        raise PrivacyError("re-normalizing changed the node table's columns")
    F.node_table = table
    F.edge_stats = constants.edge_stats()
    F.fitted = {**fitted, "constants": constants.to_dict()}

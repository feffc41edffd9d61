"""Synthetic pandemic outbreaks in the exact schema of the PETs challenge.

``synthesize(out_dir, persons=..., regions=..., seed=...)`` writes the seven
challenge inputs (days 0..56) plus ``va_disease_outcome_target.csv`` (labels for
days 57..63) and a ``manifest.json``; ``generate_outbreak(...)`` returns the
same tables in memory.  Everything is vectorized NumPy and deterministic in
the seed: the same arguments give byte-identical files.

The model, in order:

1. **Regions** (counties): ``regions`` spatial clusters laid out on a jittered
   grid over Virginia's bounding box, with log-normal population shares (sizes
   differ by up to ~10x), FIPS-like county codes 51001, 51003, ...
2. **Households** with US sizes (1: 28%, 2: 35%, 3: 15%, 4: 13%, 5: 6%,
   6+: 3%), one residence location each, placed around their county's centre.
3. **Persons** with household-aware ages (householder, partner, children or
   other adults) and sex (1 male, 2 female).
4. **Activity locations** per county: workplaces (heavy-tailed sizes), shops,
   other venues, schools, colleges and places of worship, each with the six
   type flags; service venues also employ staff (``work`` = 1).
5. **Daily schedules**: morning home, then work (employed adults), school
   (ages 5-17) or college (some 18-22 year olds), then errands (shopping,
   other, religion) and evening home.  Most destinations lie in the home
   county; commuters, students and a few shoppers cross counties.
6. **Contacts** from co-location with overlapping time windows: household
   members at home (morning and evening rows), work teams (4-20) plus a few
   co-workers, school classes (~22, by age, plus a teacher), college sections,
   and at venues each visit meets some of the visits overlapping it and, often,
   the on-shift staff (most often the venue's "front desk" employee).  Group
   caps keep the graph sparse (mean ~21-25 distinct contacts per person, ~13
   contact rows per person); staff of busy venues form the heavy degree tail
   (max degree > 4x the mean even at a few thousand persons).  ~6% of contacts
   cross regions (commuters, students, shoppers).  Each contact is one row
   and repeats every day.
7. **Outbreak**: discrete-time SIR over days 0..days+horizon-1.  Seeds on day
   0 plus a trickle of imported cases; each day an infectious person infects
   each susceptible contact with probability
   ``1 - exp(-beta * hours * susceptibility(age) * infectivity * awareness)``
   where susceptibility grows with age, asymptomatic cases (35%, recorded as S
   throughout) transmit at half strength, symptomatic cases cut
   non-household contacts after their first day, and ``awareness =
   1 / (1 + k * recorded prevalence in the susceptible's region)`` (people
   avoid contacts when cases are visible), which holds the epidemic near a
   slow plateau.  Infectious periods last 4-9 days.  Defaults give ~3-4% of
   persons ever infected by day 63 (~2-2.7% recorded) and ~0.25-0.3% newly
   infected (recorded S -> I) in days 57..63, the label; at a few thousand
   persons the label rate varies more between seeds (~0.05-0.5%).

Scale (2-core machine, measured): 1M persons generate in ~9-15 s (13.5M
contact rows, ~1.4 GB peak RSS; writing CSV adds ~20 s); 7.7M persons (103M
contact rows, 439M outcome rows, 10 GB of CSV) generate in ~2.5 min with a
7.7 GB peak.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from silofl.errors import ConfigError, DataError
from silofl.io import sha256_file
from silofl.pandemic.readers import (ContactNetwork, IdIndex, PandemicData, first_occurrence,
                                     lexsort, sorted_unique, stable_argsort)
from silofl.pandemic.schema import (
    ALL_TABLES,
    HORIZON,
    LOCATION_FLAGS,
    MANIFEST_NAME,
    SECONDS_PER_DAY,
    STATE_LETTERS,
    TABLES,
    TARGET,
    TRAIN_DAYS,
    ActivityType,
    all_dataset_filenames,
)

__all__ = ["OutbreakParams", "SyntheticOutbreak", "generate_outbreak", "synthesize", "GENERATOR_VERSION"]

#: Bump when the generator's output for a given (params, seed) changes.
GENERATOR_VERSION = "1.0"

_FORMATS = {"csv": ".csv", "csv.gz": ".csv.gz", "parquet": ".parquet"}
_WRITE_CHUNK_ROWS = 2_000_000
_H = 3600

A_HOME, A_WORK, A_SHOP, A_OTHER, A_SCHOOL, A_COLLEGE, A_RELIGION = (int(a) for a in ActivityType)
# primary location kinds (index into LOCATION_FLAGS + "work-only")
K_WORK, K_SHOP, K_SCHOOL, K_OTHER, K_COLLEGE, K_RELIGION = range(6)


@dataclass(frozen=True)
class OutbreakParams:
    """Knobs of the generator.  Defaults are tuned to the challenge's statistics."""

    # households: P(size = 1..8); 6+ = 3% split 6/7/8
    household_size_probs: tuple[float, ...] = (0.28, 0.35, 0.15, 0.13, 0.06, 0.018, 0.008, 0.004)
    # locations per person (or per pupil/worker)
    persons_per_shop: float = 200.0
    persons_per_other: float = 150.0
    persons_per_religion: float = 500.0
    persons_per_college: float = 20_000.0
    pupils_per_school: float = 400.0
    workers_per_workplace: float = 18.0
    # activities
    shopping_prob: float = 0.5
    other_prob: float = 0.55
    religion_prob: float = 0.06
    college_prob: float = 0.4
    commute_cross_region: float = 0.08
    errand_cross_region: float = 0.04
    college_cross_region: float = 0.3
    # contact structure
    team_size_min: int = 4
    team_size_mean_extra: float = 9.0
    team_size_max: int = 20
    coworker_window: int = 6
    coworker_contact_prob: float = 0.5
    class_size: int = 22
    college_section_size: int = 30
    college_contact_prob: float = 0.35
    venue_window: int = 16
    venue_contact_prob: float = 0.55
    staff_contact_prob: float = 0.25
    front_desk_contact_prob: float = 0.8
    max_staff_met: int = 6
    max_venue_popularity: float = 100.0
    venue_popularity_shape: float = 1.0
    # disease
    beta_per_hour: float = 0.007
    infectious_days_min: int = 4
    infectious_days_max: int = 9
    asymptomatic_fraction: float = 0.35
    asymptomatic_infectivity: float = 0.5
    isolation_factor: float = 0.3
    initial_infected_fraction: float = 0.0008
    min_initial_infected: int = 5
    importation_rate: float = 4e-5
    min_importations_per_day: float = 0.25
    awareness: float = 600.0


@dataclass
class SyntheticOutbreak:
    """A generated dataset in memory (arrays; ``tables`` use the file column names).

    ``tables[key]`` maps column name to a NumPy array for every table of
    :data:`silofl.pandemic.schema.ALL_TABLES` except the network and outcomes,
    which are kept compact: ``network`` holds person *indices* (``src``/``dst``)
    and ``states`` the recorded (P, days + horizon) int8 matrix (0 S, 1 I, 2 R).
    Persons are sorted by pid; ``pids[i]`` is person ``i``'s id.
    """

    persons: int
    regions: int
    seed: int
    days: int
    horizon: int
    params: OutbreakParams
    pids: np.ndarray
    tables: dict[str, dict[str, np.ndarray]]
    network: dict[str, np.ndarray]
    states: np.ndarray
    target: np.ndarray
    infection_day: np.ndarray  # (P,) int16 first infectious day, or -32768 if never (days < 0 for seeds)
    asymptomatic: np.ndarray  # (P,) bool
    region: np.ndarray  # (P,) int16 region index of each person
    stats: dict = field(default_factory=dict)

    def to_pandemic_data(self):
        """The same content as ``read_dataset`` would return for the written files."""
        return _to_pandemic_data(self)


# =========================================================================== #
# helpers
# =========================================================================== #
def _alloc(total: int, weights: np.ndarray, minimum: int = 1) -> np.ndarray:
    """Integer counts summing to ``total``, proportional to ``weights``, each >= minimum."""
    k = weights.size
    if total < minimum * k:
        raise ConfigError(f"cannot give each of {k} regions {minimum} unit(s) out of {total}")
    rest = total - minimum * k
    share = weights / weights.sum() * rest
    counts = np.floor(share).astype(np.int64)
    left = rest - counts.sum()
    if left:
        order = np.argsort(-(share - counts), kind="stable")
        counts[order[:left]] += 1
    return counts + minimum


def _choose(rng: np.random.Generator, chooser_region: np.ndarray, cand_region: np.ndarray,
            cand_weight: np.ndarray, n_regions: int) -> np.ndarray:
    """For each chooser pick a candidate in its region with probability ∝ weight.

    ``cand_region`` must be sorted and every region must have a candidate.
    Returns positions into the candidate arrays (int32).
    """
    cum = np.cumsum(cand_weight, dtype=np.float64)
    c0 = np.concatenate([[0.0], cum])
    bounds = np.searchsorted(cand_region, np.arange(n_regions + 1))
    lo_i, hi_i = bounds[chooser_region], bounds[chooser_region + 1]
    lo, hi = c0[lo_i], c0[hi_i]
    x = lo + rng.random(chooser_region.size) * (hi - lo)
    pos = np.searchsorted(cum, x, side="right")
    np.clip(pos, lo_i, hi_i - 1, out=pos)
    return pos.astype(np.int32)


def _maybe_other_region(rng, region: np.ndarray, prob: float, weights: np.ndarray) -> np.ndarray:
    """With probability ``prob`` replace a region by one drawn ∝ ``weights``."""
    move = rng.random(region.size) < prob
    out = region.copy()
    n = int(move.sum())
    if n:
        out[move] = rng.choice(weights.size, size=n, p=weights / weights.sum())
    return out


def _window_pairs(key: np.ndarray, start: np.ndarray, end: np.ndarray, window: int, prob: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (i, k), i < k, of visits in the same group whose time windows overlap.

    Visits must be sorted by (key, start).  Visit i is paired with each of the
    next ``window`` visits of its group that start before it ends, each kept
    with probability ``prob``.  With a window at least the group size and
    prob 1 this is every overlapping pair in the group.
    """
    n = key.size
    cand = np.arange(n, dtype=np.int64)
    out_i: list[np.ndarray] = []
    out_k: list[np.ndarray] = []
    for j in range(1, window + 1):
        cand = cand[cand + j < n]
        if cand.size == 0:
            break
        k = cand + j
        ok = (key[k] == key[cand]) & (start[k] < end[cand])
        cand = cand[ok]
        if cand.size == 0:
            break
        if prob < 1.0:
            keep = cand[rng.random(cand.size) < prob]
        else:
            keep = cand
        out_i.append(keep)
        out_k.append(keep + j)
    if not out_i:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(out_i), np.concatenate(out_k)


def _rank_within(key_sorted: np.ndarray) -> np.ndarray:
    """0-based position of each element within its run of equal keys (keys sorted)."""
    n = key_sorted.size
    if n == 0:
        return np.empty(0, np.int64)
    starts = np.flatnonzero(np.concatenate([[True], key_sorted[1:] != key_sorted[:-1]]))
    run_id = np.cumsum(np.concatenate([[True], key_sorted[1:] != key_sorted[:-1]])) - 1
    return np.arange(n) - starts[run_id]


class _EdgeSink:
    """Collects contact rows from all contexts as compact arrays."""

    def __init__(self):
        self.parts: dict[str, list[np.ndarray]] = {k: [] for k in
                                                   ("src", "dst", "lid", "start_time", "duration",
                                                    "activity1", "activity2")}

    def add(self, src, dst, lid, start, dur, a1, a2):
        keep = (src != dst) & (dur > 0)
        if not keep.all():
            src, dst, lid, start, dur = src[keep], dst[keep], lid[keep], start[keep], dur[keep]
            a1 = a1[keep] if np.ndim(a1) else a1
            a2 = a2[keep] if np.ndim(a2) else a2
        n = src.size
        self.parts["src"].append(src.astype(np.int32))
        self.parts["dst"].append(dst.astype(np.int32))
        self.parts["lid"].append(lid.astype(np.int32))
        self.parts["start_time"].append(start.astype(np.int32))
        self.parts["duration"].append(dur.astype(np.int32))
        self.parts["activity1"].append(np.broadcast_to(np.asarray(a1, np.int8), (n,)).astype(np.int8))
        self.parts["activity2"].append(np.broadcast_to(np.asarray(a2, np.int8), (n,)).astype(np.int8))

    def finish(self) -> dict[str, np.ndarray]:
        out = {}
        for k in list(self.parts):
            lst = self.parts.pop(k)
            out[k] = np.concatenate(lst) if lst else np.empty(0, np.int32 if k not in ("activity1", "activity2")
                                                              else np.int8)
        return out


# =========================================================================== #
# generation
# =========================================================================== #
def _check_args(persons: int, regions: int, seed: int, days: int, horizon: int):
    if not isinstance(persons, (int, np.integer)) or persons < 50:
        raise ConfigError(f"persons must be an integer >= 50, got {persons!r}")
    if persons > 50_000_000:
        raise ConfigError(f"persons={persons} is beyond what the generator supports (50M); use fewer")
    if not isinstance(regions, (int, np.integer)) or regions < 1:
        raise ConfigError(f"regions must be a positive integer, got {regions!r}")
    if regions * 40 > persons:
        raise ConfigError(f"regions={regions} is too many for {persons} persons; keep at least 40 persons per "
                          f"region (regions <= {persons // 40})")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    if days < 1 or horizon < 1 or days + horizon > 365:
        raise ConfigError(f"need days >= 1, horizon >= 1 and days + horizon <= 365; got days={days}, "
                          f"horizon={horizon}")


def generate_outbreak(*, persons: int = 10_000, regions: int = 5, seed: int = 0, days: int = TRAIN_DAYS,
                      horizon: int = HORIZON, params: OutbreakParams | None = None) -> SyntheticOutbreak:
    """Generate a synthetic population, contact network and outbreak in memory."""
    _check_args(persons, regions, seed, days, horizon)
    prm = params or OutbreakParams()
    N, R = int(persons), int(regions)
    streams = np.random.SeedSequence([int(seed), 0x5F1A_0FA1]).spawn(8)
    rng_geo, rng_hh, rng_pp, rng_loc, rng_sched, rng_net, rng_sir, _ = (np.random.default_rng(s) for s in streams)

    # ---- 1. regions ------------------------------------------------------------------------
    w = rng_geo.lognormal(0.0, 0.9, R)
    w = 0.85 * w / w.sum() + 0.15 / R
    nx = max(1, math.ceil(math.sqrt(R * 2.0)))
    ny = max(1, math.ceil(R / nx))
    cells = rng_geo.permutation(nx * ny)[:R]
    lon0, lon1, lat0, lat1 = -83.4, -75.6, 36.6, 39.4
    cw, ch = (lon1 - lon0) / nx, (lat1 - lat0) / ny
    c_lon = lon0 + ((cells % nx) + 0.5 + rng_geo.uniform(-0.2, 0.2, R)) * cw
    c_lat = lat0 + ((cells // nx) + 0.5 + rng_geo.uniform(-0.2, 0.2, R)) * ch
    spread = np.clip(0.22 * min(cw, ch) * np.sqrt(w * R), 0.02, 0.4 * min(cw, ch))
    county_codes = (51001 + 2 * np.arange(R)).astype(np.int32)

    # ---- 2. households ---------------------------------------------------------------------
    probs = np.asarray(prm.household_size_probs, dtype=np.float64)
    probs = probs / probs.sum()
    mean_size = float((np.arange(1, probs.size + 1) * probs).sum())
    sizes = np.empty(0, np.int64)
    while sizes.sum() < N:
        extra = int(max(16, (N - sizes.sum()) / mean_size * 1.1 + 16))
        sizes = np.concatenate([sizes, rng_hh.choice(probs.size, size=extra, p=probs) + 1])
    cs = np.cumsum(sizes)
    H = int(np.searchsorted(cs, N) + 1)
    sizes = sizes[:H].copy()
    sizes[-1] -= int(cs[H - 1] - N)
    if H < R:
        raise ConfigError(f"{N} persons form only {H} households, fewer than regions={R}; use fewer regions")
    hh_counts = _alloc(H, w, 1)
    hh_region = np.repeat(np.arange(R, dtype=np.int16), hh_counts)
    hh_lon = np.round(c_lon[hh_region] + rng_hh.normal(0, 1, H) * spread[hh_region], 5)
    hh_lat = np.round(c_lat[hh_region] + rng_hh.normal(0, 1, H) * spread[hh_region] * 0.8, 5)
    hids = np.arange(1, H + 1, dtype=np.int32)
    rlids = (1 + rng_hh.permutation(H)).astype(np.int32)  # household h lives at rlids[h]
    hh_vehicles = np.minimum(rng_hh.poisson(1.0 + 0.35 * np.minimum(sizes, 4)), 6).astype(np.int8)

    # ---- 3. persons ------------------------------------------------------------------------
    hh_of = np.repeat(np.arange(H, dtype=np.int32), sizes)
    first = (np.cumsum(sizes) - sizes).astype(np.int64)
    pnum = (np.arange(N) - first[hh_of] + 1).astype(np.int16)
    size_of = sizes[hh_of]
    region = hh_region[hh_of]
    bands = np.array([18, 25, 35, 45, 55, 65, 75, 91])
    head_probs = {
        1: [0.08, 0.15, 0.12, 0.14, 0.19, 0.17, 0.15],
        2: [0.06, 0.14, 0.10, 0.13, 0.22, 0.20, 0.15],
        3: [0.03, 0.22, 0.33, 0.26, 0.11, 0.04, 0.01],
    }
    hsz = np.minimum(sizes, 3)
    head_age = np.empty(H, np.int64)
    for s, pr in head_probs.items():
        m = hsz == s
        b = rng_pp.choice(7, size=int(m.sum()), p=np.asarray(pr) / np.sum(pr))
        head_age[m] = rng_pp.integers(bands[b], bands[b + 1])
    ha = head_age[hh_of]
    u = rng_pp.random(N)
    age = np.empty(N, np.int64)
    age[pnum == 1] = ha[pnum == 1]
    partner_age = np.clip(ha + np.round(rng_pp.normal(0, 4, N)), 18, 95)
    child_age = ha - rng_pp.integers(20, 41, N)
    child_age = np.where(ha < 58, np.clip(child_age, 0, 17), np.clip(child_age, 18, 70))
    other_age = rng_pp.integers(18, 86, N)
    is2 = pnum == 2
    partner = is2 & (((size_of == 2) & (u < 0.72)) | ((size_of >= 3) & (u < 0.85)))
    child2 = is2 & (size_of == 2) & (u >= 0.72) & (u < 0.87)
    other2 = is2 & ~partner & ~child2
    age[partner] = partner_age[partner]
    age[child2] = child_age[child2]
    age[other2] = other_age[other2]
    later = pnum >= 3
    kid = later & (u < 0.88)
    age[kid] = child_age[kid]
    oth = later & ~kid
    age[oth] = other_age[oth]
    age = age.astype(np.uint8)
    sex = rng_pp.integers(1, 3, N).astype(np.int8)
    head_sex = sex[first][hh_of]
    flip = partner & (rng_pp.random(N) < 0.95)
    sex[flip] = (3 - head_sex[flip]).astype(np.int8)
    gaps = (rng_pp.random(N) < 0.03) * rng_pp.integers(1, 6, N)
    pids = (1 + np.arange(N) + np.cumsum(gaps)).astype(np.int64)
    if pids[-1] > np.iinfo(np.int32).max:
        raise ConfigError("too many persons for int32 ids")
    pids = pids.astype(np.int32)
    del u, partner_age, child_age, other_age, gaps

    # ---- 4. activity roles ---------------------------------------------------------------
    a = age.astype(np.int16)
    rnd = rng_sched.random(N)
    college = (a >= 18) & (a <= 22) & (rnd < prm.college_prob)
    emp_p = np.select([(a >= 18) & (a <= 22), (a >= 23) & (a <= 59), (a >= 60) & (a <= 64), (a >= 65) & (a <= 70)],
                      [0.5, 0.78, 0.55, 0.2], 0.0)
    employed = ~college & (rng_sched.random(N) < emp_p)
    pupil = (a >= 5) & (a <= 17) & (rng_sched.random(N) < 0.97)
    n_reg = np.bincount(region, minlength=R)
    n_pup = np.bincount(region[pupil], minlength=R)
    n_wrk = np.bincount(region[employed], minlength=R)

    # ---- 5. activity locations -------------------------------------------------------------
    per_kind_counts = np.stack([
        np.zeros(R, np.int64),  # work-only: filled below
        np.maximum(1, np.round(n_reg / prm.persons_per_shop)).astype(np.int64),
        np.maximum(1, np.round(n_pup / prm.pupils_per_school)).astype(np.int64),
        np.maximum(1, np.round(n_reg / prm.persons_per_other)).astype(np.int64),
        np.maximum(1, np.round(n_reg / prm.persons_per_college)).astype(np.int64),
        np.maximum(1, np.round(n_reg / prm.persons_per_religion)).astype(np.int64),
    ])
    staff_per = np.array([0.0, 3.0, 0.0, 4.0, 25.0, 1.0])
    school_staff = np.maximum(1.0, n_pup / per_kind_counts[K_SCHOOL] / 14.0)  # teachers per school
    service_demand = (per_kind_counts * staff_per[:, None]).sum(0) + school_staff * per_kind_counts[K_SCHOOL]
    workonly_workers = np.maximum(n_wrk - service_demand, n_wrk * 0.3)
    per_kind_counts[K_WORK] = np.maximum(1, np.round(workonly_workers / prm.workers_per_workplace)).astype(np.int64)
    # locations sorted by (region, kind)
    counts_rk = per_kind_counts.T  # (R, 6)
    n_loc_rk = counts_rk.reshape(-1)
    L = int(n_loc_rk.sum())
    loc_region = np.repeat(np.repeat(np.arange(R, dtype=np.int16), 6), n_loc_rk)
    loc_kind = np.repeat(np.tile(np.arange(6, dtype=np.int8), R), n_loc_rk)
    flags = np.zeros((L, 6), np.uint8)  # columns in LOCATION_FLAGS order
    flags[np.arange(L), loc_kind] = 1
    flags[:, 0] = 1  # every activity location employs someone
    mixed = (loc_kind == K_OTHER) & (rng_loc.random(L) < 0.15)
    flags[mixed, K_SHOP] = 1
    loc_lon = np.round(c_lon[loc_region] + rng_loc.normal(0, 1, L) * spread[loc_region] * 0.7, 5)
    loc_lat = np.round(c_lat[loc_region] + rng_loc.normal(0, 1, L) * spread[loc_region] * 0.56, 5)
    # venue visitor weights: heavy-tailed (capped); staff numbers do not grow with popularity, so
    # staff at popular venues meet many visitors (the degree tail)
    popularity = np.minimum(rng_loc.pareto(prm.venue_popularity_shape, L) + 1.0, prm.max_venue_popularity)
    emp_w = np.where(loc_kind == K_WORK, rng_loc.pareto(1.4, L) + 1.0, 0.0)
    # scale work-only weights so each region's sum matches its work-only workers
    wsum = np.bincount(loc_region, weights=emp_w, minlength=R)
    emp_w = emp_w / np.maximum(wsum[loc_region], 1e-12) * workonly_workers[loc_region]
    emp_w = np.where(loc_kind == K_SCHOOL, school_staff[loc_region], emp_w)
    for k in (K_SHOP, K_OTHER, K_COLLEGE, K_RELIGION):
        emp_w = np.where(loc_kind == k, staff_per[k], emp_w)
    alid_base = 10 ** int(math.ceil(math.log10(H + 2)))
    alids = (alid_base + 1 + np.arange(L)).astype(np.int64)
    if alids[-1] > np.iinfo(np.int32).max:
        raise ConfigError("too many locations for int32 ids")
    alids = alids.astype(np.int32)

    def pick(kind: int, chooser_region: np.ndarray, weight: np.ndarray) -> np.ndarray:
        cand = np.flatnonzero(loc_kind == kind) if kind >= 0 else np.arange(L)
        pos = _choose(rng_sched, chooser_region.astype(np.int64), loc_region[cand], weight[cand], R)
        return cand[pos]

    # ---- 6. schedules ---------------------------------------------------------------------
    ones = np.ones(L)
    reg64 = region.astype(np.int64)
    main_loc = np.full(N, -1, np.int64)
    main_type = np.zeros(N, np.int8)
    main_start = np.zeros(N, np.int64)
    main_dur = np.zeros(N, np.int64)
    # work
    wi = np.flatnonzero(employed)
    wreg = _maybe_other_region(rng_sched, reg64[wi], prm.commute_cross_region, w)
    main_loc[wi] = pick(-1, wreg, emp_w)
    main_type[wi] = A_WORK
    shift = rng_sched.random(wi.size) < 0.12
    ws = np.where(shift, rng_sched.uniform(13, 16.5, wi.size), np.clip(rng_sched.normal(8.5, 1.2, wi.size), 5, 12))
    wd = np.clip(rng_sched.normal(8.0, 1.5, wi.size), 3, 10)
    wkind = loc_kind[main_loc[wi]]
    teacher = wkind == K_SCHOOL
    ws = np.where(teacher, rng_sched.uniform(7.0, 7.75, wi.size), ws)
    wd = np.where(teacher, rng_sched.uniform(8.0, 8.75, wi.size), wd)
    # venue staff work staggered shifts covering opening hours
    venue = (wkind == K_SHOP) | (wkind == K_OTHER) | (wkind == K_RELIGION)
    ws = np.where(venue, rng_sched.uniform(7.0, 15.5, wi.size), ws)
    wd = np.where(venue, rng_sched.uniform(6.0, 9.0, wi.size), wd)
    main_start[wi] = np.round(ws * _H)
    main_dur[wi] = np.minimum(np.round(wd * _H), 23 * _H - main_start[wi])
    # school
    si = np.flatnonzero(pupil)
    main_loc[si] = pick(K_SCHOOL, reg64[si], ones)
    main_type[si] = A_SCHOOL
    main_start[si] = np.round(rng_sched.uniform(7.75, 8.25, si.size) * _H)
    main_dur[si] = np.round(rng_sched.uniform(6.5, 7.0, si.size) * _H)
    # college
    ci = np.flatnonzero(college)
    creg = _maybe_other_region(rng_sched, reg64[ci], prm.college_cross_region, w)
    main_loc[ci] = pick(K_COLLEGE, creg, ones)
    main_type[ci] = A_COLLEGE
    main_start[ci] = np.round(rng_sched.uniform(8, 14, ci.size) * _H)
    main_dur[ci] = np.round(rng_sched.uniform(1.5, 4.0, ci.size) * _H)
    has_main = main_type > 0
    del wi, si, ci, wreg, creg, shift, ws, wd, teacher, venue, wkind

    # errands: shopping, other, religion (in that order, after the main activity)
    child = a < 13
    p_shop = np.where(child, 0.1, np.where(a < 18, 0.25, prm.shopping_prob))
    p_other = np.where(child, 0.25, prm.other_prob)
    errand_kinds = (K_SHOP, K_OTHER, K_RELIGION)
    errand_types = (A_SHOP, A_OTHER, A_RELIGION)
    want = [rng_sched.random(N) < p_shop, rng_sched.random(N) < p_other,
            rng_sched.random(N) < prm.religion_prob]
    durs = [np.clip(rng_sched.lognormal(math.log(30 * 60), 0.5, N), 600, 7200),
            np.clip(rng_sched.lognormal(math.log(75 * 60), 0.6, N), 1200, 4 * _H),
            rng_sched.uniform(3600, 7200, N)]
    cur = np.where(has_main, main_start + main_dur + rng_sched.uniform(600, 1800, N),
                   rng_sched.uniform(9 * _H, 17 * _H, N))
    err_start, err_dur, err_on = [], [], []
    for k in range(3):
        e = cur + durs[k]
        on = want[k] & (e <= 23 * _H)
        err_start.append(np.where(on, np.round(cur), 0).astype(np.int64))
        err_dur.append(np.where(on, np.round(durs[k]), 0).astype(np.int64))
        err_on.append(on)
        cur = np.where(on, e + rng_sched.uniform(300, 1500, N), cur)
    del want, durs, cur, p_shop, p_other
    err_loc = []
    for k, kind in enumerate(errand_kinds):
        idx = np.flatnonzero(err_on[k])
        lr = _maybe_other_region(rng_sched, reg64[idx], prm.errand_cross_region, w)
        locs = np.full(N, -1, np.int64)
        locs[idx] = pick(kind, lr, popularity)
        err_loc.append(locs)
    # home segments
    any_out = has_main | err_on[0] | err_on[1] | err_on[2]
    first_out = np.where(has_main, main_start,
                         np.where(err_on[0], err_start[0], np.where(err_on[1], err_start[1], err_start[2])))
    last_end = main_start + main_dur
    for k in range(3):
        last_end = np.where(err_on[k], err_start[k] + err_dur[k], last_end)
    travel1 = np.round(rng_sched.uniform(600, 2400, N)).astype(np.int64)
    travel2 = np.round(rng_sched.uniform(600, 2400, N)).astype(np.int64)
    hm_start = np.zeros(N, np.int64)
    hm_dur = np.where(any_out, first_out - travel1, SECONDS_PER_DAY)
    he_start = np.where(any_out, np.minimum(last_end + travel2, SECONDS_PER_DAY - 600), 0)
    he_dur = np.where(any_out, SECONDS_PER_DAY - he_start, 0)
    del first_out, last_end, travel1, travel2

    # slot matrix: home_morning, main, shop, other, religion, home_evening
    slot_on = np.stack([np.ones(N, bool), has_main, err_on[0], err_on[1], err_on[2], any_out], axis=1)
    slot_type = np.array([A_HOME, 0, A_SHOP, A_OTHER, A_RELIGION, A_HOME], np.int8)
    home_lid = rlids[hh_of].astype(np.int64)
    slot_lid = np.stack([home_lid, np.where(has_main, alids[np.maximum(main_loc, 0)], -1),
                         *[np.where(err_on[k], alids[np.maximum(err_loc[k], 0)], -1) for k in range(3)],
                         home_lid], axis=1)
    slot_start = np.stack([hm_start, main_start, *err_start, he_start], axis=1)
    slot_dur = np.stack([hm_dur, main_dur, *err_dur, he_dur], axis=1)
    types = np.broadcast_to(slot_type, (N, 6)).copy()
    types[:, 1] = main_type
    act_num = np.cumsum(slot_on, axis=1).astype(np.int16)
    sel = slot_on.reshape(-1)
    person_of_row = np.repeat(np.arange(N, dtype=np.int32), slot_on.sum(1))
    assignment = {
        "pid": pids[person_of_row],
        "activity_number": act_num.reshape(-1)[sel],
        "activity_type": types.reshape(-1)[sel],
        "start_time": slot_start.reshape(-1)[sel].astype(np.int32),
        "duration": slot_dur.reshape(-1)[sel].astype(np.int32),
        "lid": slot_lid.reshape(-1)[sel].astype(np.int32),
    }
    del act_num, types, slot_lid, slot_type, person_of_row, sel

    # ---- 7. contacts ------------------------------------------------------------------------
    edges = _EdgeSink()
    idxN = np.arange(N, dtype=np.int64)

    # (a) household members at home (morning and evening segments)
    hv_person = np.concatenate([idxN, idxN[any_out]])
    hv_start = np.concatenate([hm_start, he_start[any_out]])
    hv_end = hv_start + np.concatenate([hm_dur, he_dur[any_out]])
    hv_key = hh_of[hv_person].astype(np.int64)
    o = lexsort((hv_person, hv_start, hv_key))
    hv_person, hv_start, hv_end, hv_key = hv_person[o], hv_start[o], hv_end[o], hv_key[o]
    max_vis = int(np.bincount(hv_key).max()) if hv_key.size else 1
    i, k = _window_pairs(hv_key, hv_start, hv_end, max_vis, 1.0, rng_net)
    st = hv_start[k]
    edges.add(hv_person[i], hv_person[k], home_lid[hv_person[i]], st,
              np.minimum(hv_end[i], hv_end[k]) - st, A_HOME, A_HOME)
    del hv_person, hv_start, hv_end, hv_key, o, i, k, st

    end_main = main_start + main_dur
    # (b) workers: teams at their workplace; school staff join classes instead
    wi = np.flatnonzero(main_type == A_WORK)
    wloc = main_loc[wi]
    at_school = loc_kind[wloc] == K_SCHOOL
    tw, tl = wi[~at_school], wloc[~at_school]
    o = lexsort((rng_net.integers(0, 1 << 30, tw.size), tl))
    tw, tl = tw[o], tl[o]
    team_size = np.clip(prm.team_size_min + rng_net.poisson(prm.team_size_mean_extra, L), prm.team_size_min,
                        prm.team_size_max)
    team = _rank_within(tl) // team_size[tl]
    tkey = tl * (int(team.max(initial=0)) + 1) + team
    o = lexsort((main_start[tw], tkey))
    tw, tl, tkey = tw[o], tl[o], tkey[o]
    i, k = _window_pairs(tkey, main_start[tw], end_main[tw], prm.team_size_max, 1.0, rng_net)
    pi, pk = tw[i], tw[k]
    st = main_start[pk]
    edges.add(pi, pk, alids[tl[i]], st, np.minimum(end_main[pi], end_main[pk]) - st, A_WORK, A_WORK)
    # a few contacts across teams at the same workplace
    o = lexsort((main_start[tw], tl))
    xw, xl, xt = tw[o], tl[o], tkey[o]
    i, k = _window_pairs(xl, main_start[xw], end_main[xw], prm.coworker_window, prm.coworker_contact_prob,
                         rng_net)
    diff = xt[i] != xt[k]
    i, k = i[diff], k[diff]
    pi, pk = xw[i], xw[k]
    st = main_start[pk]
    edges.add(pi, pk, alids[xl[i]], st, np.minimum(end_main[pi], end_main[pk]) - st, A_WORK, A_WORK)
    del o, xw, xl, xt, i, k, pi, pk, st, team, tkey

    # (c) schools: classes of similar age plus a teacher; a few contacts across classes
    pu = np.flatnonzero(main_type == A_SCHOOL)
    ploc = main_loc[pu]
    o = lexsort((rng_net.integers(0, 1 << 30, pu.size), age[pu], ploc))
    pu, ploc = pu[o], ploc[o]
    cls = _rank_within(ploc) // prm.class_size
    n_cls = np.zeros(L, np.int64)
    np.maximum.at(n_cls, ploc, cls + 1)
    teachers, tloc = wi[at_school], wloc[at_school]
    o = lexsort((rng_net.integers(0, 1 << 30, teachers.size), tloc))
    teachers, tloc = teachers[o], tloc[o]
    has_cls = n_cls[tloc] > 0
    teachers, tloc = teachers[has_cls], tloc[has_cls]
    tcls = _rank_within(tloc) % np.maximum(n_cls[tloc], 1)
    cp = np.concatenate([pu, teachers])
    cl = np.concatenate([ploc, tloc])
    cc = np.concatenate([cls, tcls])
    ckey = cl * (int(cc.max(initial=0)) + 1) + cc
    ctype = np.concatenate([np.full(pu.size, A_SCHOOL, np.int8), np.full(teachers.size, A_WORK, np.int8)])
    o = lexsort((cp, main_start[cp], ckey))
    cp, cl, ckey, ctype = cp[o], cl[o], ckey[o], ctype[o]
    i, k = _window_pairs(ckey, main_start[cp], end_main[cp], prm.class_size + 8, 1.0, rng_net)
    pi, pk = cp[i], cp[k]
    st = main_start[pk]
    edges.add(pi, pk, alids[cl[i]], st, np.minimum(end_main[pi], end_main[pk]) - st, ctype[i], ctype[k])
    o = lexsort((rng_net.integers(0, 1 << 30, pu.size), ploc))
    xp, xl, xc = pu[o], ploc[o], cls[o]
    o2 = lexsort((main_start[xp], xl))
    xp, xl, xc = xp[o2], xl[o2], xc[o2]
    i, k = _window_pairs(xl, main_start[xp], end_main[xp], 6, 0.35, rng_net)
    diff = xc[i] != xc[k]
    i, k = i[diff], k[diff]
    pi, pk = xp[i], xp[k]
    st = main_start[pk]
    edges.add(pi, pk, alids[xl[i]], st, np.minimum(end_main[pi], end_main[pk]) - st, A_SCHOOL, A_SCHOOL)
    del pu, ploc, cls, teachers, tloc, cp, cl, ckey, ctype, o, o2, xp, xl, xc, i, k, pi, pk, st

    # (d) college sections
    cu = np.flatnonzero(main_type == A_COLLEGE)
    cloc = main_loc[cu]
    o = lexsort((rng_net.integers(0, 1 << 30, cu.size), cloc))
    cu, cloc = cu[o], cloc[o]
    sec = _rank_within(cloc) // prm.college_section_size
    skey = cloc * (int(sec.max(initial=0)) + 1) + sec
    o = lexsort((main_start[cu], skey))
    cu, cloc, skey = cu[o], cloc[o], skey[o]
    i, k = _window_pairs(skey, main_start[cu], end_main[cu], prm.college_section_size, prm.college_contact_prob,
                         rng_net)
    pi, pk = cu[i], cu[k]
    st = main_start[pk]
    edges.add(pi, pk, alids[cloc[i]], st, np.minimum(end_main[pi], end_main[pk]) - st, A_COLLEGE, A_COLLEGE)
    del cu, cloc, skey, o, i, k, pi, pk, st

    # (e) venues: visitors meet overlapping visitors, and often a member of staff
    staff = wi[~at_school]
    sloc = wloc[~at_school]
    o = lexsort((rng_net.integers(0, 1 << 30, staff.size), sloc))
    staff, sloc = staff[o], sloc[o]
    staff_lo = np.searchsorted(sloc, np.arange(L), side="left")
    staff_n = np.searchsorted(sloc, np.arange(L), side="right") - staff_lo
    for kk, atype in enumerate(errand_types):
        vp = np.flatnonzero(err_on[kk])
        vl = err_loc[kk][vp]
        vs = err_start[kk][vp]
        ve = vs + err_dur[kk][vp]
        o = lexsort((vp, vs, vl))
        vp, vl, vs, ve = vp[o], vl[o], vs[o], ve[o]
        window = prm.venue_window + (4 if atype == A_RELIGION else 0)
        i, k = _window_pairs(vl, vs, ve, window, prm.venue_contact_prob, rng_net)
        st = vs[k]
        edges.add(vp[i], vp[k], alids[vl[i]], st, np.minimum(ve[i], ve[k]) - st, atype, atype)
        # staff contacts: each visit meets each on-shift employee (up to the first few) with some
        # probability, the venue's first employee ("front desk") most often -- staff at busy
        # venues become the hubs of the contact graph
        n_st = np.minimum(staff_n[vl], prm.max_staff_met)
        lo_st = staff_lo[vl]
        for j in range(int(n_st.max()) if n_st.size else 0):
            p_meet = prm.front_desk_contact_prob if j == 0 else prm.staff_contact_prob
            has = np.flatnonzero((n_st > j) & (rng_net.random(vp.size) < p_meet))
            sp = staff[lo_st[has] + j]
            s0 = np.maximum(vs[has], main_start[sp])
            s1 = np.minimum(ve[has], end_main[sp])
            ok = s1 > s0
            short = np.round(rng_net.uniform(120, 900, has.size)).astype(np.int64)
            dur = np.minimum(s1 - s0, short)
            edges.add(sp[ok], vp[has][ok], alids[vl[has][ok]], s0[ok], dur[ok], A_WORK, atype)
    del staff, sloc, staff_lo, staff_n

    network = edges.finish()
    del edges
    # free the schedule arrays before the outbreak simulation (matters at millions of persons)
    del (slot_on, slot_start, slot_dur, err_start, err_dur, err_on, err_loc, main_loc, main_type, main_start,
         main_dur, end_main, hm_start, hm_dur, he_start, he_dur, any_out, home_lid, idxN, wi, wloc, at_school,
         tw, tl, has_main, vp, vl, vs, ve, n_st, lo_st, employed, pupil, college, rnd, a, reg64, child, emp_p,
         size_of, ha)

    # ---- 8. outbreak --------------------------------------------------------------------------
    T = days + horizon
    inf_day, inf_end, asym = _simulate(network, age, region, N, T, prm, rng_sir)
    states = _states_matrix(inf_day, inf_end, asym, T)
    del inf_end
    onset = inf_day.astype(np.int64)
    target = ((~asym) & (onset >= days) & (onset < T)).astype(np.int8)

    # ---- tables ----------------------------------------------------------------------------------
    hh_order = stable_argsort(rlids)
    tables = {
        "persons": {"pid": pids, "hid": hids[hh_of], "person_number": pnum, "age": age, "sex": sex},
        "households": {"hid": hids, "hh_size": sizes.astype(np.int16), "hh_vehicles": hh_vehicles},
        "residence_locations": {"rlid": rlids[hh_order], "longitude": hh_lon[hh_order],
                                "latitude": hh_lat[hh_order], "county": county_codes[hh_region[hh_order]]},
        "activity_locations": {"alid": alids, "longitude": loc_lon, "latitude": loc_lat,
                               **{f: flags[:, j].copy() for j, f in enumerate(LOCATION_FLAGS)}},
        "activity_location_assignment": assignment,
        TARGET.key: {"pid": pids, "infected": target},
    }
    out = SyntheticOutbreak(
        persons=N, regions=R, seed=int(seed), days=days, horizon=horizon, params=prm, pids=pids,
        tables=tables, network=network, states=states, target=target,
        infection_day=np.where(inf_day == _NEVER, np.iinfo(np.int16).min, inf_day).astype(np.int16),
        asymptomatic=asym, region=region,
    )
    out.stats = _stats(out)
    return out


_NEVER = np.iinfo(np.int32).max


def _csr(src: np.ndarray, dst: np.ndarray, N: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Adjacency of the undirected contact rows: (neighbour, contact id, indptr), rows by person."""
    E = src.size
    key = np.empty(2 * E, np.int64)  # (person << 32) | slot, slot < E: src end, else dst end
    key[:E] = src
    key[E:] = dst
    key <<= 32
    key[:E] |= np.arange(E, dtype=np.int64)
    key[E:] |= np.arange(E, 2 * E, dtype=np.int64)
    indptr = np.zeros(N + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=N) + np.bincount(dst, minlength=N), out=indptr[1:])
    key.sort()
    key &= 0xFFFFFFFF
    slot = key.astype(np.int32) if 2 * E < (1 << 31) else key
    del key
    from_src = slot < E
    eid = np.where(from_src, slot, slot - E).astype(np.int32 if E < (1 << 31) else np.int64)
    del slot
    nbr = np.where(from_src, dst[eid], src[eid])
    return nbr, eid, indptr


def _simulate(network: dict[str, np.ndarray], age: np.ndarray, region: np.ndarray, N: int, T: int,
              prm: OutbreakParams,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Discrete-time SIR on the (daily repeating) contact graph.

    Returns each person's first infectious day and first day no longer
    infectious (``_NEVER`` if never infected; seeds may start before day 0),
    and the asymptomatic flag.
    """
    src, dst = network["src"], network["dst"]
    E = src.size
    hours = (network["duration"].astype(np.float32) / np.float32(_H))
    home = (network["activity1"] == A_HOME) & (network["activity2"] == A_HOME)
    # CSR over both directions, built with ~12 bytes per contact row at the peak:
    # row r of the CSR is contact eid[r] seen from one end, nbr[r] the other end
    nbr, eid, indptr = _csr(src, dst, N)

    a = age.astype(np.int16)
    susc = np.select([a < 10, a < 20, a < 60], [0.5, 0.7, 1.0], 1.3).astype(np.float32)
    start = np.full(N, _NEVER, np.int32)  # first infectious day
    end = np.full(N, _NEVER, np.int32)  # first day no longer infectious
    asym = np.zeros(N, bool)
    Lmin, Lmax = prm.infectious_days_min, prm.infectious_days_max

    def infect(idx: np.ndarray, day: int | np.ndarray):
        n = idx.size
        length = rng.integers(Lmin, Lmax + 1, n)
        start[idx] = day
        end[idx] = np.asarray(day) + length
        asym[idx] = rng.random(n) < prm.asymptomatic_fraction

    # small populations get a floor of seeds and imports so their outbreaks behave like large ones
    n0 = min(N, max(prm.min_initial_infected, int(round(prm.initial_infected_fraction * N))))
    import_mean = max(prm.importation_rate * N, prm.min_importations_per_day)
    seeds = rng.choice(N, size=n0, replace=False)
    infect(seeds, -rng.integers(0, Lmin, n0))
    n_regions = int(region.max()) + 1 if N else 1
    region_size = np.maximum(np.bincount(region, minlength=n_regions), 1)
    for t in range(T - 1):
        active = np.flatnonzero((start <= t) & (t < end))
        # awareness: people cut contacts as recorded (symptomatic) prevalence in their region rises
        recorded = np.bincount(region[active[~asym[active]]], minlength=n_regions) / region_size
        damp = (1.0 / (1.0 + prm.awareness * recorded)).astype(np.float32)
        new_parts = []
        if active.size:
            lo, hi = indptr[active], indptr[active + 1]
            cnt = hi - lo
            tot = int(cnt.sum())
            if tot:
                rep = np.repeat(np.arange(active.size), cnt)
                pos = np.arange(tot) - np.repeat(np.cumsum(cnt) - cnt, cnt) + lo[rep]
                tgt = nbr[pos]
                sus = start[tgt] == _NEVER
                pos, tgt, rep = pos[sus], tgt[sus], rep[sus]
                e = eid[pos]
                srcp = active[rep]
                f = np.where(asym[srcp], prm.asymptomatic_infectivity, 1.0)
                isolating = (~asym[srcp]) & (t > start[srcp]) & ~home[e]
                f = np.where(isolating, f * prm.isolation_factor, f)
                lam = prm.beta_per_hour * hours[e] * susc[tgt] * f * damp[region[tgt]]
                hit = rng.random(tgt.size) < -np.expm1(-lam)
                new_parts.append(tgt[hit])
        k = rng.poisson(import_mean)
        if k:
            new_parts.append(rng.integers(0, N, k))
        if new_parts:
            new = sorted_unique(np.concatenate(new_parts))
            new = new[start[new] == _NEVER]
            if new.size:
                infect(new, t + 1)
    return start, end, asym


def _states_matrix(start: np.ndarray, end: np.ndarray, asym: np.ndarray, T: int) -> np.ndarray:
    N = start.size
    states = np.zeros((N, T), np.int8)
    d = np.arange(T, dtype=np.int32)[None, :]
    step = 1 << 20
    for lo in range(0, N, step):
        s = start[lo:lo + step, None]
        e = end[lo:lo + step, None]
        blk = (d >= s).astype(np.int8) + (d >= e).astype(np.int8)
        blk[asym[lo:lo + step]] = 0
        states[lo:lo + step] = blk
    return states


# =========================================================================== #
# statistics and in-memory PandemicData
# =========================================================================== #
def _distinct_degree(src: np.ndarray, dst: np.ndarray, n: int, step: int = 1 << 24) -> np.ndarray:
    """Number of distinct contacts of each person (~10 bytes per contact row at the peak)."""
    key = np.minimum(src, dst).astype(np.int64)
    key *= n
    key += np.maximum(src, dst)
    key.sort()
    deg = np.zeros(n, np.int64)
    for lo in range(0, key.size, step):
        k = key[lo:lo + step + 1]
        first = np.ones(k.size, bool)
        if lo:
            first[0] = False  # k[0] belongs to the previous block
        np.not_equal(k[1:], k[:-1], out=first[1:])
        u = k[first]
        deg += np.bincount(u // n, minlength=n)
        deg += np.bincount(u % n, minlength=n)
    return deg


def _stats(o: SyntheticOutbreak) -> dict:
    N, T, days = o.persons, o.days + o.horizon, o.days
    net = o.network
    deg = _distinct_degree(net["src"], net["dst"], N)
    inf = o.infection_day.astype(np.int64)
    never = inf == np.iinfo(np.int16).min
    ever_true = (~never) & (inf < T)
    ever_rec = ever_true & ~o.asymptomatic
    cross = o.region[net["src"]] != o.region[net["dst"]]
    region_sizes = np.bincount(o.region, minlength=o.regions)
    return {
        "persons": N,
        "households": int(o.tables["households"]["hid"].size),
        "activity_locations": int(o.tables["activity_locations"]["alid"].size),
        "assignments": int(o.tables["activity_location_assignment"]["pid"].size),
        "contacts": int(net["src"].size),
        "mean_contacts_per_person": round(float(deg.mean()), 4),
        "max_contacts_per_person": int(deg.max()) if N else 0,
        "cross_region_contact_fraction": round(float(cross.mean()) if cross.size else 0.0, 6),
        "region_sizes": [int(x) for x in region_sizes],
        "ever_infected_fraction": round(float(ever_true.mean()), 6),
        "ever_infected_recorded_fraction": round(float(ever_rec.mean()), 6),
        "infected_by_train_end_recorded_fraction": round(float((ever_rec & (inf < days)).mean()), 6),
        "final_window_new_infection_fraction": round(float(o.target.mean()), 6),
        "final_window_new_infections": int(o.target.sum()),
    }


def _to_pandemic_data(o: SyntheticOutbreak):
    import pandas as pd


    t = o.tables
    pid_index = IdIndex(o.pids)
    hh = t["households"]
    hid_index = IdIndex(hh["hid"])
    hidx = hid_index.lookup(t["persons"]["hid"])
    rl = t["residence_locations"]
    al = t["activity_locations"]
    asg = t["activity_location_assignment"]
    person = pid_index.lookup(asg["pid"])
    home = asg["activity_type"] == A_HOME
    home_lid = np.full(o.persons, -1, np.int32)
    u, f = first_occurrence(person[home])
    home_lid[u] = asg["lid"][home][f]
    county = rl["county"][IdIndex(rl["rlid"]).lookup(home_lid)]
    region_codes = sorted_unique(county).astype(np.int32)
    region = np.searchsorted(region_codes, county).astype(np.int16)
    net = o.network
    return PandemicData(
        pids=o.pids,
        pid_index=pid_index,
        hid=t["persons"]["hid"],
        person_number=t["persons"]["person_number"],
        age=t["persons"]["age"],
        sex=t["persons"]["sex"],
        hh_size=hh["hh_size"][hidx],
        home_lid=home_lid,
        county=county.astype(np.int32),
        region=region,
        region_codes=region_codes,
        households=pd.DataFrame({"hid": hh["hid"], "hh_size": hh["hh_size"]}),
        residence_locations=pd.DataFrame({"rlid": rl["rlid"], "longitude": rl["longitude"].astype(np.float32),
                                          "latitude": rl["latitude"].astype(np.float32),
                                          "county": rl["county"].astype(np.int32)}),
        activity_locations=pd.DataFrame({"alid": al["alid"], "longitude": al["longitude"].astype(np.float32),
                                         "latitude": al["latitude"].astype(np.float32),
                                         **{fl: al[fl] for fl in LOCATION_FLAGS}}),
        assignment=pd.DataFrame({"person": person, **{c: asg[c] for c in
                                                      ("activity_number", "activity_type", "start_time",
                                                       "duration", "lid")}}),
        network=ContactNetwork(src=net["src"], dst=net["dst"], lid=net["lid"], start_time=net["start_time"],
                               duration=net["duration"], activity1=net["activity1"], activity2=net["activity2"]),
        states=np.ascontiguousarray(o.states[:, :o.days]),
        target=o.target,
        directory=None,
    )


# =========================================================================== #
# writing
# =========================================================================== #
_STATE_DICT = pa.array(list(STATE_LETTERS), pa.string())


def _arrow(col: str, arr: np.ndarray) -> pa.Array:
    if col == "state":
        return pa.DictionaryArray.from_arrays(pa.array(arr, pa.int8()), _STATE_DICT)
    return pa.array(arr)


def _batches(key: str, o: SyntheticOutbreak):
    """Yield record batches of table ``key`` with file column names, in file order."""
    step = _WRITE_CHUNK_ROWS
    if key == "population_network":
        net = o.network
        n = net["src"].size
        for lo in range(0, max(n, 1), step):
            hi = min(n, lo + step)
            cols = {
                "pid1": o.pids[net["src"][lo:hi]],
                "pid2": o.pids[net["dst"][lo:hi]],
                **{c: net[c][lo:hi] for c in ("lid", "start_time", "duration", "activity1", "activity2")},
            }
            yield pa.record_batch({c: _arrow(c, a) for c, a in cols.items()})
        return
    if key == "disease_outcome_training":
        N = o.persons
        per = max(1, step // max(N, 1))
        for d0 in range(0, o.days, per):
            d1 = min(o.days, d0 + per)
            day = np.repeat(np.arange(d0, d1, dtype=np.int16), N)
            pid = np.tile(o.pids, d1 - d0)
            state = np.ascontiguousarray(o.states[:, d0:d1].T).reshape(-1)
            yield pa.record_batch({"day": pa.array(day), "pid": pa.array(pid), "state": _arrow("state", state)})
        return
    table = o.tables[key]
    n = next(iter(table.values())).size
    for lo in range(0, max(n, 1), step):
        yield pa.record_batch({c: _arrow(c, a[lo:lo + step]) for c, a in table.items()})


def _write_file(path: Path, fmt: str, batches) -> int:
    """Write record batches to ``path`` as csv / csv.gz / parquet; returns the row count."""
    it = iter(batches)
    first = next(it)
    schema = first.schema
    rows = 0
    if fmt == "parquet":
        with pq.ParquetWriter(path, schema, compression="zstd") as w:
            for b in _chain(first, it):
                w.write_batch(b)
                rows += b.num_rows
        return rows
    header = (",".join(schema.names) + "\n").encode()
    counted = _count_rows(_chain(first, it))
    if fmt == "csv.gz":
        # Python's gzip: level 1 is ~15x faster than Arrow's fixed level 9; mtime=0 keeps bytes reproducible
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=1,
                                                  mtime=0) as gz:
            gz.write(header)
            for text in _format_csv(counted):
                gz.write(memoryview(text))
    else:
        with open(path, "wb") as f:
            f.write(header)
            for text in _format_csv(counted):
                f.write(memoryview(text))
    return counted.rows


class _count_rows:
    def __init__(self, it):
        self.it, self.rows = it, 0

    def __iter__(self):
        for b in self.it:
            self.rows += b.num_rows
            yield b


def _csv_text(batch: pa.RecordBatch) -> pa.Buffer:
    buf = pa.BufferOutputStream()
    pacsv.write_csv(batch, buf, write_options=pacsv.WriteOptions(include_header=False, quoting_style="none"))
    return buf.getvalue()


def _format_csv(batches):
    """CSV text of each batch, in order, formatted on a few threads (pyarrow releases the GIL)."""
    workers = max(1, min(4, os.cpu_count() or 1))
    if workers == 1:
        for b in batches:
            if b.num_rows:
                yield _csv_text(b)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending = deque()
        for b in batches:
            if b.num_rows:
                pending.append(pool.submit(_csv_text, b))
            while len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _chain(first, it):
    yield first
    yield from it


def _identity(fmt: str, persons: int, regions: int, seed: int, days: int, horizon: int,
              prm: OutbreakParams) -> dict:
    ident = {
        "generator": "silofl.pandemic.synth",
        "generator_version": GENERATOR_VERSION,
        "format": fmt,
        "seed": int(seed),
        "params": {"persons": int(persons), "regions": int(regions), "days": int(days), "horizon": int(horizon),
                   "outbreak": dataclasses.asdict(prm)},
    }
    return json.loads(json.dumps(ident))  # normalize tuples -> lists


_IDENTITY_KEYS = ("generator", "generator_version", "format", "seed", "params")


def write_outbreak(o: SyntheticOutbreak, out_dir: Path | str, *, fmt: str = "csv") -> dict:
    """Write an in-memory outbreak into an existing empty directory; returns the manifest."""
    out_dir = Path(out_dir)
    ext = _FORMATS[fmt]
    files = {}
    rows = {}
    for key in list(TABLES) + [TARGET.key]:
        spec = ALL_TABLES[key]
        path = out_dir / (spec.stem + ext)
        n = _write_file(path, fmt, _batches(key, o))
        rows[key] = n
        files[path.name] = {"table": key, "rows": n, "bytes": path.stat().st_size, "sha256": sha256_file(path)}
    manifest = _identity(fmt, o.persons, o.regions, o.seed, o.days, o.horizon, o.params)
    manifest["rows"] = rows
    manifest["files"] = files
    manifest["content_hash"] = hashlib.sha256(
        json.dumps({k: v["sha256"] for k, v in sorted(files.items())}, sort_keys=True).encode()).hexdigest()
    manifest["stats"] = o.stats
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _existing_state(out_dir: Path) -> tuple[str, dict | None, list[str]]:
    """Classify ``out_dir``: ('absent'|'empty'|'dataset'|'foreign', manifest, foreign names)."""
    if not out_dir.exists():
        return "absent", None, []
    if not out_dir.is_dir():
        raise DataError(f"output path {out_dir} exists and is not a directory; pick a directory path")
    names = sorted(p.name for p in out_dir.iterdir())
    if not names:
        return "empty", None, []
    known = all_dataset_filenames()
    foreign = [n for n in names if n not in known]
    manifest = None
    mpath = out_dir / MANIFEST_NAME
    if mpath.is_file():
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, ValueError):
            manifest = None
    if foreign:
        return "foreign", manifest, foreign
    return "dataset", manifest, []


def synthesize(out_dir: Path | str, *, persons: int = 10_000, regions: int = 5, seed: int = 0,
               days: int = TRAIN_DAYS, horizon: int = HORIZON, overwrite: bool = False, format: str = "csv",
               params: OutbreakParams | None = None) -> dict:
    """Generate a synthetic outbreak and write it to ``out_dir``; return a summary.

    Writes ``va_person``, ``va_household``, ``va_residence_locations``,
    ``va_activity_locations``, ``va_activity_location_assignment``,
    ``va_population_network``, ``va_disease_outcome_training`` (days
    ``0..days-1``) and ``va_disease_outcome_target`` (label: recorded S -> I on
    a day in ``days..days+horizon-1``) as ``format`` (``"csv"``, ``"csv.gz"``
    or ``"parquet"``), plus ``manifest.json`` (generator version, parameters,
    seed, row counts, per-file and overall sha256, outbreak statistics).

    The same arguments always produce byte-identical files.  If ``out_dir``
    already holds the same dataset (same manifest identity, files intact) this
    is a no-op (``summary["written"]`` is False).  A directory holding a
    different dataset is refused unless ``overwrite=True``; a directory with
    other files is always refused.  Files are written to a temporary sibling
    directory and renamed into place, so a failure leaves nothing half-written.
    """
    if format not in _FORMATS:
        raise ConfigError(f"format must be one of {', '.join(_FORMATS)}, got {format!r}")
    _check_args(persons, regions, seed, days, horizon)
    prm = params or OutbreakParams()
    out_dir = Path(out_dir)
    ident = _identity(format, persons, regions, seed, days, horizon, prm)
    state, manifest, foreign = _existing_state(out_dir)
    if state == "foreign":
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise DataError(
            f"output directory {out_dir} already holds files that are not part of a synthetic dataset ({shown}); "
            "pick an empty or new directory (overwrite=True only replaces a dataset written by synthesize)"
        )
    if state == "dataset":
        same = manifest is not None and all(manifest.get(k) == ident[k] for k in _IDENTITY_KEYS)
        if same and not overwrite and _files_intact(out_dir, manifest):
            return {**manifest, "path": str(out_dir), "written": False, "seconds": 0.0}
        if not overwrite:
            if same:
                why = "the same dataset but its files are incomplete or modified"
            elif manifest is None:
                why = "dataset files without a readable manifest.json"
            else:
                diff = [k for k in _IDENTITY_KEYS if manifest.get(k) != ident[k]]
                why = f"a different dataset (differs in: {', '.join(diff)})"
            raise DataError(
                f"output directory {out_dir} already holds {why}; pick an empty directory or, to "
                "replace it, pass --overwrite (Python: overwrite=True)"
            )
    t0 = time.perf_counter()
    outbreak = generate_outbreak(persons=persons, regions=regions, seed=seed, days=days, horizon=horizon,
                                 params=prm)
    t_gen = time.perf_counter() - t0
    parent = out_dir.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    try:
        os.chmod(tmp, 0o755)
        manifest = write_outbreak(outbreak, tmp, fmt=format)
        del outbreak
        _swap_into_place(tmp, out_dir.absolute())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    total = time.perf_counter() - t0
    return {**manifest, "path": str(out_dir), "written": True, "seconds": round(total, 3),
            "generate_seconds": round(t_gen, 3)}


def _files_intact(out_dir: Path, manifest: dict) -> bool:
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for name, info in files.items():
        p = out_dir / name
        if not p.is_file() or p.stat().st_size != info.get("bytes"):
            return False
    return True


def _swap_into_place(tmp: Path, out_dir: Path):
    if not out_dir.exists():
        os.rename(tmp, out_dir)
        return
    if not any(out_dir.iterdir()):
        os.rmdir(out_dir)
        os.rename(tmp, out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    os.rmdir(old)
    os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except BaseException:
        os.rename(old, out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)

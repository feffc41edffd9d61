"""Steps 1-3 of the generator: regions (counties), households and the persons in them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from silofl.errors import ConfigError
from silofl.pandemic.synth.params import OutbreakParams


@dataclass
class Geography:
    """Regions laid out over Virginia's bounding box; arrays are (R,)."""

    weights: np.ndarray  # population share of each region (sums to 1)
    lon: np.ndarray  # centre longitude
    lat: np.ndarray  # centre latitude
    spread: np.ndarray  # std of locations around the centre, in degrees
    county_codes: np.ndarray  # int32 FIPS-like codes 51001, 51003, ...


@dataclass
class Households:
    """Households and their residences; arrays are (H,), households grouped by region."""

    sizes: np.ndarray  # int64 members per household
    region: np.ndarray  # int16 region index
    lon: np.ndarray
    lat: np.ndarray
    hids: np.ndarray  # int32 household ids 1..H
    rlids: np.ndarray  # int32 residence location of each household (a permutation of 1..H)
    vehicles: np.ndarray  # int8

    @property
    def count(self) -> int:
        return int(self.sizes.size)


@dataclass
class Persons:
    """Persons in household order; arrays are (N,)."""

    hh_of: np.ndarray  # int32 household index
    pnum: np.ndarray  # int16 person number within the household (1 = householder)
    region: np.ndarray  # int16 region index
    age: np.ndarray  # uint8 years
    sex: np.ndarray  # int8, 1 male, 2 female
    pids: np.ndarray  # int32 person ids, increasing with a few gaps


def alloc(total: int, weights: np.ndarray, minimum: int = 1) -> np.ndarray:
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


def place_regions(rng: np.random.Generator, R: int) -> Geography:
    """Step 1: ``R`` regions on a jittered grid with log-normal population shares."""
    w = rng.lognormal(0.0, 0.9, R)
    w = 0.85 * w / w.sum() + 0.15 / R
    nx = max(1, math.ceil(math.sqrt(R * 2.0)))
    ny = max(1, math.ceil(R / nx))
    cells = rng.permutation(nx * ny)[:R]
    lon0, lon1, lat0, lat1 = -83.4, -75.6, 36.6, 39.4
    cw, ch = (lon1 - lon0) / nx, (lat1 - lat0) / ny
    c_lon = lon0 + ((cells % nx) + 0.5 + rng.uniform(-0.2, 0.2, R)) * cw
    c_lat = lat0 + ((cells // nx) + 0.5 + rng.uniform(-0.2, 0.2, R)) * ch
    spread = np.clip(0.22 * min(cw, ch) * np.sqrt(w * R), 0.02, 0.4 * min(cw, ch))
    county_codes = (51001 + 2 * np.arange(R)).astype(np.int32)
    return Geography(weights=w, lon=c_lon, lat=c_lat, spread=spread, county_codes=county_codes)


def make_households(rng: np.random.Generator, N: int, R: int, geo: Geography,
                    prm: OutbreakParams) -> Households:
    """Step 2: household sizes summing to ``N``, allocated to regions, each with a residence."""
    probs = np.asarray(prm.household_size_probs, dtype=np.float64)
    probs = probs / probs.sum()
    mean_size = float((np.arange(1, probs.size + 1) * probs).sum())
    sizes = np.empty(0, np.int64)
    while sizes.sum() < N:
        extra = int(max(16, (N - sizes.sum()) / mean_size * 1.1 + 16))
        sizes = np.concatenate([sizes, rng.choice(probs.size, size=extra, p=probs) + 1])
    cs = np.cumsum(sizes)
    H = int(np.searchsorted(cs, N) + 1)
    sizes = sizes[:H].copy()
    sizes[-1] -= int(cs[H - 1] - N)
    if H < R:
        raise ConfigError(f"{N} persons form only {H} households, fewer than regions={R}; use fewer regions")
    hh_counts = alloc(H, geo.weights, 1)
    hh_region = np.repeat(np.arange(R, dtype=np.int16), hh_counts)
    hh_lon = np.round(geo.lon[hh_region] + rng.normal(0, 1, H) * geo.spread[hh_region], 5)
    hh_lat = np.round(geo.lat[hh_region] + rng.normal(0, 1, H) * geo.spread[hh_region] * 0.8, 5)
    hids = np.arange(1, H + 1, dtype=np.int32)
    rlids = (1 + rng.permutation(H)).astype(np.int32)  # household h lives at rlids[h]
    hh_vehicles = np.minimum(rng.poisson(1.0 + 0.35 * np.minimum(sizes, 4)), 6).astype(np.int8)
    return Households(sizes=sizes, region=hh_region, lon=hh_lon, lat=hh_lat, hids=hids, rlids=rlids,
                      vehicles=hh_vehicles)


# householder age bands and their probabilities by household size (1, 2, 3+)
_AGE_BANDS = np.array([18, 25, 35, 45, 55, 65, 75, 91])
_HEAD_AGE_PROBS = {
    1: [0.08, 0.15, 0.12, 0.14, 0.19, 0.17, 0.15],
    2: [0.06, 0.14, 0.10, 0.13, 0.22, 0.20, 0.15],
    3: [0.03, 0.22, 0.33, 0.26, 0.11, 0.04, 0.01],
}


def make_persons(rng: np.random.Generator, N: int, hh: Households) -> Persons:
    """Step 3: household-aware ages (householder, partner, children, other adults), sex and ids."""
    sizes, H = hh.sizes, hh.count
    hh_of = np.repeat(np.arange(H, dtype=np.int32), sizes)
    first = (np.cumsum(sizes) - sizes).astype(np.int64)
    pnum = (np.arange(N) - first[hh_of] + 1).astype(np.int16)
    size_of = sizes[hh_of]
    region = hh.region[hh_of]
    bands = _AGE_BANDS
    hsz = np.minimum(sizes, 3)
    head_age = np.empty(H, np.int64)
    for s, pr in _HEAD_AGE_PROBS.items():
        m = hsz == s
        b = rng.choice(7, size=int(m.sum()), p=np.asarray(pr) / np.sum(pr))
        head_age[m] = rng.integers(bands[b], bands[b + 1])
    ha = head_age[hh_of]
    u = rng.random(N)
    age = np.empty(N, np.int64)
    age[pnum == 1] = ha[pnum == 1]
    partner_age = np.clip(ha + np.round(rng.normal(0, 4, N)), 18, 95)
    child_age = ha - rng.integers(20, 41, N)
    child_age = np.where(ha < 58, np.clip(child_age, 0, 17), np.clip(child_age, 18, 70))
    other_age = rng.integers(18, 86, N)
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
    sex = rng.integers(1, 3, N).astype(np.int8)
    head_sex = sex[first][hh_of]
    flip = partner & (rng.random(N) < 0.95)
    sex[flip] = (3 - head_sex[flip]).astype(np.int8)
    gaps = (rng.random(N) < 0.03) * rng.integers(1, 6, N)
    pids = (1 + np.arange(N) + np.cumsum(gaps)).astype(np.int64)
    if pids[-1] > np.iinfo(np.int32).max:
        raise ConfigError("too many persons for int32 ids")
    return Persons(hh_of=hh_of, pnum=pnum, region=region, age=age, sex=sex, pids=pids.astype(np.int32))

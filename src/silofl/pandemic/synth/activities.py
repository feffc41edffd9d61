"""Step 4 of the generator: who works, studies or goes to college, and the activity locations."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from silofl.errors import ConfigError
from silofl.pandemic.synth.params import (
    K_COLLEGE,
    K_OTHER,
    K_RELIGION,
    K_SCHOOL,
    K_SHOP,
    K_WORK,
    OutbreakParams,
)
from silofl.pandemic.synth.population import Geography


@dataclass
class Roles:
    """Each person's main daytime role; boolean arrays are (N,)."""

    college: np.ndarray
    employed: np.ndarray
    pupil: np.ndarray


@dataclass
class Locations:
    """Activity locations sorted by (region, kind); arrays are (L,)."""

    region: np.ndarray  # int16
    kind: np.ndarray  # int8, one of K_WORK .. K_RELIGION
    flags: np.ndarray  # (L, 6) uint8 in LOCATION_FLAGS order
    lon: np.ndarray
    lat: np.ndarray
    popularity: np.ndarray  # visitor weight of venues (heavy-tailed, capped)
    emp_w: np.ndarray  # weight of being chosen as a workplace
    alids: np.ndarray  # int32 location ids

    @property
    def count(self) -> int:
        return int(self.kind.size)


def assign_roles(rng: np.random.Generator, age: np.ndarray, prm: OutbreakParams) -> Roles:
    """Roles: college students (some 18-22), employed adults and pupils (5-17)."""
    N = age.size
    a = age.astype(np.int16)
    rnd = rng.random(N)
    college = (a >= 18) & (a <= 22) & (rnd < prm.college_prob)
    emp_p = np.select([(a >= 18) & (a <= 22), (a >= 23) & (a <= 59), (a >= 60) & (a <= 64),
                       (a >= 65) & (a <= 70)], [0.5, 0.78, 0.55, 0.2], 0.0)
    employed = ~college & (rng.random(N) < emp_p)
    pupil = (a >= 5) & (a <= 17) & (rng.random(N) < 0.97)
    return Roles(college=college, employed=employed, pupil=pupil)


def _counts_per_kind(region: np.ndarray, roles: Roles, R: int,
                     prm: OutbreakParams) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Locations per (kind, region), staff per kind, teachers per school, work-only workers per region."""
    n_reg = np.bincount(region, minlength=R)
    n_pup = np.bincount(region[roles.pupil], minlength=R)
    n_wrk = np.bincount(region[roles.employed], minlength=R)
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
    per_kind_counts[K_WORK] = np.maximum(
        1, np.round(workonly_workers / prm.workers_per_workplace)).astype(np.int64)
    return per_kind_counts, staff_per, school_staff, workonly_workers


def make_locations(rng: np.random.Generator, region: np.ndarray, roles: Roles, R: int, H: int,
                   geo: Geography, prm: OutbreakParams) -> Locations:
    """Step 4: workplaces, shops, other venues, schools, colleges and places of worship per region."""
    per_kind_counts, staff_per, school_staff, workonly_workers = _counts_per_kind(region, roles, R, prm)
    # locations sorted by (region, kind)
    counts_rk = per_kind_counts.T  # (R, 6)
    n_loc_rk = counts_rk.reshape(-1)
    L = int(n_loc_rk.sum())
    loc_region = np.repeat(np.repeat(np.arange(R, dtype=np.int16), 6), n_loc_rk)
    loc_kind = np.repeat(np.tile(np.arange(6, dtype=np.int8), R), n_loc_rk)
    flags = np.zeros((L, 6), np.uint8)  # columns in LOCATION_FLAGS order
    flags[np.arange(L), loc_kind] = 1
    flags[:, 0] = 1  # every activity location employs someone
    mixed = (loc_kind == K_OTHER) & (rng.random(L) < 0.15)
    flags[mixed, K_SHOP] = 1
    loc_lon = np.round(geo.lon[loc_region] + rng.normal(0, 1, L) * geo.spread[loc_region] * 0.7, 5)
    loc_lat = np.round(geo.lat[loc_region] + rng.normal(0, 1, L) * geo.spread[loc_region] * 0.56, 5)
    # venue visitor weights: heavy-tailed (capped); staff numbers do not grow with popularity, so
    # staff at popular venues meet many visitors (the degree tail)
    popularity = np.minimum(rng.pareto(prm.venue_popularity_shape, L) + 1.0, prm.max_venue_popularity)
    emp_w = np.where(loc_kind == K_WORK, rng.pareto(1.4, L) + 1.0, 0.0)
    # scale work-only weights so each region's sum matches its work-only workers
    wsum = np.bincount(loc_region, weights=emp_w, minlength=R)
    emp_w = emp_w / np.maximum(wsum[loc_region], 1e-12) * workonly_workers[loc_region]
    emp_w = np.where(loc_kind == K_SCHOOL, school_staff[loc_region], emp_w)
    for k in (K_SHOP, K_OTHER, K_COLLEGE, K_RELIGION):
        emp_w = np.where(loc_kind == k, staff_per[k], emp_w)
    alid_base = 10 ** math.ceil(math.log10(H + 2))
    alids = (alid_base + 1 + np.arange(L)).astype(np.int64)
    if alids[-1] > np.iinfo(np.int32).max:
        raise ConfigError("too many locations for int32 ids")
    return Locations(region=loc_region, kind=loc_kind, flags=flags, lon=loc_lon, lat=loc_lat,
                     popularity=popularity, emp_w=emp_w, alids=alids.astype(np.int32))

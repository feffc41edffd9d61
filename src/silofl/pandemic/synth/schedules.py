"""Step 5 of the generator: each person's day (home, main activity, errands, home) and the assignment table.

The draws from the schedule stream happen in a fixed order (roles, work, school, college, errand
wishes and durations, errand places, travel times); changing it changes every seeded dataset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from silofl.pandemic.schema import SECONDS_PER_DAY
from silofl.pandemic.synth.activities import Locations, Roles
from silofl.pandemic.synth.params import (
    _H,
    A_COLLEGE,
    A_HOME,
    A_OTHER,
    A_RELIGION,
    A_SCHOOL,
    A_SHOP,
    A_WORK,
    K_COLLEGE,
    K_OTHER,
    K_RELIGION,
    K_SCHOOL,
    K_SHOP,
    OutbreakParams,
)

#: errands in the order they are done after the main activity, with their activity types
ERRAND_KINDS = (K_SHOP, K_OTHER, K_RELIGION)
ERRAND_TYPES = (A_SHOP, A_OTHER, A_RELIGION)


@dataclass
class Schedule:
    """Everyone's (repeating) day; per-person arrays are (N,), times in seconds after midnight.

    ``main_*`` is the work / school / college activity (``main_type`` 0 and ``main_loc`` -1 if
    none); ``err_*[k]`` the k-th errand of :data:`ERRAND_KINDS`; ``hm_*`` / ``he_*`` the morning and
    evening segments at home.  ``*_loc`` are indices into :class:`Locations`.
    """

    main_loc: np.ndarray
    main_type: np.ndarray
    main_start: np.ndarray
    main_dur: np.ndarray
    err_start: list[np.ndarray]
    err_dur: list[np.ndarray]
    err_on: list[np.ndarray]
    err_loc: list[np.ndarray]
    any_out: np.ndarray
    hm_start: np.ndarray
    hm_dur: np.ndarray
    he_start: np.ndarray
    he_dur: np.ndarray
    home_lid: np.ndarray  # int64 residence location id

    @property
    def main_end(self) -> np.ndarray:
        return self.main_start + self.main_dur


def maybe_other_region(rng: np.random.Generator, region: np.ndarray, prob: float,
                       weights: np.ndarray) -> np.ndarray:
    """With probability ``prob`` replace a region by one drawn ∝ ``weights``."""
    move = rng.random(region.size) < prob
    out = region.copy()
    n = int(move.sum())
    if n:
        out[move] = rng.choice(weights.size, size=n, p=weights / weights.sum())
    return out


def choose(rng: np.random.Generator, chooser_region: np.ndarray, cand_region: np.ndarray,
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


def _pick(rng: np.random.Generator, locs: Locations, kind: int, chooser_region: np.ndarray,
          weight: np.ndarray, R: int) -> np.ndarray:
    """A location of ``kind`` (any kind if negative) in each chooser's region, ∝ ``weight``."""
    cand = np.flatnonzero(locs.kind == kind) if kind >= 0 else np.arange(locs.count)
    pos = choose(rng, chooser_region.astype(np.int64), locs.region[cand], weight[cand], R)
    return cand[pos]


def _main_activities(rng: np.random.Generator, reg64: np.ndarray, roles: Roles, locs: Locations,
                     w: np.ndarray, R: int, prm: OutbreakParams) -> tuple[np.ndarray, ...]:
    """Work, school or college: (location, type, start, duration) per person."""
    N = reg64.size
    ones = np.ones(locs.count)
    main_loc = np.full(N, -1, np.int64)
    main_type = np.zeros(N, np.int8)
    main_start = np.zeros(N, np.int64)
    main_dur = np.zeros(N, np.int64)
    # work
    wi = np.flatnonzero(roles.employed)
    wreg = maybe_other_region(rng, reg64[wi], prm.commute_cross_region, w)
    main_loc[wi] = _pick(rng, locs, -1, wreg, locs.emp_w, R)
    main_type[wi] = A_WORK
    shift = rng.random(wi.size) < 0.12
    ws = np.where(shift, rng.uniform(13, 16.5, wi.size), np.clip(rng.normal(8.5, 1.2, wi.size), 5, 12))
    wd = np.clip(rng.normal(8.0, 1.5, wi.size), 3, 10)
    wkind = locs.kind[main_loc[wi]]
    teacher = wkind == K_SCHOOL
    ws = np.where(teacher, rng.uniform(7.0, 7.75, wi.size), ws)
    wd = np.where(teacher, rng.uniform(8.0, 8.75, wi.size), wd)
    # venue staff work staggered shifts covering opening hours
    venue = (wkind == K_SHOP) | (wkind == K_OTHER) | (wkind == K_RELIGION)
    ws = np.where(venue, rng.uniform(7.0, 15.5, wi.size), ws)
    wd = np.where(venue, rng.uniform(6.0, 9.0, wi.size), wd)
    main_start[wi] = np.round(ws * _H)
    main_dur[wi] = np.minimum(np.round(wd * _H), 23 * _H - main_start[wi])
    # school
    si = np.flatnonzero(roles.pupil)
    main_loc[si] = _pick(rng, locs, K_SCHOOL, reg64[si], ones, R)
    main_type[si] = A_SCHOOL
    main_start[si] = np.round(rng.uniform(7.75, 8.25, si.size) * _H)
    main_dur[si] = np.round(rng.uniform(6.5, 7.0, si.size) * _H)
    # college
    ci = np.flatnonzero(roles.college)
    creg = maybe_other_region(rng, reg64[ci], prm.college_cross_region, w)
    main_loc[ci] = _pick(rng, locs, K_COLLEGE, creg, ones, R)
    main_type[ci] = A_COLLEGE
    main_start[ci] = np.round(rng.uniform(8, 14, ci.size) * _H)
    main_dur[ci] = np.round(rng.uniform(1.5, 4.0, ci.size) * _H)
    return main_loc, main_type, main_start, main_dur


def _errands(rng: np.random.Generator, reg64: np.ndarray, age: np.ndarray, has_main: np.ndarray,
             main_end: np.ndarray, locs: Locations, w: np.ndarray, R: int,
             prm: OutbreakParams) -> tuple[list[np.ndarray], ...]:
    """Shopping, other and religion (in that order, after the main activity): start, dur, on, loc."""
    N = reg64.size
    a = age.astype(np.int16)
    child = a < 13
    p_shop = np.where(child, 0.1, np.where(a < 18, 0.25, prm.shopping_prob))
    p_other = np.where(child, 0.25, prm.other_prob)
    want = [rng.random(N) < p_shop, rng.random(N) < p_other,
            rng.random(N) < prm.religion_prob]
    durs = [np.clip(rng.lognormal(math.log(30 * 60), 0.5, N), 600, 7200),
            np.clip(rng.lognormal(math.log(75 * 60), 0.6, N), 1200, 4 * _H),
            rng.uniform(3600, 7200, N)]
    cur = np.where(has_main, main_end + rng.uniform(600, 1800, N),
                   rng.uniform(9 * _H, 17 * _H, N))
    err_start, err_dur, err_on = [], [], []
    for k in range(3):
        e = cur + durs[k]
        on = want[k] & (e <= 23 * _H)
        err_start.append(np.where(on, np.round(cur), 0).astype(np.int64))
        err_dur.append(np.where(on, np.round(durs[k]), 0).astype(np.int64))
        err_on.append(on)
        cur = np.where(on, e + rng.uniform(300, 1500, N), cur)
    del want, durs, cur, p_shop, p_other
    err_loc = []
    for k, kind in enumerate(ERRAND_KINDS):
        idx = np.flatnonzero(err_on[k])
        lr = maybe_other_region(rng, reg64[idx], prm.errand_cross_region, w)
        locs_k = np.full(N, -1, np.int64)
        locs_k[idx] = _pick(rng, locs, kind, lr, locs.popularity, R)
        err_loc.append(locs_k)
    return err_start, err_dur, err_on, err_loc


def make_schedule(rng: np.random.Generator, region: np.ndarray, age: np.ndarray, home_lid: np.ndarray,
                  roles: Roles, locs: Locations, w: np.ndarray, R: int, prm: OutbreakParams) -> Schedule:
    """Step 5: morning home, main activity, errands, evening home, for every person."""
    N = region.size
    reg64 = region.astype(np.int64)
    main_loc, main_type, main_start, main_dur = _main_activities(rng, reg64, roles, locs, w, R, prm)
    has_main = main_type > 0
    err_start, err_dur, err_on, err_loc = _errands(rng, reg64, age, has_main, main_start + main_dur, locs,
                                                   w, R, prm)
    # home segments
    any_out = has_main | err_on[0] | err_on[1] | err_on[2]
    first_out = np.where(has_main, main_start,
                         np.where(err_on[0], err_start[0], np.where(err_on[1], err_start[1], err_start[2])))
    last_end = main_start + main_dur
    for k in range(3):
        last_end = np.where(err_on[k], err_start[k] + err_dur[k], last_end)
    travel1 = np.round(rng.uniform(600, 2400, N)).astype(np.int64)
    travel2 = np.round(rng.uniform(600, 2400, N)).astype(np.int64)
    hm_start = np.zeros(N, np.int64)
    hm_dur = np.where(any_out, first_out - travel1, SECONDS_PER_DAY)
    he_start = np.where(any_out, np.minimum(last_end + travel2, SECONDS_PER_DAY - 600), 0)
    he_dur = np.where(any_out, SECONDS_PER_DAY - he_start, 0)
    return Schedule(main_loc=main_loc, main_type=main_type, main_start=main_start, main_dur=main_dur,
                    err_start=err_start, err_dur=err_dur, err_on=err_on, err_loc=err_loc, any_out=any_out,
                    hm_start=hm_start, hm_dur=hm_dur, he_start=he_start, he_dur=he_dur, home_lid=home_lid)


def assignment_table(sched: Schedule, pids: np.ndarray, alids: np.ndarray) -> dict[str, np.ndarray]:
    """The activity-location-assignment table: one row per (person, activity) in day order."""
    N = pids.size
    has_main = sched.main_type > 0
    err_on, err_loc = sched.err_on, sched.err_loc
    # slot matrix: home_morning, main, shop, other, religion, home_evening
    slot_on = np.stack([np.ones(N, bool), has_main, err_on[0], err_on[1], err_on[2], sched.any_out], axis=1)
    slot_type = np.array([A_HOME, 0, A_SHOP, A_OTHER, A_RELIGION, A_HOME], np.int8)
    home_lid = sched.home_lid
    slot_lid = np.stack([home_lid, np.where(has_main, alids[np.maximum(sched.main_loc, 0)], -1),
                         *[np.where(err_on[k], alids[np.maximum(err_loc[k], 0)], -1) for k in range(3)],
                         home_lid], axis=1)
    slot_start = np.stack([sched.hm_start, sched.main_start, *sched.err_start, sched.he_start], axis=1)
    slot_dur = np.stack([sched.hm_dur, sched.main_dur, *sched.err_dur, sched.he_dur], axis=1)
    types = np.broadcast_to(slot_type, (N, 6)).copy()
    types[:, 1] = sched.main_type
    act_num = np.cumsum(slot_on, axis=1).astype(np.int16)
    sel = slot_on.reshape(-1)
    person_of_row = np.repeat(np.arange(N, dtype=np.int32), slot_on.sum(1))
    return {
        "pid": pids[person_of_row],
        "activity_number": act_num.reshape(-1)[sel],
        "activity_type": types.reshape(-1)[sel],
        "start_time": slot_start.reshape(-1)[sel].astype(np.int32),
        "duration": slot_dur.reshape(-1)[sel].astype(np.int32),
        "lid": slot_lid.reshape(-1)[sel].astype(np.int32),
    }

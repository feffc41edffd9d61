"""Step 6 of the generator: contact rows from co-location with overlapping time windows.

Contexts, in the order they draw from the network stream (changing it changes every seeded
dataset): household members at home, work teams and co-workers, school classes, college
sections, venue visitors and staff.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from silofl.data.ids import lexsort
from silofl.pandemic.synth.activities import Locations
from silofl.pandemic.synth.params import (
    A_COLLEGE,
    A_HOME,
    A_RELIGION,
    A_SCHOOL,
    A_WORK,
    K_SCHOOL,
    OutbreakParams,
)
from silofl.pandemic.synth.schedules import ERRAND_TYPES, Schedule


def window_pairs(key: np.ndarray, start: np.ndarray, end: np.ndarray, window: int, prob: float,
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


def rank_within(key_sorted: np.ndarray) -> np.ndarray:
    """0-based position of each element within its run of equal keys (keys sorted)."""
    n = key_sorted.size
    if n == 0:
        return np.empty(0, np.int64)
    starts = np.flatnonzero(np.concatenate([[True], key_sorted[1:] != key_sorted[:-1]]))
    run_id = np.cumsum(np.concatenate([[True], key_sorted[1:] != key_sorted[:-1]])) - 1
    return np.arange(n) - starts[run_id]


class EdgeSink:
    """Collects contact rows from all contexts as compact arrays."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {k: [] for k in
                                                   ("src", "dst", "lid", "start_time", "duration",
                                                    "activity1", "activity2")}

    def add(self, src, dst, lid, start, dur, a1, a2) -> None:
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

    def add_overlap(self, pi: np.ndarray, pk: np.ndarray, lid: np.ndarray, start: np.ndarray, end: np.ndarray,
                    a1, a2) -> None:
        """Rows for persons ``pi`` and ``pk`` together from ``pk``'s start until the first leaves."""
        st = start[pk]
        self.add(pi, pk, lid, st, np.minimum(end[pi], end[pk]) - st, a1, a2)

    def finish(self) -> dict[str, np.ndarray]:
        out = {}
        for k in list(self.parts):
            lst = self.parts.pop(k)
            out[k] = np.concatenate(lst) if lst else np.empty(
                0, np.int32 if k not in ("activity1", "activity2") else np.int8)
        return out


@dataclass
class _Workers:
    """Employed persons (``idx``), their workplace and whether it is a school (then they teach)."""

    idx: np.ndarray
    loc: np.ndarray
    at_school: np.ndarray


def _household(rng: np.random.Generator, edges: EdgeSink, hh_of: np.ndarray, sched: Schedule) -> None:
    """(a) household members at home (morning and evening segments)."""
    idxN = np.arange(hh_of.size, dtype=np.int64)
    any_out = sched.any_out
    hv_person = np.concatenate([idxN, idxN[any_out]])
    hv_start = np.concatenate([sched.hm_start, sched.he_start[any_out]])
    hv_end = hv_start + np.concatenate([sched.hm_dur, sched.he_dur[any_out]])
    hv_key = hh_of[hv_person].astype(np.int64)
    o = lexsort((hv_person, hv_start, hv_key))
    hv_person, hv_start, hv_end, hv_key = hv_person[o], hv_start[o], hv_end[o], hv_key[o]
    max_vis = int(np.bincount(hv_key).max()) if hv_key.size else 1
    i, k = window_pairs(hv_key, hv_start, hv_end, max_vis, 1.0, rng)
    st = hv_start[k]
    edges.add(hv_person[i], hv_person[k], sched.home_lid[hv_person[i]], st,
              np.minimum(hv_end[i], hv_end[k]) - st, A_HOME, A_HOME)


def _work(rng: np.random.Generator, edges: EdgeSink, sched: Schedule, locs: Locations, wk: _Workers,
          prm: OutbreakParams) -> None:
    """(b) workers: teams at their workplace plus a few co-workers; school staff join classes instead."""
    main_start, end_main, alids = sched.main_start, sched.main_end, locs.alids
    tw, tl = wk.idx[~wk.at_school], wk.loc[~wk.at_school]
    o = lexsort((rng.integers(0, 1 << 30, tw.size), tl))
    tw, tl = tw[o], tl[o]
    team_size = np.clip(prm.team_size_min + rng.poisson(prm.team_size_mean_extra, locs.count),
                        prm.team_size_min, prm.team_size_max)
    team = rank_within(tl) // team_size[tl]
    tkey = tl * (int(team.max(initial=0)) + 1) + team
    o = lexsort((main_start[tw], tkey))
    tw, tl, tkey = tw[o], tl[o], tkey[o]
    i, k = window_pairs(tkey, main_start[tw], end_main[tw], prm.team_size_max, 1.0, rng)
    edges.add_overlap(tw[i], tw[k], alids[tl[i]], main_start, end_main, A_WORK, A_WORK)
    # a few contacts across teams at the same workplace
    o = lexsort((main_start[tw], tl))
    xw, xl, xt = tw[o], tl[o], tkey[o]
    i, k = window_pairs(xl, main_start[xw], end_main[xw], prm.coworker_window, prm.coworker_contact_prob, rng)
    diff = xt[i] != xt[k]
    i, k = i[diff], k[diff]
    edges.add_overlap(xw[i], xw[k], alids[xl[i]], main_start, end_main, A_WORK, A_WORK)


def _school(rng: np.random.Generator, edges: EdgeSink, age: np.ndarray, sched: Schedule, locs: Locations,
            wk: _Workers, prm: OutbreakParams) -> None:
    """(c) schools: classes of similar age plus a teacher; a few contacts across classes."""
    main_start, end_main, alids = sched.main_start, sched.main_end, locs.alids
    pu = np.flatnonzero(sched.main_type == A_SCHOOL)
    ploc = sched.main_loc[pu]
    o = lexsort((rng.integers(0, 1 << 30, pu.size), age[pu], ploc))
    pu, ploc = pu[o], ploc[o]
    cls = rank_within(ploc) // prm.class_size
    n_cls = np.zeros(locs.count, np.int64)
    np.maximum.at(n_cls, ploc, cls + 1)
    teachers, tloc = wk.idx[wk.at_school], wk.loc[wk.at_school]
    o = lexsort((rng.integers(0, 1 << 30, teachers.size), tloc))
    teachers, tloc = teachers[o], tloc[o]
    has_cls = n_cls[tloc] > 0
    teachers, tloc = teachers[has_cls], tloc[has_cls]
    tcls = rank_within(tloc) % np.maximum(n_cls[tloc], 1)
    cp = np.concatenate([pu, teachers])
    cl = np.concatenate([ploc, tloc])
    cc = np.concatenate([cls, tcls])
    ckey = cl * (int(cc.max(initial=0)) + 1) + cc
    ctype = np.concatenate([np.full(pu.size, A_SCHOOL, np.int8), np.full(teachers.size, A_WORK, np.int8)])
    o = lexsort((cp, main_start[cp], ckey))
    cp, cl, ckey, ctype = cp[o], cl[o], ckey[o], ctype[o]
    i, k = window_pairs(ckey, main_start[cp], end_main[cp], prm.class_size + 8, 1.0, rng)
    edges.add_overlap(cp[i], cp[k], alids[cl[i]], main_start, end_main, ctype[i], ctype[k])
    o = lexsort((rng.integers(0, 1 << 30, pu.size), ploc))
    xp, xl, xc = pu[o], ploc[o], cls[o]
    o2 = lexsort((main_start[xp], xl))
    xp, xl, xc = xp[o2], xl[o2], xc[o2]
    i, k = window_pairs(xl, main_start[xp], end_main[xp], 6, 0.35, rng)
    diff = xc[i] != xc[k]
    i, k = i[diff], k[diff]
    edges.add_overlap(xp[i], xp[k], alids[xl[i]], main_start, end_main, A_SCHOOL, A_SCHOOL)


def _college(rng: np.random.Generator, edges: EdgeSink, sched: Schedule, locs: Locations,
             prm: OutbreakParams) -> None:
    """(d) college sections."""
    main_start, end_main = sched.main_start, sched.main_end
    cu = np.flatnonzero(sched.main_type == A_COLLEGE)
    cloc = sched.main_loc[cu]
    o = lexsort((rng.integers(0, 1 << 30, cu.size), cloc))
    cu, cloc = cu[o], cloc[o]
    sec = rank_within(cloc) // prm.college_section_size
    skey = cloc * (int(sec.max(initial=0)) + 1) + sec
    o = lexsort((main_start[cu], skey))
    cu, cloc, skey = cu[o], cloc[o], skey[o]
    i, k = window_pairs(skey, main_start[cu], end_main[cu], prm.college_section_size,
                        prm.college_contact_prob, rng)
    edges.add_overlap(cu[i], cu[k], locs.alids[cloc[i]], main_start, end_main, A_COLLEGE, A_COLLEGE)


def _venues(rng: np.random.Generator, edges: EdgeSink, sched: Schedule, locs: Locations, wk: _Workers,
            prm: OutbreakParams) -> None:
    """(e) venues: visitors meet overlapping visitors, and often a member of staff."""
    main_start, end_main, alids, L = sched.main_start, sched.main_end, locs.alids, locs.count
    staff = wk.idx[~wk.at_school]
    sloc = wk.loc[~wk.at_school]
    o = lexsort((rng.integers(0, 1 << 30, staff.size), sloc))
    staff, sloc = staff[o], sloc[o]
    staff_lo = np.searchsorted(sloc, np.arange(L), side="left")
    staff_n = np.searchsorted(sloc, np.arange(L), side="right") - staff_lo
    for kk, atype in enumerate(ERRAND_TYPES):
        vp = np.flatnonzero(sched.err_on[kk])
        vl = sched.err_loc[kk][vp]
        vs = sched.err_start[kk][vp]
        ve = vs + sched.err_dur[kk][vp]
        o = lexsort((vp, vs, vl))
        vp, vl, vs, ve = vp[o], vl[o], vs[o], ve[o]
        window = prm.venue_window + (4 if atype == A_RELIGION else 0)
        i, k = window_pairs(vl, vs, ve, window, prm.venue_contact_prob, rng)
        st = vs[k]
        edges.add(vp[i], vp[k], alids[vl[i]], st, np.minimum(ve[i], ve[k]) - st, atype, atype)
        # staff contacts: each visit meets each on-shift employee (up to the first few) with some
        # probability, the venue's first employee ("front desk") most often -- staff at busy
        # venues become the hubs of the contact graph
        n_st = np.minimum(staff_n[vl], prm.max_staff_met)
        lo_st = staff_lo[vl]
        for j in range(int(n_st.max()) if n_st.size else 0):
            p_meet = prm.front_desk_contact_prob if j == 0 else prm.staff_contact_prob
            has = np.flatnonzero((n_st > j) & (rng.random(vp.size) < p_meet))
            sp = staff[lo_st[has] + j]
            s0 = np.maximum(vs[has], main_start[sp])
            s1 = np.minimum(ve[has], end_main[sp])
            ok = s1 > s0
            short = np.round(rng.uniform(120, 900, has.size)).astype(np.int64)
            dur = np.minimum(s1 - s0, short)
            edges.add(sp[ok], vp[has][ok], alids[vl[has][ok]], s0[ok], dur[ok], A_WORK, atype)


def make_contacts(rng: np.random.Generator, hh_of: np.ndarray, age: np.ndarray, sched: Schedule,
                  locs: Locations, prm: OutbreakParams) -> dict[str, np.ndarray]:
    """Step 6: the contact network as person *indices* (``src``/``dst``) plus the file columns.

    Returns
    -------
    dict
        ``src``, ``dst``, ``lid``, ``start_time``, ``duration`` (int32, seconds) and
        ``activity1``, ``activity2`` (int8), one entry per contact row (E,).
    """
    edges = EdgeSink()
    _household(rng, edges, hh_of, sched)
    wi = np.flatnonzero(sched.main_type == A_WORK)
    wloc = sched.main_loc[wi]
    wk = _Workers(idx=wi, loc=wloc, at_school=locs.kind[wloc] == K_SCHOOL)
    _work(rng, edges, sched, locs, wk, prm)
    _school(rng, edges, age, sched, locs, wk, prm)
    _college(rng, edges, sched, locs, prm)
    _venues(rng, edges, sched, locs, wk, prm)
    return edges.finish()

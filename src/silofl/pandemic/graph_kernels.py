"""Compiled (numba) kernels of contact-graph deduplication and pruning (`graph`).

Integer-only, allocation-light loops over CSR arrays; `graph` validates inputs and wraps
them.  Deterministic for a seed: the priority keys are a splitmix64 hash of (pair, seed).
"""

from __future__ import annotations

import numpy as np

from silofl.errors import ConfigError

try:
    import numba as nb
except ImportError as exc:  # numba is in the optional "pandemic" extra
    raise ConfigError("graph pruning needs numba: install it with "
                      "`pip install -e '.[pandemic]'`") from exc

_DUR_BITS = 16  # bits of the priority key spent on total duration (priority="duration")
_DUR_UNIT = 60  # seconds per step of the duration part of the key (saturates at ~45 days)
_INSERTION_MAX = 32  # rows up to this length are insertion-sorted


@nb.njit(cache=True)
def _count_by_min(src, dst, n):
    indptr = np.zeros(n + 1, np.int64)
    for i in range(src.shape[0]):
        a = src[i]
        b = dst[i]
        if a == b:
            continue
        indptr[(a if a < b else b) + 1] += 1
    for u in range(n):
        indptr[u + 1] += indptr[u]
    return indptr


@nb.njit(cache=True)
def _fill_by_min(src, dst, indptr, other, rows):
    pos = indptr[:-1].copy()
    for i in range(src.shape[0]):
        a = src[i]
        b = dst[i]
        if a == b:
            continue
        if a < b:
            u, v = a, b
        else:
            u, v = b, a
        k = pos[u]
        other[k] = v
        rows[k] = i
        pos[u] = k + 1


@nb.njit(cache=True)
def _sort_int64(a):
    """In-place sort of a small int64 array: insertion sort up to 32 entries, heapsort
    above (hand-written: numba's own sorts take seconds to compile)."""
    m = a.shape[0]
    if m <= _INSERTION_MAX:
        for i in range(1, m):
            x = a[i]
            j = i - 1
            while j >= 0 and a[j] > x:
                a[j + 1] = a[j]
                j -= 1
            a[j + 1] = x
        return
    for start in range(m // 2 - 1, -1, -1):
        _sift_down(a, start, m)
    for end in range(m - 1, 0, -1):
        a[0], a[end] = a[end], a[0]
        _sift_down(a, 0, end)


@nb.njit(cache=True)
def _sift_down(a, root, end):
    while True:
        child = 2 * root + 1
        if child >= end:
            return
        if child + 1 < end and a[child] < a[child + 1]:
            child += 1
        if a[root] < a[child]:
            a[root], a[child] = a[child], a[root]
            root = child
        else:
            return


@nb.njit(cache=True)
def _sort_buckets(indptr, other, rows):
    """Sort every bucket by (other, row) — rows stay increasing within a pair — and
    return the CSR pointer of unique pairs per bucket.  Needs row < 2**32."""
    n = indptr.shape[0] - 1
    maxm = 0
    for u in range(n):
        maxm = max(maxm, indptr[u + 1] - indptr[u])
    buf = np.empty(maxm, np.int64)
    low = np.int64(0xFFFFFFFF)
    uptr = np.zeros(n + 1, np.int64)
    for u in range(n):
        a = indptr[u]
        b = indptr[u + 1]
        m = b - a
        if m == 0:
            continue
        if m > 1:
            seg = buf[:m]
            for i in range(m):
                seg[i] = (np.int64(other[a + i]) << 32) | np.int64(rows[a + i])
            _sort_int64(seg)
            for i in range(m):
                other[a + i] = seg[i] >> 32
                rows[a + i] = seg[i] & low
        c = 1
        for k in range(a + 1, b):
            if other[k] != other[k - 1]:
                c += 1
        uptr[u + 1] = c
    for u in range(n):
        uptr[u + 1] += uptr[u]
    return uptr


@nb.njit(cache=True)
def _collect_pairs(indptr, other, rows, uptr, duration, has_duration,
                   out_u, out_v, out_row, out_cnt, out_tot):
    n = indptr.shape[0] - 1
    for u in range(n):
        a = indptr[u]
        b = indptr[u + 1]
        k = a
        o = uptr[u]
        while k < b:
            v = other[k]
            best = rows[k]
            best_d = duration[best] if has_duration else 0
            tot = np.int64(best_d)
            c = 1
            k += 1
            while k < b and other[k] == v:
                r = rows[k]
                if has_duration:
                    d = duration[r]
                    tot += d
                    if d > best_d:
                        best_d = d
                        best = r
                c += 1
                k += 1
            out_u[o] = u
            out_v[o] = v
            out_row[o] = best
            out_cnt[o] = c
            out_tot[o] = min(tot, np.int64(2**31 - 1))
            o += 1


@nb.njit(cache=True)
def _splitmix64(x):
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@nb.njit(cache=True)
def _key(u, v, e, s, total_duration, use_duration, index_bits):
    """Priority key of pair ``e = (u, v)`` (smaller = earlier):
    [duration part |] hash bits | pair index bits.  The pair index in the low bits makes
    every key unique, so any sort algorithm gives the same order; it only breaks ties
    between equal hash (and duration) values."""
    dur_bits = _DUR_BITS if use_duration else 0
    hash_bits = 64 - index_bits - dur_bits
    x = (np.uint64(u) << np.uint64(32)) | np.uint64(v)
    h = _splitmix64(x ^ s) >> np.uint64(64 - hash_bits)
    key = (h << np.uint64(index_bits)) | np.uint64(e)
    if use_duration:
        dmax = np.int64((1 << _DUR_BITS) - 1)
        d = np.int64(total_duration[e]) // _DUR_UNIT
        if d > dmax:
            d = dmax
        key |= np.uint64(dmax - d) << np.uint64(64 - _DUR_BITS)
    return key


@nb.njit(cache=True)
def _priority_keys(pu, pv, seed, total_duration, use_duration, index_bits):
    m = pu.shape[0]
    keys = np.empty(m, np.uint64)
    s = _splitmix64(np.uint64(seed))
    for e in range(m):
        keys[e] = _key(pu[e], pv[e], e, s, total_duration, use_duration, index_bits)
    return keys


@nb.njit(cache=True)
def _greedy(su, sv, n, cap0, allowed_sorted, use_allowed):
    """Greedy b-matching over pairs already listed in priority order (su, sv);
    returns the accept flag of every listed pair."""
    cap = np.full(n, cap0, np.int32)
    acc = np.zeros(su.shape[0], np.bool_)
    for k in range(su.shape[0]):
        if use_allowed and not allowed_sorted[k]:
            continue
        a = su[k]
        b = sv[k]
        if cap[a] > 0 and cap[b] > 0:
            cap[a] -= 1
            cap[b] -= 1
            acc[k] = True
    return acc


@nb.njit(cache=True)
def _lex_less(d, k, i, j):
    return d[i] > d[j] or (d[i] == d[j] and k[i] < k[j])


@nb.njit(cache=True)
def _order_row(d, k, perm):
    """perm ← argsort by (−d, k) (insertion sort up to 32 entries, heapsort above)."""
    m = perm.shape[0]
    for i in range(m):
        perm[i] = i
    if m <= _INSERTION_MAX:
        for i in range(1, m):
            x = perm[i]
            j = i - 1
            while j >= 0 and _lex_less(d, k, x, perm[j]):
                perm[j + 1] = perm[j]
                j -= 1
            perm[j + 1] = x
        return
    for start in range(m // 2 - 1, -1, -1):
        _sift_lex(d, k, perm, start, m)
    for end in range(m - 1, 0, -1):
        perm[0], perm[end] = perm[end], perm[0]
        _sift_lex(d, k, perm, 0, end)


@nb.njit(cache=True)
def _sift_lex(d, k, perm, root, end):
    while True:
        child = 2 * root + 1
        if child >= end:
            return
        if child + 1 < end and _lex_less(d, k, perm[child], perm[child + 1]):
            child += 1
        if _lex_less(d, k, perm[root], perm[child]):
            perm[root], perm[child] = perm[child], perm[root]
            root = child
        else:
            return


@nb.njit(cache=True)
def _build_rows(pu, pv, acc, n, duration, seed, total_duration, use_duration,
                index_bits):
    """CSR (both directions) of the accepted pairs; every row ordered by (longest
    contact first, then priority key).  Returns (indptr, nbr, pair id of every entry)."""
    m_pairs = pu.shape[0]
    indptr = np.zeros(n + 1, np.int64)
    for e in range(m_pairs):
        if acc[e]:
            indptr[pu[e] + 1] += 1
            indptr[pv[e] + 1] += 1
    maxm = 0
    for u in range(n):
        maxm = max(maxm, indptr[u + 1])
        indptr[u + 1] += indptr[u]
    m = indptr[n]
    nbr = np.empty(m, np.int32)
    eid = np.empty(m, np.int64)
    pos = indptr[:-1].copy()
    for e in range(m_pairs):
        if acc[e]:
            a = pu[e]
            b = pv[e]
            nbr[pos[a]] = b
            eid[pos[a]] = e
            pos[a] += 1
            nbr[pos[b]] = a
            eid[pos[b]] = e
            pos[b] += 1
    d_loc = np.empty(maxm, np.int64)
    k_loc = np.empty(maxm, np.uint64)
    perm = np.empty(maxm, np.int64)
    nb_tmp = np.empty(maxm, np.int32)
    e_tmp = np.empty(maxm, np.int64)
    s = _splitmix64(np.uint64(seed))
    for u in range(n):
        a = indptr[u]
        r = indptr[u + 1] - a
        if r < 2:
            continue
        for i in range(r):
            e = eid[a + i]
            d_loc[i] = duration[e]
            k_loc[i] = _key(pu[e], pv[e], e, s, total_duration, use_duration, index_bits)
            nb_tmp[i] = nbr[a + i]
            e_tmp[i] = e
        p = perm[:r]
        _order_row(d_loc, k_loc, p)
        for i in range(r):
            nbr[a + i] = nb_tmp[p[i]]
            eid[a + i] = e_tmp[p[i]]
    return indptr, nbr, eid


@nb.njit(cache=True)
def _symmetric_rows(pu, pv, n):
    indptr = np.zeros(n + 1, np.int64)
    for e in range(pu.shape[0]):
        indptr[pu[e] + 1] += 1
        indptr[pv[e] + 1] += 1
    for u in range(n):
        indptr[u + 1] += indptr[u]
    nbr = np.empty(indptr[n], np.int32)
    pos = indptr[:-1].copy()
    for e in range(pu.shape[0]):
        a = pu[e]
        b = pv[e]
        nbr[pos[a]] = b
        pos[a] += 1
        nbr[pos[b]] = a
        pos[b] += 1
    return indptr, nbr


@nb.njit(cache=True)
def _appearance_counts(n, indptr1, nbr1, indptr2, nbr2, two_hops):
    cnt = np.ones(n, np.int64)
    mark = np.full(n, -1, np.int64)
    for u in range(n):
        mark[u] = u
        for k in range(indptr1[u], indptr1[u + 1]):
            w = nbr1[k]
            if mark[w] != u:
                mark[w] = u
                cnt[w] += 1
        if two_hops:
            for k in range(indptr1[u], indptr1[u + 1]):
                v = nbr1[k]
                for j in range(indptr2[v], indptr2[v + 1]):
                    w = nbr2[j]
                    if mark[w] != u:
                        mark[w] = u
                        cnt[w] += 1
    return cnt

"""Deterministic neighbour sampling as graph pruning (thesis §2.3.2, §2.4).

Every person's training example is built from a *fixed* set of neighbours: the same
person always gets the same neighbours, so sampling is really a pruning of the contact
graph, done once and cached.  The node-level accountant (`silofl.privacy.node_level`)
needs every person to appear in at most ``S`` examples — its own plus at most ``S − 1``
other people's neighbourhoods.  With ``ℓ = 1`` hop, person ``w`` appears in ``u``'s
example iff ``u`` kept ``w`` as a neighbour, so we bound the degree of an *undirected*
pruned graph by ``max_degree = S − 1`` (a directed "each node picks S − 1 neighbours"
rule would let a hub sit in hundreds of neighbourhoods).

Pipeline (all O(contacts) except one sort of the unique pairs, numba kernels):

1. `dedupe_contacts`: contact rows (the same pair can meet many times, at different
   places and times) → unique undirected pairs ``u < v``; self-loops are dropped.  Each
   pair keeps the attributes of its *longest* contact (ties: the earliest row), the
   number of contacts and their total duration.
2. `prune_pairs`: every pair gets a priority from a seeded 64-bit hash of ``(u, v)``
   (so it does not depend on row order or duplication); the pairs are taken in priority
   order and an edge is kept iff both endpoints still have capacity (greedy maximal
   b-matching).  The result is deterministic, has degree ≤ ``max_degree`` everywhere,
   keeps every edge when the graph already satisfies the bound, and is *maximal*: no
   dropped edge could be added back without breaking the bound.
   ``priority="duration"`` prefers pairs with a longer total contact time (hash as
   tie-break) instead of a uniform random order.
3. The kept edges become a CSR neighbour index (both directions), each row ordered by
   contact duration (longest first, ties by priority), with the edge attributes aligned
   to ``nbr``.

Iterative ℓ = 2 (``hops=2``): the kept graph ``G1`` (degree ≤ k1) is pruned *again* with
the same priorities to ``G2 ⊆ G1`` with degree ≤ k2 (``max_degree_hop2``).  Person ``u``'s
2-hop neighbours are ``F(v) \\ {u}`` for each kept neighbour ``v``, where ``F(v)`` are
``v``'s ``G2`` neighbours.  Person ``w`` then appears in ``u``'s example (u ≠ w) only if
``u ∈ N1(w)`` (≤ k1 such u) or ``u ∈ N1(v) \\ {w}`` for some ``v ∈ F(w)`` (≤ k2·(k1 − 1)
such u), so every person appears in at most

    S_total = 1 + k1 + k2 · (k1 − 1)

examples (`NeighbourIndex.appearance_bound`); `appearance_counts` verifies it.  For
ℓ = 1, ``S_total = 1 + k1 = S``.

Caveat (shared with the seed method and Daigavane et al.): the accounting treats the
pruned graph as the data.  Greedy pruning is itself data-dependent — removing a person
can free capacity that lets *other* pairs be kept — and that effect is not covered by
the node-level bound (under either adjacency of `node_dp`); every model states it as an
uncharged assumption (`privacy.node_level.PRUNING_ASSUMPTION`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from silofl.errors import ConfigError, DataError, PrivacyError
from silofl.pandemic.graph_kernels import (
    _DUR_BITS,
    _appearance_counts,
    _build_rows,
    _collect_pairs,
    _count_by_min,
    _fill_by_min,
    _greedy,
    _priority_keys,
    _sort_buckets,
    _symmetric_rows,
)

Priority = Literal["random", "duration"]
PRIORITIES: tuple[str, ...] = ("random", "duration")


# --- data containers ------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class ContactPairs:
    """Unique undirected contact pairs ``u < v`` (sorted by ``(u, v)``), one row each.

    Attributes are those of the pair's longest contact; ``n_contacts`` counts the contact
    rows of the pair and ``total_duration`` sums their durations."""

    num_nodes: int
    u: np.ndarray               # (P,) int32
    v: np.ndarray               # (P,) int32
    start_time: np.ndarray      # (P,) int32
    duration: np.ndarray        # (P,) int32
    lid: np.ndarray             # (P,) location id (input integer dtype)
    n_contacts: np.ndarray      # (P,) int32
    total_duration: np.ndarray  # (P,) int32, saturating at 2**31 - 1 seconds

    @property
    def num_pairs(self) -> int:
        return int(self.u.shape[0])

    def degree(self) -> np.ndarray:
        """(N,) int64 degree of every person in the deduplicated graph."""
        n = self.num_nodes
        return (np.bincount(self.u, minlength=n) + np.bincount(self.v, minlength=n))


@dataclass(frozen=True, eq=False)
class NeighbourIndex:
    """CSR neighbour lists of the pruned undirected graph (each edge stored twice).

    Row ``p`` is ``nbr[indptr[p]:indptr[p + 1]]``, ordered by contact duration (longest
    first, ties by priority); ``start_time``, ``duration``, ``lid``, ``n_contacts`` are
    aligned with ``nbr``.  ``hop2`` holds the second pruning ``G2`` (ℓ = 2) or None."""

    num_nodes: int
    max_degree: int
    seed: int
    priority: str
    indptr: np.ndarray           # (N + 1,) int64
    nbr: np.ndarray              # (E,) int32
    start_time: np.ndarray       # (E,) int32
    duration: np.ndarray         # (E,) int32
    lid: np.ndarray              # (E,) location id (input integer dtype)
    n_contacts: np.ndarray       # (E,) int32
    original_degree: np.ndarray  # (N,) int32, degree before pruning (after dedupe)
    hop2: NeighbourIndex | None = None

    @property
    def hops(self) -> int:
        return 1 if self.hop2 is None else 2

    @property
    def degree(self) -> np.ndarray:
        """(N,) int64 degree in the pruned graph."""
        return np.diff(self.indptr)

    @property
    def num_edges(self) -> int:
        """Number of undirected kept edges."""
        return int(self.nbr.shape[0] // 2)

    @property
    def max_degree_hop2(self) -> int:
        return 0 if self.hop2 is None else self.hop2.max_degree

    @property
    def appearance_bound(self) -> int:
        """Most examples any person can appear in: the ``S`` to give the accountant."""
        k1 = self.max_degree
        if self.hop2 is None:
            return 1 + k1
        return 1 + k1 + self.hop2.max_degree * max(k1 - 1, 0)

    def neighbours(self, person: int) -> np.ndarray:
        return self.nbr[self.indptr[person]:self.indptr[person + 1]]

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """The kept undirected edges as ``(rows, cols)`` with ``rows < cols``."""
        rows = np.repeat(np.arange(self.num_nodes, dtype=np.int32), self.degree)
        keep = rows < self.nbr
        return rows[keep], self.nbr[keep]

    def nbytes(self) -> int:
        total = sum(a.nbytes for a in (self.indptr, self.nbr, self.start_time, self.duration,
                                      self.lid, self.n_contacts, self.original_degree))
        return total + (0 if self.hop2 is None else self.hop2.nbytes())


# --- validation ----------------------------------------------------------------------

def _as_index_array(name: str, a, n_rows: int | None = None) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 1:
        raise DataError(f"{name} must be a 1-D array, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        what = ("person indices 0..N-1 (map person ids to contiguous indices first)"
                if name in ("src", "dst") else "integers")
        raise DataError(f"{name} must hold {what}, got dtype {a.dtype}")
    if n_rows is not None and a.shape[0] != n_rows:
        raise DataError(f"{name} has {a.shape[0]} rows but src has {n_rows}; "
                        "all contact arrays must have one entry per contact row")
    return a


def _check_nodes(name: str, a: np.ndarray, num_nodes: int) -> None:
    if a.size == 0:
        return
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= num_nodes:  # no value in the message: it comes from a record
        raise DataError(f"{name} contains a person index outside 0..{num_nodes - 1}; "
                        "persons must be numbered contiguously 0..num_nodes-1 within the "
                        "region (drop contacts with people outside the region first)")


def _check_int(name: str, value, lo: int, err=ConfigError) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise err(f"{name} must be an integer, got {value!r}")
    if value < lo:
        raise err(f"{name} must be at least {lo}, got {value}")
    return int(value)


# --- public API ----------------------------------------------------------------------

def dedupe_contacts(src, dst, num_nodes: int, *, start_time=None, duration=None,
                    lid=None) -> ContactPairs:
    """Collapse contact rows into unique undirected pairs (see module docstring).

    ``src, dst``: (R,) person indices in ``0..num_nodes-1``; optional per-row
    ``start_time``, ``duration`` (seconds) and ``lid`` (location id).  Rows with
    ``src == dst`` are dropped.  Without ``duration`` the earliest row of a pair is kept."""
    num_nodes = _check_int("num_nodes", num_nodes, 1, DataError)
    src = _as_index_array("src", src)
    dst = _as_index_array("dst", dst, src.shape[0])
    rows_n = src.shape[0]
    st = None if start_time is None else _as_index_array("start_time", start_time, rows_n)
    du = None if duration is None else _as_index_array("duration", duration, rows_n)
    li = None if lid is None else _as_index_array("lid", lid, rows_n)
    _check_nodes("src", src, num_nodes)
    _check_nodes("dst", dst, num_nodes)
    if du is not None and du.size and int(du.min()) < 0:
        raise DataError("duration contains negative values; durations must be seconds ≥ 0")

    if rows_n >= 2**32:
        raise DataError(f"{rows_n} contact rows is more than this implementation supports "
                        "(2**32); split the region")
    indptr = _count_by_min(src, dst, num_nodes)
    m = int(indptr[-1])
    other = np.empty(m, np.int32)
    rows = np.empty(m, np.int32 if rows_n < 2**31 else np.int64)
    _fill_by_min(src, dst, indptr, other, rows)
    uptr = _sort_buckets(indptr, other, rows)
    p = int(uptr[-1])
    out_u = np.empty(p, np.int32)
    out_v = np.empty(p, np.int32)
    out_row = np.empty(p, rows.dtype)
    out_cnt = np.empty(p, np.int32)
    out_tot = np.empty(p, np.int32)
    dur_arg = du if du is not None else np.zeros(1, np.int32)
    _collect_pairs(indptr, other, rows, uptr, dur_arg, du is not None,
                   out_u, out_v, out_row, out_cnt, out_tot)
    del other, rows, indptr, uptr
    zeros32 = np.zeros(p, np.int32)
    return ContactPairs(
        num_nodes=num_nodes, u=out_u, v=out_v,
        start_time=zeros32 if st is None else st[out_row].astype(np.int32, copy=False),
        duration=zeros32 if du is None else du[out_row].astype(np.int32, copy=False),
        lid=np.zeros(p, np.int32) if li is None else li[out_row],
        n_contacts=out_cnt, total_duration=out_tot)


def _index_bits(num_pairs: int) -> int:
    return max(1, int(num_pairs - 1).bit_length()) if num_pairs > 1 else 1


def _seed64(seed) -> np.uint64:
    return np.uint64(_check_int("seed", seed, 0) & 0xFFFFFFFFFFFFFFFF)


def _check_priority(pairs: ContactPairs, priority: str) -> int:
    if priority not in PRIORITIES:
        raise ConfigError(f"priority must be one of {', '.join(PRIORITIES)}, got {priority!r}")
    bits = _index_bits(pairs.num_pairs)
    if bits + (_DUR_BITS if priority == "duration" else 0) > 56:
        raise DataError(f"too many contact pairs ({pairs.num_pairs}) for 64-bit priorities")
    return bits


def priority_keys(pairs: ContactPairs, seed: int = 0,
                  priority: Priority = "random") -> np.ndarray:
    """(P,) uint64 priority of every pair (smaller = considered earlier); unique."""
    bits = _check_priority(pairs, priority)
    return _priority_keys(pairs.u, pairs.v, _seed64(seed), pairs.total_duration,
                          priority == "duration", bits)


def _index_from(pairs: ContactPairs, acc: np.ndarray, max_degree: int, seed: int,
                priority: str, original_degree: np.ndarray) -> NeighbourIndex:
    indptr, nbr, eid = _build_rows(pairs.u, pairs.v, acc, pairs.num_nodes, pairs.duration,
                                   _seed64(seed), pairs.total_duration,
                                   priority == "duration", _index_bits(pairs.num_pairs))
    return NeighbourIndex(
        num_nodes=pairs.num_nodes, max_degree=max_degree, seed=seed, priority=priority,
        indptr=indptr, nbr=nbr, start_time=pairs.start_time[eid],
        duration=pairs.duration[eid], lid=pairs.lid[eid],
        n_contacts=pairs.n_contacts[eid], original_degree=original_degree)


def prune_pairs(pairs: ContactPairs, max_degree: int, seed: int = 0, *,
                priority: Priority = "random", hops: int = 1,
                max_degree_hop2: int | None = None) -> NeighbourIndex:
    """Greedy deterministic pruning of deduplicated pairs to degree ≤ ``max_degree``.

    ``hops=2`` additionally prunes the kept graph to degree ≤ ``max_degree_hop2`` (k2)
    for the 2-hop neighbour lists (see module docstring for the appearance bound)."""
    max_degree = _check_int("max_degree (= S - 1)", max_degree, 0)
    if hops not in (1, 2):
        raise ConfigError(f"hops must be 1 or 2, got {hops!r}")
    if hops == 2:
        if max_degree_hop2 is None:
            raise ConfigError("hops=2 needs max_degree_hop2 (2-hop neighbours kept per "
                              "1-hop neighbour), e.g. max_degree_hop2=3")
        max_degree_hop2 = _check_int("max_degree_hop2", max_degree_hop2, 1)
        if max_degree_hop2 > max_degree:
            raise ConfigError(f"max_degree_hop2 = {max_degree_hop2} cannot exceed "
                              f"max_degree = {max_degree}; the 2-hop graph is a subgraph "
                              "of the 1-hop graph")
    order = priority_keys(pairs, seed, priority)
    order.sort()  # in place: keys in priority order; the low bits are the pair ids
    np.bitwise_and(order, np.uint64((1 << _index_bits(pairs.num_pairs)) - 1), out=order)
    order = order.view(np.int64)
    su, sv = pairs.u[order], pairs.v[order]
    n = pairs.num_nodes
    orig = pairs.degree().astype(np.int32)
    acc_sorted = _greedy(su, sv, n, min(max_degree, n), np.zeros(1, np.bool_), False)
    acc2_sorted = (_greedy(su, sv, n, max_degree_hop2, acc_sorted, True)
                   if hops == 2 else None)
    del su, sv
    acc = np.zeros(pairs.num_pairs, np.bool_)
    acc[order] = acc_sorted
    if acc2_sorted is not None:
        acc2 = np.zeros(pairs.num_pairs, np.bool_)
        acc2[order] = acc2_sorted
    del order, acc_sorted, acc2_sorted
    hop2 = None
    if hops == 2:
        hop2 = _index_from(pairs, acc2, max_degree_hop2, seed, priority, orig)
        del acc2
    index = _index_from(pairs, acc, max_degree, seed, priority, orig)
    if hop2 is not None:
        index = NeighbourIndex(**{**index.__dict__, "hop2": hop2})
    return index


def prune_to_max_degree(src, dst, num_nodes: int, max_degree: int, seed: int = 0, *,
                        start_time=None, duration=None, lid=None,
                        priority: Priority = "random", hops: int = 1,
                        max_degree_hop2: int | None = None) -> NeighbourIndex:
    """Contact rows → pruned undirected simple graph with degree ≤ ``max_degree``.

    ``max_degree = S − 1`` for an ℓ = 1 neighbourhood of size S.  Same inputs and seed
    give the same result; the result does not depend on the order of the rows or on
    which end of a contact is ``src``.  Use ``index.edges()`` for ``(rows, cols)``."""
    pairs = dedupe_contacts(src, dst, num_nodes, start_time=start_time, duration=duration,
                            lid=lid)
    return prune_pairs(pairs, max_degree, seed, priority=priority, hops=hops,
                       max_degree_hop2=max_degree_hop2)


def symmetric_csr(pairs: ContactPairs) -> tuple[np.ndarray, np.ndarray]:
    """(indptr (N+1,) int64, indices (2P,) int32) of the full deduplicated graph."""
    return _symmetric_rows(pairs.u, pairs.v, pairs.num_nodes)


def appearance_counts(index: NeighbourIndex) -> np.ndarray:
    """(N,) int64: for every person, 1 + the number of *other* people's examples
    (neighbourhoods, 1- and 2-hop) it appears in."""
    h2 = index.hop2
    indptr2 = h2.indptr if h2 is not None else np.zeros(1, np.int64)
    nbr2 = h2.nbr if h2 is not None else np.zeros(1, np.int32)
    return _appearance_counts(index.num_nodes, index.indptr, index.nbr, indptr2, nbr2,
                              h2 is not None)


def max_appearances(index: NeighbourIndex) -> int:
    """Largest number of examples any one person appears in."""
    return int(appearance_counts(index).max()) if index.num_nodes else 0


def check_appearance_bound(index: NeighbourIndex, S: int | None = None) -> int:
    """Verify that nobody appears in more than ``S`` examples (default: the index's own
    `appearance_bound`); return the observed maximum or raise PrivacyError."""
    bound = index.appearance_bound if S is None else int(S)
    worst = max_appearances(index)
    if worst > bound:
        raise PrivacyError(
            f"a person appears in {worst} training examples but the node-level accountant "
            f"assumes at most S = {bound}; prune to a smaller max_degree or account with "
            f"S = {worst}")
    return worst

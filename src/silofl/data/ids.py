"""Integer ids at scale: fast stable sorts and a vectorised id -> position index.

np.unique and a stable argsort are slow at 10^7+ rows; the graph readers and generators
(tabular or graph data alike) use these instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["IdIndex", "stable_argsort", "lexsort", "sorted_unique", "first_occurrence"]


def stable_argsort(a: np.ndarray) -> np.ndarray:
    """Stable argsort (int64 positions) of an integer array.

    Packs (value, position) into one int64 and sorts that (SIMD sort), which is
    several times faster than ``np.argsort(kind="stable")`` on large arrays.
    """
    a = np.asarray(a)
    n = a.size
    if n == 0:
        return np.empty(0, np.int64)
    if a.dtype.kind in "iub" and n < (1 << 32):
        lo, hi = int(a.min()), int(a.max())
        if hi - lo < (1 << 31):
            key = (a.astype(np.int64) - lo) << 32
            key |= np.arange(n, dtype=np.int64)
            key.sort()
            key &= 0xFFFFFFFF
            return key
    return np.argsort(a, kind="stable")


def lexsort(keys: Sequence[np.ndarray]) -> np.ndarray:
    """Like ``np.lexsort`` (last key is primary) for integer keys, via repeated stable sorts."""
    keys = list(keys)
    order = stable_argsort(keys[0])
    for k in keys[1:]:
        order = order[stable_argsort(np.asarray(k)[order])]
    return order


def sorted_unique(a: np.ndarray) -> np.ndarray:
    """Sorted unique values of an integer array (sort-based; fast for large arrays)."""
    s = np.sort(np.asarray(a), kind="quicksort")
    if s.size == 0:
        return s
    keep = np.empty(s.size, bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def first_occurrence(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique values, index of each value's first occurrence) of an integer array."""
    order = stable_argsort(a)
    s = np.asarray(a)[order]
    if s.size == 0:
        return s, order
    keep = np.empty(s.size, bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep], order[keep]


# --------------------------------------------------------------------------- #
# Id lookup
# --------------------------------------------------------------------------- #
class IdIndex:
    """Vectorized map from ids to positions ``0..n-1`` of a sorted unique id array.

    Uses a dense lookup table when the ids span a compact range (the usual
    case: a few bytes per id), else binary search.  ``lookup`` returns ``-1``
    (or ``missing``) for unknown ids.
    """

    __slots__ = ("ids", "_lo", "_table")

    #: dense table only when the id span is at most this many entries...
    DENSE_MAX_SPAN = 1 << 28
    #: ...and at most this many times the number of ids (or 1M entries).
    DENSE_MAX_RATIO = 8

    def __init__(self, ids: np.ndarray):
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise ValueError("ids must be one-dimensional")
        if ids.size > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            raise ValueError("IdIndex needs sorted, unique ids")
        self.ids = ids
        self._lo = 0
        self._table = None
        if ids.size:
            lo, hi = int(ids[0]), int(ids[-1])
            span = hi - lo + 1
            dense_cap = max(self.DENSE_MAX_RATIO * ids.size, 1 << 20)
            if span <= self.DENSE_MAX_SPAN and span <= dense_cap:
                table = np.full(span, -1, dtype=np.int32)
                table[(ids.astype(np.int64) - lo)] = np.arange(ids.size, dtype=np.int32)
                self._lo, self._table = lo, table

    def __len__(self) -> int:
        return int(self.ids.size)

    def __contains__(self, value: object) -> bool:
        return bool(self.lookup(np.asarray([value]))[0] >= 0)

    def __getitem__(self, value: int) -> int:
        pos = int(self.lookup(np.asarray([value]))[0])
        if pos < 0:  # no value in the message: ids are record values
            raise KeyError("id not in the index")
        return pos

    def lookup(self, values: np.ndarray, missing: int = -1) -> np.ndarray:
        """Positions of ``values`` (int32 array, ``missing`` where unknown)."""
        values = np.asarray(values)
        n = self.ids.size
        if n == 0 or values.size == 0:
            return np.full(values.shape, missing, dtype=np.int32)
        if self._table is not None:
            off = values.astype(np.int64, copy=False) - self._lo
            span = self._table.size
            inside = (off >= 0) & (off < span)
            if inside.all():
                out = self._table.take(off)
            else:
                out = self._table.take(np.where(inside, off, 0))
                out[~inside] = -1
            if missing != -1:
                out[out < 0] = missing
            return out
        pos = np.searchsorted(self.ids, values)
        np.minimum(pos, n - 1, out=pos)
        found = self.ids[pos] == values
        return np.where(found, pos, missing).astype(np.int32)

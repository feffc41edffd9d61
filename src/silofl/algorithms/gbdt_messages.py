"""The DP-GBDT protocol's messages (the table in `silofl.algorithms.gbdt_programs`): a
server message (`Ask`) and a silo's release are flat float64 arrays of public length,
decoded and checked by the receiver (nothing is pickled).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from silofl.algorithms.gbdt_settings import GbdtSettings
from silofl.errors import SiloflError

OP_LEVEL, OP_LEAVES, OP_MODEL, OP_BINS = 1, 2, 3, 4
_HEADER = 8  # op, tree, level, m, |splits|, |leaves|, |sums|, |edges|


class MessageError(SiloflError):
    """A server message or a silo release that does not follow the protocol."""


def _ints() -> np.ndarray:
    return np.zeros(0, np.int64)


def _floats() -> np.ndarray:
    return np.zeros(0)


@dataclass
class Ask:
    """A server message. `split_feature` / `split_bin`: (n,) the original column and
    split bin of every node of the levels the silo is to apply, in heap order (bin B: no
    split); `leaves`: (2^D,) the previous tree's leaf values (empty: none); `sums`: the
    MODEL message's summed (T, 2, 2^D) leaf sums, flat (then τ² with shrink = "auto");
    `edges`: the (d, B − 1) bin edges, flat, in the first tree's first message. BINS:
    `level` is the fine histogram's bins per feature."""

    op: int
    tree: int
    level: int
    features: np.ndarray = field(default_factory=_ints)
    split_feature: np.ndarray = field(default_factory=_ints)
    split_bin: np.ndarray = field(default_factory=_ints)
    leaves: np.ndarray = field(default_factory=_floats)
    sums: np.ndarray = field(default_factory=_floats)
    edges: np.ndarray = field(default_factory=_floats)

    def to_array(self) -> np.ndarray:
        """The message as one flat float64 vector (the wire form)."""
        head = [self.op, self.tree, self.level, self.features.size, self.split_feature.size,
                self.leaves.size, self.sums.size, self.edges.size]
        return np.concatenate([np.asarray(head, float), self.features, self.split_feature,
                               self.split_bin, self.leaves, self.sums,
                               np.ravel(self.edges)]).astype(np.float64)

    @classmethod
    def from_array(cls, a: np.ndarray) -> Ask:
        """Decode `to_array`'s vector (MessageError for a malformed one)."""
        a = np.asarray(a, dtype=np.float64).ravel()
        if a.size < _HEADER or not np.all(np.isfinite(a)):
            raise MessageError("gbdt message is shorter than its header or not finite")
        head = a[:_HEADER]
        if np.any(head != np.floor(head)) or np.any(head < 0):
            raise MessageError("gbdt message header holds non-integers")
        op, tree, level, m, ns, nl, nsum, ne = (int(v) for v in head)
        if a.size != _HEADER + m + 2 * ns + nl + nsum + ne:
            raise MessageError(f"gbdt message has {a.size} numbers, its header states "
                               f"{_HEADER + m + 2 * ns + nl + nsum + ne}")
        parts = np.split(a[_HEADER:], np.cumsum([m, ns, ns, nl, nsum]))
        ints = np.concatenate(parts[:3])
        if np.any(ints != np.floor(ints)):
            raise MessageError("gbdt message: features and splits must be integers")
        return cls(op, tree, level, parts[0].astype(np.int64), parts[1].astype(np.int64),
                   parts[2].astype(np.int64), parts[3], parts[4], parts[5])


def release_size(s: GbdtSettings, ask: Ask) -> int:
    """Length of a silo's flat release answering `ask`.

    Parameters
    ----------
    s : GbdtSettings
        With its bins resolved (`gbdt_settings.resolve_bins`).
    ask : Ask

    Returns
    -------
    int
        2·2^L·m·B for a LEVEL L message (g then h histograms), 2·2^D for LEAVES (Σg then
        Σh per leaf), d·fine for BINS (noisy counts), 0 for MODEL (no release).
    """
    if ask.op == OP_LEVEL:
        return 2 * 2 ** ask.level * ask.features.size * s.n_bins
    if ask.op == OP_BINS:
        return s.d * ask.level
    return 2 * 2 ** s.depth if ask.op == OP_LEAVES else 0

"""The silos' training rows as the trainer reads them: `SiloArrays` (tabular rows packed
per silo, or image-like arrays) and the `SiloSource` protocol any data source meets
(``n`` (K,) and ``gather(silos, idx)``: lazy Parquet silos, graph data).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

#: one gathered batch: X (k, M, ...), y (k, M) and ‖x‖² (k, M) or None
Batch = tuple[np.ndarray, np.ndarray, np.ndarray | None]


class SiloSource(Protocol):
    """What a trainer reads private examples from: `SiloArrays`, or graph data
    (`pandemic.engine.GraphSource`, which also has ``start_round(round)``)."""

    n: np.ndarray  # (K,) examples (or persons) per silo

    def gather(self, silos: np.ndarray, idx: np.ndarray) -> Batch:
        """Rows idx[j] (k, M) of silo silos[j] (k,): X, y, ‖x‖² (or None)."""
        ...


@dataclass
class SiloArrays:
    """Training examples of K silos padded to a common length.

    `rows` (K, n_max, d + 3) float32 packs each tabular example as [x, 1, ‖x‖², y] so one
    gather fetches all of them (batch gathering is the memory-bound part of training), and
    [x, 1] is a GLM's whole per-example gradient direction (`training.fused`);
    image-like data (X of rank > 2 per silo) is kept as X (K, n_max, ...) and y.
    Gradient precision in float32 far exceeds what DP noise leaves; parameters stay float64.
    """

    n: np.ndarray                     # (K,) true sizes
    rows: np.ndarray | None = None    # tabular packing
    X: np.ndarray | None = None       # other data
    y: np.ndarray | None = None
    _tail: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def stack(cls, Xs: list[np.ndarray], ys: list[np.ndarray]) -> SiloArrays:
        n = np.array([len(y) for y in ys])
        K, m = len(Xs), int(n.max())
        if Xs[0].ndim == 2:
            d = Xs[0].shape[1]
            rows = np.zeros((K, m, d + 3), dtype=np.float32)
            rows[:, :, d] = 1.0
            for k, (Xk, yk) in enumerate(zip(Xs, ys)):
                rows[k, : n[k], :d] = Xk
                rows[k, : n[k], d + 1] = np.einsum("nd,nd->n", Xk, Xk)
                rows[k, : n[k], d + 2] = yk
            return cls(n, rows=rows)
        X = np.zeros((K, m) + Xs[0].shape[1:], dtype=np.float32)
        y = np.zeros((K, m))
        for k, (Xk, yk) in enumerate(zip(Xs, ys)):
            X[k, : n[k]], y[k, : n[k]] = Xk, yk
        return cls(n, X=X, y=y)

    def take(self, silos: np.ndarray) -> SiloArrays:
        """The silos `silos` (k,) alone, silo silos[j] as row j (a copy; private tuning's
        pseudo-silos, one per trial).

        Parameters
        ----------
        silos : numpy.ndarray
            Shape (k,), integer indices into the K silos (repeats allowed).

        Returns
        -------
        SiloArrays
            k silos.
        """
        return SiloArrays(self.n[silos], rows=None if self.rows is None else self.rows[silos],
                          X=None if self.X is None else self.X[silos],
                          y=None if self.y is None else self.y[silos])

    def gather(self, silos: np.ndarray, idx: np.ndarray) -> Batch:
        """Rows idx[j] of silo silos[j] → X (k, M, ...), y (k, M), ‖x‖² (k, M) or None.
        Every read of private training data goes through here."""
        rows, data_X, data_y = self.rows, self.X, self.y
        if rows is not None:
            b = self.gather_rows(silos[:, None] * rows.shape[1] + idx)
            return b[..., :-3], b[..., -1], b[..., -2]
        if data_X is None or data_y is None:
            raise ValueError("SiloArrays holds neither packed rows nor X and y")
        return self._gather_other(silos, idx, data_X, data_y)

    def gather_rows(self, flat: np.ndarray, first: int = 0) -> np.ndarray:
        """The packed rows [x, 1, ‖x‖², y] from column `first` on, at flat positions
        silo·n_max + index: the one read of tabular training data (`gather`, and the
        fused GLM pass, `training.fused`, which reads a round's ‖x‖², y ahead).

        Parameters
        ----------
        flat : numpy.ndarray
            Integer positions into the (K·n_max) packed rows, any shape.
        first : int, default 0
            The first column read (negative: from the end).

        Returns
        -------
        numpy.ndarray
            Shape flat.shape + (columns,), a fresh float32 array.
        """
        rows = self.rows
        if rows is None:
            raise ValueError("SiloArrays holds no packed tabular rows")
        if first == 0:
            b = rows.reshape(-1, rows.shape[2]).take(np.ravel(flat), axis=0)
        else:  # a contiguous copy of the last columns: a narrow take is a fast one
            tail = self._tail.get(first)
            if tail is None:
                tail = self._tail[first] = np.ascontiguousarray(
                    rows.reshape(-1, rows.shape[2])[:, first:])
            b = tail.take(np.ravel(flat), axis=0)
        return b.reshape(np.shape(flat) + b.shape[1:])

    @staticmethod
    def _gather_other(silos: np.ndarray, idx: np.ndarray, data_X: np.ndarray,
                      data_y: np.ndarray) -> Batch:
        """`gather` for unpacked (image-like) data."""
        flat = (silos[:, None] * data_X.shape[1] + idx).ravel()
        X = data_X.reshape((-1,) + data_X.shape[2:]).take(flat, axis=0)
        y = data_y.ravel().take(flat).reshape(idx.shape)
        return X.reshape(idx.shape + data_X.shape[2:]), y, None


__all__ = ["Batch", "SiloArrays", "SiloSource"]

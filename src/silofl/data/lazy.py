"""Silos larger than memory: a silo's training rows on disk, read only where sampled.

`load_table_lazy` reads a Parquet dataset (a file, or a directory of files) in record
batches, encodes each batch by the declared schema (`silofl.data.encoding.encode_table`,
the same encoding as `silofl.data.tabular`) and appends each silo's rows, float32, to a
file of its own in a cache directory. A silo's training part is then a `LazyRows`: the
file, with ``n`` rows and ``take(indices) -> numpy.ndarray``; only the rows a
Poisson batch names are read, by positioned reads of their bytes (`RowFile`), and
materialised (`LazySource.gather`, the trainer's data source), so the resident memory is
bounded by a batch, not a silo; the OS page cache keeps the file warm if it can. The
test part is materialised (keep `test_fraction` small for very large silos).

Preprocessing streams (`silofl.data.lazy_stats`): statistics are summed over chunks of the
training rows (`LazyRows.raw_chunks`), the same sums and charges as in memory, and the result
is a `Transform` (clip to declared bounds, fill, (x − center) / scale) that `take` applies
to the sampled rows — the in-memory arithmetic, row by row.

Layout: with a silo column, `path` is one Parquet file or a directory of them; without
one, `path` is a directory holding one Parquet file ``<silo>.parquet`` (or a directory
``<silo>/`` of files) per silo.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import numpy as np

from silofl.data.federation import Silo, split_indices
from silofl.data.raw import RawFederation
from silofl.data.schema import SchemaLike, as_schema
from silofl.errors import ConfigError, DataError

if TYPE_CHECKING:
    from silofl.data.encoding import EncodedTable
    from silofl.data.schema import Schema

__all__ = ["LazyRows", "LazySource", "Transform", "RowFile", "load_table_lazy", "is_lazy",
           "lazy_digest"]

#: rows per record batch read from the Parquet dataset (bounds the encoding's memory)
BATCH_ROWS = 65_536
#: training rows per chunk of a streaming statistic (a few float64 copies of one chunk)
CHUNK_ROWS = 32_768

_FNV_PRIME = np.uint64(1099511628211)
_FNV_BASIS = np.uint64(14695981039346656037)


def is_lazy(X: object) -> bool:
    """Whether a silo's X is a `LazyRows` (rows on disk) rather than an array."""
    return isinstance(X, LazyRows)


class RowFile:
    """One silo's encoded rows, float32 (n, d) in a file, read by positioned reads.

    Only the rows asked for enter the process: a sampled row is one ``pread`` of its
    4·d bytes (a memory mapping would map whole large folios of the page cache per row:
    ~5× slower and its resident pages need dropping); a run of nearly consecutive rows (a
    streaming statistic's chunk) is one read.

    Parameters
    ----------
    path : Path
        The file (n·d float32 values, row after row).
    n, d : int
        Rows and encoded features.
    digest : str
        An order-free digest of the rows and labels (`lazy_digest`).
    """

    def __init__(self, path: Path, n: int, d: int, digest: str = ""):
        self.path, self.n, self.d, self.digest = Path(path), int(n), int(d), digest
        self._fd: int | None = None
        self.tmp: object = None  # the temporary folder holding the file, kept alive with it

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
            weakref.finalize(self, os.close, self._fd)
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead
        return self._fd

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """Rows `idx` (m,) of the file as float64 (m, d), in the order given."""
        idx = np.asarray(idx, dtype=np.int64)
        if not len(idx) or not self.d:
            return np.zeros((len(idx), self.d))
        fd, rb = self._open(), 4 * self.d
        lo, hi = int(idx.min()), int(idx.max()) + 1
        if len(idx) >= 64 and hi - lo <= 4 * len(idx):  # nearly consecutive: one read
            block = np.frombuffer(os.pread(fd, (hi - lo) * rb, lo * rb), np.float32)
            return block.reshape(hi - lo, self.d)[idx - lo].astype(np.float64)
        raw = b"".join([os.pread(fd, rb, i * rb) for i in idx.tolist()])
        return np.frombuffer(raw, np.float32).reshape(len(idx), self.d).astype(np.float64)


@dataclass(frozen=True)
class Transform:
    """Preprocessing of raw encoded rows, per column (d,): clip to [lo, hi], replace NaN by
    `fill`, then (x − center) / scale — `apply_preprocessing`'s steps in its order."""

    lo: np.ndarray
    hi: np.ndarray
    fill: np.ndarray
    center: np.ndarray
    scale: np.ndarray

    @classmethod
    def identity(cls, d: int) -> Transform:
        """No clipping, no fill (NaN stays), center 0, scale 1."""
        return cls(np.full(d, -np.inf), np.full(d, np.inf), np.full(d, np.nan), np.zeros(d),
                   np.ones(d))

    def apply(self, X: np.ndarray) -> np.ndarray:
        """Transform X (m, d) float64 in place and return it."""
        np.clip(X, self.lo, self.hi, out=X)
        nan = np.isnan(X)
        if nan.any():
            X[nan] = np.broadcast_to(self.fill, X.shape)[nan]
        X -= self.center
        X /= self.scale
        return X


class LazyRows:
    """A silo's training features on disk: `n` rows of `d` features, read by `take`.

    It stands where a ``(n, d)`` array stands in a `Silo` (``shape``, ``ndim``,
    ``len``); ``numpy.asarray`` materialises it (counted in `materialised`), which the
    training path never does.

    Parameters
    ----------
    file : RowFile
        The silo's rows (training and test).
    rows : numpy.ndarray
        (n,) int64, the file row of each training row, in training order.
    transform : Transform, optional
        Applied to every row read (default: none).
    """

    ndim = 2
    dtype = np.dtype(np.float64)
    #: how many times any LazyRows was turned into a full array
    materialised = 0

    def __init__(self, file: RowFile, rows: np.ndarray, transform: Transform | None = None):
        self.file, self.rows = file, np.asarray(rows, dtype=np.int64)
        self.transform = transform or Transform.identity(file.d)

    @property
    def n(self) -> int:
        return int(len(self.rows))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.file.d)

    def __len__(self) -> int:
        return self.n

    def take(self, indices: np.ndarray) -> np.ndarray:
        """Training rows `indices` (m,), preprocessed: float64 (m, d)."""
        return self.transform.apply(self.file.rows(self.rows[np.asarray(indices)]))

    def raw_chunks(self, size: int | None = None) -> Iterator[np.ndarray]:
        """The raw (encoded, unpreprocessed) training rows, float64 (≤ size, d) at a time,
        in file order (sums do not depend on the order)."""
        order = np.sort(self.rows)
        size = size or CHUNK_ROWS
        for a in range(0, len(order), size):
            yield self.file.rows(order[a:a + size])

    def __getitem__(self, key: Any) -> Any:
        """``X[rows]`` (an index array, mask or slice): the same silo's rows `rows`, still
        on disk (a split of the training part, e.g. a sweep's validation rows); an integer
        gives that row, (d,) float64."""
        sub = self.rows[key]
        if np.ndim(sub) == 0:
            return self.take(np.array([key]))[0]
        return LazyRows(self.file, sub, self.transform)

    def with_transform(self, transform: Transform) -> LazyRows:
        """The same rows under another preprocessing."""
        return LazyRows(self.file, self.rows, transform)

    def __array__(self, dtype: Any = None, copy: object = None) -> np.ndarray:
        LazyRows.materialised += 1
        X = self.take(np.arange(self.n))
        return X if dtype is None else X.astype(dtype)


class LazySource:
    """The trainer's data source over lazy silos (`silofl.training.trainer.SiloSource`):
    ``n`` (K,) and ``gather(silos, idx)``, reading only the indexed rows.

    Parameters
    ----------
    X : list of LazyRows
        Each silo's training features.
    y : list of numpy.ndarray
        Each silo's training labels, (n_k,).
    """

    def __init__(self, X: Sequence[LazyRows], y: Sequence[np.ndarray]):
        self.X, self.y = list(X), [np.asarray(v) for v in y]
        self.n = np.array([x.n for x in self.X], dtype=np.int64)
        self.d = self.X[0].file.d if self.X else 0

    def gather(self, silos: np.ndarray, idx: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows idx[j] (k, M) of silo silos[j] → X (k, M, d), y (k, M), ‖x‖² (k, M), all
        float32 as `SiloArrays.gather` returns them. Every read of private rows of a lazy
        silo goes through here."""
        k, m = idx.shape
        X = np.empty((k, m, self.d), np.float32)
        y = np.empty((k, m), np.float32)
        sq = np.empty((k, m), np.float32)
        for j, s in enumerate(np.asarray(silos)):
            rows = self.X[s].take(idx[j])
            X[j] = rows
            sq[j] = np.einsum("nd,nd->n", rows, rows)
            y[j] = self.y[s][idx[j]]
        return X, y, sq


def row_hashes(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(n,) uint64 FNV-1a hashes of rows [x (float32), y (float64)]: one per row, so that a
    sorted list of them digests a silo's rows in no particular order."""
    words = np.ascontiguousarray(X, np.float32).view(np.uint32)
    ybits = np.ascontiguousarray(y, np.float64).view(np.uint32).reshape(len(y), 2)
    h = np.full(len(y), _FNV_BASIS, np.uint64)
    with np.errstate(over="ignore"):
        for w in (*words.T, *ybits.T):
            h ^= w.astype(np.uint64)
            h *= _FNV_PRIME
    return h


def lazy_digest(hashes: np.ndarray, d: int) -> str:
    """The order-free digest of a silo's rows from their `row_hashes`."""
    h = hashlib.sha256(f"lazy:{d}".encode())
    h.update(np.sort(hashes).tobytes())
    return h.hexdigest()[:16]


# --- reading a Parquet dataset into row files ----------------------------------------------

def _datasets(path: Path, per_silo: bool) -> list[tuple[str | None, Path]]:
    """(silo name or None, Parquet file or directory) to read, in order."""
    if not path.exists():
        raise DataError(f"Parquet dataset not found: {str(path)!r}; check [data] path")
    if not per_silo:
        return [(None, path)]
    if not path.is_dir():
        raise DataError(f"{str(path)!r} is a file, but without [data] silo_column a lazy "
                        "table is a directory with one <silo>.parquet file (or <silo>/ "
                        "directory) per silo; set silo_column or point path at such a "
                        "directory")
    found: list[tuple[str | None, Path]] = [(p.name[: -len(".parquet")] if p.is_file() else p.name, p)
             for p in sorted(path.iterdir())
             if not p.name.startswith((".", "_"))  # _SUCCESS, .crc: writers' own files
             and ((p.is_file() and p.name.endswith(".parquet")) or p.is_dir())]
    if not found:
        raise DataError(f"{str(path)!r} holds no <silo>.parquet file or <silo>/ directory")
    return found


def _batches(path: Path) -> Iterator[Any]:
    """Record batches of a Parquet file or directory, `BATCH_ROWS` rows at a time."""
    import pyarrow.dataset as pds
    try:
        dataset = pds.dataset(str(path), format="parquet")
        yield from dataset.to_batches(batch_size=BATCH_ROWS, batch_readahead=1,
                                      fragment_readahead=1)
    except (OSError, ValueError) as e:
        text = path.name.lower().endswith((".csv", ".csv.gz", ".tsv", ".txt"))
        hint = ("[data] lazy = true reads Parquet only: convert the table (e.g. "
                "pandas.read_csv(...).to_parquet(...)) or set lazy = false" if text
                else "check it is Parquet")
        raise DataError(f"cannot read the Parquet dataset {str(path)!r}: "
                        f"{type(e).__name__}; {hint}") from None


class _Writer:
    """Appends each silo's encoded rows to its own file; keeps its labels and row hashes."""

    def __init__(self, folder: Path, names: list[str]):
        self.folder, self.names = folder, names
        self.files: dict[str, IO[bytes]] = {}
        self.y: dict[str, list[np.ndarray]] = {}
        self.h: dict[str, list[np.ndarray]] = {}
        self.d = -1

    def add(self, silo: str, X: np.ndarray, y: np.ndarray) -> None:
        if silo not in self.files:
            self.files[silo] = open(self.folder / f"silo{len(self.files)}.f32", "wb")
            self.y[silo], self.h[silo] = [], []
        X32 = np.ascontiguousarray(X, np.float32)
        self.files[silo].write(X32.data)
        self.y[silo].append(y)
        self.h[silo].append(row_hashes(X32, y))
        self.d = X.shape[1]

    def close(self) -> None:
        for fh in self.files.values():
            fh.close()


def _check_chunk(X: np.ndarray, silos: np.ndarray, names: list[str],
                 nullable: np.ndarray) -> None:
    """What `RawFederation.validate` checks in memory, batch by batch: NaN only in nullable
    columns, nothing infinite."""
    bad = np.isinf(X).any(axis=0) | (np.isnan(X).any(axis=0) & ~nullable)
    if bad.any():
        j = int(np.argmax(bad))
        rows = np.isinf(X[:, j]) | (np.isnan(X[:, j]) & ~nullable[j])
        where = sorted(set(silos[rows].tolist()))[:3]
        what = "infinite" if np.isinf(X[:, j]).any() else "missing but not nullable"
        raise DataError(f"column {names[j]!r} has {int(rows.sum())} value(s) that are {what} "
                        f"(silo(s) {', '.join(map(repr, where))}); fix the rows, or declare "
                        "bounds (or nullable = true) in the schema")


def _encode_all(sources: list[tuple[str | None, Path]], writer: _Writer, label_column: str,
                silo_column: str | None, schema: Schema, kw: dict
                ) -> tuple[EncodedTable, dict[str, int]]:
    """Encode every batch of every source into `writer`; returns (encoding, dropped)."""
    from silofl.data.encoding import encode_table
    enc: EncodedTable | None = None
    dropped: dict[str, int] = {}
    for silo, src in sources:
        for batch in _batches(src):
            df = batch.to_pandas()
            if not len(df):
                continue
            enc = encode_table(df, label_column, silo_column=silo_column, schema=schema, **kw)
            for key, v in enc.dropped.items():
                dropped[key] = dropped.get(key, 0) + v
            names = np.full(len(enc.y), silo, dtype=object) if enc.silos is None or \
                silo is not None else enc.silos
            nullable = np.zeros(enc.X.shape[1], bool)
            for j, spec in enc.specs.items():
                nullable[j] = spec.nullable
            _check_chunk(enc.X, names, enc.schema.feature_names, nullable)
            if silo is not None:  # one silo per dataset: no selection (a copy) needed
                writer.add(silo, enc.X, enc.y)
                continue
            codes, order = _factorize(names)
            for c, name in enumerate(order):
                sel = codes == c
                writer.add(name, enc.X[sel], enc.y[sel])
    if enc is None:
        raise DataError("the Parquet dataset holds no rows")
    return enc, dropped


def _factorize(names: np.ndarray) -> tuple[np.ndarray, list[str]]:
    import pandas as pd
    codes, order = pd.factorize(pd.Series(names, dtype=object), sort=False)
    return codes, [str(v) for v in order]


def load_table_lazy(path: str | Path, silo_column: str, label_column: str, *,
                    schema: SchemaLike | None, task: str = "auto",
                    features: Sequence[str] | None = None, test_fraction: float = 0.2,
                    seed: int = 0, missing: str = "impute",
                    cache_dir: str | Path | None = None) -> RawFederation:
    """Read a Parquet dataset batch by batch into a `RawFederation` of lazy silos.

    Parameters
    ----------
    path : str or Path
        A Parquet file or directory with a silo column, or (``silo_column=""``) a directory
        of one ``<silo>.parquet`` file or ``<silo>/`` directory per silo.
    silo_column : str
        The column naming each row's silo ("" for one dataset per silo).
    label_column : str
        The target column.
    schema : Schema, dict or path
        The declared schema (required: the encoding may read nothing from the data).
    task, features, missing
        As `silofl.data.tabular.load_table_raw`.
    test_fraction : float, default 0.2
        Share of each silo's rows held out (materialised in memory: keep it small).
    seed : int, default 0
        Seed of the train/test split: the same split as `load_table_raw`.
    cache_dir : str or Path, optional
        Where the row files go (default: a temporary directory, removed with the silos).

    Returns
    -------
    RawFederation
        Silos in order of first appearance; ``X_train`` a `LazyRows` (n_k, d), ``X_test``
        float64 (m_k, d) with NaN where a nullable value is missing.

    Raises
    ------
    DataError
        Unreadable data or values the schema does not allow (named by column and silo).
    ConfigError
        No schema.
    """
    if schema is None:
        raise ConfigError("a lazy (larger than memory) table needs a declared schema "
                          "([data] schema): encoding it without one would read levels and "
                          "kinds from the pooled data")
    schema = as_schema(schema)
    folder, tmp = _cache_folder(cache_dir)
    sources = _datasets(Path(path), per_silo=not silo_column)
    writer = _Writer(folder, [])
    try:
        enc, dropped = _encode_all(sources, writer, label_column, silo_column or None, schema,
                                   dict(task=task, features=features, missing=missing,
                                        name=Path(path).name.split(".")[0]))
    finally:
        writer.close()
    empty = [name for name, _ in sources if name is not None and name not in writer.files]
    if empty:
        raise DataError(f"silo dataset(s) {', '.join(map(repr, empty[:5]))} in {str(path)!r} "
                        "hold no rows; remove them or add the silos' rows")
    rng = np.random.default_rng(seed)  # the in-memory split: one generator, silo by silo
    silos = []
    for i, name in enumerate(writer.files):
        y = np.concatenate(writer.y[name])
        file = RowFile(folder / f"silo{i}.f32", len(y), writer.d,
                       lazy_digest(np.concatenate(writer.h[name]), writer.d))
        tr, te = split_indices(len(y), test_fraction, rng)
        lazy = cast(np.ndarray, LazyRows(file, tr))  # stands where an (n, d) array stands
        silos.append(Silo(name, lazy, y[tr], file.rows(te), y[te]))
    for s in silos:  # the temporary folder goes when the last silo's rows do
        cast(LazyRows, s.X_train).file.tmp = tmp
    meta = {"silo_column": silo_column, "label_column": label_column, "missing": missing,
            "dropped": dropped, "seed": seed, "test_fraction": test_fraction,
            "schema": enc.schema.source, "lazy": str(folder)}
    sch = enc.schema
    if sch.label.kind != "regression":
        meta["classes"] = list(sch.label.classes)
    return RawFederation(silos, sch.feature_names, sch.label.kind,
                         num_classes=len(sch.label.classes), specs=enc.specs,
                         name=Path(path).name.split(".")[0], meta=meta)


def _cache_folder(cache_dir: str | Path | None
                  ) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    if cache_dir:
        folder = Path(cache_dir)
        folder.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="silofl-lazy-", dir=folder)), None
    tmp = tempfile.TemporaryDirectory(prefix="silofl-lazy-")
    return Path(tmp.name), tmp

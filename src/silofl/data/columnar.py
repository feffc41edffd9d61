"""The core's streaming reader for declared tables: large CSV/Parquet files read in chunks
into compact NumPy arrays (graph data: contact networks, schedules, long state tables).

A table is declared as a `TableSpec` of `silofl.data.schema.ColumnSpec`s that carry a
storage `dtype` and one of the storage kinds:

* ``"id"``: integer identifier, held in `dtype` (int32), int64 when ids do not fit;
* ``"int"``: integer in `dtype`, values outside its range refused;
* ``"float"``: number, held as float32;
* ``"flag"``: 0/1 or true/false in the file, uint8 in memory;
* ``"state"``: one of the column's `levels` (letters) in the file, int8 codes in memory.

CSV text is parsed ~16 MB at a time with pyarrow's multi-threaded parser, Parquet files in
batches; errors name the file, the line and the column, never a record's value. A domain
(e.g. `silofl.pandemic.readers`) declares its tables and assembles them; this module knows
no domain.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from silofl.data.ids import stable_argsort
from silofl.data.schema import ColumnSpec
from silofl.errors import DataError

__all__ = ["TableSpec", "ColumnarReader", "read_columns", "optional_present", "row_where",
           "is_parquet", "FILE_EXTENSIONS", "STORAGE_KINDS", "unique_sorted_ids", "check_known",
           "check_codes"]

#: Uncompressed CSV bytes handed to the parser at a time.
CSV_CHUNK_BYTES = 16 << 20
#: Rows per batch when streaming parquet files.
PARQUET_BATCH_ROWS = 4_000_000
#: File extensions a declared table may be stored under, in the order they are looked for.
FILE_EXTENSIONS: tuple[str, ...] = (".csv", ".csv.gz", ".parquet")
#: Storage kinds of a declared table's columns (see the module docstring).
STORAGE_KINDS: tuple[str, ...] = ("id", "int", "float", "flag", "state")

_HEADER_PROBE_BYTES = 1 << 16


@dataclass(frozen=True)
class TableSpec:
    """One declared table: file stem, required columns and optional extras."""

    key: str
    stem: str
    columns: tuple[ColumnSpec, ...]
    optional: tuple[ColumnSpec, ...] = ()
    description: str = ""
    extra_columns_allowed: bool = True
    unique_key: str | None = None

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def optional_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.optional)

    def column(self, name: str) -> ColumnSpec:
        for c in self.columns + self.optional:
            if c.name == name:
                return c
        raise KeyError(f"table {self.key!r} has no column {name!r}")

    def filenames(self) -> tuple[str, ...]:
        """Every file name this table may be stored under."""
        return tuple(self.stem + ext for ext in FILE_EXTENSIONS)

    @property
    def dtypes(self) -> dict[str, np.dtype]:
        return {c.name: c.np_dtype for c in self.columns + self.optional}


def is_parquet(path: Path) -> bool:
    """Whether `path` names a Parquet file (by its extension)."""
    return path.name.endswith(".parquet")


def row_where(path: Path, row: int) -> str:
    """Human location of 0-based data row ``row`` in ``path``."""
    if is_parquet(path):
        return f"{path.name} row {row + 1}"
    return f"{path.name} line {row + 2}"


def _arrow_read_type(col: ColumnSpec) -> pa.DataType:
    if col.kind == "id":
        return pa.int64()  # ids may exceed int32; narrowed after reading
    if col.kind == "int":
        return pa.from_numpy_dtype(col.np_dtype)
    if col.kind == "float":
        return pa.float64()
    if col.kind == "flag":
        return pa.bool_()
    if col.kind == "state":
        return pa.string()
    raise ValueError(col.kind)


_INT_RE = r"^\s*[-+]?[0-9]+\s*$"
_FLOAT_RE = (
    r"^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$"
    r"|^\s*[-+]?(nan|NaN|inf|Inf)\s*$"
)
_FLAG_VALUES = ["0", "1", "true", "false", "True", "False", "TRUE", "FALSE"]


class ColumnarReader:
    """Streams selected columns of one table file (CSV, gzip CSV or Parquet) as dicts of
    NumPy arrays in each column's declared compact dtype; every failure is a `DataError`
    naming the file, the line (or row) and the column, never the value."""

    def __init__(self, path: Path, spec: TableSpec, columns: list[str]):
        self.path = path
        self.spec = spec
        self.columns = columns
        self.colspecs = [spec.column(c) for c in columns]
        self._csv_stream: Any = None  # the open CSV stream (pyarrow NativeFile)
        self._pending = b""
        if is_parquet(path):
            try:
                self._pf = pq.ParquetFile(path)
            except Exception as exc:  # noqa: BLE001 - any pyarrow failure means unreadable
                raise DataError(
                    f"cannot read parquet file {path}: {exc}; re-export the table"
                ) from exc
            self.names = list(self._pf.schema_arrow.names)
        else:
            self.names = self._read_csv_header()
        missing = [c for c in spec.required if c not in self.names and c in columns]
        if missing:
            raise DataError(
                f"{path.name} (table {spec.key!r}) lacks required column(s) {', '.join(missing)}; "
                f"found columns: {', '.join(self.names) or '(none)'}. Add the missing column(s) "
                f"— the table needs {', '.join(spec.required)}"
            )
        dup = sorted({n for n in self.names if self.names.count(n) > 1 and n in columns})
        if dup:
            raise DataError(
                f"{path.name}: column(s) {', '.join(dup)} appear more than once in the header; "
                "rename or drop the duplicates"
            )

    # -- CSV -------------------------------------------------------------------
    def _read_csv_header(self) -> list[str]:
        try:
            self._csv_stream = pa.input_stream(str(self.path), compression="detect")
            first = self._csv_stream.read(_HEADER_PROBE_BYTES)
        except Exception as exc:  # noqa: BLE001
            raise DataError(
                f"cannot read {self.path}: {exc}; check the file is a (gzip-compressed) CSV"
            ) from exc
        nl = first.find(b"\n")
        head = first if nl < 0 else first[:nl]
        self._pending = b"" if nl < 0 else first[nl + 1:]
        self._eof_after_pending = len(first) < _HEADER_PROBE_BYTES
        try:
            text = head.decode("utf-8-sig").rstrip("\r")
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{self.path.name}: header line is not UTF-8 text; is this a CSV file?"
            ) from exc
        if not text.strip():
            raise DataError(f"{self.path.name} is empty: expected a header line with columns "
                            f"{', '.join(self.spec.required)}")
        return [n.strip().strip('"').strip() for n in text.split(",")]

    def _csv_pieces(self) -> Iterator[memoryview]:
        """Consecutive runs of whole CSV lines (~CSV_CHUNK_BYTES each), without copying.

        Each piece is a view into a reused buffer: parse it before asking for the next.
        """
        stream = self._csv_stream
        pending = self._pending
        eof = self._eof_after_pending
        buf = bytearray(CSV_CHUNK_BYTES + len(pending))
        try:
            while True:
                n_p = len(pending)
                if len(buf) < n_p + CSV_CHUNK_BYTES:
                    buf = bytearray(n_p + CSV_CHUNK_BYTES)
                buf[:n_p] = pending
                n_read = 0 if eof else stream.readinto(memoryview(buf)[n_p:n_p + CSV_CHUNK_BYTES])
                eof = eof or n_read == 0
                total = n_p + n_read
                view = memoryview(buf)[:total]
                if eof:
                    if total:
                        yield view
                    return
                cut = buf.rfind(b"\n", 0, total)
                if cut < 0:  # a line longer than the chunk: keep reading
                    pending = bytes(view)
                    continue
                pending = bytes(view[cut + 1:])
                yield view[: cut + 1]
        finally:
            stream.close()

    def _parse_piece(self, piece: memoryview, row0: int) -> pa.Table:
        read_opts = pacsv.ReadOptions(column_names=self.names, use_threads=True, block_size=1 << 22)
        conv = pacsv.ConvertOptions(
            include_columns=self.columns,
            column_types={c.name: _arrow_read_type(c) for c in self.colspecs},
            strings_can_be_null=False,
        )
        try:
            return pacsv.read_csv(pa.py_buffer(piece), read_options=read_opts, convert_options=conv)
        except pa.ArrowInvalid as exc:
            self._diagnose_csv(piece, row0, exc)
            raise  # pragma: no cover - _diagnose_csv always raises

    def _diagnose_csv(self, piece: memoryview, row0: int, exc: Exception) -> DataError:
        """Turn a pyarrow conversion failure into a DataError naming line and value."""
        try:
            raw = pacsv.read_csv(
                pa.py_buffer(piece),
                read_options=pacsv.ReadOptions(column_names=self.names, use_threads=True),
                convert_options=pacsv.ConvertOptions(
                    include_columns=self.columns,
                    column_types={c: pa.string() for c in self.columns},
                ),
            )
        except pa.ArrowInvalid:  # pyarrow's message quotes the row: not shown
            raise DataError(
                f"{self.path.name}: malformed CSV in the lines after line {row0 + 1}; "
                f"every line needs {len(self.names)} comma-separated fields"
            ) from None
        for col in self.colspecs:
            arr = raw.column(col.name)
            if col.kind in ("id", "int"):
                bad = pc.invert(pc.match_substring_regex(arr, _INT_RE))
                what = "an integer"
                if col.kind == "int" and not pc.any(pc.fill_null(bad, False)).as_py():
                    info = np.iinfo(col.np_dtype)
                    num = pc.cast(pc.utf8_trim_whitespace(arr), pa.float64())
                    bad = pc.or_(pc.less(num, info.min), pc.greater(num, info.max))
                    what = f"an integer in {info.min}..{info.max}"
            elif col.kind == "float":
                bad = pc.invert(pc.match_substring_regex(arr, _FLOAT_RE))
                what = "a number"
            elif col.kind == "flag":
                bad = pc.invert(pc.is_in(arr, value_set=pa.array(_FLAG_VALUES)))
                what = "0 or 1"
            else:
                continue
            bad = pc.fill_null(bad, False)
            idx = np.flatnonzero(bad.to_numpy(zero_copy_only=False))
            if idx.size:
                i = int(idx[0])
                raise DataError(
                    f"{row_where(self.path, row0 + i)}: column {col.name!r} holds a value that is "
                    f"not {what}; fix or drop that row ({idx.size} such value(s) nearby)"
                ) from None
        raise DataError(f"{self.path.name}: cannot parse the lines after line {row0 + 1} "
                        f"({type(exc).__name__}); check the file is a CSV of the table") from None

    # -- conversion ------------------------------------------------------------
    def _convert(self, table: pa.Table, row0: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for col in self.colspecs:
            arr = table.column(col.name)
            if arr.null_count:
                nulls = np.flatnonzero(pc.is_null(arr).to_numpy(zero_copy_only=False))
                raise DataError(
                    f"{row_where(self.path, row0 + int(nulls[0]))}: column {col.name!r} is empty "
                    f"({arr.null_count} empty value(s) in this part of the file); "
                    "every row needs a value"
                )
            out[col.name] = self._to_numpy(arr, col, row0)
        return out

    def _to_numpy(self, arr: Any, col: ColumnSpec, row0: int) -> np.ndarray:
        if isinstance(arr, pa.ChunkedArray) and arr.num_chunks != 1:
            if pa.types.is_dictionary(arr.type):
                arr = arr.cast(arr.type.value_type)
            arr = arr.combine_chunks()
        elif isinstance(arr, pa.ChunkedArray):
            arr = arr.chunk(0)
        if col.kind == "state":
            if pa.types.is_dictionary(arr.type):
                arr = arr.cast(pa.string())
            elif not pa.types.is_string(arr.type):
                arr = arr.cast(pa.string())
            idx = pc.index_in(arr, value_set=pa.array(list(col.levels), pa.string()))
            if idx.null_count:
                i = int(np.flatnonzero(pc.is_null(idx).to_numpy(zero_copy_only=False))[0])
                raise DataError(
                    f"{row_where(self.path, row0 + i)}: column {col.name!r} holds an invalid "
                    f"state; health states must be one of {', '.join(col.levels)} — fix "
                    "the letter"
                )
            return idx.to_numpy(zero_copy_only=False).astype(np.int8)
        if col.kind == "flag":
            if pa.types.is_boolean(arr.type):
                return arr.to_numpy(zero_copy_only=False).astype(np.uint8)
            vals = arr.to_numpy(zero_copy_only=False)
            bad = (vals != 0) & (vals != 1)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise DataError(
                    f"{row_where(self.path, row0 + i)}: flag column {col.name!r} holds a "
                    "value other than 0 or 1; use 0 or 1"
                )
            return vals.astype(np.uint8)
        if col.kind == "float":
            return arr.to_numpy(zero_copy_only=False).astype(np.float32)
        vals = arr.to_numpy(zero_copy_only=False)
        if vals.dtype.kind == "f":
            if not np.all(np.isfinite(vals)) or not np.all(vals == np.round(vals)):
                bad = ~np.isfinite(vals) | (vals != np.round(vals))
                i = int(np.flatnonzero(bad)[0])
                raise DataError(f"{row_where(self.path, row0 + i)}: column {col.name!r} holds a "
                                "value that is not an integer; fix the value")
            vals = vals.astype(np.int64)
        if vals.dtype.kind not in "iu":
            raise DataError(
                f"{self.path.name}: column {col.name!r} has type {arr.type}, expected integers"
            )
        target = col.np_dtype
        if vals.size == 0:
            return vals.astype(target)
        info = np.iinfo(target)
        lo, hi = vals.min(), vals.max()
        if lo >= info.min and hi <= info.max:
            return vals.astype(target, copy=False)
        if col.kind == "id" and lo >= np.iinfo(np.int64).min:
            return vals.astype(np.int64, copy=False)  # ids beyond int32 stay int64
        bad = (vals < info.min) | (vals > info.max)
        i = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{row_where(self.path, row0 + i)}: column {col.name!r} holds a value outside "
            f"{info.min}..{info.max} ({target}); fix the value"
        )

    # -- public ------------------------------------------------------------------
    def batches(self) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """Yield ``(first_row, {column: array})`` for consecutive row ranges."""
        row0 = 0
        if is_parquet(self.path):
            try:
                batches = self._pf.iter_batches(
                    batch_size=PARQUET_BATCH_ROWS, columns=self.columns
                )
                for batch in batches:
                    tbl = pa.Table.from_batches([batch])
                    yield row0, self._convert(tbl, row0)
                    row0 += batch.num_rows
            except pa.ArrowException as exc:  # its message may quote values: not shown
                raise DataError(f"cannot read parquet file {self.path} "
                                f"({type(exc).__name__}); re-export the table") from None
            return
        for piece in self._csv_pieces():
            tbl = self._parse_piece(piece, row0)
            yield row0, self._convert(tbl, row0)
            row0 += tbl.num_rows

    def read_all(self) -> dict[str, np.ndarray]:
        parts: dict[str, list[np.ndarray]] = {c: [] for c in self.columns}
        for _, cols in self.batches():
            for c, a in cols.items():
                parts[c].append(a)
        out = {}
        for c in self.columns:
            lst = parts[c]
            if not lst:
                out[c] = np.empty(0, dtype=self.spec.column(c).np_dtype)
            elif len(lst) == 1:
                out[c] = lst[0]
            else:
                dt = np.result_type(*lst)
                out[c] = np.concatenate(lst).astype(dt, copy=False)
            parts[c] = []
        return out


def read_columns(path: Path | str, spec: TableSpec,
                 columns: list[str] | None = None) -> dict[str, np.ndarray]:
    """Read `columns` of the table file at `path` declared by `spec`.

    Parameters
    ----------
    path : the CSV, gzip CSV or Parquet file.
    spec : the table's declaration.
    columns : the columns to read; default the required ones plus the optional ones present.

    Returns
    -------
    dict of column name -> (n_rows,) array in the column's compact dtype.
    """
    path = Path(path)
    if columns is None:
        probe = ColumnarReader(path, spec, list(spec.required))
        columns = list(spec.required) + [c for c in spec.optional_names if c in probe.names]
    return ColumnarReader(path, spec, columns).read_all()


def optional_present(path: Path, spec: TableSpec) -> list[str]:
    """The optional columns of `spec` that the file at `path` holds (reads the header only)."""
    reader = ColumnarReader(path, spec, list(spec.required))
    if reader._csv_stream is not None:
        reader._csv_stream.close()
    return [c for c in spec.optional_names if c in reader.names]


# --------------------------------------------------------------------------- #
# Validation of ids and codes (any declared table)
# --------------------------------------------------------------------------- #
def unique_sorted_ids(
    ids: np.ndarray, path: Path, col: str, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """Sort ids; raise DataError naming the first duplicate.  Returns (sorted ids, order)."""
    order = stable_argsort(ids)
    s = ids[order]
    if s.size > 1:
        dup = np.flatnonzero(s[1:] == s[:-1])
        if dup.size:
            j = int(dup[0])
            a, b = sorted((int(order[j]), int(order[j + 1])))
            raise DataError(
                f"{path.name}: duplicate {col} (at {row_where(path, a)} and {row_where(path, b)}); "
                f"each {what} must appear exactly once — remove the duplicate rows "
                f"({dup.size} duplicated id(s) in total)"
            )
    return s, order


def check_known(
    idx: np.ndarray, values: np.ndarray, path: Path, row0: int, col: str, what: str, fix: str
) -> None:
    """Raise DataError at the first row of this batch whose id is unknown (``idx`` < 0, as
    `IdIndex.lookup` returns), naming file, line, column and `fix`, never the id."""
    bad = idx < 0
    if bad.any():
        where = np.flatnonzero(bad)
        i = int(where[0])
        raise DataError(
            f"{row_where(path, row0 + i)}: column {col!r} refers to an unknown {what} "
            f"({where.size} unknown reference(s) in this part of the file); {fix}"
        )


def check_codes(values: np.ndarray, allowed: Sequence[int] | np.ndarray, path: Path, row0: int,
                col: str, what: str) -> None:
    """Raise DataError at the first row of this batch whose code is not in `allowed`."""
    ok = np.isin(values, np.asarray(allowed, dtype=values.dtype))
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise DataError(
            f"{row_where(path, row0 + i)}: column {col!r} holds an invalid {what} "
            f"(allowed: {', '.join(str(a) for a in allowed)})"
        )

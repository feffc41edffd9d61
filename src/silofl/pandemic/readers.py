"""Read a pandemic-challenge dataset directory into compact in-memory arrays.

``read_dataset(dir)`` finds the seven input tables (each as ``.csv``,
``.csv.gz`` or ``.parquet``), reads only the columns the pipeline needs into
compact dtypes, validates them, and returns a :class:`PandemicData`:

* persons sorted by ``pid``; person *index* ``i`` (0..P-1) is the row of every
  per-person array and ``pids[i]`` its id (``pid_index`` maps back);
* the health states as a dense ``int8`` matrix ``states[i, day]`` with codes
  0 = S, 1 = I, 2 = R (not a long table);
* the contact network as parallel arrays (``network.src``/``network.dst`` are
  person indices);
* the small tables (households, locations, schedules) as pandas DataFrames
  with NumPy-backed numeric columns (no object dtype).

Large tables are parsed in chunks (~16 MB of CSV text at a time, with
pyarrow's multi-threaded parser), so the full challenge scale (7.7M persons,
~186M contacts, 439M outcome rows) fits in memory: the result holds about
22 bytes per contact, 57 bytes per person for the states, plus the schedules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import ClassVar, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from silofl.errors import DataError
from silofl.pandemic.schema import (
    ACTIVITY_CODES,
    ALL_TABLES,
    LOCATION_FLAGS,
    STATE_LETTERS,
    TABLES,
    TARGET,
    ActivityType,
    ColumnSpec,
    TableSpec,
    expected_filenames,
)

__all__ = [
    "IdIndex",
    "ContactNetwork",
    "PandemicData",
    "read_dataset",
    "find_table_file",
    "read_table",
]

#: Uncompressed CSV bytes handed to the parser at a time.
CSV_CHUNK_BYTES = 16 << 20
#: Rows per batch when streaming parquet files.
PARQUET_BATCH_ROWS = 4_000_000

_HEADER_PROBE_BYTES = 1 << 16
_STATE_VALUES = pa.array(list(STATE_LETTERS), pa.string())


# --------------------------------------------------------------------------- #
# Fast integer sorting helpers (np.unique / stable argsort are slow at 10^7+)
# --------------------------------------------------------------------------- #
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


def lexsort(keys) -> np.ndarray:
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
            if span <= self.DENSE_MAX_SPAN and span <= max(self.DENSE_MAX_RATIO * ids.size, 1 << 20):
                table = np.full(span, -1, dtype=np.int32)
                table[(ids.astype(np.int64) - lo)] = np.arange(ids.size, dtype=np.int32)
                self._lo, self._table = lo, table

    def __len__(self) -> int:
        return int(self.ids.size)

    def __contains__(self, value) -> bool:
        return bool(self.lookup(np.asarray([value]))[0] >= 0)

    def __getitem__(self, value) -> int:
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


# --------------------------------------------------------------------------- #
# Containers
# --------------------------------------------------------------------------- #
@dataclass
class ContactNetwork:
    """The contact table as parallel arrays, one entry per file row.

    ``src``/``dst`` are *person indices* (rows of the per-person arrays) of
    ``pid1``/``pid2``; ``lid`` is the raw location id (look it up with
    ``PandemicData.lid_index``); times are seconds; activities are
    :class:`~silofl.pandemic.schema.ActivityType` codes.  Contacts are
    undirected and repeat every day; a pair may appear in several rows.
    """

    src: np.ndarray  # (E,) int32
    dst: np.ndarray  # (E,) int32
    lid: np.ndarray  # (E,) int32 (int64 only if location ids exceed int32)
    start_time: np.ndarray  # (E,) int32
    duration: np.ndarray  # (E,) int32
    activity1: np.ndarray  # (E,) int8
    activity2: np.ndarray  # (E,) int8

    def __len__(self) -> int:
        return int(self.src.size)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, f).nbytes for f in self.__dataclass_fields__)

    def degree(self, num_persons: int) -> np.ndarray:
        """Contact rows touching each person (int64, length ``num_persons``)."""
        return np.bincount(self.src, minlength=num_persons) + np.bincount(self.dst, minlength=num_persons)


@dataclass
class PandemicData:
    """A challenge dataset in memory.  ``P`` persons, ``D`` days, ``E`` contacts.

    Per-person arrays (length ``P``, row ``i`` = person index ``i``, persons
    sorted by pid):

    ============== ======= =====================================================
    pids           int32   person id (int64 only if ids exceed int32)
    hid            int32   household id
    person_number  int16   position in household
    age            uint8   years
    sex            int8    1 male, 2 female
    hh_size        int16   size of the person's household (from households)
    home_lid       int32   rlid of the person's home activity (-1 if none)
    county         int32   county of that residence (-1 if unknown)
    region         int16   index into ``region_codes`` (-1 if unknown)
    ============== ======= =====================================================

    ``states``: (P, D) int8, codes 0 = S, 1 = I, 2 = R.  ``target``: (P,) int8
    labels (only when read with ``with_target=True``).  ``network``: a
    :class:`ContactNetwork`.  Tables: ``households`` (hid, hh_size),
    ``residence_locations`` (rlid, longitude, latitude, county),
    ``activity_locations`` (alid, longitude, latitude, six uint8 flags),
    ``assignment`` (person [index], activity_number, activity_type,
    start_time, duration, lid), each sorted by its id (assignment in file
    order).  ``pid_index`` / ``lid_index`` map ids to positions (``lid_index``
    positions are rows of :meth:`location_table`).
    """

    pids: np.ndarray
    pid_index: IdIndex
    hid: np.ndarray
    person_number: np.ndarray
    age: np.ndarray
    sex: np.ndarray
    hh_size: np.ndarray
    home_lid: np.ndarray
    county: np.ndarray
    region: np.ndarray
    region_codes: np.ndarray
    households: pd.DataFrame
    residence_locations: pd.DataFrame
    activity_locations: pd.DataFrame
    assignment: pd.DataFrame
    network: ContactNetwork
    states: np.ndarray
    target: np.ndarray | None = None
    directory: Path | None = None
    lid_index: IdIndex = field(default=None, repr=False)  # type: ignore[assignment]

    def __post_init__(self):
        if self.lid_index is None:
            lids = np.concatenate(
                [self.residence_locations["rlid"].to_numpy(), self.activity_locations["alid"].to_numpy()]
            )
            self.lid_index = IdIndex(np.sort(lids))

    # -- sizes --------------------------------------------------------------
    @property
    def num_persons(self) -> int:
        return int(self.pids.size)

    @property
    def num_days(self) -> int:
        return int(self.states.shape[1])

    @property
    def num_contacts(self) -> int:
        return len(self.network)

    @property
    def num_regions(self) -> int:
        return int(self.region_codes.size)

    # -- views ----------------------------------------------------------------
    @property
    def persons(self) -> pd.DataFrame:
        """Per-person attributes as a DataFrame (row i = person index i)."""
        return pd.DataFrame(
            {
                "pid": self.pids,
                "hid": self.hid,
                "person_number": self.person_number,
                "age": self.age,
                "sex": self.sex,
                "hh_size": self.hh_size,
                "home_lid": self.home_lid,
                "county": self.county,
                "region": self.region,
            },
            copy=False,
        )

    def region_members(self, region: int) -> np.ndarray:
        """Person indices (int64, ascending) whose ``region`` index equals ``region``."""
        return np.flatnonzero(self.region == region)

    @cached_property
    def _location_table(self) -> pd.DataFrame:
        rl, al = self.residence_locations, self.activity_locations
        lid = np.concatenate([rl["rlid"].to_numpy(), al["alid"].to_numpy()])
        order = stable_argsort(lid)
        n_rl = len(rl)
        cols: dict[str, np.ndarray] = {
            "lid": lid[order],
            "longitude": np.concatenate([rl["longitude"].to_numpy(), al["longitude"].to_numpy()])[order],
            "latitude": np.concatenate([rl["latitude"].to_numpy(), al["latitude"].to_numpy()])[order],
            "residence": (order < n_rl).astype(np.uint8),
        }
        for f in LOCATION_FLAGS:
            cols[f] = np.concatenate([np.zeros(n_rl, np.uint8), al[f].to_numpy()])[order]
        cols["county"] = np.concatenate([rl["county"].to_numpy(), np.full(len(al), -1, np.int32)])[order]
        return pd.DataFrame(cols, copy=False)

    def location_table(self) -> pd.DataFrame:
        """Residence and activity locations in one table sorted by ``lid``.

        Row ``k`` describes ``lid_index.ids[k]``; columns: lid, longitude,
        latitude (float32), residence (uint8), the six activity flags (uint8,
        0 for residences) and county (-1 for activity locations).
        """
        return self._location_table

    #: activity types reported by :meth:`activity_indicators`, in column order
    ACTIVITY_NAMES: ClassVar[tuple[str, ...]] = ("work", "shopping", "other", "school", "college", "religion")

    def activity_indicators(self) -> np.ndarray:
        """(P, 6) uint8: 1 if the person's schedule has a work, shopping, other, school,
        college or religion activity (columns in :attr:`ACTIVITY_NAMES` order)."""
        a = self.assignment
        t = a["activity_type"].to_numpy()
        p = a["person"].to_numpy()
        out = np.zeros((self.num_persons, 6), np.uint8)
        for j, code in enumerate((ActivityType.WORK, ActivityType.SHOPPING, ActivityType.OTHER,
                                  ActivityType.SCHOOL, ActivityType.COLLEGE, ActivityType.RELIGION)):
            out[p[t == int(code)], j] = 1
        return out

    def frac_out_of_home(self) -> np.ndarray:
        """(P,) float32: share of the day spent in non-home activities, clipped to [0, 1]."""
        a = self.assignment
        away = a["activity_type"].to_numpy() != int(ActivityType.HOME)
        secs = np.bincount(a["person"].to_numpy()[away], weights=a["duration"].to_numpy()[away],
                           minlength=self.num_persons)
        return np.clip(secs / 86_400.0, 0.0, 1.0).astype(np.float32)

    def feature_inputs(self, persons: np.ndarray | None = None) -> dict:
        """Keyword arguments for ``silofl.pandemic.features.build_neighbourhood_features``.

        With ``persons`` (person indices, e.g. ``region_members(r)``) everything is
        restricted to that subset, re-indexed ``0..len(persons)-1`` in the given order,
        and only contacts with both ends inside are kept (a silo's local subgraph).
        Location arrays always cover all locations (``location_ids`` = lid).
        """
        net = self.network
        P = self.num_persons
        if persons is None:
            sel = None
            src, dst = net.src, net.dst
            keep = slice(None)
        else:
            sel = np.asarray(persons, dtype=np.int64)
            remap = np.full(P, -1, np.int32)
            remap[sel] = np.arange(sel.size, dtype=np.int32)
            s, d = remap[net.src], remap[net.dst]
            keep = (s >= 0) & (d >= 0)
            src, dst = s[keep], d[keep]
        loc = self.location_table()
        pick = (lambda x: x) if sel is None else (lambda x: x[sel])
        return dict(
            src=src, dst=dst, num_nodes=P if sel is None else int(sel.size),
            start_time=net.start_time[keep], duration=net.duration[keep], lid=net.lid[keep],
            age=pick(self.age), sex=pick(self.sex), household_size=pick(self.hh_size),
            activities=pick(self.activity_indicators()), frac_out_of_home=pick(self.frac_out_of_home()),
            states=pick(self.states),
            location_ids=loc["lid"].to_numpy(),
            location_flags=loc[list(LOCATION_FLAGS)].to_numpy(),
            longitude=loc["longitude"].to_numpy(), latitude=loc["latitude"].to_numpy(),
            activity_names=self.ACTIVITY_NAMES, location_flag_names=LOCATION_FLAGS,
        )

    def summary(self) -> dict:
        ever = (self.states != 0).any(axis=1)
        out = {
            "persons": self.num_persons,
            "days": self.num_days,
            "contacts": self.num_contacts,
            "households": len(self.households),
            "residence_locations": len(self.residence_locations),
            "activity_locations": len(self.activity_locations),
            "assignments": len(self.assignment),
            "regions": self.num_regions,
            "ever_infected_recorded": float(ever.mean()) if self.num_persons else 0.0,
        }
        if self.target is not None:
            out["target_rate"] = float(self.target.mean()) if self.num_persons else 0.0
        return out


# --------------------------------------------------------------------------- #
# Low-level table reading
# --------------------------------------------------------------------------- #
def find_table_file(directory: Path | str, spec: TableSpec | str) -> Path:
    """The file holding ``spec`` in ``directory`` (``.csv``, ``.csv.gz`` or ``.parquet``)."""
    directory = Path(directory)
    if isinstance(spec, str):
        spec = ALL_TABLES[spec]
    if not directory.is_dir():
        raise DataError(
            f"dataset directory {directory} does not exist or is not a directory; "
            "pass the folder that holds the va_*.csv files (or generate one with "
            "silofl.pandemic.synthesize)"
        )
    found = [directory / name for name in spec.filenames() if (directory / name).is_file()]
    if not found:
        want = ", ".join(expected_filenames(with_target=spec.key == TARGET.key))
        raise DataError(
            f"missing file for table {spec.key!r} in {directory}: expected one of "
            f"{', '.join(spec.filenames())}. A dataset directory holds these files "
            f"(each as .csv, .csv.gz or .parquet): {want}"
        )
    if len(found) > 1:
        raise DataError(
            f"table {spec.key!r} is stored more than once in {directory}: "
            f"{', '.join(p.name for p in found)}; keep exactly one of them"
        )
    return found[0]


def _is_parquet(path: Path) -> bool:
    return path.name.endswith(".parquet")


def _where(path: Path, row: int) -> str:
    """Human location of 0-based data row ``row`` in ``path``."""
    if _is_parquet(path):
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
_FLOAT_RE = r"^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$|^\s*[-+]?(nan|NaN|inf|Inf)\s*$"
_FLAG_VALUES = ["0", "1", "true", "false", "True", "False", "TRUE", "FALSE"]


class _TableReader:
    """Streams selected columns of one table file as dicts of NumPy arrays."""

    def __init__(self, path: Path, spec: TableSpec, columns: list[str]):
        self.path = path
        self.spec = spec
        self.columns = columns
        self.colspecs = [spec.column(c) for c in columns]
        self._csv_stream = None
        self._pending = b""
        if _is_parquet(path):
            try:
                self._pf = pq.ParquetFile(path)
            except Exception as exc:  # noqa: BLE001 - any pyarrow failure means unreadable
                raise DataError(f"cannot read parquet file {path}: {exc}; re-export the table") from exc
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
            raise DataError(f"{path.name}: column(s) {', '.join(dup)} appear more than once in the header; "
                            "rename or drop the duplicates")

    # -- CSV -------------------------------------------------------------------
    def _read_csv_header(self) -> list[str]:
        try:
            self._csv_stream = pa.input_stream(str(self.path), compression="detect")
            first = self._csv_stream.read(_HEADER_PROBE_BYTES)
        except Exception as exc:  # noqa: BLE001
            raise DataError(f"cannot read {self.path}: {exc}; check the file is a (gzip-compressed) CSV") from exc
        nl = first.find(b"\n")
        head = first if nl < 0 else first[:nl]
        self._pending = b"" if nl < 0 else first[nl + 1:]
        self._eof_after_pending = len(first) < _HEADER_PROBE_BYTES
        try:
            text = head.decode("utf-8-sig").rstrip("\r")
        except UnicodeDecodeError as exc:
            raise DataError(f"{self.path.name}: header line is not UTF-8 text; is this a CSV file?") from exc
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

    def _parse_piece(self, piece, row0: int) -> pa.Table:
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

    def _diagnose_csv(self, piece, row0: int, exc: Exception):
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
                    f"{_where(self.path, row0 + i)}: column {col.name!r} holds a value that is "
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
                    f"{_where(self.path, row0 + int(nulls[0]))}: column {col.name!r} is empty "
                    f"({arr.null_count} empty value(s) in this part of the file); every row needs a value"
                )
            out[col.name] = self._to_numpy(arr, col, row0)
        return out

    def _to_numpy(self, arr, col: ColumnSpec, row0: int) -> np.ndarray:
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
            idx = pc.index_in(arr, value_set=_STATE_VALUES)
            if idx.null_count:
                i = int(np.flatnonzero(pc.is_null(idx).to_numpy(zero_copy_only=False))[0])
                raise DataError(
                    f"{_where(self.path, row0 + i)}: column {col.name!r} holds an invalid "
                    f"state; health states must be one of {', '.join(STATE_LETTERS)} — fix "
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
                raise DataError(f"{_where(self.path, row0 + i)}: flag column {col.name!r} holds a "
                                "value other than 0 or 1; use 0 or 1")
            return vals.astype(np.uint8)
        if col.kind == "float":
            return arr.to_numpy(zero_copy_only=False).astype(np.float32)
        vals = arr.to_numpy(zero_copy_only=False)
        if vals.dtype.kind == "f":
            if not np.all(np.isfinite(vals)) or not np.all(vals == np.round(vals)):
                bad = ~np.isfinite(vals) | (vals != np.round(vals))
                i = int(np.flatnonzero(bad)[0])
                raise DataError(f"{_where(self.path, row0 + i)}: column {col.name!r} holds a "
                                "value that is not an integer; fix the value")
            vals = vals.astype(np.int64)
        if vals.dtype.kind not in "iu":
            raise DataError(f"{self.path.name}: column {col.name!r} has type {arr.type}, expected integers")
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
            f"{_where(self.path, row0 + i)}: column {col.name!r} holds a value outside "
            f"{info.min}..{info.max} ({target}); fix the value"
        )

    # -- public ------------------------------------------------------------------
    def batches(self) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """Yield ``(first_row, {column: array})`` for consecutive row ranges."""
        row0 = 0
        if _is_parquet(self.path):
            try:
                for batch in self._pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=self.columns):
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


def read_table(path: Path | str, spec: TableSpec | str, columns: list[str] | None = None) -> dict[str, np.ndarray]:
    """Read ``columns`` (default: the required ones plus optional ones present) of one file."""
    path = Path(path)
    if isinstance(spec, str):
        spec = ALL_TABLES[spec]
    if columns is None:
        probe = _TableReader(path, spec, list(spec.required))
        columns = list(spec.required) + [c for c in spec.optional_names if c in probe.names]
    return _TableReader(path, spec, columns).read_all()


def _optional_present(path: Path, spec: TableSpec) -> list[str]:
    reader = _TableReader(path, spec, list(spec.required))
    if reader._csv_stream is not None:
        reader._csv_stream.close()
    return [c for c in spec.optional_names if c in reader.names]


# --------------------------------------------------------------------------- #
# Validation helpers
# --------------------------------------------------------------------------- #
def _unique_sorted(ids: np.ndarray, path: Path, col: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Sort ids; raise DataError naming the first duplicate.  Returns (sorted ids, order)."""
    order = stable_argsort(ids)
    s = ids[order]
    if s.size > 1:
        dup = np.flatnonzero(s[1:] == s[:-1])
        if dup.size:
            j = int(dup[0])
            a, b = sorted((int(order[j]), int(order[j + 1])))
            raise DataError(
                f"{path.name}: duplicate {col} (at {_where(path, a)} and {_where(path, b)}); "
                f"each {what} must appear exactly once — remove the duplicate rows "
                f"({dup.size} duplicated id(s) in total)"
            )
    return s, order


def _check_known(idx: np.ndarray, values: np.ndarray, path: Path, row0: int, col: str, what: str, fix: str):
    bad = idx < 0
    if bad.any():
        where = np.flatnonzero(bad)
        i = int(where[0])
        raise DataError(
            f"{_where(path, row0 + i)}: column {col!r} refers to an unknown {what} "
            f"({where.size} unknown reference(s) in this part of the file); {fix}"
        )


def _check_codes(values: np.ndarray, allowed, path: Path, row0: int, col: str, what: str):
    ok = np.isin(values, np.asarray(allowed, dtype=values.dtype))
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise DataError(
            f"{_where(path, row0 + i)}: column {col!r} holds an invalid {what} "
            f"(allowed: {', '.join(str(a) for a in allowed)})"
        )


# --------------------------------------------------------------------------- #
# read_dataset
# --------------------------------------------------------------------------- #
def read_dataset(directory: Path | str, *, with_target: bool = False, num_days: int | None = None) -> PandemicData:
    """Read and validate a challenge dataset directory.

    Parameters
    ----------
    directory:
        Folder holding ``va_person``, ``va_household``, ``va_residence_locations``,
        ``va_activity_locations``, ``va_activity_location_assignment``,
        ``va_population_network`` and ``va_disease_outcome_training`` (each
        ``.csv``, ``.csv.gz`` or ``.parquet``), plus ``va_disease_outcome_target``
        when ``with_target``.
    with_target:
        Also read the labels into ``PandemicData.target``.
    num_days:
        Required number of outcome days (``0..num_days-1``).  ``None`` infers it
        from the largest day present; every person must have every day.

    Raises
    ------
    DataError
        On a missing file or column, unparsable value, duplicate id, reference
        to an unknown person or location, incomplete outcome days, or a state
        other than S/I/R.  The message names the file, column and line.
    """
    directory = Path(directory)
    specs = dict(TABLES)
    paths = {key: find_table_file(directory, spec) for key, spec in specs.items()}
    if with_target:
        paths[TARGET.key] = find_table_file(directory, TARGET)

    # ---- households ----------------------------------------------------------
    p = paths["households"]
    hh = _TableReader(p, specs["households"], ["hid", "hh_size"]).read_all()
    hh_ids, order = _unique_sorted(hh["hid"], p, "hid", "household")
    hh_size = hh["hh_size"][order]
    if hh_size.size and hh_size.min() < 0:
        i = int(np.flatnonzero(hh["hh_size"] < 0)[0])
        raise DataError(f"{_where(p, i)}: hh_size is negative; use the household's size")
    hid_index = IdIndex(hh_ids)
    households = pd.DataFrame({"hid": hh_ids, "hh_size": hh_size}, copy=False)

    # ---- persons -------------------------------------------------------------
    p = paths["persons"]
    pe = _TableReader(p, specs["persons"], ["pid", "hid", "person_number", "age", "sex"]).read_all()
    pids, order = _unique_sorted(pe["pid"], p, "pid", "person")
    pid_index = IdIndex(pids)
    hid = pe["hid"][order]
    hidx = hid_index.lookup(hid)
    _check_known(hidx, hid, p, 0, "hid", "household", "every person's hid must appear in va_household")
    age = pe["age"][order]
    if age.size and age.max() > 130:
        i = int(np.flatnonzero(pe["age"] > 130)[0])
        raise DataError(f"{_where(p, i)}: age is implausible; ages must lie in 0..130")
    _check_codes(pe["sex"], (1, 2), p, 0, "sex", "sex code (1 male, 2 female)")
    sex = pe["sex"][order]
    person_number = pe["person_number"][order]
    del pe

    # ---- locations -----------------------------------------------------------
    p = paths["residence_locations"]
    spec = specs["residence_locations"]
    rl_cols = ["rlid", "longitude", "latitude"] + _optional_present(p, spec)
    rl = _TableReader(p, spec, rl_cols).read_all()
    rlids, order = _unique_sorted(rl["rlid"], p, "rlid", "residence location")
    residence = pd.DataFrame(
        {
            "rlid": rlids,
            "longitude": rl["longitude"][order],
            "latitude": rl["latitude"][order],
            "county": rl["county"][order] if "county" in rl else np.full(rlids.size, -1, np.int32),
        },
        copy=False,
    )
    p = paths["activity_locations"]
    al_cols = ["alid", "longitude", "latitude", *LOCATION_FLAGS]
    al = _TableReader(p, specs["activity_locations"], al_cols).read_all()
    alids, order = _unique_sorted(al["alid"], p, "alid", "activity location")
    activity = pd.DataFrame({c: (alids if c == "alid" else al[c][order]) for c in al_cols}, copy=False)
    all_lids = np.concatenate([rlids, alids])
    all_lids.sort()
    both = all_lids[1:][all_lids[1:] == all_lids[:-1]]
    if both.size:
        raise DataError(
            f"{both.size} id(s) appear both as rlid in {paths['residence_locations'].name} and as alid in "
            f"{paths['activity_locations'].name}; location ids share one space (the lid "
            "column refers to either), so renumber one of the tables"
        )
    lid_index = IdIndex(all_lids)
    rl_index = IdIndex(rlids)

    # ---- activity location assignment ------------------------------------------
    p = paths["activity_location_assignment"]
    cols = ["pid", "activity_number", "activity_type", "start_time", "duration", "lid"]
    parts: dict[str, list[np.ndarray]] = {c: [] for c in ["person", *cols[1:]]}
    for row0, b in _TableReader(p, specs["activity_location_assignment"], cols).batches():
        person = pid_index.lookup(b["pid"])
        _check_known(person, b["pid"], p, row0, "pid", "person", "every pid must appear in va_person")
        _check_known(lid_index.lookup(b["lid"]), b["lid"], p, row0, "lid", "location",
                     "every lid must be an rlid of va_residence_locations or an alid of va_activity_locations")
        _check_codes(b["activity_type"], ACTIVITY_CODES, p, row0, "activity_type", "activity code")
        parts["person"].append(person)
        for c in cols[1:]:
            parts[c].append(b[c])
        del b
    assign_cols = {c: _concat(v, ALL_TABLES["activity_location_assignment"], c) for c, v in parts.items()}
    del parts
    assignment = pd.DataFrame(assign_cols, copy=False)

    # ---- home location and region ---------------------------------------------------
    P = pids.size
    home_lid = np.full(P, -1, dtype=rlids.dtype if rlids.dtype == np.int64 else np.int32)
    is_home = assign_cols["activity_type"] == int(ActivityType.HOME)
    hp = assign_cols["person"][is_home]
    hl = assign_cols["lid"][is_home]
    uniq, first = first_occurrence(hp)
    home_lid[uniq] = hl[first]
    del hp, hl, is_home, uniq, first
    # persons without a home activity inherit their household's home
    missing_home = home_lid < 0
    if missing_home.any() and (~missing_home).any():
        hh_home = np.full(hh_ids.size, -1, dtype=home_lid.dtype)
        have = np.flatnonzero(~missing_home)
        u, f = first_occurrence(hidx[have])
        hh_home[u] = home_lid[have[f]]
        home_lid[missing_home] = hh_home[hidx[missing_home]]
    rpos = rl_index.lookup(home_lid)
    rl_county = residence["county"].to_numpy()
    county = np.where(rpos >= 0, rl_county[np.maximum(rpos, 0)], -1).astype(np.int32)
    region_codes = sorted_unique(county[county >= 0]).astype(np.int32)
    region = np.full(P, -1, dtype=np.int16)
    known = county >= 0
    region[known] = np.searchsorted(region_codes, county[known]).astype(np.int16)

    # ---- population network ------------------------------------------------------------
    p = paths["population_network"]
    cols = ["pid1", "pid2", "lid", "start_time", "duration", "activity1", "activity2"]
    net_parts: dict[str, list[np.ndarray]] = {c: [] for c in ["src", "dst", *cols[2:]]}
    for row0, b in _TableReader(p, specs["population_network"], cols).batches():
        src = pid_index.lookup(b["pid1"])
        _check_known(src, b["pid1"], p, row0, "pid1", "person", "every pid1/pid2 must appear in va_person")
        dst = pid_index.lookup(b["pid2"])
        _check_known(dst, b["pid2"], p, row0, "pid2", "person", "every pid1/pid2 must appear in va_person")
        _check_known(lid_index.lookup(b["lid"]), b["lid"], p, row0, "lid", "location",
                     "every lid must be an rlid of va_residence_locations or an alid of va_activity_locations")
        _check_codes(b["activity1"], ACTIVITY_CODES, p, row0, "activity1", "activity code")
        _check_codes(b["activity2"], ACTIVITY_CODES, p, row0, "activity2", "activity code")
        net_parts["src"].append(src)
        net_parts["dst"].append(dst)
        for c in cols[2:]:
            net_parts[c].append(b[c])
        del b
    netspec = ALL_TABLES["population_network"]
    net = {}
    for c in list(net_parts):
        net[c] = _concat(net_parts.pop(c), netspec, c)
    network = ContactNetwork(**net)
    del net

    # ---- disease outcomes ------------------------------------------------------------------
    states = _read_outcomes(paths["disease_outcome_training"], pid_index, pids, num_days)

    # ---- target --------------------------------------------------------------------------------
    target = None
    if with_target:
        target = _read_target(paths[TARGET.key], pid_index, pids)

    return PandemicData(
        pids=pids,
        pid_index=pid_index,
        hid=hid,
        person_number=person_number,
        age=age,
        sex=sex,
        hh_size=hh_size[hidx],
        home_lid=home_lid,
        county=county,
        region=region,
        region_codes=region_codes,
        households=households,
        residence_locations=residence,
        activity_locations=activity,
        assignment=assignment,
        network=network,
        states=states,
        target=target,
        directory=directory,
        lid_index=lid_index,
    )


def _concat(parts: list[np.ndarray], spec: TableSpec, col: str) -> np.ndarray:
    if not parts:
        name = {"src": "pid1", "dst": "pid2", "person": "pid"}.get(col, col)
        dt = np.int32 if col in ("src", "dst", "person") else spec.column(name).np_dtype
        return np.empty(0, dtype=dt)
    if len(parts) == 1:
        return parts[0]
    dt = np.result_type(*parts)
    out = np.empty(sum(a.size for a in parts), dtype=dt)
    pos = 0
    while parts:  # free each chunk as soon as it is copied
        a = parts.pop(0)
        out[pos:pos + a.size] = a
        pos += a.size
    return out


def _read_outcomes(path: Path, pid_index: IdIndex, pids: np.ndarray, num_days: int | None) -> np.ndarray:
    """Scatter the long (day, pid, state) table into a dense (P, D) int8 matrix."""
    P = pids.size
    cap = num_days if num_days is not None else 57
    states = np.full((P, cap), -1, dtype=np.int8)
    total = 0
    max_day = -1
    for row0, b in _TableReader(path, TABLES["disease_outcome_training"], ["day", "pid", "state"]).batches():
        day = b["day"]
        idx = pid_index.lookup(b["pid"])
        _check_known(idx, b["pid"], path, row0, "pid", "person", "every pid must appear in va_person")
        if day.size:
            dmin, dmax = int(day.min()), int(day.max())
            if dmin < 0:
                i = int(np.flatnonzero(day < 0)[0])
                raise DataError(f"{_where(path, row0 + i)}: day is negative; days count from 0")
            if num_days is not None and dmax >= num_days:
                i = int(np.flatnonzero(day >= num_days)[0])
                raise DataError(f"{_where(path, row0 + i)}: day is outside 0..{num_days - 1}; "
                                f"drop days beyond {num_days - 1} or pass num_days=None")
            if dmax >= cap:  # grow (rare: only when num_days is inferred and > 57)
                new_cap = max(dmax + 1, cap * 2)
                grown = np.full((P, new_cap), -1, dtype=np.int8)
                grown[:, :cap] = states
                states, cap = grown, new_cap
            max_day = max(max_day, dmax)
        flat = idx.astype(np.int64) * cap + day
        view = states.reshape(-1)
        prev = view[flat]
        if (prev >= 0).any():
            i = int(np.flatnonzero(prev >= 0)[0])
            raise DataError(
                f"{_where(path, row0 + i)}: this person already has a state for that day; "
                "each (pid, day) must appear once — remove the duplicate rows"
            )
        view[flat] = b["state"]
        total += day.size
        del b, flat, prev, idx, day
    D = num_days if num_days is not None else max_day + 1
    if D <= 0 or P == 0:
        raise DataError(f"{path.name} holds no outcome rows; it needs one row per person and day (day, pid, state)")
    if D < cap:
        states = np.ascontiguousarray(states[:, :D])
    holes = states < 0
    if holes.any():
        rows = np.flatnonzero(holes.any(axis=1))
        i = int(rows[0])
        days = np.flatnonzero(holes[i])
        shown = ", ".join(str(d) for d in days[:8]) + (" ..." if days.size > 8 else "")
        raise DataError(
            f"{path.name}: outcome days are incomplete — a person has no state for day(s) {shown} "
            f"({rows.size} person(s) affected, {int(holes.sum())} missing (pid, day) rows). Every person needs "
            f"a state for every day 0..{D - 1}; add the missing rows"
        )
    if total != P * D:
        _raise_duplicate_outcome(path, pid_index, D, total - P * D)
    return states


def _raise_duplicate_outcome(path: Path, pid_index: IdIndex, D: int, extra: int):
    """Second pass (error path only): find the first repeated (pid, day) row."""
    seen = np.zeros(len(pid_index) * D, dtype=bool)
    for row0, b in _TableReader(path, TABLES["disease_outcome_training"], ["day", "pid", "state"]).batches():
        flat = pid_index.lookup(b["pid"]).astype(np.int64) * D + b["day"]
        order = stable_argsort(flat)
        s = flat[order]
        rep = np.zeros(flat.size, bool)
        rep[order[1:][s[1:] == s[:-1]]] = True  # later copies within the batch
        rep |= seen[flat]
        if rep.any():
            i = int(np.flatnonzero(rep)[0])
            raise DataError(
                f"{_where(path, row0 + i)}: this person already has a state for that day "
                f"({extra} duplicate (pid, day) row(s) in total); each (pid, day) must appear once — "
                "remove the duplicate rows"
            )
        seen[flat] = True
    raise DataError(f"{path.name}: {extra} more rows than persons x days; each (pid, day) must appear once")


def _read_target(path: Path, pid_index: IdIndex, pids: np.ndarray) -> np.ndarray:
    t = _TableReader(path, TARGET, ["pid", "infected"]).read_all()
    idx = pid_index.lookup(t["pid"])
    _check_known(idx, t["pid"], path, 0, "pid", "person", "every pid must appear in va_person")
    _unique_sorted(t["pid"], path, "pid", "person")
    _check_codes(t["infected"], (0, 1), path, 0, "infected", "label")
    target = np.full(pids.size, -1, dtype=np.int8)
    target[idx] = t["infected"]
    if (target < 0).any():
        i = int(np.flatnonzero(target < 0)[0])
        raise DataError(f"{path.name}: {int((target < 0).sum())} person(s) have no label; "
                        "the target needs one row per person")
    return target

"""Writing a generated outbreak as the challenge's files, reproducibly and all-or-nothing."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from silofl.errors import ConfigError, DataError
from silofl.io import sha256_file
from silofl.pandemic.schema import (
    ALL_TABLES,
    HORIZON,
    MANIFEST_NAME,
    STATE_LETTERS,
    TABLES,
    TARGET,
    TRAIN_DAYS,
    all_dataset_filenames,
)
from silofl.pandemic.synth.outbreak import SyntheticOutbreak, generate_outbreak
from silofl.pandemic.synth.params import GENERATOR_VERSION, OutbreakParams, check_args

_FORMATS = {"csv": ".csv", "csv.gz": ".csv.gz", "parquet": ".parquet"}
_WRITE_CHUNK_ROWS = 2_000_000

_STATE_DICT = pa.array(list(STATE_LETTERS), pa.string())


def _arrow(col: str, arr: np.ndarray) -> pa.Array:
    if col == "state":
        return pa.DictionaryArray.from_arrays(pa.array(arr, pa.int8()), _STATE_DICT)
    return pa.array(arr)


def _batches(key: str, o: SyntheticOutbreak):
    """Yield record batches of table ``key`` with file column names, in file order."""
    step = _WRITE_CHUNK_ROWS
    if key == "population_network":
        net = o.network
        n = net["src"].size
        for lo in range(0, max(n, 1), step):
            hi = min(n, lo + step)
            cols = {
                "pid1": o.pids[net["src"][lo:hi]],
                "pid2": o.pids[net["dst"][lo:hi]],
                **{c: net[c][lo:hi] for c in ("lid", "start_time", "duration", "activity1", "activity2")},
            }
            yield pa.record_batch({c: _arrow(c, a) for c, a in cols.items()})
        return
    if key == "disease_outcome_training":
        N = o.persons
        per = max(1, step // max(N, 1))
        for d0 in range(0, o.days, per):
            d1 = min(o.days, d0 + per)
            day = np.repeat(np.arange(d0, d1, dtype=np.int16), N)
            pid = np.tile(o.pids, d1 - d0)
            state = np.ascontiguousarray(o.states[:, d0:d1].T).reshape(-1)
            yield pa.record_batch({"day": pa.array(day), "pid": pa.array(pid),
                                   "state": _arrow("state", state)})
        return
    table = o.tables[key]
    n = next(iter(table.values())).size
    for lo in range(0, max(n, 1), step):
        yield pa.record_batch({c: _arrow(c, a[lo:lo + step]) for c, a in table.items()})


def _write_file(path: Path, fmt: str, batches) -> int:
    """Write record batches to ``path`` as csv / csv.gz / parquet; returns the row count."""
    it = iter(batches)
    first = next(it)
    schema = first.schema
    rows = 0
    if fmt == "parquet":
        with pq.ParquetWriter(path, schema, compression="zstd") as w:
            for b in _chain(first, it):
                w.write_batch(b)
                rows += b.num_rows
        return rows
    header = (",".join(schema.names) + "\n").encode()
    counted = _count_rows(_chain(first, it))
    if fmt == "csv.gz":
        # Python's gzip: level 1 is ~15x faster than Arrow's fixed level 9; mtime=0 keeps bytes reproducible
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=1,
                                                  mtime=0) as gz:
            gz.write(header)
            for text in _format_csv(counted):
                gz.write(memoryview(text))
    else:
        with open(path, "wb") as f:
            f.write(header)
            for text in _format_csv(counted):
                f.write(memoryview(text))
    return counted.rows


class _count_rows:
    def __init__(self, it):
        self.it, self.rows = it, 0

    def __iter__(self):
        for b in self.it:
            self.rows += b.num_rows
            yield b


def _csv_text(batch: pa.RecordBatch) -> pa.Buffer:
    buf = pa.BufferOutputStream()
    pacsv.write_csv(batch, buf, write_options=pacsv.WriteOptions(include_header=False, quoting_style="none"))
    return buf.getvalue()


def _format_csv(batches):
    """CSV text of each batch, in order, formatted on a few threads (pyarrow releases the GIL)."""
    workers = max(1, min(4, os.cpu_count() or 1))
    if workers == 1:
        for b in batches:
            if b.num_rows:
                yield _csv_text(b)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending = deque()
        for b in batches:
            if b.num_rows:
                pending.append(pool.submit(_csv_text, b))
            while len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _chain(first, it):
    yield first
    yield from it


def _identity(fmt: str, persons: int, regions: int, seed: int, days: int, horizon: int,
              prm: OutbreakParams) -> dict:
    ident = {
        "generator": "silofl.pandemic.synth",
        "generator_version": GENERATOR_VERSION,
        "format": fmt,
        "seed": int(seed),
        "params": {"persons": int(persons), "regions": int(regions), "days": int(days),
                   "horizon": int(horizon), "outbreak": dataclasses.asdict(prm)},
    }
    return json.loads(json.dumps(ident))  # normalize tuples -> lists


_IDENTITY_KEYS = ("generator", "generator_version", "format", "seed", "params")


def write_outbreak(o: SyntheticOutbreak, out_dir: Path | str, *, fmt: str = "csv") -> dict:
    """Write an in-memory outbreak into an existing empty directory; returns the manifest."""
    out_dir = Path(out_dir)
    ext = _FORMATS[fmt]
    files = {}
    rows = {}
    for key in list(TABLES) + [TARGET.key]:
        spec = ALL_TABLES[key]
        path = out_dir / (spec.stem + ext)
        n = _write_file(path, fmt, _batches(key, o))
        rows[key] = n
        files[path.name] = {"table": key, "rows": n, "bytes": path.stat().st_size,
                            "sha256": sha256_file(path)}
    manifest = _identity(fmt, o.persons, o.regions, o.seed, o.days, o.horizon, o.params)
    manifest["rows"] = rows
    manifest["files"] = files
    manifest["content_hash"] = hashlib.sha256(
        json.dumps({k: v["sha256"] for k, v in sorted(files.items())}, sort_keys=True).encode()).hexdigest()
    manifest["stats"] = o.stats
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _existing_state(out_dir: Path) -> tuple[str, dict | None, list[str]]:
    """Classify ``out_dir``: ('absent'|'empty'|'dataset'|'foreign', manifest, foreign names)."""
    if not out_dir.exists():
        return "absent", None, []
    if not out_dir.is_dir():
        raise DataError(f"output path {out_dir} exists and is not a directory; pick a directory path")
    names = sorted(p.name for p in out_dir.iterdir())
    if not names:
        return "empty", None, []
    known = all_dataset_filenames()
    foreign = [n for n in names if n not in known]
    manifest = None
    mpath = out_dir / MANIFEST_NAME
    if mpath.is_file():
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, ValueError):
            manifest = None
    if foreign:
        return "foreign", manifest, foreign
    return "dataset", manifest, []


def synthesize(out_dir: Path | str, *, persons: int = 10_000, regions: int = 5, seed: int = 0,
               days: int = TRAIN_DAYS, horizon: int = HORIZON, overwrite: bool = False, format: str = "csv",
               params: OutbreakParams | None = None) -> dict:
    """Generate a synthetic outbreak and write it to ``out_dir``; return a summary.

    Writes ``va_person``, ``va_household``, ``va_residence_locations``,
    ``va_activity_locations``, ``va_activity_location_assignment``,
    ``va_population_network``, ``va_disease_outcome_training`` (days
    ``0..days-1``) and ``va_disease_outcome_target`` (label: recorded S -> I on
    a day in ``days..days+horizon-1``) as ``format`` (``"csv"``, ``"csv.gz"``
    or ``"parquet"``), plus ``manifest.json`` (generator version, parameters,
    seed, row counts, per-file and overall sha256, outbreak statistics).

    The same arguments always produce byte-identical files.  If ``out_dir``
    already holds the same dataset (same manifest identity, files intact) this
    is a no-op (``summary["written"]`` is False).  A directory holding a
    different dataset is refused unless ``overwrite=True``; a directory with
    other files is always refused.  Files are written to a temporary sibling
    directory and renamed into place, so a failure leaves nothing half-written.
    """
    if format not in _FORMATS:
        raise ConfigError(f"format must be one of {', '.join(_FORMATS)}, got {format!r}")
    check_args(persons, regions, seed, days, horizon)
    prm = params or OutbreakParams()
    out_dir = Path(out_dir)
    ident = _identity(format, persons, regions, seed, days, horizon, prm)
    state, manifest, foreign = _existing_state(out_dir)
    if state == "foreign":
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise DataError(
            f"output directory {out_dir} already holds files that are not part of a synthetic "
            f"dataset ({shown}); pick an empty or new directory (overwrite=True only replaces a "
            "dataset written by synthesize)"
        )
    if state == "dataset":
        same = manifest is not None and all(manifest.get(k) == ident[k] for k in _IDENTITY_KEYS)
        if same and not overwrite and _files_intact(out_dir, manifest):
            return {**manifest, "path": str(out_dir), "written": False, "seconds": 0.0}
        if not overwrite:
            if same:
                why = "the same dataset but its files are incomplete or modified"
            elif manifest is None:
                why = "dataset files without a readable manifest.json"
            else:
                diff = [k for k in _IDENTITY_KEYS if manifest.get(k) != ident[k]]
                why = f"a different dataset (differs in: {', '.join(diff)})"
            raise DataError(
                f"output directory {out_dir} already holds {why}; pick an empty directory or, to "
                "replace it, pass --overwrite (Python: overwrite=True)"
            )
    t0 = time.perf_counter()
    outbreak = generate_outbreak(persons=persons, regions=regions, seed=seed, days=days, horizon=horizon,
                                 params=prm)
    t_gen = time.perf_counter() - t0
    parent = out_dir.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    try:
        os.chmod(tmp, 0o755)
        manifest = write_outbreak(outbreak, tmp, fmt=format)
        del outbreak
        _swap_into_place(tmp, out_dir.absolute())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    total = time.perf_counter() - t0
    return {**manifest, "path": str(out_dir), "written": True, "seconds": round(total, 3),
            "generate_seconds": round(t_gen, 3)}


def _files_intact(out_dir: Path, manifest: dict) -> bool:
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for name, info in files.items():
        p = out_dir / name
        if not p.is_file() or p.stat().st_size != info.get("bytes"):
            return False
    return True


def _swap_into_place(tmp: Path, out_dir: Path):
    if not out_dir.exists():
        os.rename(tmp, out_dir)
        return
    if not any(out_dir.iterdir()):
        os.rmdir(out_dir)
        os.rename(tmp, out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    os.rmdir(old)
    os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except BaseException:
        os.rename(old, out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)

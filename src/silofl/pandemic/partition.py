"""Input files on disk: the challenge's seven paths as one dataset directory, and a
dataset split into one directory per region (what each federated client holds).

The challenge hands a solution seven file paths (any names, any folders) while
`readers.read_dataset` reads a directory of ``va_*`` files; `input_directory` bridges
the two without copying data.  `partition_by_region` writes, for every region, the rows
of each table that belong to it — the region's persons, their households, schedules,
outcomes, the locations they visit, and the contacts *among them* (contacts that cross
regions are dropped, as in the in-process federated mode, `regions.build_regions`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from silofl.data.columnar import FILE_EXTENSIONS, TableSpec
from silofl.errors import ConfigError, DataError
from silofl.pandemic.readers import find_table_file, read_dataset
from silofl.pandemic.schema import TABLES, TARGET

#: The seven challenge inputs in the order of the challenge's function arguments.
INPUT_SPECS: tuple[TableSpec, ...] = tuple(TABLES.values())


def _extension(path: Path) -> str:
    for ext in sorted(FILE_EXTENSIONS, key=len, reverse=True):
        if path.name.endswith(ext):
            return ext
    return ".csv"


def input_directory(paths, scratch: Path) -> Path:
    """A directory from which `read_dataset` reads exactly the seven files ``paths``
    (person, household, residence locations, activity locations, activity assignment,
    population network, disease outcome — the challenge's argument order).  That is
    their common folder when they carry the expected names; otherwise ``scratch`` is
    filled with links (copies where links are not allowed) under the expected names."""
    paths = [Path(p) for p in paths]
    if len(paths) != len(INPUT_SPECS):
        raise ConfigError(f"expected {len(INPUT_SPECS)} input paths (one per challenge "
                          f"table), got {len(paths)}")
    for spec, p in zip(INPUT_SPECS, paths):
        if not p.is_file():
            raise DataError(f"input file for table {spec.key!r} not found: {p}")
    folder = paths[0].parent
    try:
        if all(find_table_file(folder, spec).resolve() == p.resolve()
               for spec, p in zip(INPUT_SPECS, paths)):
            return folder
    except DataError:
        pass  # names or folders differ from the reader's layout: link them
    scratch = Path(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    for spec, p in zip(INPUT_SPECS, paths):
        for name in spec.filenames():
            (scratch / name).unlink(missing_ok=True)
        dest = scratch / (spec.stem + _extension(p))
        try:
            dest.symlink_to(p.resolve())
        except OSError:
            shutil.copyfile(p, dest)
    return scratch


def _read(path: Path) -> pa.Table:
    if path.name.endswith(".parquet"):
        return pq.read_table(path)
    return pacsv.read_csv(path)  # .csv.gz is decompressed by extension


def _write(table: pa.Table, path: Path) -> None:
    pacsv.write_csv(table, path, write_options=pacsv.WriteOptions(quoting_style="none"))


def _rows(table: pa.Table, mask: np.ndarray) -> pa.Table:
    return table.filter(pa.array(mask, pa.bool_()))


def _col(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy()


def partition_by_region(data_dir: Path | str, out_dir: Path | str) -> dict[str, Path]:
    """Write one dataset directory per region under ``out_dir`` (``region-<county>``, as
    CSV, plus the target file when ``data_dir`` has one) and return {client id: folder}.
    A person's region is the county of their home (see `schema`); persons without one
    cannot be assigned and are refused (DataError)."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    has_target = any((data_dir / n).is_file() for n in TARGET.filenames())
    data = read_dataset(data_dir)
    if np.any(data.region < 0):
        raise DataError(f"{int((data.region < 0).sum())} persons in {data_dir} have no "
                        "region (no home residence with a county), so they belong to no "
                        "partition; fix the data or train centralized")
    tables = {spec.key: _read(find_table_file(data_dir, spec)) for spec in INPUT_SPECS}
    if has_target:
        tables[TARGET.key] = _read(find_table_file(data_dir, TARGET))
    out: dict[str, Path] = {}
    for r, code in enumerate(data.region_codes):
        cid = f"region-{int(code)}"
        pids = data.pids[data.region == r]
        hids = np.unique(data.hid[data.region == r])
        t = tables
        assign = _rows(t["activity_location_assignment"],
                       np.isin(_col(t["activity_location_assignment"], "pid"), pids))
        net = t["population_network"]
        net = _rows(net, np.isin(_col(net, "pid1"), pids) & np.isin(_col(net, "pid2"), pids))
        lids = np.union1d(_col(assign, "lid"), _col(net, "lid"))
        parts = {
            "persons": _rows(t["persons"], np.isin(_col(t["persons"], "pid"), pids)),
            "households": _rows(t["households"], np.isin(_col(t["households"], "hid"), hids)),
            "residence_locations": _rows(t["residence_locations"], np.isin(
                _col(t["residence_locations"], "rlid"), lids)),
            "activity_locations": _rows(t["activity_locations"], np.isin(
                _col(t["activity_locations"], "alid"), lids)),
            "activity_location_assignment": assign,
            "population_network": net,
        }
        for key in ("disease_outcome_training", TARGET.key):
            if key in t:
                parts[key] = _rows(t[key], np.isin(_col(t[key], "pid"), pids))
        folder = out_dir / cid
        folder.mkdir(parents=True, exist_ok=True)
        for key, table in parts.items():
            spec = TARGET if key == TARGET.key else TABLES[key]
            for name in spec.filenames():
                (folder / name).unlink(missing_ok=True)
            _write(table, folder / f"{spec.stem}.csv")
        out[cid] = folder
    return out


def input_paths(folder: Path | str) -> list[Path]:
    """The seven input files of a dataset directory, in the challenge's argument order."""
    return [find_table_file(folder, spec) for spec in INPUT_SPECS]

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

from pathlib import Path

import numpy as np
import pandas as pd

from silofl.data.columnar import (
    ColumnarReader,
    TableSpec,
    check_codes,
    check_known,
    optional_present,
    read_columns,
    row_where,
    unique_sorted_ids,
)
from silofl.data.ids import IdIndex, first_occurrence, sorted_unique, stable_argsort
from silofl.errors import DataError
from silofl.pandemic.dataset import ContactNetwork, PandemicData
from silofl.pandemic.schema import (
    ACTIVITY_CODES,
    ALL_TABLES,
    LOCATION_FLAGS,
    TABLES,
    TARGET,
    ActivityType,
    expected_filenames,
)

__all__ = [
    "PandemicData",
    "read_dataset",
    "find_table_file",
    "read_table",
]


# --------------------------------------------------------------------------- #
# The challenge's files, read by the core's columnar reader
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


def read_table(path: Path | str, spec: TableSpec | str,
               columns: list[str] | None = None) -> dict[str, np.ndarray]:
    """Read ``columns`` (default: the required ones plus optional ones present) of one
    challenge file; ``spec`` a `TableSpec` or a table key such as ``"persons"``."""
    return read_columns(path, ALL_TABLES[spec] if isinstance(spec, str) else spec, columns)


# --------------------------------------------------------------------------- #
# read_dataset
# --------------------------------------------------------------------------- #
def read_dataset(directory: Path | str, *, with_target: bool = False,
                 num_days: int | None = None) -> PandemicData:
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
    paths = {key: find_table_file(directory, spec) for key, spec in TABLES.items()}
    if with_target:
        paths[TARGET.key] = find_table_file(directory, TARGET)
    hh_ids, hh_size, hid_index = _households(paths["households"])
    persons = _persons(paths["persons"], hid_index)
    residence, activity, lid_index, rl_index = _locations(paths)
    pid_index = persons["pid_index"]
    assignment = _assignment(paths["activity_location_assignment"], pid_index, lid_index)
    home_lid, county, region, region_codes = _homes(assignment, persons, hh_ids, residence,
                                                   rl_index)
    network = _network(paths["population_network"], pid_index, lid_index)
    pids = persons["pids"]
    states = _read_outcomes(paths["disease_outcome_training"], pid_index, pids, num_days)
    target = _read_target(paths[TARGET.key], pid_index, pids) if with_target else None
    return PandemicData(
        pids=pids,
        pid_index=pid_index,
        hid=persons["hid"],
        person_number=persons["person_number"],
        age=persons["age"],
        sex=persons["sex"],
        hh_size=hh_size[persons["hidx"]],
        home_lid=home_lid,
        county=county,
        region=region,
        region_codes=region_codes,
        households=pd.DataFrame({"hid": hh_ids, "hh_size": hh_size}, copy=False),
        residence_locations=residence,
        activity_locations=activity,
        assignment=assignment,
        network=network,
        states=states,
        target=target,
        directory=directory,
        lid_index=lid_index,
    )


_UNKNOWN_LID = "every lid must be an rlid of va_residence_locations or an alid of va_activity_locations"


def _households(p: Path) -> tuple[np.ndarray, np.ndarray, IdIndex]:
    """(sorted hids, their hh_size, an index of the hids)."""
    hh = ColumnarReader(p, TABLES["households"], ["hid", "hh_size"]).read_all()
    hh_ids, order = unique_sorted_ids(hh["hid"], p, "hid", "household")
    hh_size = hh["hh_size"][order]
    if hh_size.size and hh_size.min() < 0:
        i = int(np.flatnonzero(hh["hh_size"] < 0)[0])
        raise DataError(f"{row_where(p, i)}: hh_size is negative; use the household's size")
    return hh_ids, hh_size, IdIndex(hh_ids)


def _persons(p: Path, hid_index: IdIndex) -> dict:
    """The per-person columns sorted by pid, their index, and each person's household row."""
    pe = ColumnarReader(p, TABLES["persons"], ["pid", "hid", "person_number", "age", "sex"]).read_all()
    pids, order = unique_sorted_ids(pe["pid"], p, "pid", "person")
    hid = pe["hid"][order]
    hidx = hid_index.lookup(hid)
    check_known(hidx, hid, p, 0, "hid", "household", "every person's hid must appear in va_household")
    age = pe["age"][order]
    if age.size and age.max() > 130:
        i = int(np.flatnonzero(pe["age"] > 130)[0])
        raise DataError(f"{row_where(p, i)}: age is implausible; ages must lie in 0..130")
    check_codes(pe["sex"], (1, 2), p, 0, "sex", "sex code (1 male, 2 female)")
    return {"pids": pids, "pid_index": IdIndex(pids), "hid": hid, "hidx": hidx, "age": age,
            "sex": pe["sex"][order], "person_number": pe["person_number"][order]}


def _locations(paths: dict[str, Path]) -> tuple[pd.DataFrame, pd.DataFrame, IdIndex, IdIndex]:
    """(residence table, activity-location table, index of all lids, index of the rlids)."""
    p = paths["residence_locations"]
    spec = TABLES["residence_locations"]
    rl_cols = ["rlid", "longitude", "latitude"] + optional_present(p, spec)
    rl = ColumnarReader(p, spec, rl_cols).read_all()
    rlids, order = unique_sorted_ids(rl["rlid"], p, "rlid", "residence location")
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
    al = ColumnarReader(p, TABLES["activity_locations"], al_cols).read_all()
    alids, order = unique_sorted_ids(al["alid"], p, "alid", "activity location")
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
    return residence, activity, IdIndex(all_lids), IdIndex(rlids)


def _assignment(p: Path, pid_index: IdIndex, lid_index: IdIndex) -> pd.DataFrame:
    """The schedules in file order, pid replaced by the person index ("person")."""
    cols = ["pid", "activity_number", "activity_type", "start_time", "duration", "lid"]
    parts: dict[str, list[np.ndarray]] = {c: [] for c in ["person", *cols[1:]]}
    for row0, b in ColumnarReader(p, TABLES["activity_location_assignment"], cols).batches():
        person = pid_index.lookup(b["pid"])
        check_known(person, b["pid"], p, row0, "pid", "person", "every pid must appear in va_person")
        check_known(lid_index.lookup(b["lid"]), b["lid"], p, row0, "lid", "location", _UNKNOWN_LID)
        check_codes(b["activity_type"], ACTIVITY_CODES, p, row0, "activity_type", "activity code")
        parts["person"].append(person)
        for c in cols[1:]:
            parts[c].append(b[c])
        del b
    assign_cols = {c: _concat(v, ALL_TABLES["activity_location_assignment"], c) for c, v in parts.items()}
    del parts
    return pd.DataFrame(assign_cols, copy=False)


def _homes(assignment: pd.DataFrame, persons: dict, hh_ids: np.ndarray,
           residence: pd.DataFrame, rl_index: IdIndex) -> tuple[np.ndarray, ...]:
    """(home_lid, county, region, region_codes) per person: the rlid of a person's first
    home activity (else their household's), its county, and that county's region."""
    rlids = residence["rlid"].to_numpy()
    P = persons["pids"].size
    home_lid = np.full(P, -1, dtype=rlids.dtype if rlids.dtype == np.int64 else np.int32)
    is_home = assignment["activity_type"].to_numpy() == int(ActivityType.HOME)
    hp = assignment["person"].to_numpy()[is_home]
    hl = assignment["lid"].to_numpy()[is_home]
    uniq, first = first_occurrence(hp)
    home_lid[uniq] = hl[first]
    del hp, hl, is_home, uniq, first
    # persons without a home activity inherit their household's home
    missing_home = home_lid < 0
    hidx = persons["hidx"]
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
    return home_lid, county, region, region_codes


def _network(p: Path, pid_index: IdIndex, lid_index: IdIndex) -> ContactNetwork:
    """The contacts in file order, pid1/pid2 replaced by person indices (src/dst)."""
    cols = ["pid1", "pid2", "lid", "start_time", "duration", "activity1", "activity2"]
    net_parts: dict[str, list[np.ndarray]] = {c: [] for c in ["src", "dst", *cols[2:]]}
    fix = "every pid1/pid2 must appear in va_person"
    for row0, b in ColumnarReader(p, TABLES["population_network"], cols).batches():
        src = pid_index.lookup(b["pid1"])
        check_known(src, b["pid1"], p, row0, "pid1", "person", fix)
        dst = pid_index.lookup(b["pid2"])
        check_known(dst, b["pid2"], p, row0, "pid2", "person", fix)
        check_known(lid_index.lookup(b["lid"]), b["lid"], p, row0, "lid", "location", _UNKNOWN_LID)
        check_codes(b["activity1"], ACTIVITY_CODES, p, row0, "activity1", "activity code")
        check_codes(b["activity2"], ACTIVITY_CODES, p, row0, "activity2", "activity code")
        net_parts["src"].append(src)
        net_parts["dst"].append(dst)
        for c in cols[2:]:
            net_parts[c].append(b[c])
        del b
    netspec = ALL_TABLES["population_network"]
    net = {}
    for c in list(net_parts):
        net[c] = _concat(net_parts.pop(c), netspec, c)
    return ContactNetwork(**net)


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
    for row0, b in ColumnarReader(path, TABLES["disease_outcome_training"],
                                  ["day", "pid", "state"]).batches():
        day = b["day"]
        idx = pid_index.lookup(b["pid"])
        check_known(idx, b["pid"], path, row0, "pid", "person", "every pid must appear in va_person")
        if day.size:
            dmin, dmax = int(day.min()), int(day.max())
            if dmin < 0:
                i = int(np.flatnonzero(day < 0)[0])
                raise DataError(f"{row_where(path, row0 + i)}: day is negative; days count from 0")
            if num_days is not None and dmax >= num_days:
                i = int(np.flatnonzero(day >= num_days)[0])
                raise DataError(f"{row_where(path, row0 + i)}: day is outside 0..{num_days - 1}; "
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
                f"{row_where(path, row0 + i)}: this person already has a state for that day; "
                "each (pid, day) must appear once — remove the duplicate rows"
            )
        view[flat] = b["state"]
        total += day.size
        del b, flat, prev, idx, day
    D = num_days if num_days is not None else max_day + 1
    if D <= 0 or P == 0:
        raise DataError(f"{path.name} holds no outcome rows; it needs one row per person and day "
                        "(day, pid, state)")
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
            f"({rows.size} person(s) affected, {int(holes.sum())} missing (pid, day) rows). "
            f"Every person needs a state for every day 0..{D - 1}; add the missing rows"
        )
    if total != P * D:
        _raise_duplicate_outcome(path, pid_index, D, total - P * D)
    return states


def _raise_duplicate_outcome(path: Path, pid_index: IdIndex, D: int, extra: int):
    """Second pass (error path only): find the first repeated (pid, day) row."""
    seen = np.zeros(len(pid_index) * D, dtype=bool)
    for row0, b in ColumnarReader(path, TABLES["disease_outcome_training"],
                                  ["day", "pid", "state"]).batches():
        flat = pid_index.lookup(b["pid"]).astype(np.int64) * D + b["day"]
        order = stable_argsort(flat)
        s = flat[order]
        rep = np.zeros(flat.size, bool)
        rep[order[1:][s[1:] == s[:-1]]] = True  # later copies within the batch
        rep |= seen[flat]
        if rep.any():
            i = int(np.flatnonzero(rep)[0])
            raise DataError(
                f"{row_where(path, row0 + i)}: this person already has a state for that day "
                f"({extra} duplicate (pid, day) row(s) in total); each (pid, day) must appear once — "
                "remove the duplicate rows"
            )
        seen[flat] = True
    raise DataError(f"{path.name}: {extra} more rows than persons x days; each (pid, day) must appear once")


def _read_target(path: Path, pid_index: IdIndex, pids: np.ndarray) -> np.ndarray:
    t = ColumnarReader(path, TARGET, ["pid", "infected"]).read_all()
    idx = pid_index.lookup(t["pid"])
    check_known(idx, t["pid"], path, 0, "pid", "person", "every pid must appear in va_person")
    unique_sorted_ids(t["pid"], path, "pid", "person")
    check_codes(t["infected"], (0, 1), path, 0, "infected", "label")
    target = np.full(pids.size, -1, dtype=np.int8)
    target[idx] = t["infected"]
    if (target < 0).any():
        raise DataError(f"{path.name}: {int((target < 0).sum())} person(s) have no label; "
                        "the target needs one row per person")
    return target

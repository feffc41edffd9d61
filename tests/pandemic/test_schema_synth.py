"""Schema, readers and the synthetic outbreak generator (silofl.pandemic)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import silofl.pandemic.synth.files as synth_files
import silofl.pandemic.synth.outbreak as synth_outbreak
from silofl.errors import ConfigError, DataError
from silofl.pandemic import (
    TABLES,
    TARGET,
    IdIndex,
    generate_outbreak,
    read_dataset,
    synthesize,
)
from silofl.pandemic.schema import ActivityType, expected_filenames

from .conftest import SMALL_OUTBREAK

FILES = [spec.stem + ".csv" for spec in TABLES.values()] + [TARGET.stem + ".csv"]


@pytest.fixture(scope="module")
def small_data(small_outbreak):
    return read_dataset(small_outbreak, with_target=True)


@pytest.fixture
def copy_of(small_outbreak, tmp_path):
    """A private, editable copy of the small dataset."""
    dst = tmp_path / "copy"
    shutil.copytree(small_outbreak, dst)
    return dst


def _distinct_degree(src, dst, n):
    key = np.unique(np.minimum(src, dst).astype(np.int64) * n + np.maximum(src, dst))
    return np.bincount(key // n, minlength=n) + np.bincount(key % n, minlength=n)


def _edit_csv(path: Path, fn):
    df = pd.read_csv(path)
    fn(df).to_csv(path, index=False)


# --- schema -------------------------------------------------------------------------------

def test_schema_has_the_seven_challenge_inputs():
    assert [s.stem for s in TABLES.values()] == [
        "va_person", "va_household", "va_residence_locations", "va_activity_locations",
        "va_activity_location_assignment", "va_population_network", "va_disease_outcome_training"]
    assert TABLES["population_network"].required == (
        "pid1", "pid2", "lid", "start_time", "duration", "activity1", "activity2")
    assert TABLES["persons"].dtypes["pid"] == np.int32
    assert TARGET.stem == "va_disease_outcome_target"
    assert expected_filenames(with_target=True)[-1] == "va_disease_outcome_target.csv"


def test_id_index_dense_and_sparse():
    ids = np.array([3, 10, 11, 500], np.int64)
    for idx in (IdIndex(ids), IdIndex(ids * 10**9)):  # dense table vs binary search
        scale = 1 if idx.ids[-1] == 500 else 10**9
        got = idx.lookup(np.array([11, 3, 4, 500, -7, 10**12]) * scale)
        np.testing.assert_array_equal(got, [2, 0, -1, 3, -1, -1])
        assert idx[500 * scale] == 3 and 4 * scale not in idx


# --- generator: files, determinism, manifest -------------------------------------------------

def test_writes_all_files_and_manifest(small_outbreak):
    names = sorted(p.name for p in small_outbreak.iterdir())
    assert names == sorted(FILES + ["manifest.json"])
    m = json.loads((small_outbreak / "manifest.json").read_text())
    assert m["seed"] == SMALL_OUTBREAK["seed"] and m["params"]["persons"] == 4000
    assert m["rows"]["disease_outcome_training"] == 4000 * 57
    assert m["rows"]["persons"] == 4000 and m["rows"]["disease_outcome_target"] == 4000
    header = (small_outbreak / "va_population_network.csv").read_text().split("\n", 1)[0]
    assert header == "pid1,pid2,lid,start_time,duration,activity1,activity2"


def test_same_seed_gives_identical_files_and_other_seed_differs(small_outbreak, tmp_path):
    again = synthesize(tmp_path / "again", **SMALL_OUTBREAK)
    for name in FILES + ["manifest.json"]:
        assert (tmp_path / "again" / name).read_bytes() == (small_outbreak / name).read_bytes(), name
    other = synthesize(tmp_path / "other", **{**SMALL_OUTBREAK, "seed": 8})
    assert other["content_hash"] != again["content_hash"]
    assert (tmp_path / "other" / "va_population_network.csv").read_bytes() != \
        (small_outbreak / "va_population_network.csv").read_bytes()


def test_rewriting_the_same_dataset_is_a_noop(small_outbreak):
    before = {n: (small_outbreak / n).stat().st_mtime_ns for n in FILES}
    summary = synthesize(small_outbreak, **SMALL_OUTBREAK)
    assert summary["written"] is False
    assert before == {n: (small_outbreak / n).stat().st_mtime_ns for n in FILES}


def test_refuses_directory_holding_a_different_dataset(small_outbreak):
    with pytest.raises(DataError, match=r"different dataset.*seed.*overwrite=True"):
        synthesize(small_outbreak, **{**SMALL_OUTBREAK, "seed": 99})


def test_refuses_directory_with_foreign_files(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="not part of a synthetic dataset"):
        synthesize(tmp_path / "out", persons=300, regions=2, seed=1, overwrite=True)
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_overwrite_replaces_dataset(tmp_path):
    out = tmp_path / "ds"
    a = synthesize(out, persons=300, regions=2, seed=1)
    b = synthesize(out, persons=300, regions=2, seed=2, overwrite=True)
    assert b["written"] and b["content_hash"] != a["content_hash"]
    assert json.loads((out / "manifest.json").read_text())["seed"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no temp/backup dirs left


def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = synth_files._write_file

    def flaky(path, fmt, batches):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full (simulated)")
        return real(path, fmt, batches)

    monkeypatch.setattr(synth_files, "_write_file", flaky)
    with pytest.raises(OSError, match="simulated"):
        synthesize(tmp_path / "ds", persons=300, regions=2, seed=1)
    assert list(tmp_path.iterdir()) == []


def test_bad_generator_arguments():
    with pytest.raises(ConfigError, match="regions"):
        generate_outbreak(persons=100, regions=10)
    with pytest.raises(ConfigError, match="format"):
        synthesize("/nonexistent/never", persons=300, format="xlsx")


# --- generator: realism ------------------------------------------------------------------------

def test_epidemic_targets(small_data, small_outbreak):
    P = small_data.num_persons
    ever_recorded = (small_data.states != 0).any(axis=1) | (small_data.target == 1)
    assert ever_recorded.mean() < 0.05
    stats = json.loads((small_outbreak / "manifest.json").read_text())["stats"]
    assert stats["ever_infected_fraction"] < 0.05  # including asymptomatic infections
    assert 0.0005 <= small_data.target.mean() <= 0.02
    assert small_data.target.sum() == stats["final_window_new_infections"]
    # the label is a transition: nobody recorded I or R by day 56 can be positive
    assert not (small_data.target.astype(bool) & (small_data.states[:, -1] != 0)).any()
    # states never go backwards for recorded infections (S -> I -> R)
    assert (np.diff(small_data.states.astype(np.int16), axis=1) >= 0).all()
    assert P == 4000


def test_contact_degree_is_realistic_and_heavy_tailed(small_data):
    net = small_data.network
    deg = _distinct_degree(net.src, net.dst, small_data.num_persons)
    assert 15 <= deg.mean() <= 30
    assert deg.max() > 4 * deg.mean()
    assert (net.src != net.dst).all() and (net.duration > 0).all()
    cross = small_data.region[net.src] != small_data.region[net.dst]
    assert 0 < cross.mean() < 0.15  # mostly within a region, a few across


def test_households_and_ages_look_like_a_population(small_data):
    sizes = small_data.households["hh_size"].to_numpy()
    assert sizes.sum() == small_data.num_persons
    share = np.bincount(np.minimum(sizes, 6), minlength=7)[1:] / sizes.size
    np.testing.assert_allclose(share, [0.28, 0.35, 0.15, 0.13, 0.06, 0.03], atol=0.04)
    assert 0.15 < (small_data.age < 18).mean() < 0.32
    assert 0.08 < (small_data.age >= 65).mean() < 0.25
    assert set(np.unique(small_data.sex)) == {1, 2}


def test_regions_partition_everyone(small_data):
    assert small_data.num_regions == SMALL_OUTBREAK["regions"]
    assert (small_data.region >= 0).all()
    sizes = np.bincount(small_data.region, minlength=small_data.num_regions)
    assert (sizes > 0).all() and sizes.sum() == small_data.num_persons
    # region = county of the residence location of the home activity
    a = small_data.assignment
    home = a[a["activity_type"] == int(ActivityType.HOME)]
    rl = small_data.residence_locations.set_index("rlid")["county"]
    county_of_home = rl.loc[home["lid"].to_numpy()].to_numpy()
    np.testing.assert_array_equal(small_data.county[home["person"].to_numpy()], county_of_home)
    np.testing.assert_array_equal(small_data.region_codes[small_data.region], small_data.county)
    # members of a household share a region
    hh = pd.DataFrame({"hid": small_data.hid, "r": small_data.region})
    assert (hh.groupby("hid")["r"].nunique() == 1).all()


# --- reading ---------------------------------------------------------------------------------

def test_read_dataset_compact_dtypes(small_data):
    d = small_data
    P = d.num_persons
    assert d.states.shape == (P, 57) and d.states.dtype == np.int8
    assert set(np.unique(d.states)) <= {0, 1, 2}
    assert d.target.shape == (P,) and d.target.dtype == np.int8
    assert (np.diff(d.pids) > 0).all() and d.pids.dtype == np.int32
    for name in ("src", "dst", "lid", "start_time", "duration"):
        assert getattr(d.network, name).dtype == np.int32, name
    assert d.network.activity1.dtype == np.int8
    assert d.age.dtype == np.uint8 and d.region.dtype == np.int16
    for df in (d.households, d.residence_locations, d.activity_locations, d.assignment):
        assert not any(dt == np.dtype(object) for dt in df.dtypes)
    assert d.activity_locations["longitude"].dtype == np.float32
    np.testing.assert_array_equal(d.pid_index.lookup(d.pids), np.arange(P))
    # every contact's location is known
    assert (d.lid_index.lookup(d.network.lid) >= 0).all()
    kw = d.feature_inputs(d.region_members(0))
    assert kw["num_nodes"] == (d.region == 0).sum() and kw["states"].shape == (kw["num_nodes"], 57)


def test_round_trip_csv_gz_parquet_and_memory(small_data, tmp_path):
    o = generate_outbreak(**SMALL_OUTBREAK)
    mem = o.to_pandemic_data()
    for fmt in ("csv.gz", "parquet"):
        synthesize(tmp_path / fmt, **SMALL_OUTBREAK, format=fmt)
        assert {p.suffix for p in (tmp_path / fmt).glob("va_*")} == {".gz" if fmt == "csv.gz" else ".parquet"}
        got = read_dataset(tmp_path / fmt, with_target=True)
        for other in (got, mem):
            for name in ("pids", "hid", "person_number", "age", "sex", "hh_size", "home_lid", "county",
                         "region", "region_codes", "states", "target"):
                a, b = getattr(small_data, name), getattr(other, name)
                assert a.dtype == b.dtype and np.array_equal(a, b), (fmt, name)
            for name in ("src", "dst", "lid", "start_time", "duration", "activity1", "activity2"):
                assert np.array_equal(getattr(small_data.network, name), getattr(other.network, name))
            for t in ("households", "residence_locations", "activity_locations", "assignment"):
                pd.testing.assert_frame_equal(getattr(small_data, t), getattr(other, t))
    # the in-memory states include the horizon; the label is the recorded S -> I transition in it
    onset = (o.states[:, 57:] == 1) & (np.concatenate([o.states[:, 56:57], o.states[:, 57:-1]], 1) == 0)
    np.testing.assert_array_equal(onset.any(axis=1).astype(np.int8), o.target)


def test_reader_accepts_extra_columns_and_any_row_order(copy_of):
    _edit_csv(copy_of / "va_person.csv", lambda df: df.assign(extra="x").sample(frac=1, random_state=0))
    _edit_csv(copy_of / "va_disease_outcome_training.csv", lambda df: df.sample(frac=1, random_state=1))
    d = read_dataset(copy_of)
    assert (np.diff(d.pids) > 0).all() and d.states.shape == (4000, 57)


# --- bad inputs -----------------------------------------------------------------------------------

def test_missing_file(copy_of):
    (copy_of / "va_household.csv").unlink()
    with pytest.raises(DataError, match=r"missing file.*households.*va_household\.csv.*va_person\.csv"):
        read_dataset(copy_of)


def test_missing_target_only_when_asked(copy_of):
    (copy_of / "va_disease_outcome_target.csv").unlink()
    read_dataset(copy_of)
    with pytest.raises(DataError, match="va_disease_outcome_target"):
        read_dataset(copy_of, with_target=True)


def test_missing_column(copy_of):
    _edit_csv(copy_of / "va_person.csv", lambda df: df.drop(columns=["age"]))
    with pytest.raises(DataError, match=r"va_person\.csv \(table 'persons'\) lacks required column\(s\) age"):
        read_dataset(copy_of)


def _no_value(e, *values):
    """Error messages name file, line and column, never a record's value."""
    for v in values:
        assert str(v) not in str(e.value), (v, str(e.value))


def test_duplicate_pid(copy_of):
    _edit_csv(copy_of / "va_person.csv", lambda df: pd.concat([df, df.iloc[[5]]]))
    pid = int(pd.read_csv(copy_of / "va_person.csv")["pid"].iloc[5])
    with pytest.raises(DataError, match=r"duplicate pid \(at va_person\.csv line 7 and "
                                        r"va_person\.csv line 4002\)") as e:
        read_dataset(copy_of)
    _no_value(e, f"pid {pid}")


def test_unknown_pid_in_network(copy_of):
    def add(df):
        row = df.iloc[[0]].copy()
        row["pid2"] = 999_999_999
        return pd.concat([df, row])
    _edit_csv(copy_of / "va_population_network.csv", add)
    with pytest.raises(DataError, match=r"va_population_network\.csv line \d+: column 'pid2' refers to an "
                                        r"unknown person") as e:
        read_dataset(copy_of)
    _no_value(e, 999999999)


@pytest.mark.parametrize("table", ["va_population_network.csv", "va_activity_location_assignment.csv"])
def test_unknown_lid(copy_of, table):
    def bad(df):
        df = df.copy()
        df.loc[df.index[3], "lid"] = 123_456_789
        return df
    _edit_csv(copy_of / table, bad)
    with pytest.raises(DataError, match=rf"{table.replace('.', '[.]')} line 5: column 'lid' refers to an "
                                        r"unknown location") as e:
        read_dataset(copy_of)
    _no_value(e, 123456789)


def test_missing_outcome_days(copy_of):
    path = copy_of / "va_disease_outcome_training.csv"
    df = pd.read_csv(path)
    victim = int(df["pid"].iloc[10])
    df[~((df["pid"] == victim) & df["day"].isin([30, 31]))].to_csv(path, index=False)
    with pytest.raises(DataError, match=r"incomplete.*a person has no state for day\(s\) 30, 31") as e:
        read_dataset(copy_of)
    _no_value(e, victim)
    with pytest.raises(DataError, match=r"no state for day\(s\) 57, 58, 59 \(4000 person"):
        read_dataset(copy_of, num_days=60)


def test_duplicate_outcome_row(copy_of):
    _edit_csv(copy_of / "va_disease_outcome_training.csv", lambda df: pd.concat([df, df.iloc[[100]]]))
    pid = int(pd.read_csv(copy_of / "va_disease_outcome_training.csv")["pid"].iloc[100])
    with pytest.raises(DataError, match=r"line 228002: this person already has a state for that day") as e:
        read_dataset(copy_of)
    _no_value(e, pid)


def test_bad_state_letter(copy_of):
    path = copy_of / "va_disease_outcome_training.csv"
    lines = path.read_text().split("\n")
    lines[20] = lines[20][:-1] + "X"
    path.write_text("\n".join(lines))
    with pytest.raises(DataError, match=r"va_disease_outcome_training\.csv line 21: column 'state' holds an "
                                        r"invalid state") as e:
        read_dataset(copy_of)
    _no_value(e, "'X'")


def test_unparsable_number_names_line(copy_of):
    path = copy_of / "va_person.csv"
    lines = path.read_text().split("\n")
    fields = lines[9].split(",")
    fields[3] = "forty"
    lines[9] = ",".join(fields)
    path.write_text("\n".join(lines))
    with pytest.raises(DataError, match=r"va_person\.csv line 10: column 'age' holds a value that is not an "
                                        r"integer") as e:
        read_dataset(copy_of)
    _no_value(e, "forty", fields[0])  # neither the bad value nor the row's pid


def test_ambiguous_duplicate_table_files(copy_of):
    with open(copy_of / "va_person.csv", "rb") as src, gzip.open(copy_of / "va_person.csv.gz", "wb") as dst:
        dst.write(src.read())
    with pytest.raises(DataError, match="stored more than once"):
        read_dataset(copy_of)


def test_chunked_csv_reading_matches(small_data, small_outbreak, monkeypatch):
    import silofl.data.columnar as columnar_mod

    monkeypatch.setattr(columnar_mod, "CSV_CHUNK_BYTES", 4096)  # many small pieces, lines split across reads
    d = read_dataset(small_outbreak, with_target=True)
    np.testing.assert_array_equal(d.states, small_data.states)
    np.testing.assert_array_equal(d.network.src, small_data.network.src)
    pd.testing.assert_frame_equal(d.assignment, small_data.assignment)


def test_distinct_degree_blocks_agree(small_data):
    net = small_data.network
    ref = _distinct_degree(net.src, net.dst, small_data.num_persons)
    for step in (7, 1000, 1 << 24):
        np.testing.assert_array_equal(
            synth_outbreak._distinct_degree(net.src, net.dst, small_data.num_persons, step), ref)


def test_out_of_range_value_names_line(copy_of):
    _edit_csv(copy_of / "va_activity_location_assignment.csv",
              lambda df: df.assign(activity_type=df["activity_type"].where(df.index != 2, 300)))
    with pytest.raises(DataError, match=r"line 4: column 'activity_type' holds a value that is "
                                        r"not an integer in -128\.\.127") as e:
        read_dataset(copy_of)
    _no_value(e, 300)
    _edit_csv(copy_of / "va_activity_location_assignment.csv",
              lambda df: df.assign(activity_type=df["activity_type"].where(df.index != 2, 9)))
    with pytest.raises(DataError,
                       match=r"line 4: column 'activity_type' holds an invalid activity code") as e:
        read_dataset(copy_of)
    _no_value(e, "holds 9")

"""Loaders: tabular encoding/imputation/errors, School, built-in heart data, synthetic data."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from silofl.data import (
    federation_from_frame,
    linear_silos,
    load_heart_disease,
    load_school,
    load_table,
    mean_estimation,
    vehicle_like,
)
from silofl.errors import ConfigError, DataError

# the School data ships with silofl (builtin/school.mat)
SCHOOL = Path(str(resources.files("silofl.data").joinpath("builtin", "school.mat")))
# These tests are about encoding and loading, not about schemas: they opt into uncharged
# preprocessing (the encoding is read from the table) explicitly.
RAW = {"standardize": "none", "impute": "uncharged"}


def _frame(n_per=(30, 30), seed=0):
    """Two-hospital toy table: numeric, bool-string, categorical columns and a binary label."""
    rng = np.random.default_rng(seed)
    parts = []
    for h, n in zip(("north", "south"), n_per):
        parts.append(pd.DataFrame({
            "hospital": h,
            "age": rng.integers(20, 80, n).astype(float),
            "smoker": rng.choice(["TRUE", "FALSE"], n),
            "colour": rng.choice(["red", "blue"], n),
            "y": np.arange(n) % 2,
        }))
    return pd.concat(parts, ignore_index=True)


def _test_rows(n, seed=0, test_fraction=0.2, skip=()):
    """Row indices split_silo puts in the test part, replaying the loader's generator.
    `skip` = sizes of the silos visited before this one."""
    rng = np.random.default_rng(seed)
    for m in skip:
        rng.permutation(m)
    perm = rng.permutation(n)
    return perm[:int(round(test_fraction * n))]


# --- tabular: encoding --------------------------------------------------------------------

def test_one_hot_schema_agrees_across_silos():
    df = _frame()
    df.loc[5, "colour"] = "green"  # a category only the first silo has
    fed = federation_from_frame(df, "hospital", "y", test_fraction=0.0, **RAW)
    assert fed.names == ["north", "south"]
    assert fed.feature_names == ["age", "smoker", "colour=blue", "colour=green", "colour=red"]
    for s in fed.silos:
        assert s.X_train.shape[1] == fed.dim == 5
        onehot = s.X_train[:, 2:]
        assert np.all(onehot.sum(axis=1) == 1)
        assert set(np.unique(s.X_train[:, 1])) <= {0.0, 1.0}
    assert fed.silo("north").X_train[:, 3].sum() == 1
    assert fed.silo("south").X_train[:, 3].sum() == 0
    assert fed.task == "binary" and fed.meta["classes"] == [0, 1]
    # without a schema the levels came from the pooled table: reported as uncharged
    assert "category levels of 'colour' read from the pooled table" in fed.meta["uncharged"]
    assert "label classes read from the pooled table" in fed.meta["uncharged"]


def test_label_mapping_and_task_inference():
    df = _frame()
    df["y"] = np.where(np.arange(len(df)) % 3 == 0, "sick", np.where(np.arange(len(df)) % 3 == 1,
                                                                     "well", "unknown"))
    fed = federation_from_frame(df, "hospital", "y", **RAW)
    assert fed.task == "multiclass" and fed.num_classes == 3
    assert fed.meta["classes"] == ["sick", "unknown", "well"]
    assert set(np.unique(fed.silos[0].y_train)) == {0, 1, 2}
    df["y"] = np.linspace(0, 1, len(df))
    fed = federation_from_frame(df, "hospital", "y", **RAW)
    assert fed.task == "regression" and "classes" not in fed.meta
    df["y"] = np.arange(len(df)) % 2 * 5 + 3  # values {3, 8} -> classes 0, 1
    fed = federation_from_frame(df, "hospital", "y", **RAW)
    assert fed.task == "binary" and fed.meta["classes"] == [3, 8]


def test_missing_labels_are_dropped_and_counted():
    df = _frame()
    df["y"] = df["y"].astype(float)
    df.loc[[0, 1, 40], "y"] = np.nan
    with pytest.warns(UserWarning, match="3 row"):
        fed = federation_from_frame(df, "hospital", "y", test_fraction=0.0, **RAW)
    assert fed.meta["dropped"]["missing_label"] == 3
    assert [s.n_train for s in fed.silos] == [28, 29]


# --- tabular: missing values --------------------------------------------------------------

def test_uncharged_imputation_uses_only_own_training_rows():
    n = 20
    df = pd.DataFrame({"site": ["a"] * n + ["b"] * n,
                       "x": np.concatenate([np.arange(n, dtype=float), np.full(n, np.nan)]),
                       "y": np.tile([0, 1], n)})
    test_a = _test_rows(n, seed=3)
    train_a = np.setdiff1d(np.arange(n), test_a)
    df.loc[test_a, "x"] = 1e6  # extreme test values must not move the median
    nan_train, nan_test = train_a[0], test_a[0]
    df.loc[[nan_train, nan_test], "x"] = np.nan
    expected = np.median(df.loc[train_a[1:], "x"])
    fed = federation_from_frame(df, "site", "y", seed=3, **RAW)
    assert fed.feature_names == ["x", "x__missing"]
    a = fed.silo("a")
    for X in (a.X_train, a.X_test):
        filled = X[X[:, 1] == 1, 0]
        assert filled.size == 1 and filled[0] == pytest.approx(expected)
    assert a.X_train[:, 0].max() < 1e6
    assert "per-silo training median of 'x' (imputation)" in fed.meta["uncharged"]
    # silo b never observed x: no statistic crosses silos, so it gets 0 (no declared fill
    # or bounds) -- not silo a's median
    b = fed.silo("b")
    assert np.all(b.X_train[:, 1] == 1)
    assert np.all(b.X_train[:, 0] == 0.0) and expected != 0.0


def test_missing_indicator_and_missing_category():
    df = _frame()
    df.loc[3, "age"] = np.nan         # only north has a gap ...
    df.loc[50, "colour"] = np.nan
    fed = federation_from_frame(df, "hospital", "y", test_fraction=0.0, **RAW)
    assert fed.feature_names == ["age", "age__missing", "smoker", "colour=blue", "colour=red",
                                 "colour=<missing>"]
    north, south = fed.silos
    assert north.X_train[:, 1].sum() == 1 and south.X_train[:, 1].sum() == 0  # ... both get it
    assert south.X_train[:, 5].sum() == 1 and north.X_train[:, 5].sum() == 0
    assert np.all(np.isfinite(north.X_train))


def test_missing_drop_and_error_strategies():
    df = _frame()
    df.loc[[2, 33], "age"] = np.nan
    df.loc[4, "colour"] = None
    with pytest.warns(UserWarning, match="3 row"):
        fed = federation_from_frame(df, "hospital", "y", missing="drop", test_fraction=0.0,
                                    **RAW)
    assert fed.meta["dropped"]["missing_features"] == 3
    assert [s.n_train for s in fed.silos] == [28, 29]
    assert "age__missing" not in fed.feature_names
    assert not any("<missing>" in c for c in fed.feature_names)
    with pytest.raises(DataError, match=r"age \(2\).*colour \(1\).*missing='impute'"):
        federation_from_frame(df, "hospital", "y", missing="error")
    with pytest.raises(ConfigError, match="missing must be"):
        federation_from_frame(df, "hospital", "y", missing="zero")


# --- tabular: files and errors ------------------------------------------------------------

def test_csv_gz_and_parquet_give_identical_federations(tmp_path):
    df = _frame()
    df.loc[7, "age"] = np.nan
    df.loc[8, "colour"] = None
    df.to_csv(tmp_path / "t.csv", index=False)
    df.to_csv(tmp_path / "t.csv.gz", index=False)
    df.to_parquet(tmp_path / "t.parquet", index=False)
    feds = [load_table(tmp_path / f, "hospital", "y", seed=5, standardize="uncharged")
            for f in ("t.csv", "t.csv.gz", "t.parquet")]
    ref = feds[0]
    for fed in feds[1:]:
        assert fed.feature_names == ref.feature_names and fed.names == ref.names
        assert fed.task == ref.task
        for s, r in zip(fed.silos, ref.silos):
            for part in ("X_train", "y_train", "X_test", "y_test"):
                np.testing.assert_array_equal(getattr(s, part), getattr(r, part))


def test_file_errors_name_the_path(tmp_path):
    with pytest.raises(DataError, match="not found.*nope.csv"):
        load_table(tmp_path / "nope.csv", "hospital", "y")
    (tmp_path / "t.xlsx").write_bytes(b"x")
    with pytest.raises(DataError, match=r"unsupported file type '\.xlsx'.*\.parquet"):
        load_table(tmp_path / "t.xlsx", "hospital", "y")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="could not read.*bad.parquet"):
        load_table(tmp_path / "bad.parquet", "hospital", "y")
    (tmp_path / "bad.csv.gz").write_bytes(b"plain text, not gzip")
    with pytest.raises(DataError, match="could not read.*bad.csv.gz"):
        load_table(tmp_path / "bad.csv.gz", "hospital", "y")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(DataError, match="empty"):
        load_table(tmp_path / "empty.csv", "hospital", "y")
    (tmp_path / "header.csv").write_text("hospital,age,y\n")
    with pytest.raises(DataError, match="empty.*0 rows"):
        load_table(tmp_path / "header.csv", "hospital", "y")


def test_unknown_columns_suggest_nearest_name():
    df = _frame()
    with pytest.raises(DataError, match=r"unknown silo column 'hopsital'.*hospital, age.*"
                                        r"Did you mean 'hospital'\?"):
        federation_from_frame(df, "hopsital", "y")
    with pytest.raises(DataError, match=r"unknown label column 'Age'.*Did you mean 'age'"):
        federation_from_frame(df, "hospital", "Age")
    with pytest.raises(DataError, match=r"unknown feature column 'colur'.*'colour'"):
        federation_from_frame(df, "hospital", "y", features=["age", "colur"])
    with pytest.raises(DataError, match="label column 'y' is listed in features"):
        federation_from_frame(df, "hospital", "y", features=["age", "y"])
    fed = federation_from_frame(df, "hospital", "y", features=["colour", "age"], **RAW)
    assert fed.feature_names == ["colour=blue", "colour=red", "age"]


def test_unencodable_text_column_is_rejected():
    df = _frame()
    df["note"] = [f"patient said {i}" for i in range(len(df))]
    with pytest.raises(DataError, match=r"non-numeric feature that cannot be encoded: column "
                                        r"'note'.*leave it out of the features") as err:
        federation_from_frame(df, "hospital", "y", **RAW)
    assert "patient said" not in str(err.value)  # counts and names only, never values
    fed = federation_from_frame(df, "hospital", "y", categorical_max_levels=100,
                                test_fraction=0.0, **RAW)
    assert fed.dim == 4 + 60
    df["note"] = [str(i * 1.5) for i in range(len(df))]  # numbers stored as text parse fine
    fed = federation_from_frame(df, "hospital", "y", test_fraction=0.0, **RAW)
    assert fed.feature_names[-1] == "note"
    assert np.sort(fed.silos[0].X_train[:, -1])[1] == 1.5


def test_bad_silos_and_values_name_the_silo():
    df = _frame()
    df.loc[10, "age"] = np.inf
    with pytest.raises(DataError, match=r"column 'age': 1 value\(s\) are infinite "
                                        r"\(silo 'north': 1\)"):
        federation_from_frame(df, "hospital", "y", **RAW)
    df = pd.concat([_frame(), pd.DataFrame({"hospital": ["tiny"], "age": [50.0],
                                            "smoker": ["TRUE"], "colour": ["red"], "y": [1]})])
    with pytest.raises(DataError, match=r"silo 'tiny' has 1 training example.*Merge it"):
        federation_from_frame(df, "hospital", "y", **RAW)
    df = _frame()
    df.loc[df.hospital == "south", "y"] = 1
    with pytest.raises(DataError, match=r"silo 'south' has a single class.*Drop the silo"):
        federation_from_frame(df, "hospital", "y", **RAW)
    df["y"] = 1
    with pytest.raises(DataError, match="single value"):
        federation_from_frame(df, "hospital", "y", **RAW)
    with pytest.raises(DataError, match="empty"):
        federation_from_frame(_frame().iloc[:0], "hospital", "y", **RAW)


# --- tabular: standardization and determinism ---------------------------------------------

def test_uncharged_standardization_fitted_on_train_only():
    fed = federation_from_frame(_frame(n_per=(80, 60)), "hospital", "y", features=["age"],
                                standardize="uncharged")
    for s in fed.silos:
        assert abs(s.X_train.mean()) < 1e-12
        assert s.X_train.std() == pytest.approx(1.0)
        assert abs(s.X_test.mean()) > 1e-6  # test rows did not enter the statistics
    assert "per-silo training mean and standard deviation of 'age' (standardization)" \
        in fed.meta["uncharged"]
    raw = federation_from_frame(_frame(n_per=(80, 60)), "hospital", "y", features=["age"],
                                **RAW)
    s, r = fed.silos[0], raw.silos[0]
    mu, sd = r.X_train.mean(), r.X_train.std()
    np.testing.assert_allclose(s.X_test, (r.X_test - mu) / sd)


def test_splits_are_deterministic_in_seed():
    a = federation_from_frame(_frame(), "hospital", "y", seed=11, **RAW)
    b = federation_from_frame(_frame(), "hospital", "y", seed=11, **RAW)
    c = federation_from_frame(_frame(), "hospital", "y", seed=12, **RAW)
    np.testing.assert_array_equal(a.silos[1].X_test, b.silos[1].X_test)
    assert not np.array_equal(a.silos[1].X_test, c.silos[1].X_test)
    assert [s.n_test for s in a.silos] == [6, 6]


# --- real data ----------------------------------------------------------------------------

def test_school():
    fed = load_school(SCHOOL)
    assert fed.num_silos == 139 and fed.dim == 28 and fed.task == "regression"
    assert fed.names[0] == "school-000" and fed.names[-1] == "school-138"
    assert sum(s.n_train + s.n_test for s in fed.silos) == 15362
    ys = np.concatenate([np.r_[s.y_train, s.y_test] for s in fed.silos])
    assert ys.min() >= 0 and ys.max() <= 1 and ys.min() == 0 and ys.max() == 1
    sizes = [s.n_train + s.n_test for s in fed.silos]
    assert min(sizes) == 22 and max(sizes) == 251
    # declared schema: nothing uncharged; percentages x03, x04 mapped from [0, 100] to
    # [-1, 1], every other column stays 0/1
    assert fed.meta["uncharged"] == []
    assert [st["column"] for st in fed.meta["preprocessing"]["steps"]] == ["x03", "x04"]
    X = np.concatenate([np.r_[s.X_train, s.X_test] for s in fed.silos])
    raw = load_school(SCHOOL, standardize="none")
    R = np.concatenate([np.r_[s.X_train, s.X_test] for s in raw.silos])
    np.testing.assert_allclose(X[:, 3:5], R[:, 3:5] / 50 - 1)
    others = np.delete(X, [3, 4], axis=1)
    assert set(np.unique(others)) <= {0.0, 1.0} and np.all(X[:, 27] == 1)


def test_school_missing_file(tmp_path):
    with pytest.raises(DataError, match="not found.*school.mat"):
        load_school(tmp_path / "school.mat")


def test_heart_disease_builtin():
    fed = load_heart_disease(seed=0)
    assert fed.names == ["Cleveland", "Hungary", "Switzerland", "VA Long Beach"]
    assert [s.n_train + s.n_test for s in fed.silos] == [304, 293, 123, 200]
    assert fed.task == "binary" and fed.num_classes == 2
    for s in fed.silos:
        assert set(np.unique(np.r_[s.y_train, s.y_test])) == {0, 1}
        assert np.all(np.isfinite(s.X_train)) and np.all(np.isfinite(s.X_test))
    assert "id" not in fed.feature_names and "num" not in fed.feature_names
    assert "ca__missing" in fed.feature_names and "thal=<missing>" in fed.feature_names
    assert "cp=asymptomatic" in fed.feature_names
    assert fed.dim == 34  # every declared level; every clinical column nullable
    # fully declared from the public documentation: no cost, nothing uncharged
    assert fed.meta["uncharged"] == []
    assert all(st["mode"] == "declared" for st in fed.meta["preprocessing"]["steps"])
    assert fed.meta["preprocessing"]["share"] == 0.0
    pos = sum(int(np.r_[s.y_train, s.y_test].sum()) for s in fed.silos)
    assert pos == 509  # num > 0 in 920 - 411 rows
    # most rows lack ca/thal, so dropping them leaves Hungary with (almost) nothing
    with pytest.warns(UserWarning, match="dropped 621"), \
            pytest.raises(DataError, match="silo 'Hungary'.*missing='impute' keeps them"):
        load_heart_disease(missing="drop")


# --- synthetic ----------------------------------------------------------------------------

def test_mean_estimation_model():
    fed = mean_estimation(num_silos=400, n=40, sigma=2.0, tau=0.5, theta=3.0, seed=1)
    c = fed.meta["centers"]
    assert c.shape == (400,) and fed.dim == 0 and fed.task == "regression"
    assert c.std() == pytest.approx(0.5, rel=0.15) and c.mean() == pytest.approx(3.0, abs=0.1)
    s = fed.silos[0]
    assert s.X_train.shape == (40, 0) and s.n_test == 10
    # silo sample means scatter around their centres with variance sigma^2 / n
    means = np.array([s.y_train.mean() for s in fed.silos])
    assert np.std(means - c) == pytest.approx(2.0 / np.sqrt(40), rel=0.15)
    het = mean_estimation(sizes=[5, 10, 20], seed=1)
    assert [s.n_train for s in het.silos] == [5, 10, 20]
    assert np.array_equal(mean_estimation(seed=4).meta["centers"],
                          mean_estimation(seed=4).meta["centers"])


def test_linear_silos():
    fed = linear_silos(num_silos=5, sizes=(50, 60), dim=4, seed=2)
    assert all(50 <= s.n_train <= 60 for s in fed.silos) and fed.num_silos == 5
    assert fed.meta["weights"].shape == (5, 4)
    s, w = fed.silos[0], fed.meta["weights"][0]
    resid = s.y_train - s.X_train @ w
    assert resid.std() == pytest.approx(0.1, rel=0.3)
    binary = linear_silos(sizes=[30, 40], dim=3, task="binary", seed=2)
    assert [s.n_train for s in binary.silos] == [30, 40] and binary.task == "binary"
    with pytest.raises(ConfigError):
        linear_silos(num_silos=3, sizes=[30, 40])


def test_vehicle_like():
    fed = vehicle_like(seed=0)
    sizes = [s.n_train for s in fed.silos]
    assert fed.num_silos == 23 and fed.dim == 100 and fed.task == "binary"
    assert min(sizes) == 872 and max(sizes) == 1933 and sizes == sorted(sizes)
    for s in fed.silos:
        assert set(np.unique(s.y_train)) == {0, 1}
        assert s.n_test == pytest.approx(0.25 * s.n_train, abs=1)


def test_shipped_school_file_is_the_published_copy_and_loads_without_a_path():
    shared = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "school.mat"
    if shared.is_file():  # beside a checkout: the shipped bytes are that file's
        assert SCHOOL.read_bytes() == shared.read_bytes()
    fed = load_school()
    assert fed.num_silos == 139 and sum(s.n_train + s.n_test for s in fed.silos) == 15362

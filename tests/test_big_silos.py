"""Silos larger than memory (`silofl.data.lazy`, issue 25 item 3): a lazy Parquet silo
trains exactly as the same table in memory, is charged the same, reads only sampled rows,
and peaks at a fraction of the in-memory resident memory."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from silofl.config import config_from_dict
from silofl.data.lazy import LazyRows, LazySource, load_table_lazy
from silofl.data.schema import schema_from_dict
from silofl.data.tabular import load_table_raw
from silofl.errors import ConfigError, DataError
from silofl.experiments.run import run
from silofl.training.silo_data import SiloArrays

D = 5
SCHEMA = {"label": {"name": "y", "kind": "binary", "classes": [0, 1]},
          "columns": [{"name": f"f{j}", "kind": "numeric", "lower": -3, "upper": 3,
                       "nullable": j == 3} for j in range(D)]}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """A float32 Parquet table of three silos (column "site"), NaN in nullable f3, in row
    groups of 1000 rows; its schema file."""
    tmp = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(0)
    n = 6000
    X = rng.standard_normal((n, D)).astype(np.float32) * 1.5
    X[rng.random(n) < 0.1, 3] = np.nan
    df = pd.DataFrame({f"f{j}": X[:, j] for j in range(D)})
    df["y"] = (X[:, 0] - X[:, 1] + rng.standard_normal(n) > 0).astype(np.int64)
    df["site"] = np.array(["north", "south", "east"])[rng.integers(0, 3, n)]
    path = tmp / "t.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, row_group_size=1000)
    (tmp / "schema.toml").write_text(schema_from_dict(SCHEMA).to_toml())
    return path, tmp / "schema.toml", df


def _cfg(path, schema, lazy, mode="private", **data):
    return config_from_dict({
        "data": {"source": "table", "path": str(path), "silo_column": "site",
                 "label_column": "y", "schema": str(schema), "lazy": lazy,
                 "standardize": mode, "impute": mode, **data},
        "model": {"name": "logistic"},
        "training": {"methods": ["local", "mrmtl"], "rounds": 4, "batch_size": 32,
                     "lr": 0.2},
        "privacy": {"epsilon": 2.0, "delta": 1e-5, "noise": "seeded"},
        "output": {"dir": ""}, "budget": {"scratch": True}})


def _charges(result) -> list[list[tuple]]:
    return [[(e.label, e.round, repr(e.event)) for e in led.entries] for led in result.ledgers]


@pytest.mark.parametrize("mode", ["private", "declared"])
def test_lazy_training_equals_in_memory(table, mode, monkeypatch):
    path, schema, _ = table
    monkeypatch.setattr("silofl.data.lazy.CHUNK_ROWS", 500)  # statistics over many chunks
    before = LazyRows.materialised
    mem, lazy = run(_cfg(path, schema, False, mode)), run(_cfg(path, schema, True, mode))
    assert LazyRows.materialised == before  # no training path turned a silo into an array
    for a, b in zip(mem.results, lazy.results, strict=True):
        # atol 1e-7: in-memory silos train on the fused GLM pass (float32 logits and bias
        # sums, training.fused), lazy ones on the general path: ~4e-9 apart after the run
        np.testing.assert_allclose(b.params, a.params, rtol=0, atol=1e-7)
        assert _charges(b) == _charges(a) and _charges(a)[0]  # the same charges, in order
        assert b.final_per_silo == pytest.approx(a.final_per_silo, abs=1e-12)
    assert lazy.combined_privacy == mem.combined_privacy
    assert lazy.preprocessing == mem.preprocessing  # same steps, same noise
    # the released statistics: the same sums (in another order) plus the same noise draw
    for name, want in mem.release["constants"]["silos"].items():
        got = lazy.release["constants"]["silos"][name]
        assert got["fill"] == pytest.approx(want["fill"], rel=1e-12)
        for col, cs in want["standardize"].items():
            assert got["standardize"][col] == pytest.approx(cs, rel=1e-12)


def test_lazy_rows_match_the_table_and_gather_like_silo_arrays(table, tmp_path):
    path, schema, _ = table
    raw = load_table_lazy(path, "site", "y", schema=schema, seed=3, cache_dir=tmp_path)
    mem = load_table_raw(path, "site", "y", schema=schema, seed=3)
    assert raw.names == mem.names
    for a, b in zip(raw.silos, mem.silos, strict=True):
        assert a.X_train.shape == b.X_train.shape
        idx = np.array([5, 0, 5, a.n_train - 1])  # any order, repeats: as Poisson pads
        np.testing.assert_array_equal(a.X_train.take(idx), b.X_train[idx])
        part = a.X_train[idx[1:]]  # a split of the training rows stays on disk
        assert isinstance(part, LazyRows) and part.shape == (3, b.X_train.shape[1])
        np.testing.assert_array_equal(part.take(np.arange(3)), b.X_train[idx[1:]])
        np.testing.assert_array_equal(a.X_train[7], b.X_train[7])
        np.testing.assert_array_equal(a.X_test, b.X_test)
        np.testing.assert_array_equal(a.y_train, b.y_train)
    fed_mem = [np.nan_to_num(s.X_train) for s in mem.silos]
    src = LazySource([s.X_train.with_transform(_zero_fill(s.X_train)) for s in raw.silos],
                     [s.y_train for s in raw.silos])
    arrays = SiloArrays.stack(fed_mem, [s.y_train for s in mem.silos])
    silos, idx = np.array([2, 0]), np.array([[1, 2, 0], [7, 7, 3]])
    for got, want in zip(src.gather(silos, idx), arrays.gather(silos, idx), strict=True):
        np.testing.assert_array_equal(got, want)
    assert any(p.suffix == ".f32" for p in next(tmp_path.iterdir()).iterdir())


def _zero_fill(X):
    from silofl.data.lazy import Transform
    t = Transform.identity(X.shape[1])
    t.fill[:] = 0.0
    return t


def test_one_dataset_per_silo_directory(table, tmp_path):
    path, schema, df = table
    for name, part in df.groupby("site", sort=False):
        part.drop(columns="site").to_parquet(tmp_path / f"{name}.parquet", index=False)
    (tmp_path / "_SUCCESS").write_text("")  # a writer's marker file: not a silo
    raw = load_table_lazy(tmp_path, "", "y", schema=schema)
    assert sorted(raw.names) == sorted(df["site"].unique())
    sizes = df["site"].value_counts()
    assert all(s.n_train + s.n_test == sizes[s.name] for s in raw.silos)
    df.iloc[:0].drop(columns="site").to_parquet(tmp_path / "west.parquet", index=False)
    with pytest.raises(DataError, match="'west'.*no rows"):
        load_table_lazy(tmp_path, "", "y", schema=schema)


def test_refusals_before_any_charge(table, tmp_path):
    path, schema, _ = table
    with pytest.raises(ConfigError, match="median"):  # uncharged imputation does not stream
        run(_cfg(path, schema, True, "uncharged"))
    with pytest.raises(ConfigError, match="declared schema"):
        load_table_lazy(path, "site", "y", schema=None)
    with pytest.raises(DataError, match="not found"):
        load_table_lazy(tmp_path / "nope", "site", "y", schema=schema)
    bad = pd.read_parquet(path)
    bad.loc[7, "f0"] = np.nan  # f0 is not nullable
    bad.to_parquet(tmp_path / "bad.parquet", index=False)
    with pytest.raises(DataError, match="'f0'"):
        load_table_lazy(tmp_path / "bad.parquet", "site", "y", schema=schema)


def test_peak_memory_well_below_in_memory(tmp_path):
    """A moderate case (200k rows × 100 features), each path in a fresh process: what the
    data adds to the lazy silo's peak resident memory (its peak less the interpreter's and
    imports') is a fraction of what it adds in memory (a ratio, not a time)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_big_silos as bench
    parts = bench.generate(tmp_path / "parts", 40_000, 5, 100)
    schema = bench.schema_file(tmp_path, 100)
    path, n = bench.with_silo_column(tmp_path, parts)
    added = {}
    for lazy in (True, False):
        cfg = bench.config(path, schema, lazy, tmp_path / "cache", 512, 1, 0.05, "site")
        got = bench.run_case(cfg, timeout=120)
        added[lazy] = got["peak_bytes"] - got["base_bytes"]
    assert n == 200_000
    assert 0 < added[True] < 0.5 * added[False], added

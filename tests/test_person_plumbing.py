"""Person-level DP plumbing (issue 23): a table's person column reaches the silos (never a
feature), splits keep each person whole, [privacy] unit reaches the training config with
specific errors, private preprocessing counts persons, the budget store records the unit
of every charge and refuses to mix units, and the outputs state the unit."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

from silofl.cli import app
from silofl.config import config_from_dict
from silofl.data import federation_from_frame, load_table, split_frame
from silofl.data.column_stats import sufficient_statistics
from silofl.data.persons import on_test_side
from silofl.data.preprocess import PreprocessSpec, plan_preprocessing
from silofl.data.raw import RawFederation
from silofl.data.schema import ColumnSpec
from silofl.errors import ConfigError, DataError
from silofl.experiments import build
from silofl.privacy import accounting as A
from silofl.privacy import events
from silofl.privacy.budget import BudgetStore, BudgetStoreError, PlannedCharge
from silofl.privacy.targets import PrivacyTarget
from silofl.privacy.units import group_bound_note

SCHEMA = {"source": "test", "label": {"name": "y", "kind": "binary", "classes": [0, 1]},
          "columns": [{"name": "x1", "kind": "numeric", "lower": -4.0, "upper": 4.0},
                      {"name": "x2", "kind": "numeric", "lower": -4.0, "upper": 4.0}]}


def _ehr(n_persons: int = 200, seed: int = 0, share_two: float = 0.2) -> pd.DataFrame:
    """Persons with 1 + Poisson(3) visits, some of them at two hospitals."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_persons):
        where = rng.choice(["H1", "H2", "H3"], size=1 + int(rng.random() < share_two),
                           replace=False)
        a = rng.normal()
        for _ in range(1 + rng.poisson(3)):
            x1 = a + 0.3 * rng.normal()
            rows.append({"hospital": str(rng.choice(where)), "patient": f"P{p:04d}",
                         "x1": x1, "x2": rng.normal(),
                         "y": int(rng.random() < 1 / (1 + math.exp(-x1)))})
    return pd.DataFrame(rows)


def _fed(df: pd.DataFrame, **kw):
    return federation_from_frame(df, "hospital", "y", schema=SCHEMA, person_column="patient",
                                 **kw)


# --- the reader ------------------------------------------------------------------------------

def test_a_person_column_reaches_the_silos_and_is_never_a_feature():
    df = _ehr()
    fed = _fed(df)
    assert fed.has_persons and fed.feature_names == ["x1", "x2"]
    for s in fed.silos:
        assert s.person_train.shape == (s.n_train,) and s.person_test.shape == (len(s.y_test),)
        assert s.n_persons == len(set(df.loc[df.hospital == s.name, "patient"]) &
                                  set(s.person_train))
        assert all(isinstance(p, str) and p.startswith("P") for p in s.person_train)
    # without a schema the auto features leave the person column out too
    auto = federation_from_frame(df, "hospital", "y", person_column="patient",
                                 standardize="uncharged")
    assert "patient" not in " ".join(auto.feature_names)
    # without person_column nothing changes: no persons, the same rows per silo
    plain = federation_from_frame(df.drop(columns="patient"), "hospital", "y", schema=SCHEMA)
    assert not plain.has_persons and plain.silos[0].person_train is None


def test_integer_ids_stay_integers_and_csv_ids_stay_exact_text(tmp_path):
    df = _ehr(60)
    df["patient"] = df["patient"].str[1:].astype(int)
    fed = _fed(df)
    assert fed.silos[0].person_train.dtype == np.int64
    path = tmp_path / "t.csv"
    df.assign(patient=np.where(df.patient % 2 == 0, "0" + df.patient.astype(str),
                               df.patient.astype(str))).to_csv(path, index=False)
    read = load_table(path, "hospital", "y", schema=SCHEMA, person_column="patient")
    ids = np.concatenate([s.person_train for s in read.silos])
    assert any(p.startswith("0") for p in ids)  # "0012" is read as written, not as 12


def test_a_persons_rows_stay_together_on_one_side_in_every_silo():
    df = _ehr(300, share_two=0.4)
    fed = _fed(df)
    side: dict[str, set] = {}
    for s in fed.silos:
        assert not set(s.person_train) & set(s.person_test)  # never split across sides
        for p in s.person_train:
            side.setdefault(p, set()).add("train")
        for p in s.person_test:
            side.setdefault(p, set()).add("test")
    multi = df.groupby("patient").hospital.nunique()
    shared = set(multi[multi > 1].index)
    assert len(shared) > 20
    assert all(len(side[p]) == 1 for p in shared)  # one side in every silo that sees them
    share = np.mean([side[p] == {"test"} for p in side])
    assert 0.1 < share < 0.3  # test_fraction 0.2 of persons, in expectation


def test_the_side_is_a_keyed_hash_of_the_id_not_of_the_data():
    ids = np.array([f"P{i}" for i in range(500)], dtype=object)
    a = on_test_side(ids, 0.2, seed=0)
    # another silo's data, or fewer rows, do not move a person
    assert np.array_equal(on_test_side(ids[::3], 0.2, seed=0), a[::3])
    assert not np.array_equal(on_test_side(ids, 0.2, seed=1), a)  # the seed re-draws it
    assert np.array_equal(on_test_side(np.arange(5), 0.2, 0),
                          on_test_side(np.array(["0", "1", "2", "3", "4"], dtype=object), 0.2, 0))


def test_simulated_silos_keep_each_person_in_one_silo():
    df = _ehr(300).drop(columns="hospital")
    fed = split_frame(df, "y", "iid", num_silos=4, schema=SCHEMA, person_column="patient",
                      seed=3)
    where: dict[str, set] = {}
    for s in fed.silos:
        assert not set(s.person_train) & set(s.person_test)
        for p in [*s.person_train, *s.person_test]:
            where.setdefault(p, set()).add(s.name)
    assert len(where) == df.patient.nunique()
    assert max(len(v) for v in where.values()) == 1
    assert sum(s.n_train + len(s.y_test) for s in fed.silos) == len(df)


@pytest.mark.parametrize("kw, what", [
    ({"features": ["x1", "patient"]}, "never a feature"),
    ({"person_column": "hospital"}, "silo column"),
    ({"person_column": "y"}, "label column"),
    ({"person_column": "patinet"}, "Did you mean 'patient'"),
])
def test_the_person_column_is_refused_as_a_feature_silo_or_label(kw, what):
    args = {"person_column": "patient", **kw}
    with pytest.raises((DataError, ConfigError), match=what):
        federation_from_frame(_ehr(40), "hospital", "y", standardize="uncharged", **args)


def test_a_schema_that_declares_the_person_column_is_refused():
    schema = {**SCHEMA, "columns": [*SCHEMA["columns"],
                                    {"name": "patient", "kind": "categorical",
                                     "levels": ["P0000"]}]}
    with pytest.raises(ConfigError, match="person id is never a feature"):
        federation_from_frame(_ehr(40), "hospital", "y", schema=schema,
                              person_column="patient")


def test_missing_person_ids_are_refused_or_dropped():
    df = _ehr(80)
    df.loc[[3, 7, 11], "patient"] = None
    with pytest.raises(DataError, match=r"3 row\(s\) have no person id.*missing = \"drop\""):
        _fed(df)
    with pytest.warns(UserWarning, match="without a person id"):
        fed = _fed(df, missing="drop")
    assert sum(s.n_train + len(s.y_test) for s in fed.silos) == len(df) - 3


# --- configuration -------------------------------------------------------------------------

def _cfg(d: Path, privacy: dict, data: dict | None = None) -> dict:
    _ehr(120).to_csv(d / "ehr.csv", index=False)
    (d / "schema.toml").write_text(tomli_w.dumps(SCHEMA))
    return {"data": {"source": "table", "path": str(d / "ehr.csv"), "silo_column": "hospital",
                     "label_column": "y", "schema": str(d / "schema.toml"),
                     "person_column": "patient", **(data or {})},
            "training": {"rounds": 2, "methods": ["local"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-4, **privacy},
            "budget": {"store": str(d / "b.sqlite")},
            "output": {"dir": str(d / "runs"), "name": "job"}}


def test_the_unit_reaches_the_training_config(tmp_path):
    cfg = config_from_dict(_cfg(tmp_path, {"unit": "person", "max_rows_per_person": 3}))
    tc = build.training_config(cfg)
    assert tc.privacy_unit == "person" and tc.max_rows_per_person == 3
    assert build.training_config(config_from_dict(_cfg(tmp_path, {}))).privacy_unit == \
        "example"


@pytest.mark.parametrize("privacy, data, what", [
    ({"unit": "person"}, {"person_column": ""}, "needs [data] person_column"),
    ({"unit": "persn"}, {}, "Did you mean 'person'"),
    ({"max_rows_per_person": 2}, {}, "applies only with [privacy] unit = \"person\""),
])
def test_bad_units_exit_2_before_anything_is_charged(tmp_path, privacy, data, what):
    path = tmp_path / "job.toml"
    path.write_text(tomli_w.dumps(_cfg(tmp_path, privacy, data)))
    res = CliRunner().invoke(app, ["run", "--config", str(path), "-q"])
    assert res.exit_code == 2, res.output
    assert what in " ".join(res.output.split())
    store = tmp_path / "b.sqlite"
    assert not store.exists() or not sqlite3.connect(store).execute(
        "SELECT COUNT(*) FROM charges").fetchone()[0]


def test_a_person_column_under_a_builtin_source_is_refused():
    cfg = config_from_dict({"data": {"source": "heart", "person_column": "id"}})
    with pytest.raises(ConfigError, match="person_column applies only to data.source = 'table'"):
        build.load_raw(cfg.data)


# --- the lifetime store --------------------------------------------------------------------

EV = A.dpsgd_event(0.1, 4.0, 10)


def _charge(st: BudgetStore, run: str, unit: str | None, label: str = "dpsgd") -> None:
    st.register({"a": PrivacyTarget(10.0, 1e-5)})
    if unit:
        st.use_unit(unit)
    st.reserve(run, [PlannedCharge("a", "m", label, EV)], command="t", noise="secure")
    st.settle(run, [PlannedCharge("a", "m", label, EV)])


def test_the_store_records_the_unit_and_refuses_to_mix_units(tmp_path):
    st = BudgetStore(tmp_path / "b.sqlite")
    _charge(st, "r1", "person")
    assert [c["unit"] for c in st.charges("a")] == ["person"]
    assert st.spent("a")["unit"] == "person" and "per person" in st.spent("a")["adjacency"]
    before = st.export()
    st.use_unit("example")
    with pytest.raises(BudgetStoreError, match=r"per row.*per person.*Nothing was charged.*"
                                               r"separate store"):
        st.reserve("r2", [PlannedCharge("a", "m", "dpsgd", EV)], command="t", noise="secure")
    after = st.export()
    assert after["silos"] == before["silos"] and after["runs"] == before["runs"]
    _charge(st, "r3", "person")  # the same unit composes as before
    assert len(st.charges("a")) == 2


def test_a_schema_2_store_migrates_its_charges_as_example_and_node(tmp_path):
    path = tmp_path / "v2.sqlite"
    st = BudgetStore(path)
    _charge(st, "r1", None)
    st.register({"b": PrivacyTarget(10.0, 1e-5)})
    st.register({"c": PrivacyTarget(10.0, 1e-5)})
    for run, command in (("r2", "t"), ("r3", "silofl pandemic train")):
        st._db.execute("INSERT INTO runs SELECT ?, ?, started, finished, status, noise, "
                       "host, pid, proc_start, parent FROM runs WHERE id = 'r1'", (run, command))
    # a pandemic run: node rounds + preprocessing; a tuned pandemic run: no node label
    for sid, run, label in ((2, "r2", "node-dpsgd"), (2, "r2", "preprocess"),
                            (3, "r3", "dpsgd-pivot"), (3, "r3", "tuning")):
        st._db.execute("INSERT INTO charges (silo_id, epoch, run_id, method, label, event, "
                       "count, status, time) VALUES (?, 0, ?, 'm', ?, ?, 1, 'charged', 0)",
                       (sid, run, label, events.to_json(EV)))
    st.close()
    db = sqlite3.connect(path)  # back to schema 2: no unit column
    db.execute("ALTER TABLE charges DROP COLUMN unit")
    db.execute("UPDATE meta SET value = '2' WHERE key = 'schema'")
    db.commit()
    db.close()
    st = BudgetStore(path)
    assert st.export()["schema_version"] == 3
    assert [c["unit"] for c in st.charges("a")] == ["example"]
    assert [c["unit"] for c in st.charges("b")] == ["node", "node"]  # its preprocessing too
    assert [c["unit"] for c in st.charges("c")] == ["node", "node"]
    assert any(e["action"] == "migrate" for e in st.log())
    st.use_unit("person")
    with pytest.raises(BudgetStoreError, match="another unit"):
        st.reserve("r9", [PlannedCharge("a", "m", "dpsgd", EV)], command="t", noise="secure")


# --- private preprocessing per person ----------------------------------------------------------

def test_a_persons_rows_move_the_private_statistics_by_at_most_one_rows_bound():
    rng = np.random.default_rng(0)
    X = rng.uniform(-4, 4, (200, 3))
    X[rng.random(X.shape) < 0.1] = np.nan
    persons = rng.integers(0, 40, 200)
    lo, hi = np.full(3, -4.0), np.full(3, 4.0)
    full = sufficient_statistics(X, lo, hi, persons)
    assert full[:, 0].max() <= 40 + 1e-9  # counts are of persons
    bound = math.sqrt(2 * 3)
    for p in range(40):
        keep = persons != p
        moved = np.linalg.norm(full - sufficient_statistics(X[keep], lo, hi, persons[keep]))
        assert moved <= bound + 1e-9
    # per row, one person with many rows moves them far more: the unit matters
    p = np.bincount(persons).argmax()
    keep = persons != p
    assert np.linalg.norm(sufficient_statistics(X, lo, hi) -
                          sufficient_statistics(X[keep], lo, hi)) > bound


def test_private_preprocessing_at_the_person_unit_is_charged_and_stated_per_person():
    fed = _fed(_ehr(150))
    specs = {0: ColumnSpec("x1", "numeric", lower=-4.0, upper=4.0),
             1: ColumnSpec("x2", "numeric", lower=-4.0, upper=4.0)}
    raw = RawFederation.from_federation(fed, specs).with_targets(PrivacyTarget(1.0, 1e-5))
    per_row = plan_preprocessing(raw, PreprocessSpec("private", "auto"))
    plan = plan_preprocessing(raw, PreprocessSpec("private", "auto", unit="person"))
    assert plan.events == per_row.events and plan.sensitivity == per_row.sensitivity
    assert all("per person" in s.mechanism for s in plan.steps if s.mode == "private")
    assert plan.to_meta()["unit"] == "person"
    bare = RawFederation.from_federation(federation_from_frame(
        _ehr(150).drop(columns="patient"), "hospital", "y", schema=SCHEMA), specs)
    with pytest.raises(ConfigError, match="person_column"):
        plan_preprocessing(bare.with_targets(PrivacyTarget(1.0, 1e-5)),
                           PreprocessSpec("private", "auto", unit="person"))


# --- outputs -------------------------------------------------------------------------------

def test_a_per_row_guarantee_on_rows_that_name_persons_states_the_bound_as_a_formula():
    text = group_bound_note("example", "patient")
    assert "ε_person ≤ k·ε" in text and "per row" in text
    assert group_bound_note("person", "patient") == "" and group_bound_note("example", "") == ""


def test_a_person_level_run_states_the_unit_everywhere(tmp_path):
    path = tmp_path / "job.toml"
    cfg = _cfg(tmp_path, {"unit": "person"}, {"standardize": "private"})
    path.write_text(tomli_w.dumps(cfg))
    res = CliRunner().invoke(app, ["run", "--config", str(path)])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "per person: add/remove all rows of one person in one silo" in out
    assert "person-level DP" in out and "ε per person" in out
    assert "number of persons is treated as public" in out
    rep = json.loads((tmp_path / "runs" / "job" / "privacy_report.json").read_text())
    assert rep["privacy_unit"] == "person" and "per person" in rep["neighbouring_relation"]
    assert rep["preprocessing"]["unit"] == "person"
    card = json.loads(next((tmp_path / "runs" / "job" / "models").rglob("card-*.json"))
                      .read_text())
    assert "persons of this silo" in card["privacy"]["statement"]
    st = BudgetStore(tmp_path / "b.sqlite")
    assert {c["unit"] for n in st.silos() for c in st.charges(n)} == {"person"}
    shown = CliRunner().invoke(app, ["budget", "show", "--store", str(tmp_path / "b.sqlite")])
    assert "per person" in " ".join(shown.output.split())


def test_a_schema_draft_never_drafts_the_person_column_as_a_feature():
    from silofl.data import draft_schema
    df = _ehr(40).rename(columns={"patient": "who"})
    df["who"] = df["who"].str[1:].astype(int) % 7  # not id-like by name nor by values
    assert "name = \"who\"" in draft_schema(df, "hospital", "y")
    text = draft_schema(df, "hospital", "y", person_column="who")
    assert "name = \"who\"" not in text and "\"who\": the person column" in text


@pytest.mark.parametrize("command", [["erosion", "--user", "H1"], ["rank", "--user", "H1"]])
def test_commands_bounded_per_row_refuse_the_person_unit(tmp_path, command):
    path = tmp_path / "job.toml"
    path.write_text(tomli_w.dumps(_cfg(tmp_path, {"unit": "person"})))
    res = CliRunner().invoke(app, [*command, "--config", str(path)])
    assert res.exit_code == 2, res.output
    assert "per row" in " ".join(res.output.split()) and not (tmp_path / "b.sqlite").exists()


def test_validation_rows_carved_for_tuning_keep_each_person_whole():
    from silofl.experiments.sweep import carve_validation
    from silofl.tuning.setup import carve_into_test, split_from_test
    fed = _fed(_ehr(300))
    carved, counts = carve_into_test(fed, 0.3, seed=0)
    back, val = split_from_test(carved, counts)
    for s, c, b, m in zip(fed.silos, carved.silos, back.silos, counts):
        held = c.person_test[len(c.y_test) - m:]
        assert m > 0 and not set(held) & set(c.person_train)  # a person on one side only
        assert set(held) | set(c.person_train) == set(s.person_train)
        assert np.array_equal(b.person_test, s.person_test)
    reduced, _ = carve_validation(fed, 0.3, seed=0)
    for s, r in zip(fed.silos, reduced.silos):
        assert r.person_train.shape == (r.n_train,) and r.n_train < s.n_train


def test_a_drafts_left_out_identifier_points_to_person_column():
    from silofl.data import draft_schema
    text = draft_schema(_ehr(40), "hospital", "y")
    assert "\"patient\": its name ('patient') suggests an identifier" in text
    assert "set [data]\n# person_column to it" in text

"""A newcomer's messy person column: ids padded with spaces or written in two letter cases,
a declared M above the number of silos, a small silo whose few persons all fall on the
training side. Each either reads as the user meant or is refused before any charge."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

from silofl.cli import app
from silofl.data import federation_from_frame
from silofl.data.federation import Silo
from silofl.data.persons import person_ids
from silofl.errors import DataError
from silofl.runtime.job import silo_digest

SCHEMA = {"source": "test", "silo_column": "hospital",
          "label": {"name": "y", "kind": "binary", "classes": [0, 1]},
          "columns": [{"name": "x", "kind": "numeric", "lower": -4.0, "upper": 4.0}]}


def _visits(n_persons: int = 90, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [{"hospital": ["H1", "H2", "H3"][p % 3], "patient": f"P{p:03d}",
             "x": float(rng.normal()), "y": int(rng.random() < 0.5)}
            for p in range(n_persons) for _ in range(1 + rng.poisson(2))]
    return pd.DataFrame(rows)


def test_surrounding_spaces_do_not_make_a_second_person():
    assert person_ids(pd.Series([" P1", "P1  ", "P2"]), "pid").tolist() == ["P1", "P1", "P2"]
    df = _visits()
    padded = df.assign(patient=[f" {p}" if i % 2 else f"{p} " for i, p in
                                enumerate(df.patient)])
    clean = federation_from_frame(df, "hospital", "y", schema=SCHEMA, person_column="patient")
    fed = federation_from_frame(padded, "hospital", "y", schema=SCHEMA,
                                person_column="patient")
    assert [s.n_persons for s in fed.silos] == [s.n_persons for s in clean.silos]
    # the same persons on the same side: the split hashes the stripped id
    assert [sorted(set(s.person_test)) for s in fed.silos] == \
        [sorted(set(s.person_test)) for s in clean.silos]


def test_ids_differing_only_in_letter_case_are_refused_without_printing_them():
    ids = pd.Series(["Pa1", "Pa2", "pA1", "Pa3"], index=[10, 11, 12, 13])
    with pytest.raises(DataError, match=r"2 ids differ .* only in letter case") as err:
        person_ids(ids, "pid")
    msg = str(err.value)
    assert "rows 10, 12" in msg and "Pa1" not in msg and "pA1" not in msg
    assert person_ids(pd.Series(["Pa1", "Pa2"]), "pid").tolist() == ["Pa1", "Pa2"]


def _job(d: Path, df: pd.DataFrame, privacy: dict) -> Path:
    df.to_csv(d / "v.csv", index=False)
    (d / "schema.toml").write_text(tomli_w.dumps(SCHEMA))
    cfg = {"data": {"source": "table", "path": str(d / "v.csv"), "silo_column": "hospital",
                    "label_column": "y", "schema": str(d / "schema.toml"),
                    "person_column": "patient"},
           "training": {"rounds": 2, "methods": ["fedavg"]},
           "privacy": {"epsilon": 1.0, "delta": 1e-4, "unit": "person", **privacy},
           "budget": {"store": str(d / "b.sqlite")},
           "output": {"dir": str(d / "runs"), "name": "job"}}
    (d / "job.toml").write_text(tomli_w.dumps(cfg))
    return d / "job.toml"


def _charges(d: Path) -> int:
    store = d / "b.sqlite"
    return sqlite3.connect(store).execute("SELECT COUNT(*) FROM charges").fetchone()[0] \
        if store.exists() else 0


@pytest.mark.parametrize("mess, privacy, what", [
    ("case", {}, "only in letter case"),
    ("", {"persons_in_silos": 5}, "persons_in_silos = 5, but this job has 3 silo(s)"),
])
def test_messy_person_inputs_exit_2_before_any_charge(tmp_path, mess, privacy, what):
    df = _visits()
    if mess == "case":
        df.loc[df.index[::7], "patient"] = df.patient[::7].str.lower()
    res = CliRunner().invoke(app, ["run", "--config", str(_job(tmp_path, df, privacy)), "-q"])
    assert res.exit_code == 2, res.output
    assert what in " ".join(res.output.split())
    assert "Traceback" not in res.output and _charges(tmp_path) == 0


def test_a_declared_m_equal_to_the_silos_runs_and_counts_persons(tmp_path):
    path = _job(tmp_path, _visits(), {"persons_in_silos": 3})
    res = CliRunner().invoke(app, ["run", "--config", str(path), "-q"],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert _charges(tmp_path) > 0
    # the privacy table's n is what q = b/n counts: persons, and says so
    assert "n persons" in res.output and "3 ◀ M" in res.output
    # summary.json, read alone, says what its combined ε protects
    (summary,) = (tmp_path / "runs").glob("*/summary.json")
    got = json.loads(summary.read_text())
    assert got["privacy_unit"] == "person" and "all rows of one person" in got["adjacency"]


def test_the_digest_of_a_silo_without_test_rows_is_its_rows_digest():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(6, 3)), rng.integers(0, 2, 6).astype(float)
    empty = Silo("s", X, y, np.zeros((0, 3)), np.zeros(0))
    split = Silo("s", X[:4], y[:4], X[4:], y[4:])
    assert silo_digest(empty) == silo_digest(split)  # rows in no particular order
    assert silo_digest(empty) != silo_digest(Silo("s", X[:5], y[:5], np.zeros((0, 3)),
                                                  np.zeros(0)))


def test_a_silo_whose_persons_all_fell_on_the_test_side_is_refused_with_the_reason():
    from silofl.data.federation import Federation
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(8, 2)), np.array([0, 1] * 4, float)
    big = Silo("big", X[:6], y[:6], X[6:], y[6:], person_train=np.arange(6),
               person_test=np.array([6, 7]))
    solo = Silo("solo", np.zeros((0, 2)), np.zeros(0), X[:3], y[:3],
                person_train=np.zeros(0, np.int64), person_test=np.array([9, 9, 9]))
    with pytest.raises(DataError, match=r"0 training example\(s\) \(the person split put 1 "
                                        r"of its persons.*on the test side\).*small_silos"):
        Federation([big, solo], ["a", "b"], "binary", 2)


def test_a_misspelt_unit_is_refused_before_the_table_is_read(tmp_path):
    path = _job(tmp_path, _visits(), {"unit": "persn"})
    (tmp_path / "v.csv").unlink()  # the unit is checked first: no "cannot read" error
    res = CliRunner().invoke(app, ["run", "--config", str(path), "-q"])
    assert res.exit_code == 2, res.output
    assert "Did you mean 'person'" in " ".join(res.output.split())
    assert "v.csv" not in res.output and _charges(tmp_path) == 0


def test_ldp_compare_refuses_the_person_unit_before_reading_or_charging(tmp_path):
    path = _job(tmp_path, _visits(), {})
    res = CliRunner().invoke(app, ["ldp-compare", "--config", str(path)])
    assert res.exit_code == 2, res.output
    assert "silofl ldp-compare bounds its releases per row" in " ".join(res.output.split())
    assert _charges(tmp_path) == 0

"""One of each, with the differences as plug-ins: the audit engine runs any mechanism
(`audit.engine.Mechanism`), the core's columnar reader reads any declared table
(`data.columnar`), and neither they nor the tuning path import the pandemic domain."""

import ast
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from silofl.audit.engine import Claim, multi_run, one_run
from silofl.data.columnar import TableSpec, read_columns
from silofl.data.schema import ColumnSpec
from silofl.errors import ConfigError, DataError

SRC = Path(__file__).resolve().parents[1] / "src" / "silofl"


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return out


@pytest.mark.parametrize("package", ["audit", "tuning", "data"])
def test_engines_never_import_the_pandemic_domain(package):
    files = sorted((SRC / package).rglob("*.py"))
    assert files
    bad = {str(f.relative_to(SRC)): [m for m in _imports(f) if m.startswith("silofl.pandemic")]
           for f in files}
    assert not {f: m for f, m in bad.items() if m}


# --- the audit engine over a toy mechanism ------------------------------------------------

@dataclass
class _Canaries:
    m: int


class _Finished:
    def __init__(self, scores):
        self._scores = scores

    def scores(self, unit):
        return {"score": self._scores[unit]}

    def claim(self, unit):
        return Claim(epsilon=0.5, target_epsilon=0.5, delta=1e-5)


class _Toy:
    """Releases, per canary, `leak` · included + N(0, 1): leak 0 is perfectly private,
    a large leak gives the inclusion away."""

    def __init__(self, leak: float, seed: int = 0):
        self.leak, self.rng = leak, np.random.default_rng(seed)
        self.jobs = 0

    def draw(self, unit, canaries, rng):
        if canaries < 2:
            raise ConfigError("too few")
        return _Canaries(int(canaries))

    def prepare_one(self, chosen):
        return chosen

    def run_one(self, chosen):
        self.jobs += 1
        return _Finished({u: self.leak * inc + self.rng.normal(size=c.m)
                          for u, (c, inc) in chosen.items()})

    def neighbours(self, unit, canary):
        return (0, 1)

    def run_neighbour(self, unit, pair, which):
        self.jobs += 1
        return {"stat": self.leak * pair[which] + self.rng.normal()}, Claim(0.5, 0.5, 1e-5)


def test_one_run_engine_flags_a_leaky_mechanism_and_not_a_private_one():
    private = _Toy(0.0)
    rows, _, _ = one_run(private, ["a", "b"], 1000, 0.95, np.random.default_rng(1))
    assert [r.silo for r in rows] == ["a", "b"] and private.jobs == 1  # one job for all
    assert not any(r.violation for r in rows)
    leaky = _Toy(50.0)
    rows, _, _ = one_run(leaky, ["a"], 1000, 0.95, np.random.default_rng(1))
    assert rows[0].violation and rows[0].lower_bound > 0.5


def test_one_run_engine_is_reproducible_with_a_seed_and_reports_progress():
    seen = []
    a, _, _ = one_run(_Toy(1.0, 3), ["a"], 300, 0.95, np.random.default_rng(5),
                      lambda i, n: seen.append((i, n)))
    b, _, _ = one_run(_Toy(1.0, 3), ["a"], 300, 0.95, np.random.default_rng(5))
    assert a[0].details == b[0].details and seen == [(0, 1), (1, 1)]


def test_multi_run_engine_interleaves_and_flags_a_leak():
    seen = []
    toy = _Toy(100.0)
    rows = multi_run(toy, ["a", "b"], _Canaries(1), 40, 0.95, lambda i, n: seen.append(i))
    assert toy.jobs == 160 and seen == list(range(1, 161))
    assert all(r.violation for r in rows) and rows[0].details["runs"] == 40
    assert not any(r.violation for r in multi_run(_Toy(0.0), ["a"], _Canaries(1), 40, 0.95))


# --- the core's columnar reader over a declared table that is not the pandemic's -------------

TRIPS = TableSpec(
    key="trips", stem="trips",
    columns=(ColumnSpec("tid", "id", dtype="int32"),
             ColumnSpec("legs", "int", dtype="int16"),
             ColumnSpec("km", "float", dtype="float32"),
             ColumnSpec("paid", "flag", dtype="uint8"),
             ColumnSpec("mode", "state", dtype="int8", levels=("W", "B", "C"))),
    optional=(ColumnSpec("zone", "int", dtype="int32"),))


def _frame():
    return pd.DataFrame({"tid": [3, 1, 2], "legs": [1, 2, 3], "km": [0.5, 2.0, 7.25],
                         "paid": [1, 0, 1], "mode": ["W", "C", "B"]})


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_columnar_reader_reads_any_declared_table(tmp_path, ext):
    p = tmp_path / f"trips.{ext}"
    df = _frame()
    df.to_csv(p, index=False) if ext == "csv" else df.to_parquet(p, index=False)
    got = read_columns(p, TRIPS)
    assert list(got) == ["tid", "legs", "km", "paid", "mode"]  # no optional zone in the file
    assert got["tid"].dtype == np.int32 and list(got["tid"]) == [3, 1, 2]
    assert got["legs"].dtype == np.int16 and got["km"].dtype == np.float32
    assert got["paid"].dtype == np.uint8 and list(got["mode"]) == [0, 2, 1]


def test_columnar_reader_errors_name_file_line_and_column_never_the_value(tmp_path):
    p = tmp_path / "trips.csv"
    df = _frame()
    df.loc[1, "mode"] = "Zeppelin"
    df.to_csv(p, index=False)
    with pytest.raises(DataError) as e:
        read_columns(p, TRIPS)
    msg = str(e.value)
    assert "trips.csv line 3" in msg and "'mode'" in msg and "W, B, C" in msg
    assert "Zeppelin" not in msg
    df = _frame().drop(columns="km")
    df.to_csv(p, index=False)
    with pytest.raises(DataError, match="lacks required column"):
        read_columns(p, TRIPS)

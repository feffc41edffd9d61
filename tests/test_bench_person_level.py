"""The person-level benchmark runs end to end on a tiny consortium and writes its outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_person_level as B  # noqa: E402


def test_equal_accuracy_epsilon_interpolates_and_says_when_out_of_reach():
    eps, acc = [0.5, 1, 2], [0.70, 0.75, 0.80]
    assert B.equal_accuracy_epsilon(eps, acc, 0.75 + B.EQUAL_TOLERANCE) == 1.0
    mid = B.equal_accuracy_epsilon(eps, acc, 0.775 + B.EQUAL_TOLERANCE)
    assert 1.0 < mid < 2.0
    assert B.equal_accuracy_epsilon(eps, acc, 0.9) == float("inf")
    assert B.equal_accuracy_epsilon(eps, acc, 0.6) == 0.5  # below the grid: its floor


def test_the_benchmark_writes_its_table_json_and_plot(tmp_path):
    out = tmp_path / "b"
    assert B.main(["--hospitals", "3", "--seeds", "1", "--persons", "300", "--epsilons",
                   "1,4", "--methods", "fedavg", "--rounds", "3", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert {r["unit"] for r in res["runs"]} == {"example", "person"}
    s = res["summary"][0]
    assert s["k_max"] >= 2 and s["tight_person_eps_of_example_run_same_eps"] > 1.0
    assert [r["m"] for r in s["person_in_m_hospitals"]] == [1, 2, 3]
    assert s["person_in_m_hospitals"][1]["epsilon"] < 2 * s["person_in_m_hospitals"][0]["epsilon"]
    assert "group bound" in (out / "table.md").read_text()
    assert (out / "person_level.png").stat().st_size > 1000

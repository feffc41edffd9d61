"""benchmarks/bench_performance.py --quick: the four issue-25 figures, side by side, in one
table and one JSON file. Checks the rows and that their ratios are finite and positive, not
their values (no timed assertions)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_performance.py"
KEYS = ("engine", "opacus", "memory", "sweep")


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "perf.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--json", str(out)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    return proc, out


@pytest.mark.slow
def test_quick_prints_four_rows_and_writes_them(tmp_path):
    pytest.importorskip("opacus")
    pytest.importorskip("ray")
    proc, out = _run(tmp_path, "--quick")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    got = json.loads(out.read_text())
    assert list(got["rows"]) == list(KEYS)
    for key, row in got["rows"].items():
        assert "error" not in row, (key, row)
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0, (key, row)
        assert row["silofl"] > 0 and row["comparison"] > 0, (key, row)
        assert isinstance(row["met"], bool) and row["target"]
        assert key in got["figures"]
    assert got["rows"]["opacus"]["compared_with"].startswith("Opacus")
    assert got["rows"]["engine"]["compared_with"] == "non-private"
    assert got["rows"]["memory"]["compared_with"] == "in memory"
    assert got["rows"]["sweep"]["compared_with"].startswith("local engine")
    # the printed table: a header and one line per figure, each with its ratio
    lines = proc.stdout.splitlines()
    head = next(i for i, s in enumerate(lines) if s.startswith("what "))
    assert [c.strip() for c in lines[head].split("|")] == [
        "what", "silofl", "comparison", "ratio", "target", "met?"]
    body = lines[head + 2: head + 2 + len(KEYS)]
    for line, row in zip(body, got["rows"].values()):
        assert line.startswith(row["what"]) and f"{row['ratio']:.2f}×" in line


def test_unknown_subset_is_a_usage_error(tmp_path):
    proc, out = _run(tmp_path, "--only", "engine,gpu")
    assert proc.returncode == 2 and "unknown gpu" in proc.stderr
    assert not out.exists()


def test_a_failing_script_gives_a_failed_row(tmp_path, monkeypatch, capsys):
    """One script that fails (here: bench_engine with a rounds value it rejects) is a row
    marked failed with its error; the run exits 1 and still writes the JSON."""
    sys.path.insert(0, str(SCRIPT.parent))
    import bench_performance as bench
    monkeypatch.setitem(bench.STEPS, "engine", ("bench_engine.py", [], ["--rounds", "x"]))
    out = tmp_path / "perf.json"
    assert bench.main(["--quick", "--only", "engine", "--json", str(out)]) == 1
    row = json.loads(out.read_text())["rows"]["engine"]
    assert "exited with 2" in row["error"] and "invalid int value" in row["error"]
    assert "| failed" in capsys.readouterr().out

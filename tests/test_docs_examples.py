"""The documentation's Python examples run as printed, and none spends a budget twice.

A sweep spawns worker processes that import the user's script again: a docs example that
trains or runs a job at the top level of a script which also sweeps would run that job
once more in every worker, each time charged to the lifetime budget (found in review: the
Python guide's example ran `silofl.run` three times). The README's example has its own
test (test_readme.py); the quick examples below run here on built-in data.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SPAWNS = ("run_sweep",)  # calls that start worker processes which re-import __main__


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)


def unguarded_work(code: str) -> list[str]:
    """Top-level statements that would run again in a spawned worker, if `code` spawns."""
    tree = ast.parse(code)
    if not any(isinstance(n, ast.Name | ast.Attribute) and
               getattr(n, "id", getattr(n, "attr", None)) in SPAWNS for n in ast.walk(tree)):
        return []
    harmless = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.If)
    out = []
    for node in tree.body:
        unguarded_if = isinstance(node, ast.If) and "__main__" not in ast.unparse(node.test)
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if unguarded_if or not (isinstance(node, harmless) or docstring):
            out.append(ast.unparse(node).splitlines()[0])
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_example_that_sweeps_keeps_its_work_under_a_main_guard(page):
    for code in python_blocks(page):
        assert unguarded_work(code) == [], page.name


def test_the_guard_check_has_power():
    bad = textwrap.dedent("""
        import silofl
        report = silofl.run(silofl.load_config("my.toml"))
        if __name__ == "__main__":
            silofl.run_sweep(silofl.load_sweep_config("s.toml"))
    """)
    assert unguarded_work(bad) == ['report = silofl.run(silofl.load_config(\'my.toml\'))']
    good = "import silofl\ndef main():\n    silofl.run_sweep(x)\nif __name__ == '__main__':\n    main()\n"
    assert unguarded_work(good) == []


def _run(code: str, tmp_path: Path) -> str:
    env = {**os.environ, "SILOFL_HOME": str(tmp_path / "home"),
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_tuning_guides_example_runs_as_printed(tmp_path):
    (code,) = python_blocks(ROOT / "docs" / "guides" / "tuning.md")
    out = _run(code, tmp_path)
    assert out.count("'lam'") == 4  # one released setting per hospital, h_k not among them
    assert "'h'" not in out


def test_help_silofl_shows_an_example_that_runs(tmp_path):
    import silofl

    doc = silofl.__doc__
    code = textwrap.dedent(doc.split("::", 1)[1].split("\n\n")[1])
    out = _run(code, tmp_path)
    assert 0.5 < float(out.strip().splitlines()[-1]) <= 1.0  # a pooled accuracy
    assert (tmp_path / "budget.sqlite").exists()  # charged to the store it names

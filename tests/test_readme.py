"""The README is the front page (issue 20 part 7): the two commands first, a short Python
example that runs as printed, links that lead somewhere, and at most ~250 lines."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.DOTALL | re.MULTILINE)


def test_the_two_commands_come_first_and_the_readme_is_short():
    first = re.search(r"^```\w*\n(.*?)^```", README, flags=re.DOTALL | re.MULTILINE).group(1)
    assert first.split() == ["make", "run", "make", "test"]
    assert len(README.splitlines()) <= 250


def test_every_relative_link_exists():
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert links
    missing = [x for x in links if "://" not in x and not (ROOT / x).exists()]
    assert not missing


@pytest.mark.slow
def test_the_python_example_runs_as_printed(tmp_path):
    """Each silo spends exactly its own target, and the same job again is refused."""
    (code,) = _blocks("python")
    assert len(code.splitlines()) <= 25
    env = dict(os.environ, SILOFL_HOME=str(tmp_path / "home"),
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    acc = float(re.fullmatch(r"pooled accuracy (\S+)", lines[0]).group(1))
    assert 0.6 < acc <= 1.0  # the job's accuracy is ≈ 0.82 (README): a floor, not a figure
    spent = {}
    for line in lines[1:5]:
        silo, eps, target = re.fullmatch(r"(.+?)\s+ε spent (\S+) of (\S+)", line).groups()
        spent[silo] = (float(eps), float(target))
    assert set(spent) == {"Cleveland", "Hungary", "Switzerland", "VA Long Beach"}
    assert spent["Switzerland"][1] == 0.5
    for eps, target in spent.values():
        assert target - 1e-3 <= eps <= target  # printed to 3 decimals; never above
    assert lines[5].startswith("refused: silo 'Cleveland': lifetime ε would reach")
    assert (tmp_path / "budget.sqlite").exists()

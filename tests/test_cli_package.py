"""The command line as a package (`silofl.cli`): one module per command group, the entry
points, and the import boundaries that keep `silofl --help` cheap and the domains below it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import typer

import silofl
import silofl.cli as cli

PKG = Path(silofl.__file__).resolve().parent
SRC = PKG.parent
CLI = PKG / "cli"

#: `silofl --help` lists commands first, then groups, each in registration order
COMMANDS = ["run", "rank", "erosion", "ldp-compare", "contrib", "audit", "account", "sweep",
            "plot", "report", "predict", "persons", "stats", "silo", "silo-worker", "server",
            "schema", "budget", "pandemic", "theory", "deploy"]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC),
                                                        os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)


def _imports(path: Path) -> set[str]:
    """Every module name `path` imports (top level and inside functions)."""
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            out |= {n.module} | {f"{n.module}.{a.name}" for a in n.names}
    return out


def test_help_lists_every_command_in_its_order():
    group = typer.main.get_command(cli.app)
    with click.Context(group) as ctx:
        assert group.list_commands(ctx) == COMMANDS


def test_help_loads_neither_a_domain_nor_a_heavy_library():
    """`silofl --help` imports the CLI package and the error types only: the pandemic and
    theory domains, NumPy/pandas/torch/Flower and rich's progress bars load with a command."""
    res = _python(
        "import json, runpy, sys\n"
        "sys.argv = ['silofl', '--help']\n"
        "try:\n"
        "    runpy.run_module('silofl.cli', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "print(json.dumps(sorted(sys.modules)))\n")
    assert res.returncode == 0, res.stderr
    loaded = json.loads(res.stdout.splitlines()[-1])
    ours = {m for m in loaded if m == "silofl" or m.startswith("silofl.")}
    assert ours - {"silofl", "silofl.errors", "silofl._version"} == {
        m for m in ours if m.startswith("silofl.cli")}
    assert "silofl.cli.pandemic" in ours and "silofl.cli.theory" in ours  # registered
    heavy = {"numpy", "pandas", "torch", "flwr", "numba", "sknetwork", "matplotlib",
             "rich.progress"}
    assert not heavy & set(loaded)


def test_nothing_below_the_cli_imports_it():
    """The CLI is the composition root: no module outside `silofl.cli` (the core, or the
    theory and pandemic domains) imports it, so there is no circle through it."""
    offenders = [str(p.relative_to(SRC)) for p in PKG.rglob("*.py")
                 if CLI not in p.parents
                 and any(m == "silofl.cli" or m.startswith("silofl.cli.")
                         for m in _imports(p))]
    assert offenders == []


def test_the_domain_is_reached_only_from_its_own_command_module():
    """`silofl.pandemic` is imported by `cli/pandemic.py` only, and only inside commands."""
    for p in CLI.glob("*.py"):
        tree = ast.parse(p.read_text())
        top = {m for n in tree.body for m in _imports_of(n)}
        anywhere = _imports(p)
        assert not any(m.startswith("silofl.pandemic") for m in top), p.name
        if p.name != "pandemic.py":
            assert not any(m.startswith("silofl.pandemic") for m in anywhere), p.name


def _imports_of(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if isinstance(node, ast.ImportFrom) and node.module:
        return {node.module}
    return set()


def test_every_module_and_function_stays_small():
    """No CLI module over 600 lines, no function over 80 (signatures included)."""
    for p in CLI.glob("*.py"):
        text = p.read_text()
        assert len(text.splitlines()) <= 600, p.name
        for n in ast.walk(ast.parse(text)):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert n.end_lineno - n.lineno < 80, f"{p.name}: {n.name}"


def test_both_entry_points_reach_main():
    """The console script is `silofl.cli:main`, and `python -m silofl.cli` runs it too."""
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["silofl"] == "silofl.cli:main"
    assert callable(cli.main)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC),
                                                        os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "silofl.cli", "--version"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("silofl ")
    bad = subprocess.run([sys.executable, "-m", "silofl.cli", "account", "--n", "10",
                          "--batch", "20", "--delta", "1e-5", "--steps", "1", "--sigma", "1"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "error:" in bad.stderr  # the one error printer, exit 2

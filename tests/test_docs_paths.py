"""Every module path the README and the documentation name must exist in the code.

Modules move (issue 20 moved dozens in one day); a page that still says
`silofl.experiments.atomic` or `src/silofl/cli.py` sends a newcomer nowhere. This test reads
README.md and docs/**/*.md and resolves, statically (no import: no torch or flwr needed),

* every dotted `silofl.a.b.c` — a module, then a name defined at its top level (a class,
  function, assignment or import), then a member of that class;
* every backticked `pkg.module[.name]` without the `silofl.` prefix whose first part is a
  silofl package and whose second is a module in it, or that has three parts
  (`privacy.node_level.X`, `tuning.graph.score`), and every
  backticked `module.name` whose first part is a module's own name (`node_level.X`);
  configuration keys such as `training.seed` are neither and are left alone;
* every file path: `src/silofl/...`, `silofl/...`, `<subpackage>/...` (under src/silofl),
  `tests/...`, `benchmarks/...`, `examples/...`.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "silofl"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# backticked names that look like module.attr but are JSON paths of outputs, not code
NOT_CODE = {"weight_erosion.extra.alpha"}
# TOML sections: `sweep.tuning`, `report.epsilon` are configuration keys, not module paths
CONFIG_SECTIONS = {"data", "model", "training", "privacy", "budget", "output", "sweep",
                   "report", "tuning", "job", "server", "silo", "silos", "graph"}

DOTTED = re.compile(r"(?<![\w/.-])silofl(?:\.[A-Za-z_]\w*)+")
BACKTICK = re.compile(r"`([^`\n]+)`")
BARE = re.compile(r"(?<![\w/.-])([a-z_]\w*(?:\.[A-Za-z_]\w*)+)")
FILE = re.compile(r"(?<![\w./-])((?:src/)?(?:silofl|tests|benchmarks|examples|"
                  r"[a-z_]+)/[\w./-]*\w\.(?:py|toml|md|json|csv|mat))\b")
FILE_SUFFIXES = (".py", ".md", ".json", ".toml", ".csv", ".mat", ".png", ".html", ".jsonl",
                 ".sqlite", ".npz", ".gz", ".pem", ".key", ".pub", ".txt", ".lock")


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()
SUBPACKAGES = {m.split(".")[1] for m in MODULES if m.count(".") >= 1}


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _top_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body defines (also inside if/try blocks)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names[n.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names[(a.asname or a.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try)):
            for sub in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", []),
                        *[h.body for h in getattr(node, "handlers", [])]):
                names.update(_top_names(sub))
    return names


def _public_api() -> set[str]:
    tree = _tree(PKG / "__init__.py")
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("silofl/__init__.py has no literal __all__")


def resolve(dotted: str) -> str | None:
    """None if `dotted` (silofl.x.y...) names a module or a defined name, else the reason."""
    parts = dotted.split(".")
    i = len(parts)
    while i > 0 and ".".join(parts[:i]) not in MODULES:
        i -= 1
    if i == 0:
        return f"{parts[0]} is not a silofl module"
    module = ".".join(parts[:i])
    rest = parts[i:]
    if not rest:
        return None
    if module == "silofl" and rest[0] in _public_api():
        return None  # a public name; test_public_api checks it resolves
    names = _top_names(_tree(MODULES[module]).body)
    node = names.get(rest[0])
    if node is None:
        return f"{module} defines no {rest[0]!r}"
    if len(rest) > 1 and isinstance(node, ast.ClassDef):
        members = _top_names(node.body)
        if rest[1] not in members and not node.bases:
            return f"{module}.{rest[0]} has no member {rest[1]!r}"
    return None


def bare_reference(token: str) -> str | None:
    """The full silofl path a backticked `a.b[.c]` names, or None if it is no code path."""
    if token in NOT_CODE:
        return None
    parts = token.split(".")
    if parts[0] in SUBPACKAGES and (f"silofl.{parts[0]}.{parts[1]}" in MODULES
                                    or len(parts) >= 3):
        return "silofl." + token  # three parts are code: config keys have two
    if parts[0] in SUBPACKAGES and f"silofl.{parts[0]}" in MODULES and len(parts) == 2 \
            and parts[1][:1].isupper():
        return "silofl." + token  # `audit.Canaries`: a class of a package
    homes = [m for m in MODULES if m.rsplit(".", 1)[-1] == parts[0] and m.count(".") >= 2]
    if homes and parts[0] not in SUBPACKAGES and parts[0] not in CONFIG_SECTIONS:
        for home in homes:  # `node_level.calibrate_node_sigma`: any module of that name
            if resolve(f"{home}.{'.'.join(parts[1:])}") is None:
                return None
        return f"{homes[0]}.{'.'.join(parts[1:])}"
    return None


def file_exists(path: str) -> bool:
    path = path.rstrip(".,:;)")
    if path.startswith("src/"):
        return (ROOT / path).exists()
    first = path.split("/", 1)[0]
    if first == "silofl":
        return (ROOT / "src" / path).exists()
    if first in {"tests", "benchmarks", "examples", "docs"}:
        return (ROOT / path).exists()
    if first in SUBPACKAGES:
        return (PKG / path).exists()
    return True  # a path of the user's (runs/..., c/server.toml): not ours to check


def problems(text: str) -> list[str]:
    """Every module path or file named in `text` that does not exist, with its line."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in DOTTED.finditer(line):
            why = resolve(m.group(0))
            if why:
                out.append(f"line {n}: {m.group(0)}: {why}")
        for tok in BACKTICK.findall(line):
            for m in BARE.finditer(tok):
                name = m.group(1)
                if name.startswith("silofl.") or name.endswith(FILE_SUFFIXES):
                    continue
                full = bare_reference(name)
                if full and (why := resolve(full)):
                    out.append(f"line {n}: `{name}` ({full}): {why}")
        for m in FILE.finditer(line):
            if not file_exists(m.group(1)):
                out.append(f"line {n}: file {m.group(1)} does not exist")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_path_and_file_a_page_names_exists(page):
    assert problems(page.read_text(encoding="utf-8")) == []


def test_the_check_catches_stale_paths():
    """Power: each kind of stale reference this test exists for is reported."""
    lines = [
        "`silofl.experiments.atomic.write_json` writes atomically",  # a moved module
        "`silofl.privacy.accounting.no_such_function`",              # a renamed name
        "`silofl.BudgetStore.no_such_method`",                       # a public name's member
        "see `src/silofl/cli.py`",                                   # a file now a package
        "`privacy/no_such_module.py` holds it",                      # a file under a package
        "`tuning.graph.score` is the graph score",                   # bare pkg.module path
        "`node_level.no_such_function(n, S)`",                       # bare module.name
        "`tests/test_no_such_file.py` checks it",
    ]
    found = problems("\n".join(lines))
    assert len(found) == 7, found  # silofl.BudgetStore is public: resolved through __all__
    for word in ("atomic", "no_such_function", "cli.py", "no_such_module", "tuning.graph",
                 "node_level", "test_no_such_file"):
        assert any(word in f for f in found), (word, found)


def test_the_check_leaves_real_paths_and_config_keys_alone():
    lines = [
        "`silofl.privacy.accounting.epsilon` and `silofl.io`",
        "`privacy.node_tuning.NodeRepeatAndSelectEvent`, `audit.Canaries`",
        "`training.seed`, `data.path`, `privacy.silos.\"A\".epsilon`",
        "`src/silofl/data/builtin/PROVENANCE.md`, `privacy/curves.py`, `runs/x/summary.json`",
        "`weight_erosion.extra.alpha` in history.json",
    ]
    assert problems("\n".join(lines)) == []

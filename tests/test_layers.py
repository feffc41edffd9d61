"""Imports point one way (issue 20). The whole module graph of silofl, read with an AST
parser (imports inside functions and under TYPE_CHECKING count too), has

* no import cycle among silofl modules,
* no arrow against the layer order below (a package imports only its own or lower layers),
* no core module importing a domain (pandemic, theory), not even lazily.

Each rule has a power check on a synthetic bad graph. Arrows that other parts of the
redesign still own are listed in ALLOWED with their owner; delete an entry once its arrow
is gone (the stale-entry test says when).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "silofl"

#: bottom to top; a package may import packages of its own or a lower layer
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(s.split()) for s in (
    "_version errors io",
    "privacy",
    "config",       # one configuration model (uses privacy.targets' range rule)
    "data models",
    "training",
    "algorithms",
    "runtime",
    "tuning",
    "experiments",
    "audit",        # a job that runs experiments (experiments never import audit)
    "cli",          # the composition root: may also import the domains
    "__init__",     # `import silofl`: the public surface
))
#: optional layers on top of the core; only the composition root (cli) and the public
#: surface import them, and a domain may import any core package
DOMAINS = frozenset({"pandemic", "theory"})
COMPOSITION = frozenset({"cli", "__init__"})

#: arrows allowed against the rules, with the reason: (from, to) -> why. Empty: none is.
ALLOWED: dict[tuple[str, str], str] = {}


# --- reading the graph --------------------------------------------------------------------

def module_name(path: Path, root: Path = SRC) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(source: str, module: str, is_package: bool) -> list[str]:
    """Every silofl name an import statement anywhere in `source` mentions (``from a import
    b`` gives a and a.b; relative imports resolved against `module`)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    return [n for n in out if n == "silofl" or n.startswith("silofl.")]


def module_graph(files: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """{module: modules it imports} from {module: (source, is_package)}; a name that is not
    a module resolves to the module that defines it."""
    edges: dict[str, set[str]] = defaultdict(set)
    for mod, (source, is_package) in files.items():
        edges[mod]
        for name in imported_names(source, mod, is_package):
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != mod:
                edges[mod].add(name)
    return edges


def read_tree(root: Path = SRC) -> dict[str, set[str]]:
    return module_graph({module_name(p, root): (p.read_text(encoding="utf-8"),
                                                p.name == "__init__.py")
                         for p in sorted(root.rglob("*.py"))})


# --- the rules ----------------------------------------------------------------------------

def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer(pkg: str) -> int:
    for i, names in enumerate(LAYERS):
        if pkg in names:
            return i
    raise KeyError(f"package {pkg!r} has no layer: add it to LAYERS (or DOMAINS)")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def wrong_way(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Arrows from a package to a higher layer, or from the core to a domain."""
    bad = []
    for a, targets in edges.items():
        for b in targets:
            pa, pb = package(a), package(b)
            if pa == pb:
                continue
            if pb in DOMAINS:
                if pa not in DOMAINS | COMPOSITION:
                    bad.append((a, b))  # the core imports a domain
            elif pa in DOMAINS:
                if pb in COMPOSITION:
                    bad.append((a, b))  # a domain reaches into the composition root
            elif layer(pb) > layer(pa):
                bad.append((a, b))
    return sorted(bad)


def core_to_domain(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, bs in edges.items() for b in bs
                  if package(b) in DOMAINS and package(a) not in DOMAINS | COMPOSITION)


def without_allowed(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    return {a: {b for b in bs if (a, b) not in ALLOWED} for a, bs in edges.items()}


# --- the tree -----------------------------------------------------------------------------

def test_every_package_has_a_layer():
    pkgs = {package(m) for m in read_tree()}
    assert pkgs - DOMAINS - set().union(*LAYERS) == set()


def test_no_import_cycle_among_silofl_modules():
    assert cycles(without_allowed(read_tree())) == []


def test_every_import_points_down_the_layers():
    assert wrong_way(without_allowed(read_tree())) == []


def test_the_core_never_imports_a_domain():
    assert core_to_domain(read_tree()) == []  # no allowance here


def test_the_allowlist_has_no_stale_entries():
    """An arrow another part removed must leave ALLOWED too (so the list only shrinks)."""
    edges = read_tree()
    assert [e for e in ALLOWED if e[1] not in edges.get(e[0], ())] == []


# --- power checks: each rule fails on a bad graph -----------------------------------------

def _graph(**sources: str) -> dict[str, set[str]]:
    return module_graph({m.replace("__", "."): (s, False) for m, s in sources.items()})


def test_the_parser_sees_lazy_relative_and_type_checking_imports():
    src = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from silofl.data import x\n"
           "def f():\n    from ..pandemic.graph import g\n    import silofl.io\n")
    names = imported_names(src, "silofl.runtime.plan", is_package=False)
    assert {"silofl.data", "silofl.pandemic.graph", "silofl.io"} <= set(names)


def test_a_cycle_is_found():
    g = _graph(silofl__privacy__a="from silofl.privacy.b import x",
               silofl__privacy__b="def f():\n    import silofl.privacy.a",
               silofl__privacy__c="import silofl.privacy.a")
    assert cycles(g) == [["silofl.privacy.a", "silofl.privacy.b"]]


def test_an_upward_arrow_is_found():
    g = _graph(silofl__privacy__budget="from silofl.data.federation import PrivacyTarget",
               silofl__data__federation="from silofl.privacy.targets import PrivacyTarget",
               silofl__privacy__targets="")
    assert wrong_way(g) == [("silofl.privacy.budget", "silofl.data.federation")]


def test_a_core_to_domain_arrow_is_found():
    g = _graph(silofl__runtime__plan="def f():\n    from silofl.pandemic.node_dp import s",
               silofl__pandemic__node_dp="from silofl.runtime import plan",
               silofl__cli="import silofl.pandemic.node_dp", silofl__runtime="")
    assert core_to_domain(g) == [("silofl.runtime.plan", "silofl.pandemic.node_dp")]
    assert wrong_way(g) == [("silofl.runtime.plan", "silofl.pandemic.node_dp")]


def test_a_domain_reaching_into_the_cli_is_found():
    g = _graph(silofl__theory__cli="from silofl.cli import _fail", silofl__cli="")
    assert wrong_way(g) == [("silofl.theory.cli", "silofl.cli")]


def test_each_allowance_is_needed():
    """Power check of the allowlist itself: without an entry the tree fails a rule."""
    tree = read_tree()
    for entry in sorted(ALLOWED):
        edges = {a: {b for b in bs if (a, b) not in ALLOWED or (a, b) == entry}
                 for a, bs in tree.items()}
        assert cycles(edges) or wrong_way(edges), entry

"""The core never imports a domain: no module of privacy, data, models, training,
algorithms or runtime imports silofl.pandemic (not even lazily inside a function)."""

import ast
from pathlib import Path

import pytest

CORE = ("privacy", "data", "models", "training", "algorithms", "runtime")
SRC = Path(__file__).resolve().parents[1] / "src" / "silofl"


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative: resolve against the module's package
                pkg = path.relative_to(SRC.parent).with_suffix("").parts[:-node.level]
                base = ".".join((*pkg, node.module))
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    return out


@pytest.mark.parametrize("package", CORE)
def test_the_core_never_imports_the_pandemic_domain(package):
    files = sorted((SRC / package).rglob("*.py"))
    assert files
    bad = {str(f.relative_to(SRC)): [m for m in _imports(f) if m.startswith("silofl.pandemic")]
           for f in files}
    assert not {f: m for f, m in bad.items() if m}


def test_the_check_sees_a_domain_import(tmp_path):
    """Power check: the parser finds a lazy, function-level domain import."""
    f = tmp_path / "probe.py"
    f.write_text("def g():\n    from silofl.pandemic.graph import x\n")
    assert "silofl.pandemic.graph" in _imports(f)

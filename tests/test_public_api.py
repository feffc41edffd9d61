"""The public API (`import silofl`, issue 20 part 6): every name resolves, is documented
NumPy-style, is the object its home module defines, appears in the API reference, and
`import silofl` itself imports nothing heavy (a Flower ClientApp process imports silofl
for every message)."""

import ast
import inspect
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

import silofl

ROOT = Path(__file__).resolve().parents[1]
INIT = ROOT / "src" / "silofl" / "__init__.py"
PUBLIC = [n for n in silofl.__all__ if n != "__version__"]


def _section(doc: str, name: str) -> bool:
    """True when the NumPy-style docstring `doc` has a section `name` (title + dashes)."""
    lines = [line.strip() for line in inspect.cleandoc(doc).splitlines()]
    return any(a == name and b and set(b) == {"-"} for a, b in itertools.pairwise(lines))


def test_every_public_name_resolves_to_its_home_module():
    for name in PUBLIC:
        module, attr = silofl._API[name]
        obj = getattr(silofl, name)
        assert obj is getattr(__import__(module, fromlist=[attr]), attr), name


def test_all_is_the_table():
    assert sorted(silofl.__all__) == sorted(["__version__", *silofl._API])


def test_the_type_checking_block_mirrors_the_table():
    """Type checkers and mkdocstrings read the TYPE_CHECKING imports; the lazy loader reads
    `_API`: both must name the same objects, or the docs describe something else."""
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If)
                 and getattr(n.test, "id", None) == "TYPE_CHECKING")
    seen = {}
    for imp in block.body:
        assert isinstance(imp, ast.ImportFrom)
        if imp.module == "typing":
            continue
        for a in imp.names:
            seen[a.asname or a.name] = (imp.module, a.name)
    assert seen == silofl._API


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'simulat'"):
        silofl.simulat  # noqa: B018
    assert set(PUBLIC) <= set(dir(silofl))


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_is_documented_numpy_style(name):
    obj = getattr(silofl, name)
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        # a constant: documented by its `#:` comment in the API reference
        assert f"::: silofl.{name}" in (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
        return
    doc = inspect.getdoc(obj)
    assert doc and len(doc) > 30, f"{name} has no docstring"
    if inspect.isclass(obj) and issubclass(obj, Exception):
        return
    if inspect.isclass(obj):
        assert _section(doc, "Parameters") or _section(doc, "Attributes"), \
            f"{name}: the class docstring needs a Parameters or Attributes section"
        for meth_name, meth in vars(obj).items():
            if meth_name.startswith("_") or not inspect.isfunction(meth):
                continue
            mdoc = inspect.getdoc(meth)
            assert mdoc, f"{name}.{meth_name} has no docstring"
            params = [p for p in inspect.signature(meth).parameters if p != "self"]
            if params:
                assert _section(mdoc, "Parameters"), f"{name}.{meth_name}: no Parameters"
        return
    assert _section(doc, "Parameters"), f"{name}: no Parameters section"
    assert _section(doc, "Returns"), f"{name}: no Returns section"


def test_every_public_name_is_in_the_api_reference():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    missing = [n for n in PUBLIC if f"::: silofl.{n}\n" not in text]
    assert not missing, f"docs/api.md lacks {missing}"


HEAVY = ("numpy", "scipy", "pandas", "torch", "flwr", "dp_accounting", "matplotlib",
         "pyarrow", "pydantic", "sklearn")


def test_import_silofl_is_cheap():
    code = ("import sys, json, silofl; print(json.dumps(sorted(m for m in sys.modules "
            f"if m.split('.')[0] in {HEAVY!r} or m.startswith('silofl.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    # the version lives in a bottom module with no imports of its own
    assert json.loads(out.stdout) == ["silofl._version"]


def test_a_light_name_stays_light():
    """`silofl.load_run` (saved models) does not pull in torch or flwr."""
    code = ("import sys, silofl; silofl.load_run; "
            "print(sorted(m for m in ('torch', 'flwr') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"

"""Declared schemas: what is public about a table, written down before its data is read.

A schema fixes, for every feature column, its kind and the public facts preprocessing may
use, and the label's kind and classes. Everything in it must come from public
documentation (a codebook, a data dictionary, physical limits), never from the private
rows: then the feature columns (names and order), one-hot levels, clipping bounds and
declared scales are identical in every silo without anyone looking at a pooled table.

TOML layout (`load_schema`; the same keys as a dict in `schema_from_dict`)::

    source = "UCI heart disease documentation"   # where the values come from (free text)
    silo_column = "dataset"                      # optional: the column naming the silo

    [label]
    name = "disease"
    kind = "binary"              # binary | multiclass (need `classes`) | regression
    classes = [0, 1]             # class i becomes label id i
    # regression only, optional: lower = 1, upper = 70 (labels are clipped to them)

    [[columns]]                  # one table per feature column, in feature order
    name = "age"
    kind = "numeric"             # numeric | binary | categorical
    lower = 18                   # public bounds; values outside are clipped to them
    upper = 100
    # optional: mean = ..., scale = ... (declared standardization), fill = ... (imputation)
    nullable = false             # true: a `age__missing` 0/1 indicator column follows

    [[columns]]
    name = "cp"
    kind = "categorical"
    levels = ["typical angina", "atypical angina", "non-anginal", "asymptomatic"]
    nullable = true              # true: a `cp=<missing>` level follows the declared ones

Encoded feature columns, in schema order: a numeric or binary column ``c`` gives ``c`` (then
``c__missing`` if nullable); a categorical column gives ``c=<level>`` per declared level
(then ``c=<missing>`` if nullable). Binary columns hold 0/1 (TRUE/FALSE text, booleans or
0/1 numbers in the table).

`draft_schema` (`silofl.data.schema_draft`) writes a TOML draft *from the data* for a
person to check; it carries ``drafted = true``, and `load_schema` refuses such a file until
that line is removed.
"""

from __future__ import annotations

import difflib
import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np

from silofl.errors import ConfigError

KINDS = ("numeric", "binary", "categorical")
#: The learning task a label declares.
Task = Literal["binary", "multiclass", "regression"]
LABEL_KINDS: tuple[Task, ...] = ("binary", "multiclass", "regression")
MISSING_LEVEL = "<missing>"
INDICATOR_SUFFIX = "__missing"
_TOP_KEYS = ("source", "silo_column", "label", "columns", "drafted", "description")
_COLUMN_KEYS = {
    "numeric": ("name", "kind", "lower", "upper", "mean", "scale", "fill", "nullable",
                "description"),
    "binary": ("name", "kind", "fill", "nullable", "description"),
    "categorical": ("name", "kind", "levels", "nullable", "description"),
}
_LABEL_KEYS = ("name", "kind", "classes", "lower", "upper", "description")
DRAFT_REFUSAL = (
    "is a draft (drafted = true): its kinds, bounds, levels and classes were read from the "
    "data, and such values are public only if checked against public documentation (a "
    "codebook, a data dictionary, physical limits). Review every value, replace those that "
    "only the data gave, then delete the line `drafted = true`")


def value_key(v: object) -> float | str:
    """Canonical key for matching a table value against declared levels or classes:
    numbers, booleans and numeric text compare as floats (so 1, 1.0 and "1" match), other
    text compares stripped."""
    if isinstance(v, (bool, np.bool_, int, float, np.integer, np.floating)):
        return float(v)
    s = str(v).strip()
    try:
        f = float(s)
    except ValueError:
        return s
    return f if math.isfinite(f) else s


def level_text(v: object) -> str:
    """How a declared level appears in a feature name: integral numbers without '.0'."""
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, float, np.integer, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


@dataclass(frozen=True)
class ColumnSpec:
    """One declared column, of a feature table or of a declared graph/long table.

    A feature column (`kind` in `KINDS`) has numeric bounds, mean, scale and fill in its
    own units and `levels`, its declared categories in order. A storage column of a
    declared table (`kind` in `silofl.data.columnar.STORAGE_KINDS`) has a `dtype` it is
    held in, and for kind "state" its `levels` (the letters of the codes 0, 1, ...)."""

    name: str
    kind: str
    lower: float | None = None
    upper: float | None = None
    mean: float | None = None
    scale: float | None = None
    fill: float | None = None
    levels: tuple = ()
    nullable: bool = False
    description: str = ""
    #: storage dtype of a declared graph/long table's column (`silofl.data.columnar`);
    #: None for a schema's feature columns, which are encoded as float features
    dtype: str | None = None

    @property
    def np_dtype(self) -> np.dtype:
        """The NumPy dtype the column is held in (storage columns; float64 otherwise)."""
        return np.dtype(self.dtype or "float64")

    @property
    def bounds(self) -> tuple[float, float] | None:
        """(lower, upper) for numeric columns that declare them; (0, 1) for binary ones."""
        if self.kind == "binary":
            return (0.0, 1.0)
        if self.lower is None or self.upper is None:
            return None
        return (float(self.lower), float(self.upper))

    def encoded_names(self) -> list[str]:
        """The feature columns this column becomes (see the module docstring)."""
        if self.kind == "categorical":
            names = [f"{self.name}={level_text(lv)}" for lv in self.levels]
            return names + ([f"{self.name}={MISSING_LEVEL}"] if self.nullable else [])
        return [self.name] + ([self.name + INDICATOR_SUFFIX] if self.nullable else [])

    def to_dict(self) -> dict:
        out: dict = {"name": self.name, "kind": self.kind}
        for key in ("lower", "upper", "mean", "scale", "fill"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.kind == "categorical":
            out["levels"] = list(self.levels)
        out["nullable"] = self.nullable
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class LabelSpec:
    """The declared label: classification `classes` (class i -> id i) or regression with
    optional public bounds (labels are clipped to them)."""

    name: str
    kind: Task
    classes: tuple = ()
    lower: float | None = None
    upper: float | None = None
    description: str = ""

    @property
    def bounds(self) -> tuple[float, float] | None:
        if self.lower is None or self.upper is None:
            return None
        return (float(self.lower), float(self.upper))

    def to_dict(self) -> dict:
        out: dict = {"name": self.name, "kind": self.kind}
        if self.kind != "regression":
            out["classes"] = list(self.classes)
        for key in ("lower", "upper"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class Schema:
    """The declared feature columns (in order) and label of a table.

    A schema fixes the columns, their encoding and the label classes, so every silo
    encodes its own table identically and nothing is read from pooled data (see the
    module ``silofl.data.schema``).

    Attributes
    ----------
    columns : tuple of ColumnSpec
        The feature columns: name, kind (numeric, binary, categorical), bounds, levels,
        nullable.
    label : LabelSpec
        The label column and its task/classes.
    silo_column : str or None
        The column naming each row's silo, where the table holds several silos.
    source : str
        Where the schema came from (a file path), for reports.
    drafted : bool
        A draft read from data: refused until reviewed.
    description : str
        Free text.
    """

    columns: tuple[ColumnSpec, ...]
    label: LabelSpec
    silo_column: str | None = None
    source: str = ""
    drafted: bool = False
    description: str = ""

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def feature_names(self) -> list[str]:
        """The encoded feature columns, in order (what a model sees)."""
        return [n for c in self.columns for n in c.encoded_names()]

    @property
    def task(self) -> Task:
        return self.label.kind

    def column(self, name: str) -> ColumnSpec:
        """The spec of column `name`.

        Parameters
        ----------
        name : str
            A column name.

        Returns
        -------
        ColumnSpec
            Its spec; ConfigError if the schema has no such column.
        """
        for c in self.columns:
            if c.name == name:
                return c
        raise ConfigError(f"the schema has no column {name!r}")

    def value_columns(self) -> dict[int, ColumnSpec]:
        """The numeric and binary value columns, by encoded index.

        Returns
        -------
        dict of int to ColumnSpec
            ``{encoded index: spec}`` of the columns imputation and standardization act
            on (not one-hot levels or missing indicators).
        """
        out, j = {}, 0
        for c in self.columns:
            if c.kind != "categorical":
                out[j] = c
            j += len(c.encoded_names())
        return out

    def to_dict(self) -> dict:
        """This schema as plain data (the TOML file's tables).

        Returns
        -------
        dict
            ``{"label": ..., "columns": [...]}`` plus the optional keys that are set.
        """
        out: dict = {}
        if self.drafted:
            out["drafted"] = True
        if self.source:
            out["source"] = self.source
        if self.description:
            out["description"] = self.description
        if self.silo_column:
            out["silo_column"] = self.silo_column
        out["label"] = self.label.to_dict()
        out["columns"] = [c.to_dict() for c in self.columns]
        return out

    def to_toml(self, header: str = "", notes: Mapping[str, str] | None = None) -> str:
        """This schema as TOML text.

        Parameters
        ----------
        header : str, default ""
            Lines written as comments at the top.
        notes : mapping of str to str, optional
            A comment written above a column's table, by column name.

        Returns
        -------
        str
            TOML text that `load_schema` reads back.
        """
        return _to_toml(self.to_dict(), header, notes or {})


# --- reading and validation ---------------------------------------------------------------

def load_schema(path: str | Path) -> Schema:
    """Read and validate a TOML schema file.

    Parameters
    ----------
    path : str or Path
        The schema file (see `Schema`; `silofl.data.draft_schema` writes a draft).

    Returns
    -------
    Schema
        The declared columns and label.

    Raises
    ------
    ConfigError
        Naming the file on any problem; a draft (``drafted = true``) is refused until a
        person has reviewed it and removed that line.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"schema file not found: {str(p)!r}; write one (see "
                          "silofl.data.schema) or draft it with silofl.data.draft_schema")
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"schema {str(p)!r} is not valid TOML: {e}") from None
    return schema_from_dict(raw, where=f"schema {str(p)!r}")


#: What a ``schema=`` argument accepts: a Schema, its dict (TOML layout) or a TOML file path.
SchemaLike = Schema | Mapping[str, Any] | str | Path


@overload
def as_schema(obj: None) -> None: ...
@overload
def as_schema(obj: SchemaLike) -> Schema: ...
def as_schema(obj: SchemaLike | None) -> Schema | None:
    """A Schema from a Schema, a dict, or a path to a TOML file (None stays None)."""
    if obj is None or isinstance(obj, Schema):
        return obj
    if isinstance(obj, Mapping):
        return schema_from_dict(obj)
    if isinstance(obj, (str, Path)):
        return load_schema(obj)
    raise ConfigError(f"schema must be a Schema, a dict or a path to a TOML file, got "
                      f"{type(obj).__name__}")


def schema_from_dict(raw: Mapping, *, where: str = "schema", allow_draft: bool = False) -> Schema:
    """Validate a schema given as a dict (the TOML layout of the module docstring)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table of keys, got {type(raw).__name__}")
    drafted = raw.get("drafted", False)
    if not isinstance(drafted, bool):
        raise ConfigError(f"{where}: drafted must be true or false")
    if drafted and not allow_draft:
        raise ConfigError(f"{where} {DRAFT_REFUSAL}")
    _unknown_keys(raw, _TOP_KEYS, where)
    if "label" not in raw:
        raise ConfigError(f"{where} has no [label] table; declare the label's name and kind")
    if "columns" not in raw:
        raise ConfigError(f"{where} has no [[columns]] tables; declare every feature column")
    cols_raw = raw["columns"]
    if not isinstance(cols_raw, list) or not all(isinstance(c, Mapping) for c in cols_raw):
        raise ConfigError(f"{where}: columns must be an array of tables ([[columns]] in TOML)")
    columns = tuple(_column(c, i, where) for i, c in enumerate(cols_raw))
    names = [c.name for c in columns]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{where}: duplicate column name(s) {dup}; declare each column once")
    label = _label(raw["label"], where)
    silo = raw.get("silo_column")
    if silo is not None and (not isinstance(silo, str) or not silo):
        raise ConfigError(f"{where}: silo_column must be a non-empty string")
    for role, n in (("label", label.name), ("silo column", silo)):
        if n is not None and n in names:
            raise ConfigError(f"{where}: the {role} {n!r} is also declared as a feature "
                              "column; a model must not see it")
    if silo is not None and silo == label.name:
        raise ConfigError(f"{where}: silo_column and label are both {silo!r}")
    for key in ("source", "description"):
        if not isinstance(raw.get(key, ""), str):
            raise ConfigError(f"{where}: {key} must be a string")
    schema = Schema(columns, label, silo, raw.get("source", ""), drafted,
                    raw.get("description", ""))
    enc = schema.feature_names
    clash = sorted({n for n in enc if enc.count(n) > 1})
    if clash:
        raise ConfigError(f"{where}: encoded feature name(s) {clash} occur twice (e.g. a "
                          "column named 'x__missing' beside a nullable 'x'); rename a column")
    return schema


def _unknown_keys(d: Mapping, allowed: Sequence[str], where: str) -> None:
    for key in d:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), list(allowed), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint} (allowed: "
                              f"{', '.join(allowed)})")


def _number(v: object, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(f"{what} must be a finite number, got {v!r}")
    return float(v)


def _bounds_pair(d: Mapping, what: str) -> tuple[float | None, float | None]:
    lo, hi = d.get("lower"), d.get("upper")
    if (lo is None) != (hi is None):
        raise ConfigError(f"{what}: give both lower and upper, or neither")
    if lo is None:
        return None, None
    lo, hi = _number(lo, f"{what}: lower"), _number(hi, f"{what}: upper")
    if not lo < hi:
        raise ConfigError(f"{what}: lower ({lo}) must be below upper ({hi})")
    return lo, hi


def _column(d: Mapping, i: int, where: str) -> ColumnSpec:
    name = d.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: column #{i + 1} needs a non-empty string name")
    what = f"{where}: column {name!r}"
    kind = d.get("kind")
    if kind not in KINDS:
        near = difflib.get_close_matches(str(kind), KINDS, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"{what}: unknown kind {kind!r}{hint}; choose one of "
                          f"{', '.join(KINDS)}")
    _unknown_keys(d, _COLUMN_KEYS[kind], what)
    nullable = d.get("nullable", False)
    if not isinstance(nullable, bool):
        raise ConfigError(f"{what}: nullable must be true or false")
    desc = d.get("description", "")
    if not isinstance(desc, str):
        raise ConfigError(f"{what}: description must be a string")
    if kind == "categorical":
        levels = d.get("levels")
        if not isinstance(levels, list) or not levels:
            raise ConfigError(f"{what}: a categorical column needs a non-empty list of levels")
        for lv in levels:
            if isinstance(lv, bool) or not isinstance(lv, (str, int, float)) or \
                    (isinstance(lv, str) and not lv.strip()):
                raise ConfigError(f"{what}: levels must be non-empty strings or numbers")
            if isinstance(lv, str) and lv.strip() == MISSING_LEVEL:
                raise ConfigError(f"{what}: {MISSING_LEVEL!r} is reserved; declare "
                                  "nullable = true instead")
        keys = [value_key(lv) for lv in levels]
        dup = sorted({level_text(lv) for lv, k in zip(levels, keys) if keys.count(k) > 1})
        if dup:
            raise ConfigError(f"{what}: duplicate level(s) {dup}")
        return ColumnSpec(name, kind, levels=tuple(levels), nullable=nullable, description=desc)
    fill = d.get("fill")
    if fill is not None:
        fill = _number(fill, f"{what}: fill")
    if kind == "binary":
        if fill is not None and not 0 <= fill <= 1:
            raise ConfigError(f"{what}: fill of a binary column must lie in [0, 1]")
        return ColumnSpec(name, kind, fill=fill, nullable=nullable, description=desc)
    lo, hi = _bounds_pair(d, what)
    mean, scale = d.get("mean"), d.get("scale")
    if (mean is None) != (scale is None):
        raise ConfigError(f"{what}: give both mean and scale, or neither")
    if mean is not None:
        mean, scale = _number(mean, f"{what}: mean"), _number(scale, f"{what}: scale")
        if scale <= 0:
            raise ConfigError(f"{what}: scale must be positive, got {scale}")
        if lo is not None and hi is not None and not lo <= mean <= hi:
            raise ConfigError(f"{what}: mean ({mean}) lies outside [lower, upper]")
    if fill is not None and lo is not None and hi is not None and not lo <= fill <= hi:
        raise ConfigError(f"{what}: fill ({fill}) lies outside [lower, upper]")
    return ColumnSpec(name, kind, lo, hi, mean, scale, fill, nullable=nullable,
                      description=desc)


def as_task(kind: object) -> Task | None:
    """`kind` as a `Task` when it names one of `LABEL_KINDS`, else None."""
    for task in LABEL_KINDS:
        if kind == task:
            return task
    return None


def _label(d: object, where: str) -> LabelSpec:
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: label must be a table ([label] in TOML)")
    what = f"{where}: label"
    _unknown_keys(d, _LABEL_KEYS, what)
    name = d.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{what} needs a non-empty string name (the label column)")
    asked = d.get("kind")
    kind = as_task(asked)
    if kind is None:
        near = difflib.get_close_matches(str(asked), LABEL_KINDS, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"{what}: unknown kind {asked!r}{hint}; choose one of "
                          f"{', '.join(LABEL_KINDS)}")
    desc = d.get("description", "")
    if kind == "regression":
        if "classes" in d:
            raise ConfigError(f"{what}: a regression label has no classes; remove them or "
                              "use kind = 'binary' / 'multiclass'")
        lo, hi = _bounds_pair(d, what)
        return LabelSpec(name, kind, (), lo, hi, desc)
    if "lower" in d or "upper" in d:
        raise ConfigError(f"{what}: bounds apply to regression labels only")
    classes = d.get("classes")
    if not isinstance(classes, list) or not classes:
        raise ConfigError(f"{what}: a {kind} label needs its list of classes")
    for c in classes:
        if isinstance(c, bool) or not isinstance(c, (str, int, float)):
            raise ConfigError(f"{what}: classes must be strings or numbers")
    keys = [value_key(c) for c in classes]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{what}: duplicate classes")
    if kind == "binary" and len(classes) != 2:
        raise ConfigError(f"{what}: a binary label needs exactly 2 classes, got "
                          f"{len(classes)}; use kind = 'multiclass'")
    if kind == "multiclass" and len(classes) < 2:
        raise ConfigError(f"{what}: a multiclass label needs at least 2 classes")
    return LabelSpec(name, kind, tuple(classes), None, None, desc)


# --- TOML writing ---------------------------------------------------------------------------

def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return repr(int(f)) if f.is_integer() and abs(f) < 1e15 else repr(f)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # JSON string escapes are valid TOML
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _to_toml(d: dict, header: str, notes: Mapping[str, str]) -> str:
    lines = [("# " + ln).rstrip() for ln in header.splitlines()] if header else []
    if lines:
        lines.append("")
    for key, v in d.items():
        if key not in ("label", "columns"):
            lines.append(f"{key} = {_toml_value(v)}")
    lines += ["", "[label]"] + [f"{k} = {_toml_value(v)}" for k, v in d["label"].items()]
    for col in d["columns"]:
        lines.append("")
        if col["name"] in notes:
            lines.append(f"# {notes[col['name']]}")
        lines.append("[[columns]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in col.items()]
    return "\n".join(lines) + "\n"

"""Encoding a table by its schema (`encode_table`): features to a float matrix (values
clipped to declared bounds, categories one-hot, NaN where a nullable value is missing),
labels to class ids or targets, rows without a label or silo dropped and counted -- no
split and no statistic. `silofl.data.tabular` reads tables and splits the encoded rows into
silos; its module docstring describes the rules (missing values, placeholders, schemas)."""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from silofl.data.persons import check_person_column, missing_ids, person_ids
from silofl.data.schema import ColumnSpec, LabelSpec, Schema, SchemaLike, as_schema, value_key
from silofl.data.schema_draft import infer_schema
from silofl.data.table_checks import HUGE, check_all_missing
from silofl.data.values import parse_numeric
from silofl.errors import ConfigError, DataError

TASKS = ("auto", "binary", "multiclass", "regression")
MISSING_MODES = ("impute", "drop", "error")


# --- encoding -----------------------------------------------------------------------------

@dataclass
class EncodedTable:
    """A table encoded by a schema, before any split: X (n, d) float64 (NaN only in nullable
    value columns), y (n,) int64 class ids or float64 targets, rows (n,) the input row of
    each kept row, silos (n,) silo names (or None), the schema used (declared, or read from
    the data: ``schema.drafted``), `specs` {encoded index: ColumnSpec} of the value columns
    and `uncharged` the items read from the data (empty with a declared schema)."""

    X: np.ndarray
    y: np.ndarray
    rows: np.ndarray
    silos: np.ndarray | None
    schema: Schema
    specs: dict[int, ColumnSpec]
    uncharged: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    persons: np.ndarray | None = None  # (n,) person ids as read (`person_column`), or None


def encode_table(df: pd.DataFrame, label_column: str, *, silo_column: str | None = None,
                 schema: SchemaLike | None = None, task: str = "auto",
                 features: Sequence[str] | None = None,
                 missing: str = "impute", categorical_max_levels: int = 50,
                 name: str = "table", person_column: str | None = None) -> EncodedTable:
    """Encode a whole table (see the module docstring); no split, no statistic. Without a
    schema the encoding is read from the table (listed in `EncodedTable.uncharged`).
    `person_column` names the person of each row: never a feature, its ids kept as read
    (`silofl.data.persons.person_ids`); rows without one are dropped with
    ``missing="drop"`` and refused otherwise."""
    df, label_column, silo_column, schema, feats = _checked_frame(
        df, label_column, silo_column, schema, task, features, missing, name, person_column)
    dropped, notes, rows, all_silos, df = _drop_unusable(df, label_column, silo_column, feats,
                                                         schema, missing, name, person_column)
    _check_label_finite(df[label_column], label_column,
                        np.array([_silo_name(v) for v in df[silo_column].tolist()],
                                 dtype=object) if silo_column is not None else None)
    silos = np.array([_silo_name(v) for v in df[silo_column].tolist()], dtype=object) \
        if silo_column is not None else None
    lost = [s for s in all_silos if s not in set(silos.tolist())] if silos is not None else []
    if lost:
        notes.append(f"silo(s) {lost} lost all their rows and are left out")
    if notes:
        warnings.warn(f"{name}: " + "; ".join(notes), UserWarning, stacklevel=3)

    uncharged: list[str] = []
    if schema is None:
        schema = infer_schema(df, silo_column, label_column, features=feats, task=task,
                              bounds=False, categorical_max_levels=categorical_max_levels)
        uncharged = _uncharged_items(schema, task)
        if task == "auto" and schema.label.kind == "regression":
            _hint_integer_classes(df[label_column], label_column, notes, name)
    blocks = [_encode_column(df[c.name], c, silos) for c in schema.columns]
    X = np.hstack([b for bl in blocks for b in bl]) if blocks else np.zeros((len(df), 0))
    y = _encode_label(df[label_column], schema.label, silos)
    persons = person_ids(df[person_column], person_column) if person_column else None
    return EncodedTable(X, y, rows, silos, schema, schema.value_columns(), uncharged,
                        dropped, notes, persons)


def _checked_frame(df: pd.DataFrame, label_column: str, silo_column: str | None,
                   schema: SchemaLike | None, task: str, features: Sequence[str] | None,
                   missing: str, name: str, person_column: str | None = None
                   ) -> tuple[pd.DataFrame, str, str | None, Schema | None, list[str]]:
    """The arguments of `encode_table` checked: (a copy of `df` with str column names, the
    label and silo column names, the schema, the feature columns)."""
    if task not in TASKS:
        raise ConfigError(f"task must be one of {', '.join(TASKS)}; got {task!r}")
    if missing not in MISSING_MODES:
        raise ConfigError(f"missing must be one of {', '.join(MISSING_MODES)}; got {missing!r}")
    if not isinstance(df, pd.DataFrame):
        raise DataError(f"expected a pandas DataFrame, got {type(df).__name__}")
    if df.shape[0] == 0 or df.shape[1] == 0:
        raise DataError(f"table {name!r} is empty ({df.shape[0]} rows, {df.shape[1]} columns); "
                        "it needs a silo column, a label column and at least one data row")
    label_column = str(label_column)
    silo_column = None if silo_column is None else str(silo_column)
    df = df.reset_index(drop=True)  # copies; helpers align on a unique row index
    df.columns = [str(c) for c in df.columns]
    dup = sorted({c for c in df.columns if list(df.columns).count(c) > 1})
    if dup:
        raise DataError(f"table {name!r} has duplicate column names {dup}; rename them so "
                        "each column is unique")
    if silo_column is not None:
        _check_column(df, silo_column, "silo column")
    _check_column(df, label_column, "label column")
    if silo_column == label_column:
        raise DataError(f"silo column and label column are both {silo_column!r}; "
                        "they must be different columns")
    if person_column:
        person_column = str(person_column)
        _check_column(df, person_column, "person column")
        check_person_column(person_column, silo_column, label_column, features)
    schema = as_schema(schema)
    if schema is not None:
        _check_schema_fits(df, schema, silo_column, label_column, task, features, name)
        if person_column in schema.column_names:
            raise ConfigError(f"the schema declares the person column {person_column!r} as "
                              "a feature; remove it from the schema's columns: a person id "
                              "is never a feature")
        feats = schema.column_names
    else:
        feats = [c for c in _feature_columns(df, silo_column, label_column, features)
                 if c != person_column]
    return df, label_column, silo_column, schema, feats


def _drop_unusable(df: pd.DataFrame, label_column: str, silo_column: str | None,
                   feats: list[str], schema: Schema | None, missing: str, name: str,
                   person_column: str | None = None
                   ) -> tuple[dict[str, int], list[str], np.ndarray, list[str], pd.DataFrame]:
    """Drop rows without a label or silo (and, with missing='drop', rows with a missing
    feature or person id): (dropped counts, notes, kept input rows, every silo name, kept
    rows)."""
    # rows without a label or silo carry no usable example
    dropped: dict[str, int] = {}
    notes: list[str] = []
    rows = np.arange(len(df))
    all_silos = list(dict.fromkeys(df[silo_column][~_missing(df[silo_column])]
                                   .map(_silo_name))) if silo_column is not None else []
    if silo_column is not None:
        _check_silo_names(all_silos, silo_column, name)
    checks = [("missing_label", label_column)] + \
        ([("missing_silo", silo_column)] if silo_column is not None else [])
    for what, col in checks:
        bad = _missing(df[col]) if what == "missing_silo" else df[col].isna().to_numpy()
        if bad.any():
            dropped[what] = int(bad.sum())
            notes.append(f"dropped {int(bad.sum())} row(s) with a missing {col!r} value")
            df, rows = df.loc[~bad], rows[~bad]
    if person_column and missing == "drop":
        bad = missing_ids(df[person_column])
        if bad.any():
            dropped["missing_person"] = int(bad.sum())
            notes.append(f"dropped {int(bad.sum())} row(s) without a person id "
                         f"({person_column!r})")
            df, rows = df.loc[~bad], rows[~bad]
    check_all_missing(df, feats, schema, missing, name)
    if missing == "error":
        cols = [c for c in feats if df[c].isna().any()]
        if cols:
            counts = ", ".join(f"{c} ({int(df[c].isna().sum())})" for c in cols)
            raise DataError(f"missing values in feature column(s): {counts}; fill them, drop "
                            "those columns via features=, or use missing='impute' or 'drop'")
    elif missing == "drop":
        bad = df[feats].isna().any(axis=1).to_numpy() if feats else np.zeros(len(df), bool)
        if bad.any():
            dropped["missing_features"] = int(bad.sum())
            notes.append(f"dropped {int(bad.sum())} row(s) with missing feature values")
            df, rows = df.loc[~bad], rows[~bad]
    if len(df) == 0:
        fix = {"missing_label": f"fill the label column {label_column!r}",
               "missing_silo": f"fill the silo column {silo_column!r}",
               "missing_features": "use missing='impute' (or declare the columns nullable)",
               "missing_person": f"fill the person column {person_column!r}"}
        raise DataError(f"table {name!r} has no rows left after dropping rows with missing "
                        f"values ({dropped}); " + " or ".join(fix[k] for k in dropped))
    return dropped, notes, rows, all_silos, df


def _uncharged_items(schema: Schema, task: str) -> list[str]:
    """What reading the encoding from a pooled table took from the data."""
    items = ["feature kinds (numeric / binary / categorical) read from the pooled table"]
    items += [f"category levels of {c.name!r} read from the pooled table"
              for c in schema.columns if c.kind == "categorical"]
    nullable = [c.name for c in schema.columns if c.nullable]
    if nullable:
        items.append("missing-value columns (" + ", ".join(repr(n) for n in nullable)
                     + ") chosen from the pooled table")
    if schema.label.kind != "regression":
        items.append("label classes read from the pooled table")
    elif task == "auto":
        items.append("task (regression) inferred from the pooled labels")
    return items


def _check_schema_fits(df: pd.DataFrame, schema: Schema, silo_column: str | None,
                       label_column: str, task: str, features: Sequence[str] | None,
                       name: str) -> None:
    if schema.label.name != label_column:
        raise ConfigError(f"the schema's label is {schema.label.name!r} but label_column is "
                          f"{label_column!r}; make them agree")
    if schema.silo_column and silo_column is not None and schema.silo_column != silo_column:
        raise ConfigError(f"the schema's silo_column is {schema.silo_column!r} but the silo "
                          f"column asked for is {silo_column!r}; make them agree")
    if task != "auto" and task != schema.label.kind:
        raise ConfigError(f"task={task!r} but the schema declares a {schema.label.kind} "
                          "label; leave task='auto' with a schema")
    if features is not None and list(features) != schema.column_names:
        raise ConfigError("features= cannot be combined with a schema: the schema fixes the "
                          "feature columns; edit the schema instead")
    lacking = [c for c in schema.column_names if c not in df.columns]
    if lacking:
        hints = []
        for c in lacking[:20]:  # column names, never values: list them (a newcomer's
            # cut-down export lacked 10 and saw 5)
            near = difflib.get_close_matches(c, list(df.columns), n=1, cutoff=0.6)
            hints.append(f"{c!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
        raise DataError(f"table {name!r} lacks {len(lacking)} column(s) its schema declares: "
                        + ", ".join(hints) + (" …" if len(lacking) > 20 else "")
                        + "; fix the table or the schema")


def _bad(col: str, bad: np.ndarray, what: str, silos: np.ndarray | None, hint: str) -> DataError:
    """DataError naming the column, the count and the silos -- never a value."""
    n = int(bad.sum())
    if silos is not None:
        names, counts = np.unique(silos[bad], return_counts=True)
        order = np.argsort(-counts, kind="stable")[:5]
        where = ", ".join(f"silo {names[i]!r}: {int(counts[i])}" for i in order)
        where += ", ..." if len(names) > 5 else ""
    else:
        where = "in the table"
    return DataError(f"column {col!r}: {n} value(s) {what} ({where}); {hint}")


_NULL_HINT = ("declare nullable = true for it in the schema, or use missing='drop' to drop "
              "those rows")


def _encode_column(s: pd.Series, spec: ColumnSpec, silos: np.ndarray | None) -> list[np.ndarray]:
    """Encoded (n, 1) blocks of one column (see the module docstring)."""
    isna = s.isna().to_numpy()
    if isna.any() and not spec.nullable:
        raise _bad(spec.name, isna, "are missing but the column is not nullable", silos,
                   _NULL_HINT)
    if spec.kind == "categorical":
        index = {value_key(lv): i for i, lv in enumerate(spec.levels)}
        codes = _lookup(s, isna, lambda v: index.get(value_key(v), -1), -1.0)
        unknown = (codes < 0) & ~isna
        if unknown.any():
            raise _bad(spec.name, unknown, "are not among its declared levels", silos,
                       "declare every level the documentation lists, or fix the data")
        out = [(codes == i).astype(np.float64)[:, None] for i in range(len(spec.levels))]
        return out + ([isna.astype(np.float64)[:, None]] if spec.nullable else [])
    if spec.kind == "binary":
        vals = _lookup(s, isna, _binary_value, np.nan)
        bad = np.isnan(vals) & ~isna
        if bad.any():
            raise _bad(spec.name, bad, "are not binary", silos,
                       "a binary column holds TRUE/FALSE, booleans or 0/1")
    else:
        vals = _numeric_values(s, isna)
        bad = np.isnan(vals) & ~isna
        if bad.any():
            raise _bad(spec.name, bad, "are not numbers", silos,
                       "fix them, turn placeholders such as '?' into missing values, or "
                       "declare the column categorical")
        b = spec.bounds
        huge = ~isna & ~(np.abs(vals) <= HUGE)  # ±inf, or a placeholder such as 1e308
        inf = int(np.isinf(vals[huge]).sum())
        what = "are infinite" if inf == huge.sum() else \
            f"are {'infinite or ' if inf else ''}of magnitude above {HUGE:g}"
        if huge.any() and b is None:
            raise _bad(spec.name, huge, what, silos,
                       "such values are no measurement (a placeholder or an overflow): fix "
                       "them, leave them empty (declare the column nullable), or declare "
                       "lower/upper bounds to clip them")
        if huge.any() and b is not None:
            warnings.warn(f"column {spec.name!r}: {int(huge.sum())} value(s) {what} "
                          f"and are clipped to the declared "
                          f"bounds [{b[0]:g}, {b[1]:g}]; if they are placeholders for "
                          "unknown values, leave those cells empty instead", UserWarning,
                          stacklevel=2)
        if b is not None:  # declared bounds: clipping is data-independent
            vals = np.clip(vals, *b)
    return [vals[:, None]] + ([isna.astype(np.float64)[:, None]] if spec.nullable else [])


def _lookup(s: pd.Series, isna: np.ndarray, fn: Callable[[Any], float],
            default: float) -> np.ndarray:
    """(n,) float64: `fn` of each observed value (computed once per distinct value),
    `default` where missing."""
    out = np.full(len(s), default, dtype=np.float64)
    obs = s[~isna]
    if len(obs):
        lut = {v: float(fn(v)) for v in pd.unique(obs)}
        out[~isna] = obs.map(lut).to_numpy(dtype=np.float64)
    return out


def _binary_value(v: object) -> float:
    if isinstance(v, (bool, np.bool_)):
        return float(v)
    k = value_key(v)
    if isinstance(k, str):
        return {"true": 1.0, "false": 0.0}.get(k.lower(), np.nan)
    return k if k in (0.0, 1.0) else np.nan


def _numeric_values(s: pd.Series, isna: np.ndarray) -> np.ndarray:
    """float64 values; NaN where missing or not a number (booleans are not numbers)."""
    parsed = parse_numeric(s)
    if parsed is not None:
        return parsed
    out = np.full(len(s), np.nan)
    for i, v in enumerate(s.tolist()):
        if isna[i] or isinstance(v, (bool, np.bool_)):
            continue
        try:
            out[i] = float(str(v).strip())
        except ValueError:
            pass
    return out


def _encode_label(s: pd.Series, label: LabelSpec, silos: np.ndarray | None) -> np.ndarray:
    """y (n,): class ids 0..C-1 (int64) in declared order, or float64 targets clipped to
    declared bounds."""
    isna = s.isna().to_numpy()
    if label.kind == "regression":
        y = _numeric_values(s, isna)
        bad = np.isnan(y) | np.isinf(y) & (label.bounds is None)
        if bad.any():
            raise _bad(label.name, bad, "are not finite numbers (label)", silos,
                       "a regression label must be numeric")
        return np.clip(y, *label.bounds) if label.bounds is not None else y
    index = {value_key(c): i for i, c in enumerate(label.classes)}
    y = _lookup(s, isna, lambda v: index.get(value_key(v), -1), -1.0).astype(np.int64)
    bad = y < 0
    if bad.any():
        raise _bad(label.name, bad, "are not among the declared label classes", silos,
                   "declare every class in the schema's [label] classes")
    return y


# --- helpers -------------------------------------------------------------------------------

def _check_column(df: pd.DataFrame, col: str, role: str) -> None:
    if col in df.columns:
        return
    cols = list(df.columns)
    lower = {c.lower(): c for c in cols}
    near = difflib.get_close_matches(str(col).lower(), list(lower), n=1, cutoff=0.5)
    hint = f" Did you mean {lower[near[0]]!r}?" if near else ""
    shown = ", ".join(cols[:40]) + (", ..." if len(cols) > 40 else "")
    raise DataError(f"unknown {role} {col!r}; available columns: {shown}.{hint}")


def _feature_columns(df: pd.DataFrame, silo_column: str | None, label_column: str,
                     features: Sequence[str] | None) -> list[str]:
    if features is None:
        return [c for c in df.columns if c not in (silo_column, label_column)]
    if isinstance(features, str):
        raise ConfigError(f"features must be a list of column names, got the string {features!r}")
    feats = [str(f) for f in features]
    for f in feats:
        _check_column(df, f, "feature column")
    for role, col in (("label", label_column), ("silo", silo_column)):
        if col is not None and col in feats:
            raise DataError(f"the {role} column {col!r} is listed in features=; remove it "
                            "(a model must not see its own label or the silo id as a feature)")
    dup = sorted({f for f in feats if feats.count(f) > 1})
    if dup:
        raise DataError(f"features= lists {dup} more than once; list each column once")
    return feats


def _missing(s: pd.Series) -> np.ndarray:
    """Missing silo names: NA, or text that is empty after stripping."""
    return (s.isna() | s.map(lambda v: isinstance(v, str) and not v.strip())).to_numpy(bool)


def _name_key(name: str) -> str:
    """What a silo name could be confused with: case, spaces and number spellings."""
    k = " ".join(name.split()).casefold()
    try:
        f = float(k)
    except ValueError:
        return k
    return repr(f) if f == f else k


def _check_silo_names(names: list[str], col: str, table: str) -> None:
    """Silo names are exact strings; refuse names that differ only in case, spacing or
    number spelling ("1", "1.0", "01"), which tools and people would merge."""
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(_name_key(n), []).append(n)
    clash = [g for g in groups.values() if len(g) > 1]
    if clash:
        shown = "; ".join(" / ".join(repr(n) for n in g) for g in clash[:5])
        raise DataError(f"table {table!r}, silo column {col!r}: {len(clash)} group(s) of "
                        f"silo names differ only in case, spacing or number spelling "
                        f"({shown}); give each silo one distinct name")


def _check_label_finite(s: pd.Series, col: str, silos: np.ndarray | None) -> None:
    """A label of ±inf is a data error (not a class, not a clippable target)."""
    isna = s.isna().to_numpy()
    vals = _numeric_values(s, isna) if s.dtype.kind in "fiu" else \
        _lookup(s, isna, _float_or_nan, np.nan)
    bad = np.isinf(vals)
    if bad.any():
        raise _bad(col, bad, "are infinite (label)", silos,
                   "fix or drop those rows; a label must be a finite number or a class")


def _float_or_nan(v: object) -> float:
    if isinstance(v, (bool, np.bool_)) or v is None:
        return np.nan
    try:
        return float(str(v).strip())
    except ValueError:
        return np.nan


def _hint_integer_classes(s: pd.Series, col: str, notes: list[str], table: str) -> None:
    """task="auto" read integer labels with few values as regression: say so."""
    v = s.dropna()
    if v.dtype.kind not in "iuf" or not len(v):
        return
    vals = v.to_numpy(float)
    k = len(np.unique(vals))
    if 2 < k <= 50 and np.all(vals == np.round(vals)):
        msg = (f"label {col!r} holds {k} distinct integer values, so task='auto' treats it "
               "as regression; if they are classes, set [data] task = \"multiclass\" (or "
               "declare the classes in a schema)")
        notes.append(msg)
        warnings.warn(f"{table}: {msg}", UserWarning, stacklevel=4)


def _silo_name(v: object) -> str:
    # 3.0 read from a float column (e.g. after NaNs) should still be silo "3".
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)

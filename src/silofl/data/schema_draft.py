"""Drafting a schema *from the data* (`draft_schema`, `infer_schema`): a TOML draft for a
person to check, carrying ``drafted = true`` so that `load_schema` refuses it until that
line is removed; and the uncharged path of the table loaders, which infers the schema.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence

import numpy as np
import pandas as pd

from silofl.data.schema import ColumnSpec, LabelSpec, Schema, as_task, value_key
from silofl.data.values import parse_binary, parse_numeric
from silofl.errors import ConfigError, DataError

__all__ = ["DRAFT_HEADER", "draft_schema", "infer_schema"]

DRAFT_HEADER = """\
silofl schema DRAFT{name}. EVERY VALUE BELOW WAS READ FROM THE DATA: the kinds, the
lower/upper bounds (observed minimum and maximum), the category levels, which columns are
nullable and the label classes. Values read from private data are not public: declaring
them would leak what they reveal about individual records, uncharged.
Check every value against public documentation (a codebook, a data dictionary, physical or
legal limits): replace observed bounds by documented ones, list every documented level
(also levels this table happens not to contain), and name your sources in `source`.
Then delete the line `drafted = true`; silofl refuses to load the file until you do."""


def infer_schema(df: pd.DataFrame, silo_column: str | None, label_column: str, *,
                 features: Sequence[str] | None = None, task: str = "auto",
                 bounds: bool = False, categorical_max_levels: int = 50) -> Schema:
    """A schema read from the data (``drafted=True``): kinds, levels, nullability and
    label classes as found in `df`, and with `bounds` the observed min/max of numeric
    columns. Used by `draft_schema` (for a person to review) and, without bounds, by the
    uncharged path of the table loaders. Raises DataError for columns that cannot be
    encoded; messages hold counts and column names, never values."""
    feats = [c for c in df.columns if c not in (silo_column, label_column)] \
        if features is None else list(features)
    cols = [_infer_column(df[c], c, bounds, categorical_max_levels) for c in feats]
    label = _infer_label(df[label_column].dropna(), label_column, task)
    return Schema(tuple(cols), label, silo_column, "read from the data", drafted=True)


def draft_schema(df: pd.DataFrame, silo_column: str | None, label_column: str, *,
                 features: Sequence[str] | None = None, task: str = "auto",
                 categorical_max_levels: int = 50, name: str = "",
                 person_column: str | None = None) -> str:
    """A TOML schema draft for `df`, read from the data, for a person to check against
    public documentation (see DRAFT_HEADER, written at its top). It carries
    ``drafted = true``: `load_schema` refuses it until that line is deleted.
    `person_column` (the person of each row) is never drafted as a feature."""
    df = df.copy()
    df.columns = [str(c) for c in df.columns]
    if person_column:
        from silofl.data.persons import check_person_column
        check_person_column(person_column, silo_column, label_column, features)
    for col, opt in ((label_column, "--label-column"), (silo_column, "--silo-column"),
                     (person_column, "--person-column"),
                     *((f, "feature") for f in features or ())):
        if col is not None and col not in df.columns:
            near = difflib.get_close_matches(col, list(df.columns), n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]!r}?" if near else "."
            raise DataError(f"{opt} {col!r} is not a column of the table{hint} Its columns: "
                            f"{', '.join(map(repr, df.columns))}")
    from silofl.data.column_roles import left_out_block, likely_non_features
    left_out = {}  # likely identifiers and dates are never drafted as features silently
    if features is None:
        left_out = likely_non_features(df.drop(columns=[person_column] if person_column
                                               else []), silo_column, label_column)
        if person_column:
            left_out[person_column] = ("the person column ([data] person_column): who a row "
                                       "is about, never a feature")
        features = [c for c in df.columns if c not in (silo_column, label_column, *left_out)]
    schema = infer_schema(df, silo_column, label_column, features=features, task=task,
                          bounds=True, categorical_max_levels=categorical_max_levels)
    notes = {}
    for c in schema.columns:
        if c.kind == "numeric" and c.lower is not None:
            notes[c.name] = ("lower/upper are the observed min/max: replace them by "
                             "documented bounds")
        elif c.kind == "numeric":
            notes[c.name] = "no observed value: declare lower/upper from documentation"
        elif c.kind == "categorical":
            notes[c.name] = "levels as found in the data: list every documented level"
    from silofl.data.draft_checks import draft_warnings
    for col, lines in draft_warnings(df, schema).items():
        notes[col] = "\n# ".join([*lines, notes[col]] if col in notes else lines)
    header = DRAFT_HEADER.format(name=f" for {name}" if name else "")
    return schema.to_toml(header, notes) + left_out_block(left_out)



def _infer_column(s: pd.Series, name: str, bounds: bool, max_levels: int) -> ColumnSpec:
    nullable = bool(s.isna().any())
    if pd.api.types.is_datetime64_any_dtype(s.dtype) or pd.api.types.is_timedelta64_dtype(s.dtype):
        raise DataError(f"feature column {name!r} holds dates/times, which cannot be encoded "
                        "directly; convert it to a number (e.g. days since a reference date) "
                        f"or leave it out with [data] drop = [{json.dumps(name)}]")
    b = parse_binary(s)
    if b is not None and b.notna().any():
        return ColumnSpec(name, "binary", nullable=nullable)
    num = parse_numeric(s)
    if num is not None:
        from silofl.data.table_checks import HUGE
        # ±inf and 1e308 are an export's placeholders, not measurements: never a bound
        obs = num[np.isfinite(num) & (np.abs(num) <= HUGE)]
        if len(obs) and np.isin(obs, (0.0, 1.0)).all():
            return ColumnSpec(name, "binary", nullable=nullable)
        lo = hi = None
        if bounds and len(obs):
            lo, hi = float(obs.min()), float(obs.max())
            if lo == hi:  # a constant column: a schema needs lower < upper
                hi = lo + 1.0
        return ColumnSpec(name, "numeric", lo, hi, nullable=nullable)
    obs = s.dropna()
    keys: dict[float | str, object] = {}
    for v in obs.tolist():
        keys.setdefault(value_key(v), v)
    from silofl.data.column_roles import date_reason
    if len(keys) > max_levels and date_reason(s, name):
        raise DataError(
            f"feature column {name!r} holds date-like text, which cannot be encoded "
            f"directly; leave it out with [data] drop = [{json.dumps(name)}] (or list the "
            "columns you want in [data] features, or declare a schema without it), or "
            "convert it to a number (e.g. days since a public reference date) first")
    if len(keys) > max_levels:
        raise DataError(
            f"non-numeric feature that cannot be encoded: column {name!r} has {len(keys)} "
            f"distinct text values (more than categorical_max_levels={max_levels}); leave it "
            "out of the features, encode it numerically yourself, or raise "
            "categorical_max_levels. If it holds numbers with placeholders such as '?', turn "
            "those into missing values first")
    if not keys:
        raise DataError(f"feature column {name!r} holds no value at all; leave it out")
    levels = sorted((str(v).strip() if isinstance(v, str) else v for v in keys.values()),
                    key=lambda v: (not isinstance(v, str), str(v)))
    return ColumnSpec(name, "categorical", levels=tuple(levels), nullable=nullable)


def _infer_label(s: pd.Series, col: str, task: str) -> LabelSpec:
    num = parse_numeric(s)
    if num is None:
        b = parse_binary(s)
        num = None if b is None else b.to_numpy(dtype="float64")
    if task == "auto":
        if num is None:
            task = "classification"
        else:
            uniq = np.unique(num)
            is_int = bool(np.all(uniq == np.round(uniq)))
            task = "classification" if is_int and len(uniq) <= 10 else "regression"
    if task == "regression":
        if num is None:
            raise DataError(f"label column {col!r} is not numeric but task='regression'; use "
                            "task='binary'/'multiclass' or a numeric label")
        return LabelSpec(col, "regression")
    classes: list[int | float] | list[str]
    if num is not None:
        classes = [int(v) if float(v).is_integer() else float(v) for v in np.unique(num)]
    else:
        classes = sorted({str(v).strip() for v in s.tolist()})
    if len(classes) < 2:
        raise DataError(f"label column {col!r} has a single value; there is nothing to learn. "
                        "Check the label column name")
    if task == "binary" and len(classes) != 2:
        raise DataError(f"task='binary' but label column {col!r} has {len(classes)} classes; "
                        "use task='multiclass' or map the labels to two values")
    if task == "classification":
        return LabelSpec(col, "binary" if len(classes) == 2 else "multiclass", tuple(classes))
    kind = as_task(task)
    if kind is None:
        raise ConfigError(f"unknown task {task!r}; use 'auto', 'binary', 'multiclass' or "
                          "'regression'")
    return LabelSpec(col, kind, tuple(classes))

"""Load a federation from one table (CSV, CSV.gz or Parquet) with a column naming the silo.

Each row is one example; `silo_column` says which institution holds it and `label_column`
is the target. Every silo is split into train/test with one seeded generator
(`numpy.random.default_rng(seed)`, silos visited in order of first appearance).

With a declared schema (`silofl.data.schema`; ``schema=`` a Schema, a dict or a TOML path)
the schema fixes the feature columns, their encoding and the label classes, so every silo
has the same columns and nothing is read from a pooled table: numeric values are clipped
to declared bounds, binary columns become 0/1, categorical columns one-hot columns
``col=level`` per declared level, and nullable columns get ``col__missing`` indicators
(``col=<missing>`` for categoricals). A table that does not match its schema is a
DataError naming the column and silos, with counts only -- never record values.

Without a schema the kinds, levels, nullable columns and label classes would have to be
read from the pooled table: that is refused unless you opt into uncharged preprocessing
(``standardize="uncharged"`` or ``impute="uncharged"``); the items read are then listed in
``meta["uncharged"]``. `silofl.data.draft_schema` writes a draft to start a schema from.

Missing feature values (`missing=`): ``"impute"`` (default) keeps them for preprocessing
(see `silofl.data.preprocess`; a missing value in a non-nullable column is an error),
``"drop"`` drops rows with any missing feature before the split, ``"error"`` refuses.
Rows whose label or silo is missing are always dropped; the counts are stored in
``meta["dropped"]`` and a `UserWarning` is emitted.

Values that are no measurement are never clipped silently: a numeric feature value that is
±inf or of magnitude above `HUGE` (1e100; e.g. a 1e308 placeholder) is a DataError naming
the column and the number of such cells, or -- where the schema declares bounds, which
clip -- a warning saying how many were clipped. A feature column with no value in any row
is a DataError (a warning with a declared schema that makes it nullable: a silo may not
record it), and a CSV header that names a column twice is a DataError (pandas would
silently rename the second ``x`` to ``x.1``).

Preprocessing (`standardize=`, `impute=`; modes in `silofl.data.preprocess`) defaults to
"auto": declared statistics from the schema. The ``*_raw`` functions stop before it, for
callers that charge private statistics first (`plan_preprocessing` / `apply_preprocessing`).
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from silofl.data.federation import Federation, split_silo
from silofl.data.preprocess import PreprocessSpec, RawFederation, preprocess_without_budget
from silofl.data.schema import MISSING_LEVEL, ColumnSpec, LabelSpec, Schema, as_schema, value_key
from silofl.data.schema_draft import infer_schema
from silofl.data.silo_size import check_settings, limit_silos
from silofl.data.table_checks import HUGE, check_all_missing, check_header_unique
from silofl.data.table_text import check_encoding_name, check_separator, decode_error, drop_columns
from silofl.data.values import parse_numeric
from silofl.errors import ConfigError, DataError

MISSING_CATEGORY = MISSING_LEVEL
_TASKS = ("auto", "binary", "multiclass", "regression")
_MISSING = ("impute", "drop", "error")


def load_table(path: str | Path, silo_column: str, label_column: str, *, schema=None,
               task: str = "auto", features: Sequence[str] | None = None,
               test_fraction: float = 0.2, seed: int = 0, standardize: str | bool = "auto",
               impute: str = "auto", missing: str = "impute",
               categorical_max_levels: int = 50) -> Federation:
    """Read one table with a silo column and build a validated federation from it.

    Each row is one example; every silo is split into train/test with one seeded
    generator. See `federation_from_frame` for what the silos hold.

    Parameters
    ----------
    path : str or Path
        A CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``, ``.pq``) file.
    silo_column : str
        The column naming the silo of each row.
    label_column : str
        The target column.
    schema : Schema, dict or path, optional
        The declared schema (`silofl.load_schema`); fixes columns, encodings and label
        classes so nothing is read from the pooled table. Without one, preprocessing must
        be opted into as uncharged (see below).
    task : {"auto", "binary", "multiclass", "regression"}, default "auto"
        The label's task ("auto": from the schema, else from the labels).
    features : sequence of str, optional
        The feature columns (default: every column but the silo and label columns).
    test_fraction : float, default 0.2
        Share of each silo's rows held out for testing, in [0, 1).
    seed : int, default 0
        Seed of the train/test split (`numpy.random.default_rng(seed)`).
    standardize : {"auto", "declared", "uncharged", "none"} or bool, default "auto"
        Feature scaling ("auto": declared statistics from the schema; "private" needs the
        two-phase API of `silofl.data.preprocess`).
    impute : {"auto", "declared", "uncharged"}, default "auto"
        How missing values of nullable columns are filled.
    missing : {"impute", "drop", "error"}, default "impute"
        Rows with a missing feature value: keep for imputation, drop, or refuse.
    categorical_max_levels : int, default 50
        Without a schema, the most levels a column may have to count as categorical.

    Returns
    -------
    Federation
        One silo per value of `silo_column`, X of shape (n_k, d) float64, y (n_k,).

    Raises
    ------
    DataError
        The file is unreadable or does not match its schema (the message names the
        column and silos, with counts only, never record values).
    ConfigError
        An invalid option.
    """
    raw = load_table_raw(path, silo_column, label_column, schema=schema, task=task,
                         features=features, test_fraction=test_fraction, seed=seed,
                         missing=missing, categorical_max_levels=categorical_max_levels)
    return preprocess_without_budget(raw, _spec(standardize, impute), "load_table")


def load_table_raw(path: str | Path, silo_column: str, label_column: str, *, schema=None,
                   task: str = "auto", features: Sequence[str] | None = None,
                   test_fraction: float = 0.2, seed: int = 0, missing: str = "impute",
                   categorical_max_levels: int = 50, min_silo_rows: int = 0,
                   small_silos: str = "refuse", read_options: dict | None = None
                   ) -> RawFederation:
    """`load_table` up to (not including) preprocessing: a `RawFederation`.
    `read_options`: `read_table`'s sep, encoding and drop."""
    df = read_table(path, text_columns=[silo_column], **(read_options or {}))
    raw = federation_from_frame_raw(
        df, silo_column, label_column, schema=schema, task=task, features=features,
        test_fraction=test_fraction, seed=seed, missing=missing,
        categorical_max_levels=categorical_max_levels, name=Path(path).name.split(".")[0],
        min_silo_rows=min_silo_rows, small_silos=small_silos)
    raw.meta["source"] = str(path)
    return raw


def read_table(path: str | Path, text_columns: Sequence[str] = (), *, sep: str = "",
               encoding: str = "", drop: Sequence[str] = (),
               settings: tuple[str, str, str] = ("[data] sep", "[data] encoding",
                                                 "[data] drop")) -> pd.DataFrame:
    """Read a table by extension, turning every failure into a `DataError` naming the path.

    `text_columns` (e.g. the silo column) are read from a CSV as exact text: "01", "1.0"
    and "1" stay distinct and "NA"/"None"/"null" stay names (only an empty cell is missing).
    A CSV is read with separator `sep` (default ",") and text encoding `encoding` (default
    UTF-8); a file that needs others is refused naming the setting (`settings`: how the
    caller spells sep, encoding and drop). Columns in `drop` are removed after reading.
    """
    p = Path(path)
    if not p.exists():
        rel = "" if p.is_absolute() else \
            f" (relative paths are resolved from {str(Path.cwd())!r})"
        raise DataError(f"data file not found: {str(p)!r}; check the path{rel}")
    if not p.is_file():
        raise DataError(
            f"data path {str(p)!r} is not a file; pass a .csv, .csv.gz or .parquet file"
        )
    gz = p.name.lower().endswith(".gz")
    suffix = "".join(p.suffixes[-2:]).lower() if gz else p.suffix.lower()
    # utf-8-sig: UTF-8 that drops a spreadsheet's byte-order mark from the first header
    enc = check_encoding_name(encoding or "utf-8-sig", settings[1])
    try:
        if suffix in (".csv", ".csv.gz"):
            df = _read_csv(p, [str(c) for c in text_columns if c is not None], sep, enc,
                           settings[0])
        elif suffix in (".parquet", ".pq"):
            df = pd.read_parquet(p)
        else:
            raise DataError(f"unsupported file type {suffix or '(none)'!r} for {str(p)!r}; "
                            "use a .csv, .csv.gz or .parquet file")
    except DataError:
        raise
    except pd.errors.EmptyDataError:
        raise DataError(
            f"data file {str(p)!r} is empty; it needs a header row and data rows"
        ) from None
    except UnicodeDecodeError as e:
        raise decode_error(p, enc, e, settings[1]) from None
    except Exception as e:  # parser, decoding, gzip and Arrow errors all mean "unreadable"
        raise DataError(
            f"could not read {str(p)!r}: {type(e).__name__}; check that the "
            "file is a valid, uncorrupted table of the type its extension says"
        ) from None
    if suffix in (".csv", ".csv.gz"):
        check_header_unique(p, df, sep=sep or ",", encoding=enc)
    return drop_columns(df, drop, p, settings[2])


def _read_csv(p: Path, text_columns: list[str], sep: str, encoding: str,
              sep_setting: str) -> pd.DataFrame:
    from pandas._libs.parsers import STR_NA_VALUES
    opts = {"sep": sep or ",", "encoding": encoding}
    header = pd.read_csv(p, nrows=0, **opts).columns
    if not sep:  # a one-column header with ';' in it: say which setting reads the file
        check_separator(p, header, sep_setting)
    text = [c for c in text_columns if c in header]
    if not text:
        return pd.read_csv(p, **opts)
    # default NA markers everywhere except the text columns, where only "" is missing
    na = {c: ([""] if c in text else sorted(STR_NA_VALUES)) for c in header}
    return pd.read_csv(p, dtype={c: str for c in text}, keep_default_na=False, na_values=na,
                       **opts)


def federation_from_frame(df: pd.DataFrame, silo_column: str, label_column: str, *,
                          schema=None, task: str = "auto",
                          features: Sequence[str] | None = None, test_fraction: float = 0.2,
                          seed: int = 0, standardize: str | bool = "auto",
                          impute: str = "auto", missing: str = "impute",
                          categorical_max_levels: int = 50, name: str = "table") -> Federation:
    """Build a validated `Federation` from an in-memory table (one row per example).

    Parameters
    ----------
    df : pandas.DataFrame
        The table.
    silo_column : str
        The column naming the silo of each row.
    label_column : str
        The target column.
    schema : Schema, dict or path, optional
        The declared schema (`silofl.load_schema`); fixes columns, encodings and label
        classes so nothing is read from the pooled table. Without one, preprocessing must
        be opted into as uncharged (see below).
    task : {"auto", "binary", "multiclass", "regression"}, default "auto"
        The label's task ("auto": from the schema, else from the labels).
    features : sequence of str, optional
        The feature columns (default: every column but the silo and label columns).
    test_fraction : float, default 0.2
        Share of each silo's rows held out for testing, in [0, 1).
    seed : int, default 0
        Seed of the train/test split (`numpy.random.default_rng(seed)`).
    standardize : {"auto", "declared", "uncharged", "none"} or bool, default "auto"
        Feature scaling ("auto": declared statistics from the schema; "private" needs the
        two-phase API of `silofl.data.preprocess`).
    impute : {"auto", "declared", "uncharged"}, default "auto"
        How missing values of nullable columns are filled.
    missing : {"impute", "drop", "error"}, default "impute"
        Rows with a missing feature value: keep for imputation, drop, or refuse.
    categorical_max_levels : int, default 50
        Without a schema, the most levels a column may have to count as categorical.
    name : str, default "table"
        The federation's name.

    Returns
    -------
    Federation
        Silos named ``str(value)`` of `silo_column` in order of first appearance, each
        with X of shape (n_k, d) float64 (d = len(schema.feature_names)) and y of shape
        (n_k,) (int64 class ids or float64 targets), preprocessed by the modes
        `standardize` and `impute` (private modes need `federation_from_frame_raw` and the
        two-phase API of `silofl.data.preprocess`).

    Raises
    ------
    DataError
        The table does not match its schema or cannot make a valid federation.
    """
    spec = _spec(standardize, impute)
    raw = federation_from_frame_raw(
        df, silo_column, label_column, schema=schema, task=task, features=features,
        test_fraction=test_fraction, seed=seed, missing=missing,
        categorical_max_levels=categorical_max_levels, name=name)
    return preprocess_without_budget(raw, spec, "federation_from_frame")


def federation_from_frame_raw(df: pd.DataFrame, silo_column: str, label_column: str, *,
                              schema=None, task: str = "auto",
                              features: Sequence[str] | None = None,
                              test_fraction: float = 0.2, seed: int = 0,
                              missing: str = "impute", categorical_max_levels: int = 50,
                              name: str = "table", min_silo_rows: int = 0,
                              small_silos: str = "refuse") -> RawFederation:
    """Encode and split a table without computing any statistic: a `RawFederation` whose X
    (n_k, d) float64 holds NaN where a nullable value is missing. Silos with fewer than
    `min_silo_rows` training or test rows are refused or dropped (`small_silos`; see
    `silofl.data.silo_size`) before the silos are checked."""
    check_settings(min_silo_rows, small_silos)
    enc = encode_table(df, label_column, silo_column=silo_column, schema=schema, task=task,
                       features=features, missing=missing,
                       categorical_max_levels=categorical_max_levels, name=name)
    codes, order = pd.factorize(pd.Series(enc.silos, dtype=object), sort=False)
    rng = np.random.default_rng(seed)
    silos = [split_silo(str(s), enc.X[codes == k], enc.y[codes == k], test_fraction, rng)
             for k, s in enumerate(order)]
    silos, small = limit_silos(silos, min_silo_rows, small_silos)
    meta = {"silo_column": str(silo_column), "label_column": str(label_column),
            "missing": missing, "dropped": enc.dropped, "warnings": enc.notes, "seed": seed,
            "test_fraction": test_fraction,
            "schema": enc.schema.source if not enc.schema.drafted else "read from the data"}
    if small:
        meta["dropped_silos"] = small
    if enc.schema.drafted:
        meta["schema_from_data"] = True
    if enc.schema.label.kind != "regression":
        meta["classes"] = list(enc.schema.label.classes)
    try:
        return RawFederation(silos, enc.schema.feature_names, enc.schema.label.kind,
                             num_classes=len(enc.schema.label.classes), specs=enc.specs,
                             name=name, meta=meta, uncharged=list(enc.uncharged))
    except DataError as e:
        if "missing_features" not in enc.dropped:
            raise
        raise DataError(f"{e} (this is after missing='drop' removed "
                        f"{enc.dropped['missing_features']} row(s); missing='impute' keeps "
                        "them)") from None


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


def encode_table(df: pd.DataFrame, label_column: str, *, silo_column: str | None = None,
                 schema=None, task: str = "auto", features: Sequence[str] | None = None,
                 missing: str = "impute", categorical_max_levels: int = 50,
                 name: str = "table") -> EncodedTable:
    """Encode a whole table (see the module docstring); no split, no statistic. Without a
    schema the encoding is read from the table (listed in `EncodedTable.uncharged`)."""
    if task not in _TASKS:
        raise ConfigError(f"task must be one of {', '.join(_TASKS)}; got {task!r}")
    if missing not in _MISSING:
        raise ConfigError(f"missing must be one of {', '.join(_MISSING)}; got {missing!r}")
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
    schema = as_schema(schema)
    if schema is not None:
        _check_schema_fits(df, schema, silo_column, label_column, task, features, name)
        feats = schema.column_names
    else:
        feats = _feature_columns(df, silo_column, label_column, features)

    # Rows without a label or silo carry no usable example.
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
               "missing_features": "use missing='impute' (or declare the columns nullable)"}
        raise DataError(f"table {name!r} has no rows left after dropping rows with missing "
                        f"values ({dropped}); " + " or ".join(fix[k] for k in dropped))
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
    return EncodedTable(X, y, rows, silos, schema, schema.value_columns(), uncharged,
                        dropped, notes)


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


def _check_schema_fits(df, schema: Schema, silo_column, label_column, task, features, name):
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


def _encode_column(s: pd.Series, spec: ColumnSpec, silos) -> list[np.ndarray]:
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
        if huge.any():
            warnings.warn(f"column {spec.name!r}: {int(huge.sum())} value(s) {what} "
                          f"and are clipped to the declared "
                          f"bounds [{b[0]:g}, {b[1]:g}]; if they are placeholders for "
                          "unknown values, leave those cells empty instead", UserWarning,
                          stacklevel=2)
        if b is not None:  # declared bounds: clipping is data-independent
            vals = np.clip(vals, *b)
    return [vals[:, None]] + ([isna.astype(np.float64)[:, None]] if spec.nullable else [])


def _lookup(s: pd.Series, isna: np.ndarray, fn, default: float) -> np.ndarray:
    """(n,) float64: `fn` of each observed value (computed once per distinct value),
    `default` where missing."""
    out = np.full(len(s), default, dtype=np.float64)
    obs = s[~isna]
    if len(obs):
        lut = {v: float(fn(v)) for v in pd.unique(obs)}
        out[~isna] = obs.map(lut).to_numpy(dtype=np.float64)
    return out


def _binary_value(v) -> float:
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


def _encode_label(s: pd.Series, label: LabelSpec, silos) -> np.ndarray:
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


def _spec(standardize, impute) -> PreprocessSpec:
    return PreprocessSpec(standardize=standardize, impute=impute)


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


def _feature_columns(df, silo_column, label_column, features) -> list[str]:
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


def _check_label_finite(s: pd.Series, col: str, silos) -> None:
    """A label of ±inf is a data error (not a class, not a clippable target)."""
    isna = s.isna().to_numpy()
    vals = _numeric_values(s, isna) if s.dtype.kind in "fiu" else \
        _lookup(s, isna, _float_or_nan, np.nan)
    bad = np.isinf(vals)
    if bad.any():
        raise _bad(col, bad, "are infinite (label)", silos,
                   "fix or drop those rows; a label must be a finite number or a class")


def _float_or_nan(v) -> float:
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


def _silo_name(v) -> str:
    # 3.0 read from a float column (e.g. after NaNs) should still be silo "3".
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


__all__ = ["load_table", "load_table_raw", "read_table", "federation_from_frame",
           "federation_from_frame_raw", "encode_table", "EncodedTable", "MISSING_CATEGORY"]

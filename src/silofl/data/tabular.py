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

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from silofl.data.encoding import encode_table
from silofl.data.federation import Federation, Silo, split_silo
from silofl.data.persons import group_split
from silofl.data.preprocess import PreprocessSpec, preprocess_without_budget
from silofl.data.raw import RawFederation
from silofl.data.schema import MISSING_LEVEL, SchemaLike
from silofl.data.silo_size import check_settings, limit_silos
from silofl.data.table_checks import check_header_unique
from silofl.data.table_text import check_encoding_name, check_separator, decode_error, drop_columns
from silofl.errors import DataError

MISSING_CATEGORY = MISSING_LEVEL


def load_table(path: str | Path, silo_column: str, label_column: str, *,
               schema: SchemaLike | None = None,
               task: str = "auto", features: Sequence[str] | None = None,
               test_fraction: float = 0.2, seed: int = 0, standardize: str | bool = "auto",
               impute: str = "auto", missing: str = "impute",
               categorical_max_levels: int = 50, person_column: str | None = None
               ) -> Federation:
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
    person_column : str, optional
        The column naming the person of each row (never a feature): the silos then carry
        ``person_train``/``person_test`` and the train/test split keeps each person's rows
        on one side (see `federation_from_frame_raw`).

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
                         missing=missing, categorical_max_levels=categorical_max_levels,
                         person_column=person_column)
    return preprocess_without_budget(raw, _spec(standardize, impute), "load_table")


def load_table_raw(path: str | Path, silo_column: str, label_column: str, *,
                   schema: SchemaLike | None = None,
                   task: str = "auto", features: Sequence[str] | None = None,
                   test_fraction: float = 0.2, seed: int = 0, missing: str = "impute",
                   categorical_max_levels: int = 50, min_silo_rows: int = 0,
                   small_silos: str = "refuse", read_options: dict | None = None,
                   person_column: str | None = None) -> RawFederation:
    """`load_table` up to (not including) preprocessing: a `RawFederation`.
    `read_options`: `read_table`'s sep, encoding and drop. A CSV's person ids are read as
    exact text ("01" and "1" are two persons)."""
    df = read_table(path, text_columns=[c for c in (silo_column, person_column) if c],
                    **(read_options or {}))
    raw = federation_from_frame_raw(
        df, silo_column, label_column, schema=schema, task=task, features=features,
        test_fraction=test_fraction, seed=seed, missing=missing,
        categorical_max_levels=categorical_max_levels, name=Path(path).name.split(".")[0],
        min_silo_rows=min_silo_rows, small_silos=small_silos, person_column=person_column)
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
                          schema: SchemaLike | None = None, task: str = "auto",
                          features: Sequence[str] | None = None, test_fraction: float = 0.2,
                          seed: int = 0, standardize: str | bool = "auto",
                          impute: str = "auto", missing: str = "impute",
                          categorical_max_levels: int = 50, name: str = "table",
                          person_column: str | None = None) -> Federation:
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
    person_column : str, optional
        The column naming the person of each row (see `federation_from_frame_raw`).

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
        categorical_max_levels=categorical_max_levels, name=name, person_column=person_column)
    return preprocess_without_budget(raw, spec, "federation_from_frame")


def federation_from_frame_raw(df: pd.DataFrame, silo_column: str, label_column: str, *,
                              schema: SchemaLike | None = None, task: str = "auto",
                              features: Sequence[str] | None = None,
                              test_fraction: float = 0.2, seed: int = 0,
                              missing: str = "impute", categorical_max_levels: int = 50,
                              name: str = "table", min_silo_rows: int = 0,
                              small_silos: str = "refuse",
                              person_column: str | None = None) -> RawFederation:
    """Encode and split a table without computing any statistic: a `RawFederation` whose X
    (n_k, d) float64 holds NaN where a nullable value is missing. Silos with fewer than
    `min_silo_rows` training or test rows are refused or dropped (`small_silos`; see
    `silofl.data.silo_size`) before the silos are checked. With `person_column` every
    silo carries ``person_train``/``person_test`` and the split is by person: a keyed hash
    of (seed, id) puts each person's rows on one side, the same side in every silo
    (`silofl.data.persons.group_split`)."""
    check_settings(min_silo_rows, small_silos)
    enc = encode_table(df, label_column, silo_column=silo_column, schema=schema, task=task,
                       features=features, missing=missing,
                       categorical_max_levels=categorical_max_levels, name=name,
                       person_column=person_column)
    codes, order = pd.factorize(pd.Series(enc.silos, dtype=object), sort=False)
    if enc.persons is None:
        rng = np.random.default_rng(seed)
        silos = [split_silo(str(s), enc.X[codes == k], enc.y[codes == k], test_fraction, rng)
                 for k, s in enumerate(order)]
    else:
        silos = [_person_silo(str(s), enc.X[codes == k], enc.y[codes == k],
                              enc.persons[codes == k], test_fraction, seed)
                 for k, s in enumerate(order)]
    silos, small = limit_silos(silos, min_silo_rows, small_silos)
    meta = {"silo_column": str(silo_column), "label_column": str(label_column),
            "missing": missing, "dropped": enc.dropped, "warnings": enc.notes, "seed": seed,
            "test_fraction": test_fraction,
            "schema": enc.schema.source if not enc.schema.drafted else "read from the data"}
    if small:
        meta["dropped_silos"] = small
    if enc.persons is not None:
        meta["person_column"] = str(person_column)
        meta["split_by"] = "person (keyed hash of seed and id)"
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


def _person_silo(name: str, X: np.ndarray, y: np.ndarray, persons: np.ndarray,
                 test_fraction: float, seed: int) -> Silo:
    """One silo split by person (`group_split`), its ids kept with its rows."""
    tr, te = group_split(persons, test_fraction, seed)
    return Silo(name, X[tr], y[tr], X[te], y[te], person_train=persons[tr],
                person_test=persons[te])


def _spec(standardize: str | bool, impute: str) -> PreprocessSpec:
    return PreprocessSpec.of(standardize, impute)


__all__ = ["load_table", "load_table_raw", "read_table", "federation_from_frame",
           "federation_from_frame_raw", "MISSING_CATEGORY"]

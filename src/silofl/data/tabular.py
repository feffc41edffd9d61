"""Load a federation from one table (CSV, CSV.gz or Parquet) with a column naming the silo.

Each row is one example; `silo_column` says which institution holds it and `label_column`
is the target. Every silo is split into train/test with one seeded generator
(`numpy.random.default_rng(seed)`, silos visited in order of first appearance).

Feature encoding (one schema for all silos, so every silo's X has the same columns):
  * numeric columns stay numeric (float64);
  * bool columns and columns of TRUE/FALSE strings (any case) become 0/1;
  * other text/categorical columns are one-hot encoded with ONE category list taken from
    the whole table (sorted), columns named ``col=value``; a category seen in only one silo
    still gets its column everywhere. A text column with more than `categorical_max_levels`
    distinct values is rejected (it is most likely an identifier or free text).

Missing values (`missing=`):
  * ``"impute"`` (default) -- a numeric NaN is replaced by the median of that column over
    the silo's own TRAINING rows (computed after the split, so test rows never influence
    it); if the silo has no observed training value, the median over all silos' training
    rows is used (0.0 if there is none at all). For every numeric column with any missing
    value anywhere in the table, an indicator column ``col__missing`` (1 = was missing)
    is added to every silo, so a model can learn from missingness itself. A missing
    categorical value becomes its own category ``col=<missing>``.
  * ``"drop"`` -- rows with any missing feature are dropped before the split.
  * ``"error"`` -- raise `DataError` listing the columns that have missing values.
Rows whose label or silo is missing are always dropped; the counts are stored in
``meta["dropped"]`` and a `UserWarning` is emitted.

Labels (`task="auto"`): a non-numeric label, or a numeric one with at most 10 distinct
integer values, means classification ("binary" for 2 classes, else "multiclass") with the
classes mapped to 0..C-1 in sorted order (``meta["classes"]`` holds the original values);
otherwise regression with the label as float64 in its own units.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from silofl.data.federation import Federation, split_silo
from silofl.data.federation import standardize as standardize_federation
from silofl.errors import ConfigError, DataError

MISSING_CATEGORY = "<missing>"
_TASKS = ("auto", "binary", "multiclass", "regression")
_MISSING = ("impute", "drop", "error")
_MAX_AUTO_CLASSES = 10


def load_table(path: str | Path, silo_column: str, label_column: str, *, task: str = "auto",
               features: Sequence[str] | None = None, test_fraction: float = 0.2, seed: int = 0,
               standardize: bool = True, missing: str = "impute",
               categorical_max_levels: int = 50) -> Federation:
    """Read a CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``, ``.pq``) file and build a
    federation from it; see the module docstring and `federation_from_frame`."""
    df = read_table(path)
    fed = federation_from_frame(
        df, silo_column, label_column, task=task, features=features,
        test_fraction=test_fraction, seed=seed, standardize=standardize, missing=missing,
        categorical_max_levels=categorical_max_levels, name=Path(path).name.split(".")[0])
    fed.meta["source"] = str(path)
    return fed


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a table by extension, turning every failure into a `DataError` naming the path."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"data file not found: {str(p)!r}; check the path "
                        f"(relative paths are resolved from {str(Path.cwd())!r})")
    if not p.is_file():
        raise DataError(f"data path {str(p)!r} is not a file; pass a .csv, .csv.gz or .parquet file")
    suffix = "".join(p.suffixes[-2:]).lower() if p.name.lower().endswith(".gz") else p.suffix.lower()
    try:
        if suffix in (".csv", ".csv.gz"):
            df = pd.read_csv(p)
        elif suffix in (".parquet", ".pq"):
            df = pd.read_parquet(p)
        else:
            raise DataError(f"unsupported file type {suffix or '(none)'!r} for {str(p)!r}; "
                            "use a .csv, .csv.gz or .parquet file")
    except DataError:
        raise
    except pd.errors.EmptyDataError:
        raise DataError(f"data file {str(p)!r} is empty; it needs a header row and data rows") from None
    except Exception as e:  # parser, decoding, gzip and Arrow errors all mean "unreadable"
        raise DataError(f"could not read {str(p)!r}: {type(e).__name__}: {e}; check that the "
                        "file is a valid, uncorrupted table of the type its extension says") from None
    return df


def federation_from_frame(df: pd.DataFrame, silo_column: str, label_column: str, *,
                          task: str = "auto", features: Sequence[str] | None = None,
                          test_fraction: float = 0.2, seed: int = 0, standardize: bool = True,
                          missing: str = "impute", categorical_max_levels: int = 50,
                          name: str = "table") -> Federation:
    """Build a validated `Federation` from an in-memory table (one row per example).

    Returns silos named ``str(value)`` of `silo_column` in order of first appearance, each
    with X of shape (n_k, d) float64 and y of shape (n_k,) (int64 class ids or float64
    targets). With `standardize`, features are z-scored per silo on its training rows.
    """
    if task not in _TASKS:
        raise ConfigError(f"task must be one of {', '.join(_TASKS)}; got {task!r}")
    if missing not in _MISSING:
        raise ConfigError(f"missing must be one of {', '.join(_MISSING)}; got {missing!r}")
    if not isinstance(df, pd.DataFrame):
        raise DataError(f"expected a pandas DataFrame, got {type(df).__name__}")
    if df.shape[0] == 0 or df.shape[1] == 0:
        raise DataError(f"table {name!r} is empty ({df.shape[0]} rows, {df.shape[1]} columns); "
                        "it needs a silo column, a label column and at least one data row")
    silo_column, label_column = str(silo_column), str(label_column)
    df = df.reset_index(drop=True)  # copies; helpers align on a unique row index
    df.columns = [str(c) for c in df.columns]
    dup = sorted({c for c in df.columns if list(df.columns).count(c) > 1})
    if dup:
        raise DataError(f"table {name!r} has duplicate column names {dup}; rename them so "
                        "each column is unique")
    _check_column(df, silo_column, "silo column")
    _check_column(df, label_column, "label column")
    if silo_column == label_column:
        raise DataError(f"silo column and label column are both {silo_column!r}; "
                        "they must be different columns")
    feats = _feature_columns(df, silo_column, label_column, features)

    # Rows without a label or silo carry no usable example.
    dropped: dict[str, int] = {}
    notes: list[str] = []
    all_silos = list(dict.fromkeys(df[silo_column].dropna().map(_silo_name)))
    for what, col in (("missing_label", label_column), ("missing_silo", silo_column)):
        bad = df[col].isna().to_numpy()
        if bad.any():
            dropped[what] = int(bad.sum())
            notes.append(f"dropped {int(bad.sum())} row(s) with a missing {col!r} value")
            df = df.loc[~bad]
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
            df = df.loc[~bad]
    if len(df) == 0:
        raise DataError(f"table {name!r} has no rows left after dropping rows with missing "
                        f"values ({dropped}); use missing='impute' or fix the data")
    lost = [s for s in all_silos if s not in set(df[silo_column].map(_silo_name))]
    if lost:
        notes.append(f"silo(s) {lost} lost all their rows and are left out")
    if notes:
        warnings.warn(f"{name}: " + "; ".join(notes), UserWarning, stacklevel=2)

    task, y, classes = _encode_labels(df[label_column], label_column, task)
    X, names, numeric_idx = _encode_features(df, feats, categorical_max_levels)
    silo_names = [_silo_name(v) for v in df[silo_column].tolist()]
    codes, order = pd.factorize(pd.Series(silo_names, dtype=object), sort=False)

    rng = np.random.default_rng(seed)
    silos = [split_silo(str(s), X[codes == k], y[codes == k], test_fraction, rng)
             for k, s in enumerate(order)]
    medians = _impute(silos, numeric_idx, names) if numeric_idx else {}

    meta = {"silo_column": silo_column, "label_column": label_column, "missing": missing,
            "dropped": dropped, "warnings": notes, "standardized": bool(standardize),
            "seed": seed, "test_fraction": test_fraction}
    if classes is not None:
        meta["classes"] = classes
    if medians:
        meta["imputed_medians"] = medians
    try:
        fed = Federation(silos, names, task, num_classes=len(classes) if classes else 0,
                         name=name, meta=meta)
    except DataError as e:
        if "missing_features" not in dropped:
            raise
        raise DataError(f"{e} (this is after missing='drop' removed "
                        f"{dropped['missing_features']} row(s); missing='impute' keeps them)") from None
    return standardize_federation(fed) if standardize else fed


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
        if col in feats:
            raise DataError(f"the {role} column {col!r} is listed in features=; remove it "
                            "(a model must not see its own label or the silo id as a feature)")
    dup = sorted({f for f in feats if feats.count(f) > 1})
    if dup:
        raise DataError(f"features= lists {dup} more than once; list each column once")
    return feats


def _silo_name(v) -> str:
    # 3.0 read from a float column (e.g. after NaNs) should still be silo "3".
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def _as_bool01(s: pd.Series) -> pd.Series | None:
    """0/1 floats (NaN kept) if every observed value is a bool or a TRUE/FALSE string."""
    if pd.api.types.is_bool_dtype(s.dtype):
        return s.astype("float64")
    if pd.api.types.is_numeric_dtype(s.dtype):
        return None
    obs = s.dropna()
    mapping = {True: 1.0, False: 0.0, "true": 1.0, "false": 0.0}
    if len(obs) == 0:
        return None
    vals = [v.strip().lower() if isinstance(v, str) else v for v in obs.tolist()]
    if not all(isinstance(v, (bool, np.bool_, str)) and v in mapping for v in vals):
        return None
    out = pd.Series(np.nan, index=s.index, dtype="float64")
    out[obs.index] = [mapping[bool(v) if isinstance(v, np.bool_) else v] for v in vals]
    return out


def _as_numeric(s: pd.Series) -> pd.Series | None:
    """float64 (NaN kept) if the column is numeric or all observed values parse as numbers."""
    if pd.api.types.is_bool_dtype(s.dtype):
        return None
    if pd.api.types.is_numeric_dtype(s.dtype):
        return s.astype("float64")
    if isinstance(s.dtype, pd.CategoricalDtype) or not (
            pd.api.types.is_object_dtype(s.dtype) or pd.api.types.is_string_dtype(s.dtype)):
        return None
    obs = s.dropna()
    if len(obs) == 0:
        return None
    parsed = pd.to_numeric(obs.astype(str).str.strip(), errors="coerce")
    if parsed.isna().any():
        return None
    out = pd.Series(np.nan, index=s.index, dtype="float64")
    out[obs.index] = parsed.to_numpy(dtype="float64")
    return out


def _encode_features(df: pd.DataFrame, feats: list[str], max_levels: int):
    """(X (n, d) float64 with NaN where a numeric value is missing, names, numeric col ids)."""
    blocks: list[np.ndarray] = []
    names: list[str] = []
    numeric_idx: list[int] = []
    for c in feats:
        s = df[c]
        num = _as_bool01(s)
        if num is None:
            num = _as_numeric(s)
        if num is not None:
            vals = num.to_numpy(dtype="float64")
            numeric_idx.append(len(names))
            names.append(c)
            blocks.append(vals[:, None])
            if np.isnan(vals).any():  # missingness itself may be informative
                names.append(f"{c}__missing")
                blocks.append(np.isnan(vals).astype("float64")[:, None])
            continue
        if pd.api.types.is_datetime64_any_dtype(s.dtype) or pd.api.types.is_timedelta64_dtype(s.dtype):
            raise DataError(f"feature column {c!r} holds dates/times, which cannot be encoded "
                            f"directly; convert it to a number (e.g. days since a reference date) "
                            f"or drop it via features=")
        isna = s.isna().to_numpy()
        text = np.array([str(v) for v in s.tolist()], dtype=object)
        levels = sorted(set(text[~isna].tolist()))
        if len(levels) > max_levels:
            raise DataError(
                f"non-numeric feature that cannot be encoded: column {c!r} has {len(levels)} "
                f"distinct text values (more than categorical_max_levels={max_levels}), e.g. "
                f"{levels[:3]}; drop it via features=[...], encode it numerically yourself, or "
                "raise categorical_max_levels. If it holds numbers with placeholders such as "
                "'?', turn those into missing values first")
        if isna.any():
            levels.append(MISSING_CATEGORY)
            text[isna] = MISSING_CATEGORY
        for lv in levels:
            names.append(f"{c}={lv}")
            blocks.append((text == lv).astype("float64")[:, None])
    X = np.hstack(blocks) if blocks else np.zeros((len(df), 0))
    return X, names, numeric_idx


def _encode_labels(s: pd.Series, col: str, task: str):
    """(task, y (n,), classes or None). Classes are sorted; y holds their indices 0..C-1."""
    num = _as_numeric(s)
    if num is None and _as_bool01(s) is not None:
        num = _as_bool01(s)  # TRUE/FALSE labels are classes False < True
    if task == "auto":
        if num is None:
            task = "classification"
        else:
            v = num.to_numpy()
            uniq = np.unique(v)
            is_int = bool(np.all(uniq == np.round(uniq)))
            task = "classification" if is_int and len(uniq) <= _MAX_AUTO_CLASSES else "regression"
    if task == "regression":
        if num is None:
            raise DataError(f"label column {col!r} is not numeric (e.g. {s.dropna().iloc[0]!r}) "
                            "but task='regression'; use task='binary'/'multiclass' or a numeric label")
        return "regression", num.to_numpy(dtype="float64"), None
    if num is not None:
        keys = num.to_numpy()
        classes = [v.item() if hasattr(v, "item") else v for v in np.unique(keys)]
        classes = [int(v) if float(v).is_integer() else v for v in classes]
        y = np.searchsorted(np.unique(keys), keys)
    else:
        keys = np.array([str(v) for v in s.tolist()], dtype=object)
        classes = sorted(set(keys.tolist()))
        y = np.searchsorted(np.array(classes, dtype=object), keys)
    if len(classes) < 2:
        raise DataError(f"label column {col!r} has a single value ({classes[0]!r}); there is "
                        "nothing to learn. Check the label column name")
    if task == "binary" and len(classes) != 2:
        raise DataError(f"task='binary' but label column {col!r} has {len(classes)} classes "
                        f"({classes[:10]}); use task='multiclass' or map the labels to two values")
    if task == "classification":
        task = "binary" if len(classes) == 2 else "multiclass"
    return task, y.astype("int64"), classes


def _impute(silos, numeric_idx: list[int], names: list[str]) -> dict[str, dict[str, float]]:
    """Fill NaNs in place with per-silo training medians (fallback: pooled training median).
    Returns {silo: {column: value used}} for the columns that had gaps in that silo."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns are handled below
        pooled = np.nanmedian(np.vstack([s.X_train[:, numeric_idx] for s in silos]), axis=0)
        pooled = np.where(np.isnan(pooled), 0.0, pooled)
        used: dict[str, dict[str, float]] = {}
        for s in silos:
            tr, te = s.X_train[:, numeric_idx], s.X_test[:, numeric_idx]
            gaps = np.isnan(tr).any(axis=0) | np.isnan(te).any(axis=0)
            if not gaps.any():
                continue
            med = np.nanmedian(tr, axis=0) if len(tr) else np.full(len(numeric_idx), np.nan)
            med = np.where(np.isnan(med), pooled, med)  # silo never observed it in training
            for X, sub in ((s.X_train, tr), (s.X_test, te)):
                r, c = np.nonzero(np.isnan(sub))
                X[r, np.asarray(numeric_idx)[c]] = med[c]
            used[s.name] = {names[numeric_idx[i]]: float(med[i]) for i in np.flatnonzero(gaps)}
    return used

"""Reading a table's cells as numbers or 0/1 flags, whatever their storage: the one parser
the schema model, the table reader and the drafting checks share."""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["parse_binary", "parse_numeric"]

_BOOL_TEXT = {"true": 1.0, "false": 0.0}


def parse_binary(s: pd.Series) -> pd.Series | None:
    """0/1 floats (NaN kept) if every observed value is a boolean or TRUE/FALSE text (any
    case); None otherwise. Numeric 0/1 columns are handled by `parse_numeric`."""
    if pd.api.types.is_bool_dtype(s.dtype):
        return s.astype("float64")
    if pd.api.types.is_numeric_dtype(s.dtype):
        return None
    obs = s.dropna()
    out = pd.Series(np.nan, index=s.index, dtype="float64")
    vals = []
    for v in obs.tolist():
        if isinstance(v, (bool, np.bool_)):
            vals.append(float(v))
        elif isinstance(v, str) and v.strip().lower() in _BOOL_TEXT:
            vals.append(_BOOL_TEXT[v.strip().lower()])
        else:
            return None
    out[obs.index] = vals
    return out


def parse_numeric(s: pd.Series) -> np.ndarray | None:
    """float64 values (NaN where missing) if the column is numeric or every observed value
    parses as a number; None otherwise (booleans are not numbers here)."""
    if pd.api.types.is_bool_dtype(s.dtype):
        return None
    if pd.api.types.is_numeric_dtype(s.dtype):
        return s.to_numpy(dtype="float64", na_value=np.nan)
    if isinstance(s.dtype, pd.CategoricalDtype) or not (
            pd.api.types.is_object_dtype(s.dtype) or pd.api.types.is_string_dtype(s.dtype)):
        return None
    obs = s.dropna()
    if len(obs) == 0 or any(isinstance(v, (bool, np.bool_)) for v in obs.tolist()):
        return None
    parsed = pd.to_numeric(obs.astype(str).str.strip(), errors="coerce")
    if parsed.isna().any():
        return None
    out = np.full(len(s), np.nan)
    out[s.index.get_indexer(obs.index)] = parsed.to_numpy(dtype="float64")
    return out

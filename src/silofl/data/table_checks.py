"""Checks on a table that stop silent surprises (README "Your own table"): a CSV header that
names a column twice (pandas would rename the repeat ``x.1``), a feature column with no
value in any row, and the magnitude beyond which a numeric value is no measurement.
Messages name columns and counts, never values."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from silofl.data.schema import Schema
from silofl.errors import DataError

#: a numeric feature value beyond this magnitude is no measurement (a placeholder or an
#: overflow such as 1e308): refused, or clipped with a warning where bounds are declared
HUGE = 1e100


def check_header_unique(p: Path, df: pd.DataFrame, **read_kw: Any) -> None:
    """pandas renames a repeated header name ``x`` to ``x.1``: read the header row as it is
    written and refuse repeated names (only when such a renamed pair is present)."""
    cols = set(map(str, df.columns))
    suspects = [c for c in cols if "." in c and c.rsplit(".", 1)[1].isdigit()
                and c.rsplit(".", 1)[0] in cols]
    if not suspects:
        return
    try:
        header = pd.read_csv(p, header=None, nrows=1, dtype=str, keep_default_na=False,
                             **read_kw).iloc[0].tolist()
    except Exception:  # unreadable as a header: the table itself was read; leave it
        return
    dup = sorted({h for h in header if header.count(h) > 1})
    if dup:
        raise DataError(f"table {str(p)!r} names column(s) {dup} more than once in its "
                        "header (pandas would silently rename the repeats, e.g. "
                        f"{dup[0] + '.1'!r}); rename them so that every column is unique")


def check_all_missing(df: pd.DataFrame, feats: list[str], schema: Schema | None, missing: str,
                       name: str) -> None:
    """A feature column with no value in any row: a warning where a declared schema makes
    it nullable (a silo may not record it; it is encoded as missing), else a DataError."""
    empty = [c for c in feats if len(df) and df[c].isna().all()]
    if not empty:
        return
    specs = {c.name: c for c in schema.columns} if schema is not None else {}
    ok = [c for c in empty if c in specs and specs[c].nullable and missing != "drop"]
    bad = [c for c in empty if c not in ok]
    if bad:
        fix = ("remove it from the schema, or declare it nullable = true (and keep "
               "missing = 'impute')") if schema is not None else \
            "remove it from the table or list the other columns in [data] features"
        raise DataError(f"table {name!r}: feature column(s) {bad} have no value in any of "
                        f"the {len(df)} row(s), so they carry no information; {fix}")
    warnings.warn(f"{name}: feature column(s) {ok} have no value in any row; they are "
                  "encoded as missing everywhere and carry no information here",
                  UserWarning, stacklevel=4)  # encode_table's caller, via _drop_unusable

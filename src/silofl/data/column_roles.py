"""Columns that are probably not features: identifiers and dates.

`silofl schema draft` must not draft a patient number or a visit date as a feature
silently (a model could memorise it, and a date is not a number): such columns are left
out of the draft with a note saying why, and the table loaders' errors name the setting
that drops them (``[data] drop``). The reasons quote column names, never values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import numpy as np
import pandas as pd

from silofl.data.values import parse_numeric

#: column names (split on _ - . space, lower case) that usually identify a person/record
_ID_WORDS = {"id", "ids", "uid", "uuid", "guid", "mrn", "ssn", "nhs", "email", "phone",
             "passport"}
_ID_NAME_RE = (r"^(patient|subject|person|record|encounter|case|participant|member)"
               r"[\s_\-.]*(id|no|nr|num|number|key)?$")
_DATE_RE = (r"^\s*(\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4})"
            r"([ T]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?)?\s*(Z|[+-]\d{2}:?\d{2})?\s*$")


def likely_non_features(df: pd.DataFrame, silo_column: str | None,
                        label_column: str) -> dict[str, str]:
    """{column: why} of the columns that look like dates or identifiers (see
    `date_reason`, `identifier_reason`), which `draft_schema` leaves out with a note."""
    out = {}
    for c in df.columns:
        if c not in (silo_column, label_column):
            why = date_reason(df[c], str(c)) or identifier_reason(df[c], str(c))
            if why:
                out[str(c)] = why
    return out


def identifier_reason(s: pd.Series, name: str) -> str:
    """Why column `name` looks like an identifier ("" if it does not): its name, or a
    distinct integer or text value in every row (of at least 20). A note for a person:
    never a value from the column."""
    words = {w for w in re.split(r"[\s_\-.]+", name.strip().lower()) if w}
    if words & _ID_WORDS or re.match(_ID_NAME_RE, name.strip().lower()) or \
            re.search(r"(^|[a-z])(Id|ID)$", name.strip()):
        return f"its name ({name!r}) suggests an identifier"
    obs = s.dropna()
    if len(obs) >= 20 and obs.nunique() == len(obs):
        num = parse_numeric(obs)
        if num is None or np.all(np.isfinite(num) & (num == np.round(num))):
            return "every row holds a different value (integer or text), like an identifier"
    return ""


def date_reason(s: pd.Series, name: str) -> str:
    """Why column `name` looks like dates or times ("" if it does not)."""
    if pd.api.types.is_datetime64_any_dtype(s.dtype) or pd.api.types.is_timedelta64_dtype(s.dtype):
        return "it holds dates/times"
    obs = s.dropna()
    if len(obs) and obs.map(lambda v: isinstance(v, str)).all() and \
            obs.astype(str).str.match(_DATE_RE).mean() >= 0.9:
        return "it holds date-like text (e.g. YYYY-MM-DD)"
    return ""


def left_out_block(left_out: Mapping[str, str]) -> str:
    if not left_out:
        return ""
    lines = ["", "# LEFT OUT of the features (columns not listed above are ignored when the",
             "# table is encoded). An identifier or a raw date must never be a feature: a",
             "# model could memorise it. If one really is a documented feature, encode it",
             "# first (e.g. days since a public reference date) and declare it above."]
    for c, why in left_out.items():
        lines.append(f"#   {json.dumps(c, ensure_ascii=False)}: {why}")
    if any("identifier" in why for why in left_out.values()):
        lines += ["# A column naming the person of each row (a patient number): set [data]",
                  "# person_column to it, so splits keep a person's rows together and",
                  "# [privacy] unit = \"person\" can protect persons, not rows."]
    return "\n".join(lines) + "\n"



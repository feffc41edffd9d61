"""What a schema draft must point out about a messy export (issue 19, newcomer review).

A draft is read from the data, so it inherits the export's faults: a 1e308 or ±inf
placeholder became an observed bound (``upper = 1e+308``), and one category spelled several
ways (``ASYMPTOMATIC``, ``asymptomatic``, ``non-Angina l``; ``fémale``; ``M``) became several
levels with nothing said. The draft leaves placeholders out of its bounds
(`schema_draft._infer_column`) and these checks write a comment above each such column and warn
in the terminal (column names and counts only: the levels are in the draft file, which is
read from the data anyway).
"""

from __future__ import annotations

import unicodedata
import warnings
from collections.abc import Iterable

import numpy as np
import pandas as pd

from silofl.data.schema import Schema
from silofl.data.table_checks import HUGE
from silofl.data.values import parse_numeric


def _spelling_key(v: str) -> str:
    """A level with case, accents, spaces, hyphens and underscores taken out."""
    s = unicodedata.normalize("NFKD", v.casefold())
    s = "".join(ch for ch in s if not unicodedata.combining(ch))
    return "".join(ch for ch in s if ch.isalnum())


def spelling_groups(levels: Iterable[object]) -> list[list[str]]:
    """Groups of text levels that look like one category spelled several ways: equal up to
    case, accents, spacing and punctuation, or a 1–2 letter level that starts a longer
    word (``M`` / ``Male``; not ``A`` / ``AB``). Each group is listed in the levels' order."""
    texts = [lv for lv in levels if isinstance(lv, str)]
    keys = {lv: _spelling_key(lv) for lv in texts}
    groups: dict[str, list[str]] = {}
    for lv in texts:
        groups.setdefault(keys[lv], []).append(lv)
    short = [lv for lv in texts if 0 < len(keys[lv]) <= 2]
    for lv in short:  # an abbreviation joins the group of a longer level it starts
        # …a word (3+ letters), not another short code: blood groups 'A' and 'AB' stay apart
        longer = [k for k in groups if len(k) >= 3 and k.startswith(keys[lv])]
        if len(longer) == 1 and lv in groups.get(keys[lv], []):
            groups[keys[lv]].remove(lv)
            groups[longer[0]].append(lv)
    return [g for g in groups.values() if len(g) > 1]


def _placeholders(s: pd.Series) -> int:
    """Cells of a numeric column that are ±inf or of magnitude above HUGE."""
    num = parse_numeric(s)
    if num is None:
        return 0
    num = np.asarray(num, dtype="float64")
    return int((np.isinf(num) | (np.isfinite(num) & (np.abs(num) > HUGE))).sum())


def draft_warnings(df: pd.DataFrame, schema: Schema) -> dict[str, list[str]]:
    """{column: comment lines for the draft} for placeholder cells and near-duplicate
    levels, each also raised as a UserWarning naming the column (no values)."""
    out: dict[str, list[str]] = {}
    for c in schema.columns:
        if c.kind == "numeric":
            n = _placeholders(df[c.name])
            if n:
                out.setdefault(c.name, []).append(
                    f"{n} cell(s) hold ±inf or a magnitude above {HUGE:g} (a placeholder, not "
                    "a measurement): left out of lower/upper; make them empty cells")
                warnings.warn(f"column {c.name!r}: {n} cell(s) hold ±inf or a magnitude "
                              f"above {HUGE:g}, an export's placeholder: the draft's bounds "
                              "leave them out; make them empty cells (missing values)",
                              stacklevel=3)
        elif c.kind == "categorical":
            groups = spelling_groups(c.levels)
            if groups:
                shown = "; ".join(" / ".join(repr(v) for v in g) for g in groups)
                out.setdefault(c.name, []).append(
                    f"one category spelled several ways? {shown}: merge them in the data "
                    "and declare each level once")
                warnings.warn(f"column {c.name!r}: {sum(map(len, groups))} of its "
                              f"{len(c.levels)} levels look like {len(groups)} categories "
                              "spelled several ways (case, accents, spacing, abbreviations; "
                              "see the draft): merge them in the data, or silofl treats each "
                              "spelling as its own category", stacklevel=3)
    return out

"""Reading a CSV's text the way its author saved it: encoding, separator, dropped columns.

`read_table` (silofl.data.tabular) reads UTF-8, comma-separated files by default. A file
saved by a spreadsheet in another locale is often Latin-1/CP-1252 or semicolon-separated;
such a file is refused with a message that says where the problem is (byte offset and line,
never the bytes: they are part of a record) and which setting reads it: ``[data] encoding``
/ ``[data] sep`` in a config, ``--encoding`` / ``--sep`` on the command line.
"""

from __future__ import annotations

import codecs
import gzip
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from silofl.errors import ConfigError, DataError

#: separators a one-column header is checked for
_OTHER_SEPARATORS = {";": "semicolon", "\t": "tab", "|": "pipe"}


def check_encoding_name(encoding: str, setting: str) -> str:
    """`encoding` if Python knows it; DataError naming `setting` otherwise."""
    try:
        return codecs.lookup(encoding).name
    except LookupError:
        raise DataError(f"{setting} = {encoding!r} is not a known text encoding; use e.g. "
                        "'utf-8', 'latin-1', 'cp1252' or 'utf-16'") from None


def decode_error(p: Path, encoding: str, e: UnicodeDecodeError, setting: str) -> DataError:
    """A DataError locating the first undecodable byte of `p` (offset and line)."""
    try:
        opener = gzip.open if p.name.lower().endswith(".gz") else open
        with opener(p, "rb") as f:
            data = f.read()
        data.decode(encoding)
        where = ""
    except UnicodeDecodeError as first:
        line = data[:first.start].count(b"\n") + 1
        where = f" at byte offset {first.start} (line {line}: {first.reason})"
    except (OSError, LookupError, EOFError):
        where = f" ({e.reason})"
    shown = "utf-8" if encoding == "utf-8-sig" else encoding
    return DataError(
        f"could not read {str(p)!r} as {shown} text: invalid byte sequence{where}. "
        f"If the file was saved in another encoding (spreadsheets often use "
        f"Latin-1 or Windows-1252), {_setting(setting, 'latin-1')} (or cp1252, utf-16); if "
        "it is not a text table at all, check the file")


def _setting(setting: str, value: str) -> str:
    """How to give `value`: ``--sep ";"`` on the command line, ``[data] sep = ";"`` in a
    config file."""
    if setting.startswith("--"):
        return f'pass {setting} "{value}"'
    return f'set {setting} = "{value}"'



def check_separator(p: Path, header: pd.Index, sep_setting: str) -> None:
    """Refuse a header read as one column whose name contains another separator."""
    if len(header) != 1:
        return
    name = str(header[0])
    for sep, word in _OTHER_SEPARATORS.items():
        if sep in name:
            shown = "\\t" if sep == "\t" else sep
            raise DataError(
                f"{str(p)!r} was read as a single column whose header contains {word}s "
                f"({name.count(sep) + 1} names): the file looks {word}-separated, not "
                f"comma-separated; {_setting(sep_setting, shown)}")


def drop_columns(df: pd.DataFrame, drop: Sequence[str], p: Path, setting: str) -> pd.DataFrame:
    """`df` without the columns in `drop` (e.g. dates, identifiers); DataError naming
    `setting` for a column the table lacks."""
    if isinstance(drop, str):
        raise ConfigError(f"{setting} must be a list of column names, e.g. [\"{drop}\"]")
    names = [str(c) for c in drop]
    missing = [c for c in names if c not in df.columns]
    if missing:
        raise DataError(f"{setting} lists {missing}, which {str(p)!r} does not have; "
                        f"its columns: {', '.join(map(str, df.columns[:40]))}")
    return df.drop(columns=names) if names else df

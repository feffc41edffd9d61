"""Persons in a table (`[data] person_column`): their ids as read, a train/test split that
keeps each person's rows together, and simulated silos that keep each person in one silo.

The split side of a person is a keyed hash of (the split seed, the id): no statistic of the
data decides it, so the same person falls on the same side in every silo that sees them
(a person treated at two hospitals is never trained on at one and tested on at the other)
and the split of one silo does not depend on what the other silos hold. The share of test
*persons* is `test_fraction` in expectation; the share of test rows varies with how many
rows each person has.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pandas as pd

from silofl.data.federation import Silo, split_silo
from silofl.errors import DataError

#: the domain of the split hash (a new domain would re-draw every split)
_SPLIT_KEY = b"silofl/person-split/v1/"


def person_ids(values: pd.Series | Sequence, column: str) -> np.ndarray:
    """The person ids of a column as read: (n,) int64 when every id is an integer (an
    integer-valued float such as 3.0 read from a column with gaps counts as 3), else (n,)
    object of str with surrounding spaces dropped (" P1 " is "P1"). A missing id is a
    DataError (the caller drops such rows first when ``missing = "drop"``), and so are two
    ids that differ only in letter case ("P1", "p1"): one person under two spellings would
    be counted as two persons and protected only by group privacy.

    Parameters
    ----------
    values : pandas.Series or sequence
        (n,) the column's values.
    column : str
        The column's name, for messages (never a value).

    Returns
    -------
    numpy.ndarray
        (n,) the ids.
    """
    s = pd.Series(list(values), dtype=object,
                  index=values.index if isinstance(values, pd.Series) else None)
    miss = missing_ids(s)
    if miss.any():
        raise DataError(f"person column {column!r}: {int(miss.sum())} row(s) have no person "
                        "id; fill them, or set [data] missing = \"drop\" to drop those rows")
    vals = s.tolist()
    ints = [_as_int(v) for v in vals]
    if all(i is not None for i in ints):
        return np.asarray(ints, dtype=np.int64)
    out = np.asarray([str(v).strip() for v in vals], dtype=object)
    _refuse_case_variants(out, column, s.index if isinstance(values, pd.Series) else None)
    return out


def _refuse_case_variants(ids: np.ndarray, column: str, index: pd.Index | None) -> None:
    """DataError when distinct ids are equal up to letter case (no id is printed: the
    message names the column, counts and rows -- `index` labels where given)."""
    uniq = np.unique(ids)
    folded = pd.Series([u.casefold() for u in uniq])
    dup = folded.duplicated(keep=False).to_numpy()
    if not dup.any():
        return
    clash = set(uniq[dup].tolist())
    pos = [i for i, v in enumerate(ids) if v in clash][:3]
    rows = [str(index[i]) for i in pos] if index is not None else [str(i) for i in pos]
    raise DataError(
        f"person column {column!r}: {int(dup.sum())} ids differ from another id only in "
        f"letter case (e.g. table rows {', '.join(rows)}, counted from 0 as pandas reads "
        "the table); one person under two spellings would be counted as "
        "two persons and get a weaker guarantee. Write every id of a person the same way "
        "(e.g. upper-case the column) -- or, if they really are different persons, rename "
        "one of them")


def missing_ids(s: pd.Series) -> np.ndarray:
    """Which person ids are missing.

    Parameters
    ----------
    s : pandas.Series
        The person column, (n,).

    Returns
    -------
    numpy.ndarray of bool, shape (n,)
        True where the id is NA, or text that is empty after stripping.
    """
    return (s.isna() | s.map(lambda v: isinstance(v, str) and not v.strip())).to_numpy(bool)


def _as_int(v: object) -> int | None:
    if isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return int(v)
    return None


def on_test_side(ids: np.ndarray, test_fraction: float, seed: int, salt: str = ""
                 ) -> np.ndarray:
    """(n,) bool: the rows whose person is on the test side, from a keyed hash of (seed,
    id) -- the same person on the same side in every silo and every call.

    Parameters
    ----------
    ids : numpy.ndarray
        (n,) person ids (ints or strings; an int and its decimal text are the same id).
    test_fraction : float
        In [0, 1): the expected share of persons held out.
    seed : int
        The split seed ([data] seed).
    salt : str, default ""
        Another split of the same persons (e.g. "validation"), independent of this one.

    Returns
    -------
    numpy.ndarray
        (n,) bool.
    """
    if not 0 <= test_fraction < 1:
        raise DataError(f"test_fraction must be in [0, 1), got {test_fraction}")
    key = _SPLIT_KEY + f"{int(seed)}/{salt}".encode()
    uniq, inverse = np.unique(np.asarray(ids).astype(str), return_inverse=True)
    u = np.array([int.from_bytes(hashlib.blake2b(str(p).encode(), key=key[:64],
                                                 digest_size=8).digest(), "big") / 2.0 ** 64
                  for p in uniq])
    return (u < test_fraction)[inverse.reshape(-1)]


def group_split(ids: np.ndarray, test_fraction: float, seed: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows) of 0..n-1 with every person's rows on one side (`on_test_side`).

    Parameters
    ----------
    ids : numpy.ndarray
        (n,) the person of each row.
    test_fraction : float
        In [0, 1): the expected share of persons held out.
    seed : int
        The split seed.

    Returns
    -------
    tuple of numpy.ndarray
        Row indices, in row order.
    """
    test = on_test_side(ids, test_fraction, seed)
    return np.flatnonzero(~test), np.flatnonzero(test)


def split_training(s: Silo, fraction: float, rng: np.random.Generator, seed: int,
                   salt: str) -> Silo:
    """A silo's training rows split in two, as `split_silo` does (the held-out share in
    the returned silo's test part): by person (keyed hash of seed, `salt` and id) where the
    silo names persons, else seeded by `rng`. Validation rows carved for tuning keep each
    person on one side, like the test split.

    Parameters
    ----------
    s : Silo
        The silo; only its training rows are read.
    fraction : float
        In [0, 1): the share held out (of persons, in expectation, where persons are named).
    rng : numpy.random.Generator
        Draws the row split of a silo without persons.
    seed : int
        The split seed.
    salt : str
        Names this split (e.g. "validation"), independent of the train/test split.

    Returns
    -------
    Silo
        Training part in ``X_train``/``y_train``/``person_train``, held-out part in
        ``X_test``/``y_test``/``person_test``.
    """
    if s.person_train is None:
        return split_silo(s.name, s.X_train, s.y_train, fraction, rng)
    out = on_test_side(s.person_train, fraction, seed, salt)
    tr, te = np.flatnonzero(~out), np.flatnonzero(out)
    return Silo(s.name, s.X_train[tr], s.y_train[tr], s.X_train[te], s.y_train[te],
                person_train=s.person_train[tr], person_test=s.person_train[te])


def keep_persons_whole(parts: list[np.ndarray], ids: np.ndarray) -> list[np.ndarray]:
    """Simulated silos (row-index parts of a pooled table) with each person's rows moved to
    the one part that holds most of them (ties: the first such part): a person is in one
    simulated silo, as the split's own rows suggest.

    Parameters
    ----------
    parts : list of numpy.ndarray
        Disjoint row indices of the pooled table, one array per silo.
    ids : numpy.ndarray
        (n,) the person of each pooled row.

    Returns
    -------
    list of numpy.ndarray
        The parts, sorted, every person in exactly one of them.
    """
    rows = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    owner = np.concatenate([np.full(len(p), k) for k, p in enumerate(parts)]) if parts \
        else np.zeros(0, np.int64)
    _, pid = np.unique(np.asarray(ids)[rows].astype(str), return_inverse=True)
    pid = pid.reshape(-1)
    counts = np.zeros((pid.max() + 1 if len(pid) else 0, len(parts)), np.int64)
    np.add.at(counts, (pid, owner), 1)
    home = np.argmax(counts, axis=1)  # first maximum: deterministic ties
    new_owner = home[pid]
    return [np.sort(rows[new_owner == k]) for k in range(len(parts))]


def check_person_column(person_column: str | None, silo_column: str | None,
                        label_column: str, features: Sequence[str] | None) -> None:
    """Refuse a person column that is also the silo or label column or a listed feature:
    it names who a row is about and must never reach a model.

    Parameters
    ----------
    person_column : str or None
        [data] person_column (None: no persons, nothing to check).
    silo_column : str or None
        The column naming each row's silo.
    label_column : str
        The label column.
    features : sequence of str or None
        [data] features (None: not listed, nothing to check against).

    Raises
    ------
    DataError
        Naming the clash and the fix.
    """
    if not person_column:
        return
    for role, col in (("silo", silo_column), ("label", label_column)):
        if col is not None and person_column == col:
            raise DataError(f"[data] person_column and the {role} column are both "
                            f"{col!r}; the person column names who each row is about and "
                            "must be its own column")
    if features is not None and person_column in [str(f) for f in features]:
        raise DataError(f"[data] person_column {person_column!r} is listed in "
                        "[data] features; remove it: a person id is never a feature (a "
                        "model could memorise who a row is about)")

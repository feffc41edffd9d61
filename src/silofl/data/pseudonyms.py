"""Keyed pseudonyms of person ids, for linking the persons that several silos hold.

A pseudonym is HMAC-SHA256(key, id) in hex. The key is a consortium secret shared by the
silos and by nobody else: with it anyone can test a guessed id (hospital ids and national
numbers are easy to enumerate), so the party that links the silos' pseudonym sets (the
linkage party, `silofl.privacy.overlap`) must not hold it. Without the key a pseudonym
reveals nothing about the id; the same id under the same key always gives the same
pseudonym, and under another key an unrelated one (rotating the key unlinks old sets).

The key comes from a file (``[privacy] linkage_key_file``; its bytes, one trailing newline
dropped) or else from the environment variable ``SILOFL_LINKAGE_KEY`` (its UTF-8 bytes),
and must be at least 16 bytes long, e.g. ``openssl rand -hex 32 > linkage.key``. It never
reaches an output or a log: `LinkageKey` prints without its bytes and refuses to be
pickled (so no checkpoint can hold it), and no error message quotes it.

Ids may be strings or integers: an integer is hashed as its decimal text, so a person id
read as 12 by one silo and as "12" by another links (but "012" does not: silos must agree
on the id's text form). Floats, booleans and missing values are refused.
"""

from __future__ import annotations

import hashlib
import hmac
import numbers
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NoReturn

import numpy as np

from silofl.errors import ConfigError, DataError

#: the environment variable read when no key file is configured
KEY_ENV = "SILOFL_LINKAGE_KEY"
#: the shortest key accepted (bytes)
MIN_KEY_BYTES = 16


class LinkageKeyError(ConfigError):
    """The linkage key is missing, unreadable or too short (the message never quotes it)."""


class LinkageKey:
    """The consortium's linkage secret. Its bytes are never printed or pickled.

    Parameters
    ----------
    secret : bytes
        At least `MIN_KEY_BYTES` bytes.
    source : str
        Where it came from (a path or the variable's name), for messages.

    Raises
    ------
    LinkageKeyError
        Fewer than `MIN_KEY_BYTES` bytes.
    """

    __slots__ = ("_mac", "source")

    def __init__(self, secret: bytes, source: str = "the linkage key") -> None:
        if not isinstance(secret, (bytes, bytearray)):
            raise LinkageKeyError(f"{source}: a linkage key must be bytes")
        if len(secret) < MIN_KEY_BYTES:
            raise LinkageKeyError(
                f"{source}: the linkage key has {len(secret)} bytes, fewer than the "
                f"{MIN_KEY_BYTES} required; make a new consortium key, e.g. "
                "`openssl rand -hex 32 > linkage.key`, and share it with every silo (not "
                "with the linkage party)")
        self._mac = hmac.new(bytes(secret), digestmod=hashlib.sha256)  # keyed state only
        self.source = source

    def __repr__(self) -> str:
        return f"LinkageKey(from {self.source}, secret withheld)"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("a LinkageKey cannot be pickled: the consortium secret must not "
                        "reach a checkpoint or a file")

    def pseudonym(self, person_id: object) -> str:
        """HMAC-SHA256(key, id) of one person id, 64 hex characters."""
        h = self._mac.copy()
        h.update(_id_bytes(person_id))
        return h.hexdigest()


def load_linkage_key(key_file: str | Path | None = None, *,
                     environ: Mapping[str, str] | None = None) -> LinkageKey:
    """The consortium's linkage key: from `key_file`, else from ``SILOFL_LINKAGE_KEY``.

    Parameters
    ----------
    key_file : str or Path, optional
        ``[privacy] linkage_key_file``; "" or None: use the environment.
    environ : mapping, optional
        The environment to read (default `os.environ`).

    Returns
    -------
    LinkageKey

    Raises
    ------
    LinkageKeyError
        No key configured, the file unreadable, or the key shorter than 16 bytes.
    """
    env = os.environ if environ is None else environ
    if key_file:
        path = Path(key_file).expanduser()
        try:
            raw = path.read_bytes()
        except OSError as err:
            raise LinkageKeyError(
                f"[privacy] linkage_key_file: cannot read {str(path)!r} "
                f"({err.strerror or type(err).__name__}); give the path of the consortium's "
                "key file") from None
        for end in (b"\r\n", b"\n"):
            if raw.endswith(end):
                raw = raw[: -len(end)]
                break
        return LinkageKey(raw, f"[privacy] linkage_key_file {str(path)!r}")
    value = env.get(KEY_ENV)
    if not value:
        raise LinkageKeyError(
            f"no linkage key: set [privacy] linkage_key_file to the consortium's key file, "
            f"or the environment variable {KEY_ENV}")
    return LinkageKey(value.encode("utf-8"), f"the environment variable {KEY_ENV}")


def _id_bytes(person_id: object) -> bytes:
    if isinstance(person_id, (str, np.str_)):
        return str(person_id).encode("utf-8")
    if isinstance(person_id, (bool, np.bool_)) or not isinstance(person_id, numbers.Integral):
        raise DataError(
            f"a person id of type {type(person_id).__name__} cannot be pseudonymized: "
            "person ids must be strings or integers (a float or missing id is ambiguous); "
            "clean the person column")
    return str(int(person_id)).encode("ascii")


def pseudonymize(key: LinkageKey, ids: Iterable[object]) -> np.ndarray:
    """Pseudonyms of many person ids (one per row: repeated ids give repeated pseudonyms).

    Parameters
    ----------
    key : LinkageKey
    ids : iterable of str or int, shape (n,)
        Person ids, e.g. `Silo.person_train`.

    Returns
    -------
    numpy.ndarray of str, shape (n,)
        64-hex-character pseudonyms, row-aligned with `ids`.

    Raises
    ------
    DataError
        An id that is neither a string nor an integer.
    """
    arr = ids if isinstance(ids, np.ndarray) else np.asarray(list(ids), dtype=object)
    if arr.ndim != 1:
        raise DataError(f"person ids must be one id per row (1-D), got shape {arr.shape}")
    cache: dict[tuple[type, object], str] = {}  # a person's rows share one HMAC
    out = np.empty(arr.shape[0], dtype="<U64")
    for i, pid in enumerate(arr.tolist()):
        k = (type(pid), pid)  # by type too: 1, 1.0 and True are equal dict keys
        hit = cache.get(k)
        if hit is None:
            hit = cache[k] = key.pseudonym(pid)
        out[i] = hit
    return out

"""Shared file helpers at the bottom of the layers: atomic strict writes and file hashes.

Every package (privacy stores aside, which use SQLite) writes files through here.

A file is written to a temporary file in the same directory and moved into place with
`os.replace`, so a crash or a full disk leaves the old file (or none), never a truncated
one. JSON is strict: NaN and ±inf become null (RFC 8259 has no token for them), and
`json_safe` reports which paths were non-finite so callers can flag them.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def write_bytes_atomic(path: str | Path, data: bytes, *, mkdir: bool = False) -> None:
    """Write `data` to `path` via a temp file + fsync + os.replace.

    Parameters
    ----------
    path : str or Path
        The file to (re)place.
    data : bytes
        Its whole content.
    mkdir : bool
        Create the missing parent folders first (else a missing folder is an OSError).
    """
    path = Path(path)
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str, *, mkdir: bool = False) -> None:
    """UTF-8 `text` to `path`, atomically (see `write_bytes_atomic`)."""
    write_bytes_atomic(path, text.encode("utf-8"), mkdir=mkdir)


def write_npz_atomic(path: str | Path, *, compressed: bool = False, **arrays: Any) -> None:
    """Write `arrays` as one .npz (zip-compressed with `compressed`), atomically."""
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    write_bytes_atomic(path, buf.getvalue())


def json_safe(obj: Any, nonfinite: list[str] | None = None, where: str = "") -> Any:
    """Plain-JSON copy of `obj`: numpy → Python, non-finite floats → None. The path of
    every non-finite value is appended to `nonfinite` (when given)."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v, nonfinite, f"{where}.{k}" if where else str(k))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v, nonfinite, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist(), nonfinite, where)
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        if math.isfinite(obj):
            return float(obj)
        if nonfinite is not None:
            nonfinite.append(where)
        return None
    return obj


def dumps_strict(obj: Any, **kw: Any) -> str:
    """Strict JSON text of `obj` (non-finite floats as null)."""
    return json.dumps(json_safe(obj), allow_nan=False, **kw)


def write_json_atomic(path: str | Path, obj: Any, **kw: Any) -> None:
    """Strict JSON, written atomically (see the module docstring)."""
    write_text_atomic(path, dumps_strict(obj, **kw))


def savefig_atomic(fig: Figure, path: str | Path, **kw: Any) -> None:
    """`fig.savefig` to a temp file, then os.replace: no truncated PNG on a crash."""
    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png", **kw)
    write_bytes_atomic(path, buf.getvalue())


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(folder: str | Path, files: dict[str, str]) -> dict[str, str]:
    """{role: sha256} of `files` ({role: name}) in `folder`, for a manifest."""
    return {role: sha256_file(Path(folder) / name) for role, name in files.items()}


def array_digest(*arrays: np.ndarray, length: int = 16) -> str:
    """Hex SHA-256 of arrays' dtypes, shapes and bytes, cut to `length` characters.

    Parameters
    ----------
    *arrays : ndarray
        Any shapes and dtypes; each is hashed in C order.
    length : int
        How many hex characters to keep (16: 64 bits, enough to see a change of data).

    Returns
    -------
    str
        The digest (never a keyed hash: callers that store it key it first).
    """
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:length]


__all__ = [
    "array_digest", "dumps_strict", "file_hashes", "json_safe", "savefig_atomic", "sha256_file",
    "write_bytes_atomic", "write_json_atomic", "write_npz_atomic", "write_text_atomic",
]

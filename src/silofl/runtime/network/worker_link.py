"""The ClientApp's side of the silo worker link (`silo_worker`): where a silo's worker
listens and how one message is handed over. Imported by the per-message ClientApp, so it
imports only the standard library (and flwr's serialisation when a message is forwarded).

Wire: length-prefixed frames (8-byte big-endian length) of Flower's own protobuf
serialisation — request: Message, Context; reply: a status byte, then Message, Context
(ok) or an error text.
"""

from __future__ import annotations

import os
import socket
import struct
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SOCKET_NAME = "clientapp.sock"
_LEN = struct.Struct(">Q")
OK, ERR = b"\x00", b"\x01"
CONNECT_TIMEOUT_S = 5.0


def socket_path(silo_toml: str | Path) -> Path:
    """The worker socket of the silo configured by `silo_toml`: ``<[silo] state_dir>/
    clientapp.sock`` (relative paths from the config's folder, as the silo reads them).

    Parameters
    ----------
    silo_toml : str or Path
        The silo's silo.toml (the SuperNode's ``--node-config silo-config``).

    Returns
    -------
    Path
        Where the worker listens.
    """
    path = Path(silo_toml)
    raw = tomllib.loads(path.read_text())
    return path.parent / str(raw["silo"]["state_dir"]) / SOCKET_NAME


@contextmanager
def unix_address(path: Path) -> Iterator[str]:
    """An address for `path` that fits AF_UNIX's ~107 bytes: the path itself, or (Linux)
    the same file through an open descriptor of its folder, /proc/self/fd/<n>/<name>.

    Parameters
    ----------
    path : Path
        The socket file.

    Yields
    ------
    str
        What to pass to ``bind``/``connect`` while the context is open.
    """
    if len(os.fsencode(str(path))) < 100 or not Path("/proc/self/fd").is_dir():
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def send_frames(conn: socket.socket, *frames: bytes) -> None:
    """Send each frame as its 8-byte big-endian length, then its bytes.

    Parameters
    ----------
    conn : socket
        A connected socket.
    *frames : bytes
        The payloads.
    """
    conn.sendall(b"".join(_LEN.pack(len(f)) + f for f in frames))


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("the silo worker connection closed mid-message")
        buf += chunk
    return bytes(buf)


def recv_frame(conn: socket.socket) -> bytes:
    """Receive one frame written by `send_frames`.

    Parameters
    ----------
    conn : socket
        A connected socket.

    Returns
    -------
    bytes
        The payload.
    """
    (n,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
    return _recv_exact(conn, n)


def encode(message: Any, context: Any) -> tuple[bytes, bytes]:
    """Flower's protobuf serialisation of a Message and a Context.

    Parameters
    ----------
    message, context : flwr Message, Context

    Returns
    -------
    tuple of bytes
        (message, context).
    """
    from flwr.common.serde import context_to_proto, message_to_proto
    return (message_to_proto(message).SerializeToString(),
            context_to_proto(context).SerializeToString())


def decode(message: bytes, context: bytes) -> tuple[Any, Any]:
    """Inverse of `encode`.

    Parameters
    ----------
    message, context : bytes
        From `encode`.

    Returns
    -------
    tuple
        (Message, Context).
    """
    from flwr.common.serde import context_from_proto, message_from_proto
    from flwr.proto.message_pb2 import Context as ProtoContext
    from flwr.proto.message_pb2 import Message as ProtoMessage
    m, c = ProtoMessage(), ProtoContext()
    m.ParseFromString(message)
    c.ParseFromString(context)
    return message_from_proto(m), context_from_proto(c)


def forward(path: Path, message: Any, context: Any) -> tuple[Any, Any] | None:
    """Hand one message to the worker at `path`.

    Parameters
    ----------
    path : Path
        The worker's socket (`socket_path`).
    message, context : flwr Message, Context
        What the ClientApp received.

    Returns
    -------
    tuple of (Message, Context) or None
        The reply and the context after handling; None when no worker answers (nothing
        was handed over: handle the message in-process).

    Raises
    ------
    SiloflError
        The worker took the message and then failed (its error), or died mid-message.
    """
    from silofl.errors import SiloflError
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_TIMEOUT_S)
        try:
            with unix_address(Path(path)) as addr:
                conn.connect(addr)
        except OSError:   # no socket, a stale one, or no permission: no worker
            return None
        conn.settimeout(None)   # a round takes what it takes
        try:
            send_frames(conn, *encode(message, context))
            status = _recv_exact(conn, 1)
            if status == OK:
                return decode(recv_frame(conn), recv_frame(conn))
            raise SiloflError(recv_frame(conn).decode(errors="replace"))
        except (OSError, ConnectionError) as e:
            raise SiloflError(f"the silo worker at {path} failed mid-message ({e}); the "
                              f"message is not re-run here (the server asks again)") from None
    finally:
        conn.close()

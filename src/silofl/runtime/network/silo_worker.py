"""`python -m silofl.runtime.network.silo_worker --config silo.toml`: a long-lived process
per silo that handles its ClientApp's messages, so the process flwr starts per message
does not import the silo program (≈ 1 s of CPU each: dp_accounting, scipy, pandas).

The worker listens on a UNIX socket in the silo's own state folder (`socket_path`, mode
0600) and runs each message through `clientapp.local_app` — the very handler the ClientApp
runs in-process: a fresh `SiloProgram` from the silo's config and state on disk per
message, every request checked against the silo's plan, each round reserved in its
lifetime store before any read. The worker keeps only imported code between messages, no
privacy state, so a restarted or killed worker forgets nothing. The ClientApp
(`clientapp.client_app`) forwards when the socket answers and otherwise handles the
message in-process exactly as without a worker; once a request was handed over it never
re-runs it in-process (a worker that dies mid-message fails that message).

Wire: length-prefixed frames (8-byte big-endian length) of Flower's own protobuf
serialisation — request: Message, Context; reply: a status byte, then Message, Context
(ok) or an error text.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SOCKET_NAME = "clientapp.sock"
_LEN = struct.Struct(">Q")
_OK, _ERR = b"\x00", b"\x01"
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
def _addr(path: Path) -> Iterator[str]:
    """An address for `path` that fits AF_UNIX's ~107 bytes: the path itself, or (Linux)
    the same file through an open descriptor of its folder, /proc/self/fd/<n>/<name>."""
    if len(os.fsencode(str(path))) < 100 or not Path("/proc/self/fd").is_dir():
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def _send(conn: socket.socket, *frames: bytes) -> None:
    conn.sendall(b"".join(_LEN.pack(len(f)) + f for f in frames))


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("the silo worker connection closed mid-message")
        buf += chunk
    return bytes(buf)


def _recv(conn: socket.socket) -> bytes:
    (n,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
    return _recv_exact(conn, n)


def _to_bytes(message: Any, context: Any) -> tuple[bytes, bytes]:
    from flwr.common.serde import context_to_proto, message_to_proto
    return (message_to_proto(message).SerializeToString(),
            context_to_proto(context).SerializeToString())


def _from_bytes(message: bytes, context: bytes) -> tuple[Any, Any]:
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
            with _addr(Path(path)) as addr:
                conn.connect(addr)
        except OSError:   # no socket, a stale one, or no permission: no worker
            return None
        conn.settimeout(None)   # a round takes what it takes
        try:
            _send(conn, *_to_bytes(message, context))
            status = _recv_exact(conn, 1)
            if status == _OK:
                return _from_bytes(_recv(conn), _recv(conn))
            raise SiloflError(_recv(conn).decode(errors="replace"))
        except (OSError, ConnectionError) as e:
            raise SiloflError(f"the silo worker at {path} failed mid-message ({e}); the "
                              f"message is not re-run here (the server asks again)") from None
    finally:
        conn.close()


def handle(conn: socket.socket, config: str | Path) -> None:
    """Serve one forwarded message on `conn` through `clientapp.local_app`.

    Parameters
    ----------
    conn : socket
        An accepted connection.
    config : str or Path
        This worker's silo.toml; a message for another silo's config is refused.
    """
    from silofl.runtime.network.clientapp import local_app
    message, context = _from_bytes(_recv(conn), _recv(conn))
    print(f"silo worker: {message.metadata.message_type} message of run "
          f"{message.metadata.run_id}", file=sys.stderr, flush=True)
    try:
        asked = Path(str(context.node_config.get("silo-config", ""))).resolve()
        if asked != Path(config).resolve():
            raise ValueError(f"this worker serves {config}, not {asked}")
        reply = local_app(message, context)
    except Exception as e:   # noqa: BLE001 - reported to the ClientApp, which raises it
        conn.sendall(_ERR)
        _send(conn, f"{type(e).__name__}: {e}".encode())
        return
    conn.sendall(_OK)
    _send(conn, *_to_bytes(reply, context))


def listen(config: str | Path) -> socket.socket:
    """Bind the worker socket of `config` with mode 0600; refuse when a live worker
    already answers there, replace a stale socket file.

    Parameters
    ----------
    config : Path
        The silo's silo.toml.

    Returns
    -------
    socket
        The listening socket.
    """
    from silofl.errors import ConfigError
    path = socket_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with _addr(path) as addr:
                probe.connect(addr)
            raise ConfigError(f"a silo worker already serves {path}; stop it first")
        except OSError:
            path.unlink()   # stale: its worker is gone
        finally:
            probe.close()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)   # the socket is created 0600: only this silo's user may talk
    try:
        with _addr(path) as addr:
            srv.bind(addr)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    srv.listen(4)
    return srv


def serve(config: str | Path, srv: socket.socket, max_messages: int | None = None) -> None:
    """Answer forwarded messages one at a time (a SuperNode sends one at a time).

    Parameters
    ----------
    config : Path
        The silo's silo.toml.
    srv : socket
        From `listen`.
    max_messages : int, optional
        Stop after this many (tests); default: until killed.
    """
    done = 0
    while max_messages is None or done < max_messages:
        conn, _ = srv.accept()
        with conn:
            try:
                handle(conn, config)
            except (OSError, ConnectionError) as e:   # the ClientApp went away
                print(f"silo worker: {e}", file=sys.stderr)
        done += 1


def main(argv: list[str] | None = None) -> None:
    """`python -m silofl.runtime.network.silo_worker --config silo.toml`."""
    ap = argparse.ArgumentParser(prog="python -m silofl.runtime.network.silo_worker",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, type=Path, help="this silo's silo.toml")
    a = ap.parse_args(argv)
    from silofl.errors import SiloflError
    try:
        from silofl.runtime.network.silo import load_silo_config
        load_silo_config(a.config)   # a bad config fails here, not at the first message
        import silofl.runtime.network.clientapp  # noqa: F401 - the imports it saves
        srv = listen(a.config)
    except (SiloflError, OSError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"silo worker: serving {socket_path(a.config)}", flush=True)
    try:
        serve(a.config, srv)
    finally:
        srv.close()
        socket_path(a.config).unlink(missing_ok=True)


if __name__ == "__main__":
    main()

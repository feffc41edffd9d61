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

The ClientApp's side (socket path, wire format, forwarding) is `worker_link`.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from silofl.runtime.network.worker_link import (
    ERR,
    OK,
    decode,
    encode,
    recv_frame,
    send_frames,
    socket_path,
    unix_address,
)


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
    message, context = decode(recv_frame(conn), recv_frame(conn))
    print(f"silo worker: {message.metadata.message_type} message of run "
          f"{message.metadata.run_id}", file=sys.stderr, flush=True)
    try:
        asked = Path(str(context.node_config.get("silo-config", ""))).resolve()
        if asked != Path(config).resolve():
            raise ValueError(f"this worker serves {config}, not {asked}")
        reply = local_app(message, context)
    except Exception as e:   # noqa: BLE001 - reported to the ClientApp, which raises it
        conn.sendall(ERR)
        send_frames(conn, f"{type(e).__name__}: {e}".encode())
        return
    conn.sendall(OK)
    send_frames(conn, *encode(reply, context))


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
            with unix_address(path) as addr:
                probe.connect(addr)
            raise ConfigError(f"a silo worker already serves {path}; stop it first")
        except OSError:
            path.unlink()   # stale: its worker is gone
        finally:
            probe.close()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)   # the socket is created 0600: only this silo's user may talk
    try:
        with unix_address(path) as addr:
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
        from silofl.runtime.network.silo_config import load_silo_config
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

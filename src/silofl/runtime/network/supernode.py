"""`python -m silofl.runtime.network.supernode [--poll-interval S] <flower-supernode args…>`:
Flower's own SuperNode with a configurable poll interval.

flwr 1.41's SuperNode loop (`flwr.supernode.start_client_internal`) sleeps a fixed 3 s
whenever the SuperLink has no message for it, and waits for its ClientApp's reply in
0.5 s steps, so a round on the SuperLink route waits up to ~3.5 s per silo before any work
is done; flwr offers no setting for either. This launcher runs flwr's own
`flower-supernode` entry point unchanged, except that the module's `time` name is this
module's `PollClock`: every `sleep(t)` there waits `min(t, S)` seconds (S default
0.05 s). Everything else (TLS, SuperNode authentication, isolation, the ClientApp
processes) is Flower's. The one flwr internal it touches is checked at start (`check_flwr`)
and pinned by `tests/test_supernode_poll.py`; plain `flower-supernode` still works, at
Flower's 3 s.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from types import ModuleType
from typing import Any

#: flwr's module whose `time` name is replaced, and the idle sleep its loop must contain
FLWR_LOOP_MODULE = "flwr.supernode.start_client_internal"
FLWR_IDLE_SLEEP = "time.sleep(3)"
#: flwr releases (major, minor) this adapter is tested against, inclusive
FLWR_TESTED = ((1, 41), (1, 41))
DEFAULT_POLL_S = 0.05
POLL_RANGE_S = (0.01, 60.0)


class PollClock:
    """Stand-in for the `time` module inside flwr's SuperNode loop: every attribute is the
    real module's, except `sleep`, which waits at most `interval` seconds.

    Parameters
    ----------
    interval : float
        Longest single sleep, seconds (the SuperNode's poll interval).
    sleep : callable, optional
        The real sleep (``time.sleep``); a test passes a recorder.
    """

    def __init__(self, interval: float, sleep: Any = None):
        self.interval = float(interval)
        self._sleep = sleep or time.sleep

    def sleep(self, seconds: float) -> None:
        """Sleep ``min(seconds, interval)`` seconds.

        Parameters
        ----------
        seconds : float
            What flwr asked for (3 when idle, 0.5 while a reply is pending).
        """
        self._sleep(min(float(seconds), self.interval))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def check_flwr(module: ModuleType) -> None:
    """Raise `RuntimeError` unless flwr's SuperNode loop still is what `PollClock` relies
    on: the module imports `time` as a module and sleeps `time.sleep(3)` when idle.

    Parameters
    ----------
    module : module
        ``flwr.supernode.start_client_internal``.
    """
    try:
        src = inspect.getsource(module)
    except (OSError, TypeError):   # no source to check (e.g. installed without .py files)
        src = ""
    if getattr(module, "time", None) is not time or FLWR_IDLE_SLEEP not in src:
        raise RuntimeError(
            f"{module.__name__} (flwr {flwr_version()}) no longer sleeps "
            f"'{FLWR_IDLE_SLEEP}' through its module-level `time` import: the SuperNode "
            f"poll interval cannot be set with this flwr; run plain `flower-supernode` "
            f"(Flower's own intervals) or install a flwr release between "
            f"{'.'.join(map(str, FLWR_TESTED[0]))} and {'.'.join(map(str, FLWR_TESTED[1]))}")


def flwr_version() -> str:
    """The installed flwr's version string."""
    from importlib.metadata import version
    return version("flwr")


def install(interval: float) -> PollClock:
    """Make flwr's SuperNode loop in this process poll every `interval` seconds.

    Parameters
    ----------
    interval : float
        Seconds between polls when idle and while a ClientApp's reply is pending.

    Returns
    -------
    PollClock
        The clock now installed as the loop module's `time`.
    """
    import importlib
    module = importlib.import_module(FLWR_LOOP_MODULE)
    check_flwr(module)
    clock = PollClock(interval)
    module.time = clock  # type: ignore[attr-defined]
    return clock


def _interval(text: str) -> float:
    lo, hi = POLL_RANGE_S
    try:
        s = float(text)
    except ValueError:
        s = float("nan")
    if not lo <= s <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds between {lo:g} and {hi:g}")
    return s


def main(argv: list[str] | None = None) -> None:
    """Parse ``--poll-interval``, install the clock, run flwr's `flower-supernode` with
    the remaining arguments (``-- --help`` shows flower-supernode's own help).

    Parameters
    ----------
    argv : list of str, optional
        The arguments (default ``sys.argv[1:]``).
    """
    ap = argparse.ArgumentParser(
        prog="python -m silofl.runtime.network.supernode", allow_abbrev=False,
        description="flower-supernode with a configurable poll interval; every other "
                    "argument is flower-supernode's")
    ap.add_argument("--poll-interval", type=_interval, default=DEFAULT_POLL_S,
                    metavar="S", help="seconds between the SuperNode's polls for its next "
                    f"message and for its ClientApp's reply (default {DEFAULT_POLL_S:g}; "
                    "Flower: 3 and 0.5)")
    a, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        install(a.poll_interval)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    from flwr.supernode.cli import flower_supernode
    if "--" in rest:   # `-- --help`: everything after it is flower-supernode's
        rest.remove("--")
    sys.argv = ["flower-supernode", *rest]
    flower_supernode()


if __name__ == "__main__":
    main()

"""Critical sections for charges: a signal never splits one.

A charge is several writes — the silos' ledgers (memory and ledger files), then the budget
store's progress transaction. An interrupt between two of them would leave the store and
the ledger files disagreeing (settling then counts one more or one less charge than a file
shows). Inside `deferred_signals()` the handlers `silofl.experiments.signals` installs
(SIGTERM, SIGINT) only note the signal (`defer`); it is delivered again with
`signal.raise_signal` when the outermost section ends, so its exception is raised right
after the whole charge is recorded. Sections nest. Only the main thread defers: Python runs
signal handlers there, and a section in another thread cannot be interrupted by one.

This module imports nothing of silofl: the handlers (above it) ask it whether to defer.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["deferred_signals", "defer", "active"]

_MAIN = threading.main_thread().ident


class _Section:
    """The one reusable section object (re-entrant: a depth counter, main thread only)."""

    __slots__ = ("depth", "pending")

    def __init__(self) -> None:
        self.depth = 0
        self.pending: list[int] = []  # signal numbers noted while depth > 0, in order

    def __enter__(self) -> _Section:
        if threading.get_ident() == _MAIN:
            self.depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        if threading.get_ident() != _MAIN:
            return
        self.depth -= 1
        if self.depth == 0 and self.pending:
            signum = self.pending[0]
            self.pending.clear()
            # the installed handler runs again, now outside any section, and raises
            signal.raise_signal(signum)


_SECTION = _Section()


def deferred_signals() -> _Section:
    """A context manager: while it is active (in the main thread), signals whose handler
    asks `defer` are held and delivered when the outermost section ends.

    Returns
    -------
    context manager
        Re-entrant; nested sections deliver only when the outermost one exits (also when
        its body raised: the interrupt then wins, the error is its ``__context__``).
    """
    return _SECTION


def active() -> bool:
    """Is the main thread inside a critical section now?"""
    return _SECTION.depth > 0


def defer(signum: int) -> bool:
    """Called by a signal handler first: True if the signal was noted for delivery at the
    end of the current section (the handler must then return without raising); False if
    no section is active (the handler acts now).

    Parameters
    ----------
    signum : int
        The signal number the handler received.

    Returns
    -------
    bool
        Whether the signal was deferred.
    """
    if _SECTION.depth > 0:
        _SECTION.pending.append(signum)
        return True
    _SECTION.pending.clear()  # acting now: nothing older may be delivered later
    return False

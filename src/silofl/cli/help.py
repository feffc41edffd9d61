"""Help texts print literally: config section names such as ``[budget] store`` or
``[data] sep`` look like rich markup tags to the terminal library, which drops them
silently. `escape_help` escapes every help text of a Typer app once, after all commands
are registered, so no help string needs hand-written escapes (and none can forget one).
Error messages are escaped in the one error printer (`silofl.cli.root._fail`)."""

from __future__ import annotations

import inspect
import typing

import typer
from rich.markup import escape
from typer.models import ArgumentInfo, OptionInfo


def _params(callback) -> list:
    """The OptionInfo/ArgumentInfo objects of a command (defaults and Annotated)."""
    out = [p.default for p in inspect.signature(callback).parameters.values()]
    try:
        hints = typing.get_type_hints(callback, include_extras=True)
    except Exception:  # noqa: BLE001 — an unresolvable hint: Typer reports it itself
        hints = {}
    for h in hints.values():
        out += list(getattr(h, "__metadata__", ()))
    return [p for p in out if isinstance(p, (OptionInfo, ArgumentInfo))]


def escape_help(app: typer.Typer, _seen: set | None = None) -> None:
    """Escape rich markup in every command's, option's and argument's help of `app`
    (and its sub-apps), in place; idempotent."""
    seen = set() if _seen is None else _seen
    for info in app.registered_commands:
        cb = info.callback
        if cb is None or id(cb) in seen:
            continue
        seen.add(id(cb))
        if info.help is None and cb.__doc__:
            info.help = inspect.getdoc(cb)
        if info.help:
            info.help = escape(info.help)
        for p in _params(cb):
            if p.help and id(p) not in seen:
                seen.add(id(p))
                p.help = escape(p.help)
    for group in app.registered_groups:
        sub = group.typer_instance
        if sub is not None and id(sub) not in seen:
            seen.add(id(sub))
            if isinstance(sub.info.help, str):
                sub.info.help = escape(sub.info.help)
            escape_help(sub, seen)

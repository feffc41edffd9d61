"""Turning dp_accounting events into plain data (for ledgers on disk) and into
(base event, count) pairs (so a ledger can tell when a charge is already covered)."""

from __future__ import annotations

from collections import Counter

import attr
import dp_accounting as dpa


def to_dict(event) -> dict:
    """JSON-ready description of a DpEvent (or any event with `to_dict`)."""
    if hasattr(event, "to_dict"):
        return event.to_dict()
    if attr.has(type(event)):
        out = {"type": type(event).__name__}
        for f in attr.fields(type(event)):
            v = getattr(event, f.name)
            if isinstance(v, (list, tuple)):
                out[f.name] = [to_dict(e) for e in v]
            elif attr.has(type(v)) or hasattr(v, "to_dict"):
                out[f.name] = to_dict(v)
            else:
                out[f.name] = v
        return out
    raise TypeError(f"cannot serialize privacy event {event!r}")


def flatten(event) -> Counter:
    """Multiset of base events: SelfComposed(e, c) → e × c; Composed → the union.
    Ledgers flatten the same round event for every silo every round, so results are
    memoized by the event object's identity: treat the returned Counter as read-only."""
    hit = _MEMO.get(id(event))
    if hit is None or hit[0] is not event:
        counts: Counter = Counter()
        _flatten(event, 1, counts)
        if len(_MEMO) > 4096:
            _MEMO.clear()
        hit = _MEMO[id(event)] = (event, counts)  # holding `event` keeps its id unique
    return hit[1]


_MEMO: dict[int, tuple[object, Counter]] = {}


def _flatten(event, mult: int, counts: Counter) -> None:
    if isinstance(event, dpa.NoOpDpEvent):
        return
    if isinstance(event, dpa.SelfComposedDpEvent):
        _flatten(event.event, mult * event.count, counts)
    elif isinstance(event, dpa.ComposedDpEvent):
        for e in event.events:
            _flatten(e, mult, counts)
    else:
        counts[event] += mult


def compose(counts: Counter):
    """The inverse of `flatten`: one ComposedDpEvent of self-composed base events."""
    parts = [e if c == 1 else dpa.SelfComposedDpEvent(e, c) for e, c in counts.items() if c]
    if not parts:
        return dpa.NoOpDpEvent()
    return parts[0] if len(parts) == 1 else dpa.ComposedDpEvent(parts)

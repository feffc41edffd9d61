"""Privacy events: the DP-SGD event factory, and turning dp_accounting events into plain
data (for ledgers and the budget store on disk) and back, and into (base event, count)
pairs (so a ledger can tell when a charge is already covered)."""

from __future__ import annotations

import importlib
import json
from collections import Counter
from typing import Any

import attr
import dp_accounting as dpa

from silofl.errors import PrivacyError

#: events silofl defines itself (dp_accounting has no type for them), by their dict's
#: "event" name → "module:Class" (imported lazily)
CUSTOM_EVENTS = {"node_level_dp": "silofl.privacy.node_level:NodeLevelDpEvent",
                 "rdp_curve": "silofl.privacy.curves:FixedRdpCurveEvent",
                 # private tuning at the node level (silofl.privacy.node_tuning)
                 "node_repeat_and_select": "silofl.privacy.node_tuning:NodeRepeatAndSelectEvent",
                 "gaussian_score": "silofl.privacy.node_tuning:GaussianScoreEvent",
                 # a DP-SGD step with a private adaptive-clipping count
                 "adaptive_clip": "silofl.privacy.adaptive_clip:AdaptiveClipDpEvent",
                 # repeat-and-select with TNB η ∈ (−1, 0) (dp_accounting: η ≥ 0 only)
                 "tnb_repeat_and_select": "silofl.privacy.tnb_select:TnbRepeatAndSelectDpEvent"}


def dpsgd_event(q: float, noise_multiplier: float, steps: int = 1) -> dpa.DpEvent:
    """The privacy event of `steps` DP-SGD steps with Poisson sampling and Gaussian noise.

    Parameters
    ----------
    q : float
        Poisson sampling rate in (0, 1]: each record joins a batch independently with
        probability q (expected batch size / records).
    noise_multiplier : float
        σ > 0: the Gaussian noise's standard deviation is σ·C for clipping norm C.
    steps : int, default 1
        Number of steps composed.

    Returns
    -------
    dp_accounting.DpEvent
        ``PoissonSampled(q, Gaussian(σ))``, self-composed `steps` times when steps > 1.
    """
    _check_q_sigma(q, noise_multiplier)
    base = dpa.PoissonSampledDpEvent(float(q), dpa.GaussianDpEvent(float(noise_multiplier)))
    return base if steps == 1 else dpa.SelfComposedDpEvent(base, int(steps))


def steps_for_epochs(n: int, batch_size: float, epochs: float) -> int:
    """Number of Poisson-sampled steps that make `epochs` passes in expectation."""
    return max(1, int(round(epochs * n / batch_size)))


def _check_q_sigma(q: float, sigma: float) -> None:
    if not 0 < q <= 1:
        raise PrivacyError(f"sampling rate q = batch/n must be in (0, 1], got {q}; "
                           "use a batch size below the silo's number of training examples")
    if not sigma > 0:
        raise PrivacyError(f"noise multiplier must be positive, got {sigma}")


def to_dict(event: Any) -> dict[str, Any]:
    """JSON-ready description of a DpEvent (or any event with `to_dict`)."""
    if hasattr(event, "to_dict"):
        return event.to_dict()
    if attr.has(type(event)):
        out: dict[str, Any] = {"type": type(event).__name__}
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


def from_dict(d: dict) -> dpa.DpEvent:
    """The inverse of `to_dict`: a dp_accounting event (or a registered custom event)."""
    if not isinstance(d, dict):
        raise PrivacyError(f"a privacy event must be a JSON object, got {type(d).__name__}")
    if "event" in d and isinstance(d["event"], str):  # a custom event (e.g. node-level)
        target = CUSTOM_EVENTS.get(d["event"])
        if target is None:
            raise PrivacyError(f"unknown privacy event type {d['event']!r}")
        module, name = target.split(":")
        return getattr(importlib.import_module(module), name).from_dict(d)
    cls = getattr(dpa, str(d.get("type")), None)
    nested = False
    if cls is None:  # events dp_accounting does not re-export (RepeatAndSelect: tuning)
        from dp_accounting import dp_event
        cls, nested = getattr(dp_event, str(d.get("type")), None), True
    if not (isinstance(cls, type) and issubclass(cls, dpa.DpEvent)):
        raise PrivacyError(f"unknown privacy event type {d.get('type')!r}")
    kwargs = {}
    for f in attr.fields(cls):
        if f.name not in d:
            continue
        v = d[f.name]
        if isinstance(v, dict):
            v = from_dict(v)
        elif isinstance(v, list):
            v = [from_dict(x) if isinstance(x, dict) else x for x in v]
        kwargs[f.name] = hashable(v) if nested else v
    return cls(**kwargs)


def hashable(event: dpa.DpEvent) -> dpa.DpEvent:
    """`event` with its compositions' lists as tuples, so that it can be a base event of a
    ledger (RepeatAndSelect wraps a composition: silofl.tuning builds it this way too)."""
    if isinstance(event, dpa.ComposedDpEvent):
        return dpa.ComposedDpEvent(tuple(hashable(e) for e in event.events))
    if isinstance(event, dpa.SelfComposedDpEvent):
        return dpa.SelfComposedDpEvent(hashable(event.event), event.count)
    return event


def to_json(event: dpa.DpEvent) -> str:
    """Canonical JSON text of an event (sorted keys): equal events give equal text."""
    return json.dumps(to_dict(event), sort_keys=True, separators=(",", ":"))


_PARSED: dict[str, object] = {}


def from_json(text: str) -> dpa.DpEvent:
    """Parse `to_json` text; the same text always gives the same event *object*, so the
    identity-keyed caches (flatten, accounting) hit when a store re-reads its charges."""
    hit = _PARSED.get(text)
    if hit is None:
        if len(_PARSED) > 4096:
            _PARSED.clear()
        hit = _PARSED[text] = from_dict(json.loads(text))
    return hit


def flatten(event: dpa.DpEvent) -> Counter:
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


def _flatten(event: dpa.DpEvent, mult: int, counts: Counter) -> None:
    if isinstance(event, dpa.NoOpDpEvent):
        return
    if isinstance(event, dpa.SelfComposedDpEvent):
        _flatten(event.event, mult * event.count, counts)
    elif isinstance(event, dpa.ComposedDpEvent):
        for e in event.events:
            _flatten(e, mult, counts)
    else:
        counts[event] += mult


def compose(counts: Counter) -> dpa.DpEvent:
    """The inverse of `flatten`: one ComposedDpEvent of self-composed base events."""
    parts = [e if c == 1 else dpa.SelfComposedDpEvent(e, c) for e, c in counts.items() if c]
    if not parts:
        return dpa.NoOpDpEvent()
    return parts[0] if len(parts) == 1 else dpa.ComposedDpEvent(parts)

"""What a person seen by several hospitals is guaranteed: the report dict and its table.

`person_report` turns each silo's executed events (its ledger), the silos' targets, δ, the
declared M (``[privacy] persons_in_silos``) and, optionally, a released noisy overlap
histogram (`silofl.privacy.overlap.release_overlap`) into a JSON-ready dict;
`person_table` renders it for the terminal. Every figure comes from
`silofl.privacy.person_composition`; nothing here touches data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import dp_accounting as dpa
import numpy as np

from silofl.errors import PrivacyError
from silofl.io import json_safe
from silofl.privacy.ledger import tightest
from silofl.privacy.overlap import OverlapRelease
from silofl.privacy.person_composition import DEFAULT_MAX_SUBSETS, person_composition
from silofl.privacy.targets import PrivacyTarget

if TYPE_CHECKING:
    from rich.table import Table

UNIT_NOTE = ("each silo's ε is for adding or removing one person of that silo when it "
             "trains at the person unit (one record otherwise); a person present in m "
             "silos is covered by the composition of those m silos' mechanisms")


def person_report(silo_events: Mapping[str, Sequence[dpa.DpEvent]],
                  targets: Mapping[str, PrivacyTarget], delta: float, declared_m: int = 0,
                  overlap: OverlapRelease | Sequence[float] | np.ndarray | None = None, *,
                  max_subsets: int = DEFAULT_MAX_SUBSETS) -> dict[str, Any]:
    """The consortium-wide person guarantee as a JSON-ready dict.

    Parameters
    ----------
    silo_events : mapping of str to sequence of dp_accounting.DpEvent
        Each silo's executed events (`person_composition.ledger_events`); K silos.
    targets : mapping of str to PrivacyTarget
        Each silo's own target (its own ε is reported at its own δ).
    delta : float
        δ of the consortium-wide figures.
    declared_m : int, default 0
        Declared most silos per person (0, or more than K: K).
    overlap : OverlapRelease or sequence of float, shape (K,), optional
        A *released* noisy histogram: entry m − 1 = persons in exactly m silos
        (`release_overlap`'s answer, or its ``noisy``). Never pass the exact histogram:
        it is not private. With an `OverlapRelease` (its noise std known) the report
        also flags the m above the declared M whose noisy count exceeds 3 noise stds.
    max_subsets : int
        See `person_composition`.

    Returns
    -------
    dict
        ``silos`` (own ε vs target), ``rows`` (m = 1..K: ε, δ, method, worst silos,
        naive sum, group bound, noisy persons), ``declared`` (the row for M), ``unit``,
        ``delta``, ``overlap_above_declared`` (with an `OverlapRelease`: m > M whose
        noisy count exceeds 3 stds — an estimate from a private release, post-processing
        only); non-finite floats as None.
    """
    std = overlap.std if isinstance(overlap, OverlapRelease) else None
    if isinstance(overlap, OverlapRelease):
        overlap = overlap.noisy
    comp = person_composition(silo_events, delta, declared_m=declared_m,
                              max_subsets=max_subsets)
    k = len(comp.rows)
    if overlap is not None and len(overlap) != k:
        raise PrivacyError(f"the overlap histogram must have one entry per m = 1..{k}, "
                           f"got {len(overlap)}")
    silos = []
    for name, evs in silo_events.items():
        t = targets.get(name)
        own = tightest(_composed(evs), t.delta)[0] if t else comp.silo_epsilons[name]
        silos.append({"silo": name, "epsilon": own,
                      "target_epsilon": t.epsilon if t else None,
                      "delta": t.delta if t else delta})
    rows = []
    for r, d in zip(comp.rows, comp.to_dict()["rows"]):
        if overlap is not None:
            d["persons_noisy"] = float(overlap[r.m - 1])
        rows.append(d)
    out = {"unit": UNIT_NOTE, "delta": comp.delta, "declared_m": comp.declared_m,
           "silos": silos, "rows": rows, "declared": rows[comp.declared_m - 1]}
    if std is not None and overlap is not None:
        out["overlap_above_declared"] = [m for m in range(comp.declared_m + 1, k + 1)
                                         if overlap[m - 1] > 3 * std]
    return json_safe(out)


def _composed(evs: Sequence[dpa.DpEvent]) -> dpa.DpEvent:
    return dpa.ComposedDpEvent(list(evs))


def _num(v: float | None, fmt: str = ".3g") -> str:
    return "—" if v is None else format(v, fmt)


def person_table(report: Mapping[str, Any]) -> Table:
    """A rich table of `person_report`'s rows: "A person seen by m hospitals".

    Parameters
    ----------
    report : dict
        `person_report`'s answer.

    Returns
    -------
    rich.table.Table
    """
    from rich.table import Table
    delta = report["delta"]
    caption = report["unit"]
    above = report.get("overlap_above_declared")
    if above:
        caption += (f". The released overlap suggests persons in {', '.join(map(str, above))} "
                    f"silos, more than the declared M = {report['declared_m']}")
    t = Table(title=f"A person seen by m hospitals (δ = {delta:g}; declared M = "
                    f"{report['declared_m']})", caption=caption)
    noisy = any("persons_noisy" in r for r in report["rows"])
    for c in ("m", "ε (composition)", "how", "worst silos", "naive sum Σε (δ)",
              "group bound (δ)") + (("persons (noisy)",) if noisy else ()):
        t.add_column(c, justify="right" if c not in ("how", "worst silos") else "left",
                     overflow="fold")
    for r in report["rows"]:
        mark = " ◀ M" if r["m"] == report["declared_m"] else ""
        eps = _num(r["epsilon"]) + (" (bound)" if r["method"] == "bound" else "")
        cells = [f"{r['m']}{mark}", eps, r["method"] if r["method"] != "exact" else
                 (r["accountant"] or ""), ", ".join(r["silos"] or []) or "—",
                 f"{_num(r['naive_sum_epsilon'])} ({_num(r['naive_sum_delta'], '.2g')})",
                 f"{_num(r['group_epsilon'])} ({_num(r['group_delta'], '.2g')})"]
        if noisy:
            cells.append(_num(r.get("persons_noisy"), ".1f"))
        t.add_row(*cells)
    return t


def job_persons(results: Sequence[Any], extra: Mapping[str, dpa.DpEvent] | None,
                delta: float, declared_m: int = 0,
                overlap: OverlapRelease | None = None) -> dict[str, Any] | None:
    """`person_report` for a finished person-level job: each silo's executed events over
    every method of the job (its ledgers) plus its private preprocessing (`extra`).

    Parameters
    ----------
    results : sequence of RunResult
        The job's results, one per method (their ledgers hold what executed).
    extra : mapping of str to dp_accounting.DpEvent, optional
        Silo name → its releases outside the methods (preprocessing, the overlap
        histogram), charged with the job.
    delta : float
        δ of the consortium-wide figures ([privacy] delta).
    declared_m : int, default 0
        [privacy] persons_in_silos (0: every silo).
    overlap : OverlapRelease, optional
        The job's released noisy overlap histogram (`experiments.linkage.release`): the
        table gains its "persons (noisy)" column and the above-declared warning.

    Returns
    -------
    dict or None
        The report, or None for a non-private job.
    """
    if not results or results[0].ledgers is None:
        return None
    silo_events: dict[str, list[dpa.DpEvent]] = {}
    targets: dict[str, PrivacyTarget] = {}
    for r in results:
        for led in r.ledgers:
            silo_events.setdefault(led.silo, []).extend(e.event for e in led.entries)
            targets[led.silo] = led.target
    for name, ev in (extra or {}).items():
        silo_events.setdefault(name, []).append(ev)
    return person_report(silo_events, targets, delta, declared_m, overlap)

"""The consortium-wide guarantee of a person seen by several silos.

Each silo's guarantee is its own: silo k's mechanism (the composition of the events its
ledger executed) is (ε_k, δ)-DP for adding or removing one *unit* of its data — one person
when the silo trains with ``[privacy] unit = "person"`` (one record otherwise, and then
the figures below are for a person with one record per silo). A person present in the
silos S changes the data of every silo in S, and the silos draw their noise
independently, so what the whole run reveals about that person is bounded by the
(adaptive) composition of the mechanisms of the silos in S — silos outside S do not
depend on them. This module composes those mechanisms under PLD (RDP where PLD has no
model, the tighter of the two as a silo's ledger reports it), not the naive m·ε. This
holds when each silo's events describe mechanisms on that silo's data with its own noise
(silo-specific DP-SGD: the server's sum is post-processing of the silos' noisy parts). A
release computed from all silos at once and charged to every ledger (the overlap
histogram, `silofl.privacy.overlap`) is counted once per silo: conservative there, since
removing a person from all their silos moves that histogram by 1, less than √2.

Worst case over which m silos: silos with equal mechanisms are interchangeable, so the
candidates are multisets of distinct mechanisms; those that can be upgraded to a provably
dominating one (`silofl.privacy.dominance`) are skipped. When at most `max_subsets`
candidates remain, every one is composed and the largest ε is reported (exact: the worst
set is named). Otherwise an upper bound is given only where one is proved: m copies of a
mechanism that dominates every silo's, or of the join (largest q and steps, smallest σ)
of single-Gaussian-type silos, or the figure for m + 1 silos when that is smaller (the
worst case grows with m); else the row says "not computed" and why.

Two comparisons show why composition matters: the naive sum Σε of the m largest ε_k
(basic composition: δ adds up to m·δ), and the group-privacy bound that treats the
consortium as one mechanism (m·max ε_k, δ·Σ_{i<m} e^{i·max ε_k}).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import dp_accounting as dpa

from silofl.errors import PrivacyError
from silofl.privacy import accounting, dominance, events
from silofl.privacy.ledger import Ledger, tightest
from silofl.privacy.targets import check_delta

#: candidate silo sets composed per m at most (each is one PLD composition)
DEFAULT_MAX_SUBSETS = 256


@dataclass(frozen=True)
class PersonRow:
    """The guarantee of a person present in m silos (one row of the table).

    Attributes
    ----------
    m : int
        Number of silos the person appears in.
    epsilon : float or None
        ε at `delta` (an upper bound); None when not computed (see `reason`).
    delta : float
        δ of `epsilon`.
    accountant : str or None
        "pld" or "rdp": the tighter figure; for bounds, of the bounding composition.
    method : str
        "exact" (worst set found), "bound" (a proved upper bound) or "not computed".
    silos : tuple of str or None
        A worst set of silos (exact rows only).
    reason : str
        How the figure was obtained, or why there is none.
    candidates : int
        Silo sets composed for this row.
    naive_sum_epsilon, naive_sum_delta : float
        Σ of the m largest per-silo ε, and m·δ (basic composition).
    group_epsilon, group_delta : float
        m·max ε_k and δ·Σ_{i<m} e^{i·max ε_k} (group privacy over the consortium).
    """

    m: int
    epsilon: float | None
    delta: float
    accountant: str | None
    method: str
    silos: tuple[str, ...] | None
    reason: str
    candidates: int
    naive_sum_epsilon: float
    naive_sum_delta: float
    group_epsilon: float
    group_delta: float


@dataclass(frozen=True)
class PersonComposition:
    """`person_composition`'s answer: rows m = 1..K and the declared M's row."""

    delta: float
    declared_m: int
    silo_epsilons: dict[str, float]
    rows: list[PersonRow] = field(default_factory=list)

    def row(self, m: int) -> PersonRow:
        """The row of a person present in `m` silos (1 ≤ m ≤ K)."""
        if not 1 <= m <= len(self.rows):
            raise PrivacyError(f"m must be between 1 and {len(self.rows)} silos, got {m}")
        return self.rows[m - 1]

    @property
    def declared(self) -> PersonRow:
        """The row for the declared M (`[privacy] persons_in_silos`; 0 = every silo)."""
        return self.row(self.declared_m)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (non-finite floats are left as they are: pass through
        `silofl.io.json_safe` before writing JSON)."""
        return {"delta": self.delta, "declared_m": self.declared_m,
                "silo_epsilons": dict(self.silo_epsilons),
                "rows": [dict(asdict(r), silos=list(r.silos) if r.silos else None)
                         for r in self.rows]}


def ledger_events(ledgers: Iterable[Ledger]) -> dict[str, list[dpa.DpEvent]]:
    """The events each silo's ledger executed (the input of `person_composition`).

    Parameters
    ----------
    ledgers : iterable of Ledger
        One per silo.

    Returns
    -------
    dict of str to list of dp_accounting.DpEvent
        Silo name → its executed events.
    """
    return {led.silo: [e.event for e in led.entries] for led in ledgers}


def person_composition(silo_events: Mapping[str, Sequence[dpa.DpEvent]], delta: float, *,
                       declared_m: int = 0,
                       max_subsets: int = DEFAULT_MAX_SUBSETS) -> PersonComposition:
    """ε of a person present in m silos, m = 1..K: the composition of those silos'
    mechanisms, worst case over which m silos.

    Parameters
    ----------
    silo_events : mapping of str to sequence of dp_accounting.DpEvent
        Each silo's executed events, as its ledger holds them (`ledger_events`); K silos.
    delta : float
        δ in (0, 0.5) of every figure.
    declared_m : int, default 0
        The declared most silos a person appears in (`[privacy] persons_in_silos`);
        0, or more than K, means K.
    max_subsets : int, default 256
        The most candidate silo sets composed per m before falling back to a bound.

    Returns
    -------
    PersonComposition
        K rows (m = 1..K) and the declared M; m = 1 is the largest silo's own ledger ε.

    Raises
    ------
    PrivacyError
        No silos, δ out of range, `declared_m` not an integer ≥ 0, or `max_subsets`
        not an integer ≥ 1.
    """
    delta = check_delta(delta, "person composition: ")
    names = list(silo_events)
    k = len(names)
    if k == 0:
        raise PrivacyError("person composition needs at least one silo's events")
    if isinstance(declared_m, bool) or not isinstance(declared_m, int) or declared_m < 0:
        raise PrivacyError(f"[privacy] persons_in_silos must be an integer ≥ 0 (the most "
                           f"silos one person appears in; 0 = every silo), got {declared_m!r}")
    if isinstance(max_subsets, bool) or not isinstance(max_subsets, int) or max_subsets < 1:
        raise PrivacyError(f"max_subsets must be an integer ≥ 1, got {max_subsets!r}")
    counts = {n: _counts(silo_events[n]) for n in names}
    own = {n: tightest(events.compose(counts[n]), delta)[0] for n in names}
    groups: dict[dominance.Signature, list[str]] = {}
    for n in names:
        groups.setdefault(dominance.signature(counts[n]), []).append(n)
    sigs = list(groups)
    strict = dominance.strict_dominators(sigs)
    top = sorted(own.values(), reverse=True)
    rows = []
    for m in range(1, k + 1):
        base = _comparisons(top, m, delta)
        if m == 1:  # every silo's own figure is already known: the exact worst
            worst = max(names, key=own.__getitem__)
            kind = tightest(events.compose(counts[worst]), delta)[1]
            rows.append(PersonRow(1, own[worst], delta, kind, "exact", (worst,),
                                  "the largest silo's own ε", k, **base))
            continue
        rows.append(_row(m, sigs, groups, strict, delta, max_subsets, base))
    # nobody is in more silos than there are: a larger declared M means every silo
    return PersonComposition(delta, min(declared_m or k, k), own, _monotone(rows))


def _monotone(rows: list[PersonRow]) -> list[PersonRow]:
    """Tighten bounds (and fill "not computed" rows) from larger m: any m silos are a
    subset of some m' > m silos, and composing more mechanisms never costs less privacy,
    so every figure for m' silos (an upper bound itself) bounds the worst case for m."""
    out = list(rows)
    best: tuple[float, str | None, int] | None = None  # smallest figure above: (ε, acc, m')
    for i in range(len(out) - 1, 0, -1):
        row = out[i]
        if row.method != "exact" and best is not None and (
                row.epsilon is None or best[0] < row.epsilon):
            out[i] = replace(row, epsilon=best[0], accountant=best[1], method="bound",
                             silos=None, reason=(
                                 f"upper bound: the figure for m = {best[2]} silos; a person "
                                 f"in {row.m} silos is no worse off than in {best[2]} silos "
                                 "that include them"))
        eps = out[i].epsilon
        if eps is not None and (best is None or eps < best[0]):
            best = (eps, out[i].accountant, out[i].m)
    return out


def _counts(evs: Sequence[dpa.DpEvent]) -> Counter:
    out: Counter = Counter()
    for e in evs:
        out.update(events.flatten(e))
    return out


def _comparisons(top: list[float], m: int, delta: float) -> dict[str, float]:
    emax = top[0]
    gdelta = math.inf if m * emax > 700 else delta * sum(math.exp(i * emax) for i in range(m))
    return {"naive_sum_epsilon": float(sum(top[:m])), "naive_sum_delta": m * delta,
            "group_epsilon": m * emax, "group_delta": gdelta}


def _compose(parts: Iterable[tuple[dominance.Signature, int]]) -> dpa.DpEvent:
    total: Counter = Counter()
    for sig, times in parts:
        for e, c in sig:
            total[e] += c * times
    return events.compose(total)


def _row(m: int, sigs: list, groups: dict, strict: list, delta: float, max_subsets: int,
         base: dict[str, float]) -> PersonRow:
    caps = [len(groups[s]) for s in sigs]
    cands = dominance.maximal_multisets(caps, strict, m, max_subsets)
    try:
        if cands is not None:
            eps, kind, cand, composed = _worst(sigs, cands, delta)
            silos = tuple(n for s, c in zip(sigs, cand) for n in groups[s][:c])
            how = (f"worst of {len(cands)} candidate set(s) of {m} silos (sets provably "
                   f"dominated by another were skipped; {composed} composed in full, the "
                   "rest had an RDP bound below the worst)")
            return PersonRow(m, eps, delta, kind, "exact", silos, how, len(cands), **base)
        return _bound(m, sigs, groups, strict, delta, max_subsets, base)
    except PrivacyError as err:  # e.g. node-level and dp_accounting events in one set
        return PersonRow(m, None, delta, None, "not computed", None,
                         f"these silos' events do not compose: {err}", 0, **base)


def _worst(sigs: list, cands: list[tuple[int, ...]],
           delta: float) -> tuple[float, str, tuple[int, ...], int]:
    """(ε, accountant, counts, sets composed) of the candidate with the largest `tightest`
    figure. A candidate whose RDP ε (cheap; `tightest` never exceeds it) is at most the
    worst figure so far cannot change the maximum, so only the others get a PLD run."""
    evs = [_compose(zip(sigs, c)) for c in cands]
    rdp_eps = [accounting.epsilon(e, delta, "rdp") for e in evs]
    best: tuple[float, str, tuple[int, ...]] | None = None
    composed = 0
    for i in sorted(range(len(cands)), key=lambda i: -rdp_eps[i]):
        if best is not None and rdp_eps[i] <= best[0]:
            continue
        eps, kind = tightest(evs[i], delta)
        composed += 1
        if best is None or eps > best[0]:
            best = (eps, kind, cands[i])
    assert best is not None
    return (*best, composed)


def _bound(m: int, sigs: list, groups: dict, strict: list, delta: float, max_subsets: int,
           base: dict[str, float]) -> PersonRow:
    """An upper bound when there are too many candidate sets, or "not computed"."""
    too_many = f"more than {max_subsets} candidate sets of {m} silos"
    maxima = [i for i in range(len(sigs))
              if all(j == i or dominance.dominates(sigs[i], sigs[j]) for j in range(len(sigs)))]
    if maxima:
        i = maxima[0]
        eps, kind = tightest(_compose([(sigs[i], m)]), delta)
        how = (f"upper bound: {too_many}; {m} copies of silo {groups[sigs[i]][0]!r}'s "
               "mechanism, which provably dominates every silo's")
        return PersonRow(m, eps, delta, kind, "bound", None, how, 1, **base)
    joined = dominance.join_event(sigs)
    if joined is not None:
        e, c = joined
        eps, kind = tightest(dpa.SelfComposedDpEvent(e, c * m), delta)
        how = (f"upper bound: {too_many}; {m} copies of the join of all silos' DP-SGD "
               "(largest q and step count, smallest σ), which dominates each silo")
        return PersonRow(m, eps, delta, kind, "bound", None, how, 1, **base)
    return PersonRow(m, None, delta, None, "not computed", None,
                     f"{too_many}, and no single mechanism provably dominates every silo's; "
                     "raise max_subsets to compose them all", 0, **base)


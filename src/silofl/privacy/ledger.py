"""One privacy ledger per silo and run: the per-run audit trail and its enforcement.

A ledger holds the silo's target (ε, δ) and the events actually executed on its data.
`charge` is called *before* the data is touched and records the event — in memory and as
one JSON line appended to the ledger file on disk — or refuses it (BudgetExceeded):
- with an `allowance` (the multiset of base events the run reserved in the lifetime
  budget store, `silofl.privacy.budget`), anything not covered by what is left of it;
- without one, anything that would take the silo past its target under the accountant.

Checking a composition with dp_accounting costs milliseconds, and a run charges every
silo every round, so the ledger remembers the largest composition it has verified: a
charge whose total is covered by it (every base event count ≤ the verified count) needs
no new computation, because composing fewer mechanisms never costs more privacy.
`preflight` verifies a whole training plan up front, which also makes a run that cannot
fit its budget fail before any data is touched.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from silofl.errors import BudgetExceeded
from silofl.privacy import accounting, events
from silofl.privacy.critical import deferred_signals
from silofl.privacy.targets import PrivacyTarget

if TYPE_CHECKING:
    import dp_accounting as dpa


def tightest(event: dpa.DpEvent, delta: float) -> tuple[float, str]:
    """(ε, accountant) of `event` at `delta`: the smallest of the upper bounds that RDP and
    (pessimistic) PLD give — each is a valid guarantee, so the smaller one is too. Checks
    and reports both use this one figure, so a violation can never be reported as a pass."""
    eps = {k: v for k, v in accounting.epsilons(event, delta).items() if v is not None}
    kind = min(eps, key=eps.__getitem__)
    return eps[kind], kind


def read_entries(path: Path, run: str | None = None) -> list[Entry]:
    """The entries of a ledger file (one JSON line per charge); a torn last line (a kill
    mid-write) is dropped: its charge was never acted on. With `run`, only the lines that
    run wrote (lines without a run id, from older versions, count for any run)."""
    out = []
    lines = path.read_text().split("\n") if path.exists() else []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise
        if run is None or d.get("run", run) == run:
            out.append(Entry(d["round"], d["label"], events.from_dict(d["event"]),
                             d.get("run")))
    return out


def silo_file_id(name: str) -> str:
    """A file name for silo `name` that no other name maps to: a readable prefix plus a
    hash of the exact name ("A B" and "A_B" get different files)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40] or "silo"
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


@dataclass
class Entry:
    round: int
    label: str
    event: object
    run: str | None = None  # the budget-store run that charged it


@dataclass
class Ledger:
    silo: str
    target: PrivacyTarget
    accountant: accounting.Accountant = accounting.DEFAULT_ACCOUNTANT
    path: Path | None = None
    #: base-event counts reserved for this run in the budget store (None: check ε instead)
    allowance: Counter | None = None
    entries: list[Entry] = field(default_factory=list)
    #: the budget-store run these charges belong to (written on each ledger line)
    run_id: str | None = None
    #: called with (event, round, label) after a charge passes its checks and before it
    #: is recorded here: the job records it in the budget store (progress) first
    on_charge: Callable | None = field(default=None, repr=False)
    _spent: Counter = field(default_factory=Counter, repr=False)
    _verified: Counter = field(default_factory=Counter, repr=False)
    # Fast path for the per-round charge (a run charges every silo every round): the same
    # base-event objects recur, so their spent/verified counts are kept by object identity
    # and no event is hashed (dp_accounting events hash recursively, which dominated).
    _by_id: dict = field(default_factory=dict, repr=False)  # id → [event, spent, verified]
    _pending: list = field(default_factory=list, repr=False)  # charges not yet in _spent
    #: inside `charge_all`: the round's hooks run together there (one store transaction)
    _batched: bool = field(default=False, repr=False, compare=False)

    def __getstate__(self) -> dict:
        """Pickled (checkpointed results) without the store hook: a connection is not
        state, and a restored ledger charges nothing more."""
        state = dict(self.__dict__)
        state["on_charge"] = None
        return state

    def _sync(self) -> None:
        for added in self._pending:
            self._spent.update(added)
        self._pending.clear()

    # -- checks ------------------------------------------------------------------------
    def _covered(self, counts: Counter) -> bool:
        return all(c <= self._verified.get(e, 0) for e, c in counts.items())

    def _slot(self, e: dpa.DpEvent) -> list:
        hit = self._by_id.get(id(e))
        if hit is None or hit[0] is not e:
            self._sync()
            hit = self._by_id[id(e)] = [e, self._spent.get(e, 0), self._verified.get(e, 0)]
        return hit

    def _covered_after(self, added: dict) -> bool:
        """Is spent + `added` covered? Only `added`'s keys can change, and spent itself is
        always covered (it was verified when charged), so those keys are all we check."""
        for e, c in added.items():
            slot = self._slot(e)
            if slot[1] + c > slot[2]:
                return False
        return True

    def _check(self, counts: Counter, what: str) -> None:
        """`counts` must include everything spent (callers build it after `_sync`)."""
        if self._covered(counts):
            return
        if self.allowance is not None:
            extra = [e for e, c in counts.items() if c > self.allowance.get(e, 0)]
            raise BudgetExceeded(
                f"silo {self.silo!r}: {what} is not covered by what this run reserved in "
                f"the budget store ({len(extra)} event type(s) over); nothing was executed")
        eps, kind = tightest(events.compose(counts), self.target.delta)
        if not eps <= self.target.epsilon:  # no tolerance: a violation never rounds to a pass
            raise BudgetExceeded(
                f"silo {self.silo!r}: {what} would spend ε = {eps:.4g} > its budget "
                f"ε = {self.target.epsilon:g} (δ = {self.target.delta:g}, {kind}); "
                "nothing was executed. Lower the number of rounds/epochs, raise the noise, "
                "or raise this silo's epsilon")
        self._verified = counts
        self._by_id.clear()

    def __post_init__(self) -> None:
        if self.allowance is not None:  # the reservation is verified: counting suffices
            self._verified = Counter(self.allowance)

    def preflight(self, planned: dpa.DpEvent) -> None:
        """Verify that `planned` (an event) plus what is already spent fits the budget."""
        self._sync()
        self._check(self._spent + events.flatten(planned), "the planned training")

    def check(self, event: dpa.DpEvent, *, round: int = -1, label: str = "dpsgd") -> None:
        """Raise BudgetExceeded if `event` would exceed the budget; record nothing."""
        added = events.flatten(event)
        if not self._covered_after(added):
            self._sync()
            self._check(self._spent + added, f"{label} in round {round}")

    def charge(self, event: dpa.DpEvent, *, round: int = -1, label: str = "dpsgd") -> None:
        """Record `event` as about to be executed; raise BudgetExceeded instead if it
        would exceed the budget. Call this before touching the silo's data."""
        added = events.flatten(event)
        if not self._covered_after(added):
            self._sync()
            self._check(self._spent + added, f"{label} in round {round}")
        with deferred_signals():  # store, memory and file: a signal never splits them
            if self.on_charge is not None and not self._batched:
                self.on_charge(event, round, label)
            self._pending.append(added)
            for e, c in added.items():
                self._slot(e)[1] += c
            self.entries.append(Entry(round, label, event, self.run_id))
            if self.path is not None:
                line = {"silo": self.silo, "round": round, "label": label,
                        "event": events.to_dict(event)}
                if self.run_id is not None:
                    line["run"] = self.run_id
                with open(self.path, "a") as f:
                    f.write(json.dumps(line) + "\n")

    def restore(self, entries: list[Entry]) -> None:
        """Take back entries an earlier process of the same run charged (read from this
        ledger's file when resuming): counted as spent, not written again, not checked
        (they were checked when they were charged)."""
        added: Counter = Counter()
        for e in entries:
            for base, c in events.flatten(e.event).items():
                added[base] += c
        self._sync()
        self._spent.update(added)
        self._by_id.clear()
        self.entries.extend(entries)

    # -- reporting ---------------------------------------------------------------------
    @property
    def spent_event(self) -> dpa.DpEvent:
        """Everything executed so far, as one composed dp_accounting event."""
        self._sync()
        return events.compose(self._spent)

    def spent_counts(self) -> Counter:
        self._sync()
        return Counter(self._spent)

    def epsilon(self, kind: accounting.Accountant | None = None) -> float:
        """ε spent under `kind`, or the guarantee (`tightest`) when None."""
        if kind is None:
            return tightest(self.spent_event, self.target.delta)[0]
        return accounting.epsilon(self.spent_event, self.target.delta, kind)

    def report(self) -> dict:
        """Spent ε (the guarantee, `tightest`: the figure checks use) and under RDP and
        PLD, the target, and the event counts."""
        event = self.spent_event  # syncs _spent
        both = accounting.epsilons(event, self.target.delta)
        eps, kind = tightest(event, self.target.delta)
        return {"silo": self.silo, "target_epsilon": self.target.epsilon,
                "delta": self.target.delta, "accountant": kind, "epsilon": eps,
                "epsilon_rdp": both["rdp"], "epsilon_pld": both["pld"],
                "within_target": eps <= self.target.epsilon,
                "events": [{"count": c, "event": events.to_dict(e)}
                           for e, c in self._spent.items()]}


def charge_all(ledgers: list[Ledger], evs: list, *, round: int, label: str) -> None:
    """Charge ledger j the event evs[j], all or none: every ledger is checked first. When
    all the ledgers' `on_charge` hooks share one ``many`` (a job's store: see
    `runtime.job`), the round's charges reach it in one call — one store transaction —
    right after the ledgers recorded them, so the store still hears of every charge
    before the caller reads data. A SIGINT/SIGTERM arriving meanwhile is raised only
    after all of it (`privacy.critical`), so the store and the ledger files always agree.
    (Ledgers first still: an error between the two leaves the ledgers ahead, and settling
    counts what they hold.)

    Parameters
    ----------
    ledgers : list of Ledger
        The silos' ledgers.
    evs : list of dp_accounting.DpEvent
        One event per ledger.
    round : int
        The round the charges belong to.
    label : str
        The ledger label.
    """
    pairs = list(zip(ledgers, evs, strict=True))
    for ledger, event in pairs:
        ledger.check(event, round=round, label=label)
    many: Callable | None = getattr(pairs[0][0].on_charge, "many", None) if pairs else None
    batched = many is not None and all(
        getattr(led.on_charge, "many", None) == many for led, _ in pairs)
    with deferred_signals():  # every ledger and the store, or a signal waits until they are
        for ledger, event in pairs:
            ledger._batched = batched
            try:
                ledger.charge(event, round=round, label=label)
            finally:
                ledger._batched = False
        if many is not None and batched:
            many([(led.on_charge, event, round, label) for led, event in pairs])

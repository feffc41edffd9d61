"""One privacy ledger per silo.

A ledger holds the silo's target (ε, δ) and the events actually executed on its data.
`charge` is called *before* the data is touched: it refuses (BudgetExceeded) any event
that would take the silo past its target under the chosen accountant, and otherwise
records it — in memory and as one JSON line appended to the ledger file on disk.

Checking a composition with dp_accounting costs milliseconds, and a run charges every
silo every round, so the ledger remembers the largest composition it has verified: a
charge whose total is covered by it (every base event count ≤ the verified count) needs
no new computation, because composing fewer mechanisms never costs more privacy.
`preflight` verifies a whole training plan up front, which also makes a run that cannot
fit its budget fail before any data is touched.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from silofl.data.federation import PrivacyTarget
from silofl.errors import BudgetExceeded
from silofl.privacy import accounting, events

_TOL = 1e-9


@dataclass
class Entry:
    round: int
    label: str
    event: object


@dataclass
class Ledger:
    silo: str
    target: PrivacyTarget
    accountant: accounting.Accountant = accounting.DEFAULT_ACCOUNTANT
    path: Path | None = None
    entries: list[Entry] = field(default_factory=list)
    _spent: Counter = field(default_factory=Counter, repr=False)
    _verified: Counter = field(default_factory=Counter, repr=False)
    # Fast path for the per-round charge (a run charges every silo every round): the same
    # base-event objects recur, so their spent/verified counts are kept by object identity
    # and no event is hashed (dp_accounting events hash recursively, which dominated).
    _by_id: dict = field(default_factory=dict, repr=False)  # id → [event, spent, verified]
    _pending: list = field(default_factory=list, repr=False)  # charges not yet in _spent

    def _sync(self) -> None:
        for added in self._pending:
            self._spent.update(added)
        self._pending.clear()

    # -- checks ------------------------------------------------------------------------
    def _covered(self, counts: Counter) -> bool:
        return all(c <= self._verified.get(e, 0) for e, c in counts.items())

    def _slot(self, e) -> list:
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
        eps = accounting.epsilon(events.compose(counts), self.target.delta, self.accountant)
        if eps > self.target.epsilon * (1 + _TOL):
            raise BudgetExceeded(
                f"silo {self.silo!r}: {what} would spend ε = {eps:.4g} > its budget "
                f"ε = {self.target.epsilon:g} (δ = {self.target.delta:g}, {self.accountant}); "
                "nothing was executed. Lower the number of rounds/epochs, raise the noise, "
                "or raise this silo's epsilon")
        self._verified = counts
        self._by_id.clear()

    def preflight(self, planned) -> None:
        """Verify that `planned` (an event) plus what is already spent fits the budget."""
        self._sync()
        self._check(self._spent + events.flatten(planned), "the planned training")

    def check(self, event, *, round: int = -1, label: str = "dpsgd") -> None:
        """Raise BudgetExceeded if `event` would exceed the budget; record nothing."""
        added = events.flatten(event)
        if not self._covered_after(added):
            self._sync()
            self._check(self._spent + added, f"{label} in round {round}")

    def charge(self, event, *, round: int = -1, label: str = "dpsgd") -> None:
        """Record `event` as about to be executed; raise BudgetExceeded instead if it
        would exceed the budget. Call this before touching the silo's data."""
        added = events.flatten(event)
        if not self._covered_after(added):
            self._sync()
            self._check(self._spent + added, f"{label} in round {round}")
        self._pending.append(added)
        for e, c in added.items():
            self._slot(e)[1] += c
        self.entries.append(Entry(round, label, event))
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps({"silo": self.silo, "round": round, "label": label,
                                    "event": events.to_dict(event)}) + "\n")

    # -- reporting ---------------------------------------------------------------------
    @property
    def spent_event(self):
        """Everything executed so far, as one composed dp_accounting event."""
        self._sync()
        return events.compose(self._spent)

    def spent_counts(self) -> Counter:
        self._sync()
        return Counter(self._spent)

    def epsilon(self, kind: accounting.Accountant | None = None) -> float:
        return accounting.epsilon(self.spent_event, self.target.delta, kind or self.accountant)

    def report(self) -> dict:
        """Spent (ε, δ) under both accountants, the target, and the event counts."""
        eps = accounting.epsilons(self.spent_event, self.target.delta)  # syncs _spent
        return {"silo": self.silo, "target_epsilon": self.target.epsilon,
                "delta": self.target.delta, "accountant": self.accountant,
                "epsilon_rdp": eps["rdp"], "epsilon_pld": eps["pld"],
                "within_target": eps[self.accountant] <= self.target.epsilon * (1 + _TOL),
                "events": [{"count": c, "event": events.to_dict(e)}
                           for e, c in self._spent.items()]}

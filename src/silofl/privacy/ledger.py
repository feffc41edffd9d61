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

    # -- checks ------------------------------------------------------------------------
    def _covered(self, counts: Counter) -> bool:
        return all(c <= self._verified.get(e, 0) for e, c in counts.items())

    def _check(self, counts: Counter, what: str) -> None:
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

    def preflight(self, planned) -> None:
        """Verify that `planned` (an event) plus what is already spent fits the budget."""
        self._check(self._spent + events.flatten(planned), "the planned training")

    def check(self, event, *, round: int = -1, label: str = "dpsgd") -> None:
        """Raise BudgetExceeded if `event` would exceed the budget; record nothing."""
        self._check(self._spent + events.flatten(event), f"{label} in round {round}")

    def charge(self, event, *, round: int = -1, label: str = "dpsgd") -> None:
        """Record `event` as about to be executed; raise BudgetExceeded instead if it
        would exceed the budget. Call this before touching the silo's data."""
        total = self._spent + events.flatten(event)
        self._check(total, f"{label} in round {round}")
        self._spent = total
        self.entries.append(Entry(round, label, event))
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps({"silo": self.silo, "round": round, "label": label,
                                    "event": events.to_dict(event)}) + "\n")

    # -- reporting ---------------------------------------------------------------------
    @property
    def spent_event(self):
        """Everything executed so far, as one composed dp_accounting event."""
        return events.compose(self._spent)

    def spent_counts(self) -> Counter:
        return Counter(self._spent)

    def epsilon(self, kind: accounting.Accountant | None = None) -> float:
        return accounting.epsilon(self.spent_event, self.target.delta, kind or self.accountant)

    def report(self) -> dict:
        """Spent (ε, δ) under both accountants, the target, and the event counts."""
        eps = accounting.epsilons(self.spent_event, self.target.delta)
        return {"silo": self.silo, "target_epsilon": self.target.epsilon,
                "delta": self.target.delta, "accountant": self.accountant,
                "epsilon_rdp": eps["rdp"], "epsilon_pld": eps["pld"],
                "within_target": eps[self.accountant] <= self.target.epsilon * (1 + _TOL),
                "events": [{"count": c, "event": events.to_dict(e)}
                           for e, c in self._spent.items()]}

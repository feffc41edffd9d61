"""The privacy unit of a guarantee and of every charge in the lifetime store: what one
"neighbouring dataset" differs by, in words every output uses.

* ``"example"`` -- per row: adding or removing one row (record) of one silo.
* ``"person"`` -- per person: adding or removing all rows of one person in one silo
  (`[data] person_column`, `[privacy] unit = "person"`).
* ``"node"`` -- per node: one person of a contact graph with their edges (or without,
  `privacy.node_level`).

A silo's lifetime figure composes charges of ONE unit. ε per row and ε per person do not
add up to a figure about anything: converting a per-row charge to a person costs group
privacy (ε_person ≤ k·ε for a person with k rows, δ_person ≤ k·e^{(k−1)ε}·δ), and k is a
data-dependent number no output may print unreleased. So a store refuses a job whose unit
differs from the charges it already composes for a silo (`check_units`: the silo's current
epoch; after a logged reset or new cohort its composition, and so its unit, starts afresh).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping

from silofl.privacy.store_schema import NODE_COMMAND, NODE_LABELS, UNITS
from silofl.privacy.targets import ADJACENCY as ROW_ADJACENCY
from silofl.privacy.targets import PERSON_ADJACENCY

#: the neighbouring relation of each unit, as every report, card and table states it
ADJACENCY = {
    "example": ROW_ADJACENCY,
    "person": PERSON_ADJACENCY,
    "node": "per node: add/remove one person of the contact graph (node-level DP)",
}
#: the short column label of terminal tables
SHORT = {"example": "per row", "person": "per person", "node": "per node"}


def adjacency(unit: str) -> str:
    """The guarantee's neighbouring relation in words (`ADJACENCY`).

    Parameters
    ----------
    unit : str
        "example", "person" or "node".

    Returns
    -------
    str
        E.g. "per row: add/remove one record (example-level DP within each silo; …)".
    """
    return ADJACENCY.get(unit, f"per {unit}")


def group_bound_note(unit: str, person_column: str = "") -> str:
    """What a per-row guarantee means for a person, where the rows name persons
    (`person_column` set, `unit` "example"): the group-privacy bound as a formula of k --
    never k itself, which is data-dependent. "" otherwise.

    Parameters
    ----------
    unit : str
        The run's unit.
    person_column : str, default ""
        [data] person_column.

    Returns
    -------
    str
        One sentence, or "".
    """
    if unit != "example" or not person_column:
        return ""
    return (f"the rows name persons (data.person_column = {person_column!r}) but the "
            "guarantee is per row; a person with k rows in a silo is protected only by "
            "group privacy: ε_person ≤ k·ε and δ_person ≤ k·e^((k−1)·ε)·δ for a person "
            "with k rows. Set privacy.unit = \"person\" for a guarantee about persons")


def infer_unit(labels: Iterable[str], command: str = "") -> str:
    """The unit of a job that did not name one (stores and callers older than units).

    Parameters
    ----------
    labels : iterable of str
        The labels of the job's charges (e.g. "dpsgd", "preprocess").
    command : str, default ""
        The command that runs the job (as the store logs it).

    Returns
    -------
    str
        "node" when a charge is node-level (`NODE_LABELS`) or the command a pandemic one
        (`NODE_COMMAND`), else "example".
    """
    node = NODE_COMMAND in command or any(lb in NODE_LABELS for lb in labels)
    return "node" if node else "example"


def check_units(db: sqlite3.Connection, ids: Mapping[str, tuple], unit: str, where: str,
                error: type[Exception]) -> None:
    """Inside a reservation's transaction: refuse (`error`) a job of `unit` on a silo whose
    current charges are of another unit -- before anything is written.

    Parameters
    ----------
    db : sqlite3.Connection
        The open store.
    ids : mapping of str to tuple
        Silo name -> its row (id, ε, δ, epoch).
    unit : str
        The job's unit.
    where : str
        How messages name the store.
    error : type
        The exception raised (`BudgetStoreError`).
    """
    if unit not in UNITS:
        raise error(f"unknown privacy unit {unit!r}; one of {', '.join(UNITS)}")
    clash = []
    for name, (sid, _, _, epoch) in ids.items():
        have = [r[0] for r in db.execute(
            "SELECT DISTINCT unit FROM charges WHERE silo_id = ? AND epoch = ?",
            (sid, epoch)).fetchall() if r[0] != unit]
        if have:
            clash.append(f"silo {name!r} ({', '.join(SHORT.get(u, u) for u in have)})")
    if clash:
        raise error(
            f"this job's guarantee is {SHORT.get(unit, unit)}, but budget store {where} "
            f"already holds charges of another unit for {'; '.join(clash)}. A lifetime "
            "figure composes charges of one unit: mixing per-row and per-person charges "
            "would need group privacy with a data-dependent number of rows per person. "
            "Nothing was charged. Fix: keep this store's unit, or run this unit against a "
            "separate store ([budget] deployment = \"<a new name>\" or [budget] store = "
            "<another file>) -- which does NOT include this store's charges: the same "
            "persons' privacy was spent here too, and their total is both stores' figures "
            "together (this store's per-row ones through group privacy)")

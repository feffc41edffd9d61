"""Person ids for data with one row per person (the built-in heart and School data).

In the UCI heart data every row is a distinct patient of the study (920 patients, four
institutions; ``builtin/PROVENANCE.md``); in the School data every row is one student
(15,362 students, each in one school). The person of a row is then the row itself: this
module states that fact as person ids, so person-level DP (`[privacy] unit = "person"`) can
run on them and equals example-level DP there. It never invents repeat visits for real data
(for several rows per person see the simulated `silofl.data.ehr`).
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

import numpy as np

from silofl.data.federation import SiloCollection

F = TypeVar("F", bound=SiloCollection)

ONE_ROW_NOTE = ("one row per person: every row is a distinct person, so person ids are row "
                "ids and person-level DP equals example-level DP here")


def one_row_per_person(fed: F) -> F:
    """A copy of `fed` whose rows carry person ids = global row ids.

    Use only where each row is a distinct person (heart: one patient per row; School: one
    student per row). Ids are distinct across silos: silo k's training rows, then its test
    rows, numbered after those of silos 0..k-1.

    Parameters
    ----------
    fed : Federation or RawFederation
        The silos (any preprocessing state).

    Returns
    -------
    Federation or RawFederation
        The same data with ``person_train`` (n_k_train,) and ``person_test`` (n_k_test,)
        int64 ids set and ``meta["persons"]`` = `ONE_ROW_NOTE`.
    """
    silos, start = [], 0
    for s in fed.silos:
        tr = np.arange(start, start + s.n_train, dtype=np.int64)
        te = np.arange(start + s.n_train, start + s.n_train + s.n_test, dtype=np.int64)
        silos.append(dataclasses.replace(s, person_train=tr, person_test=te))
        start += s.n_train + s.n_test
    meta = {**getattr(fed, "meta", {}), "persons": ONE_ROW_NOTE}
    return dataclasses.replace(fed, silos=silos, meta=meta)  # type: ignore[type-var]


__all__ = ["ONE_ROW_NOTE", "one_row_per_person"]

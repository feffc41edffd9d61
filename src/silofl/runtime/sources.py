"""What a trainer reads: the silos' training rows under the run's privacy unit.

One function for every host (the simulator, per-silo hosting, a networked silo), so a silo
trained alone reads its rows exactly as it does in the simulator.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from silofl.data.federation import Silo
from silofl.data.lazy import LazyRows, LazySource, is_lazy
from silofl.errors import ConfigError
from silofl.training.persons import PersonIndex, PersonSource
from silofl.training.silo_data import SiloArrays


def require_persons(silos: list[Silo]) -> None:
    """Refuse the person-level unit for silos that do not name the person of each row.

    The one check of this refusal: the trainer's source (`training_source`), the planner
    and the job's configuration check (`experiments.build.check_unit`) all call it.

    Parameters
    ----------
    silos : list of Silo
        The silos a person-level job would train on.

    Raises
    ------
    ConfigError
        A silo has no person ids, with the keys that fix it.
    """
    missing = [s.name for s in silos if s.person_train is None]
    if missing:
        raise ConfigError(
            f"[privacy] unit = \"person\" needs the person of every row, and silo(s) "
            f"{', '.join(missing[:5])} have none; set [data] person_column to the column "
            "naming each row's person (a patient or customer id), or use unit = \"example\"")


def training_source(silos: list[Silo], unit: str = "example", max_rows_per_person: int = 0,
                    seed: int = 0):
    """The trainer's data source for `silos` under `unit`.

    Parameters
    ----------
    silos : list of Silo
        The hosted silos, in the trainer's order.
    unit : {"example", "person"}, default "example"
        Example level reads rows (`SiloArrays`); person level groups each silo's rows by
        `Silo.person_train` (`PersonSource`: n counts persons).
    max_rows_per_person : int, default 0
        Person level: the most rows of a sampled person one step reads (0: all).
    seed : int, default 0
        Seeds which rows a capped person's step reads (not a privacy-relevant draw).

    Returns
    -------
    SiloArrays, PersonSource or LazySource
        `LazySource` when the silos' rows are on disk (`silofl.data.lazy`).
    """
    if any(is_lazy(s.X_train) for s in silos):  # rows on disk: only sampled rows are read
        if unit == "person" or not all(is_lazy(s.X_train) for s in silos):
            raise ConfigError("lazy (larger than memory) silos train at example level, all "
                              "hosted silos lazy; use [privacy] unit = \"example\"")
        return LazySource([cast(LazyRows, s.X_train) for s in silos],
                          [s.y_train for s in silos])
    if unit != "person":
        return SiloArrays.stack([s.X_train for s in silos], [s.y_train for s in silos])
    require_persons(silos)
    index, orders = PersonIndex.group([np.asarray(s.person_train) for s in silos],
                                       max_rows_per_person)
    rows = SiloArrays.stack([s.X_train[o] for s, o in zip(silos, orders)],
                            [s.y_train[o] for s, o in zip(silos, orders)])
    return PersonSource(rows, index, seed)

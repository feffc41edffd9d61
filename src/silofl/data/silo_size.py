"""`[data] min_silo_rows`: a silo too small to train or test on is refused, or dropped
when `[data] small_silos = "drop"` says so, with the dropped silos listed.

A silo needs at least `min_silo_rows` rows in its training part *and* in its test part
(after the train/test split): a handful of test rows gives a figure such as "1.0000" that
says nothing (its 95% interval spans most of [0, 1]). 0 (the default) turns the check off;
the hard minimum of 2 training rows (DP-SGD) always holds. Silo sizes are public
(README "What is not counted"), so refusing or dropping by size reveals nothing new.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from silofl.data.federation import Federation, Silo
from silofl.data.raw import RawFederation
from silofl.errors import ConfigError, DataError

SMALL_SILOS = ("refuse", "drop")


def check_settings(min_silo_rows: int, small_silos: str) -> None:
    """ConfigError for a negative minimum or an unknown `small_silos` mode."""
    if isinstance(min_silo_rows, bool) or not isinstance(min_silo_rows, int) or \
            min_silo_rows < 0:
        raise ConfigError(f"[data] min_silo_rows must be a whole number ≥ 0 (0 = off), got "
                          f"{min_silo_rows!r}")
    if small_silos not in SMALL_SILOS:
        raise ConfigError(f"[data] small_silos must be one of {', '.join(SMALL_SILOS)}, got "
                          f"{small_silos!r}")


def limit_silos(silos: list[Silo], min_silo_rows: int, small_silos: str = "refuse"
                ) -> tuple[list[Silo], list[dict]]:
    """The silos with at least `min_silo_rows` training and test rows, and the dropped
    ones as [{silo, n_train, n_test}].

    Raises
    ------
    DataError
        `small_silos` = "refuse" and a silo is too small (every such silo is named with
        its counts), or every silo would be dropped.
    """
    check_settings(min_silo_rows, small_silos)
    if not min_silo_rows:
        return list(silos), []
    small = [s for s in silos if s.n_train < min_silo_rows or s.n_test < min_silo_rows]
    if not small:
        return list(silos), []
    listed = ", ".join(f"{s.name!r} ({s.n_train} training / {s.n_test} test rows)"
                       for s in small[:10]) + (f" and {len(small) - 10} more"
                                              if len(small) > 10 else "")
    if small_silos == "refuse":
        raise DataError(f"{len(small)} silo(s) have fewer than [data] min_silo_rows = "
                        f"{min_silo_rows} training or test rows: {listed}. Merge them with "
                        "other silos, lower min_silo_rows, or set [data] small_silos = "
                        "\"drop\" to leave them out (they are then listed in the output)")
    small_ids = {id(s) for s in small}  # identity: silos hold arrays
    kept = [s for s in silos if id(s) not in small_ids]
    if not kept:
        raise DataError(f"[data] min_silo_rows = {min_silo_rows} drops every silo ({listed}); "
                        "lower it")
    return kept, [{"silo": s.name, "n_train": s.n_train, "n_test": s.n_test} for s in small]


F = TypeVar("F", Federation, RawFederation)


def limit_federation(raw: F, min_silo_rows: int, small_silos: str = "refuse") -> F:
    """`limit_silos` on a (Raw)Federation: a copy without the dropped silos, which are
    added to ``meta["dropped_silos"]``; `raw` itself when nothing is dropped."""
    kept, dropped = limit_silos(raw.silos, min_silo_rows, small_silos)
    if not dropped:
        return raw
    meta = dict(raw.meta)
    meta["dropped_silos"] = list(meta.get("dropped_silos", [])) + dropped
    return dataclasses.replace(raw, silos=kept, meta=meta)

"""Federated algorithms, each a silo step and a server step over explicit state."""

import difflib

from silofl.algorithms.base import Algorithm
from silofl.algorithms.fedavg import FedAvg
from silofl.algorithms.local import Local
from silofl.algorithms.mrmtl import MRMTL
from silofl.errors import ConfigError

ALGORITHMS = {"local": Local, "fedavg": FedAvg, "mrmtl": MRMTL}


def make_algorithm(name: str, *, lam: float = 0.0, weighted: bool = True) -> Algorithm:
    """Build an algorithm by name; `lam` is used by MR-MTL, `weighted` by the averaging ones."""
    if name == "local":
        return Local()
    if name == "fedavg":
        return FedAvg(weighted)
    if name == "mrmtl":
        return MRMTL(lam, weighted)
    near = difflib.get_close_matches(name, list(ALGORITHMS), n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise ConfigError(f"unknown method {name!r}; choose from {', '.join(ALGORITHMS)}.{hint}")


__all__ = ["ALGORITHMS", "Algorithm", "FedAvg", "Local", "MRMTL", "make_algorithm"]

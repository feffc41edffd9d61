"""Federated algorithms, each a silo step and a server step over explicit state."""

import difflib

from silofl.algorithms.base import Algorithm
from silofl.algorithms.fedavg import FedAvg
from silofl.algorithms.local import Local
from silofl.algorithms.mrmtl import MRMTL
from silofl.errors import ConfigError

#: every method name a config may use, in the order figures list them
METHODS = ("local", "fedavg", "mrmtl", "finetune", "ditto", "mocha",
           "ifca", "ifca_local", "ifca_finetune", "ifca_mrmtl")
#: methods whose behaviour depends on the regularization strength λ (`lam`)
LAMBDA_METHODS = frozenset({"mrmtl", "ditto", "mocha", "ifca_mrmtl"})
ALGORITHMS = {"local": Local, "fedavg": FedAvg, "mrmtl": MRMTL}


def make_algorithm(name: str, *, lam: float = 0.3, weighted: bool = True,
                   finetune_fraction: float = 0.5, clusters: int = 2,
                   selection_fraction: float = 0.03,
                   selection_rounds: float = 0.1) -> Algorithm:
    """Build an algorithm by name. `lam` is used by the LAMBDA_METHODS, `weighted` by the
    averaging ones, `finetune_fraction` (share of rounds spent federated) by the finetune
    variants, and `clusters`, `selection_fraction` (share of the silo's ε per selection) and
    `selection_rounds` (share of rounds with selection) by the IFCA variants."""
    if name == "local":
        return Local()
    if name == "fedavg":
        return FedAvg(weighted)
    if name == "mrmtl":
        return MRMTL(lam, weighted)
    if name in METHODS:
        raise ConfigError(f"method {name!r} is not implemented yet")
    near = difflib.get_close_matches(name, list(METHODS), n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise ConfigError(f"unknown method {name!r}; choose from {', '.join(METHODS)}.{hint}")


__all__ = ["ALGORITHMS", "Algorithm", "FedAvg", "LAMBDA_METHODS", "Local", "METHODS", "MRMTL",
           "make_algorithm"]

"""Federated algorithms, each a silo step and a server step over explicit state."""

import difflib

from silofl.algorithms.base import Algorithm, check_fraction, check_nonnegative
from silofl.algorithms.ditto import Ditto
from silofl.algorithms.fedavg import FedAvg
from silofl.algorithms.finetune import Finetune
from silofl.algorithms.ifca import IFCA, IFCAFinetune, IFCALocal
from silofl.algorithms.ifca_mrmtl import IFCAMRMTL
from silofl.algorithms.local import Local
from silofl.algorithms.mocha import Mocha
from silofl.algorithms.mrmtl import MRMTL
from silofl.algorithms.robust import RULES, ROBUST_METHODS, Aggregator, Attack, Attacked
from silofl.algorithms.weight_erosion import WeightErosion
from silofl.errors import ConfigError

#: every method name a config may use, in the order figures list them
METHODS = ("local", "fedavg", "mrmtl", "finetune", "ditto", "mocha",
           "ifca", "ifca_local", "ifca_finetune", "ifca_mrmtl", "weight_erosion")
#: methods whose behaviour depends on the regularization strength λ (`lam`)
LAMBDA_METHODS = frozenset({"mrmtl", "ditto", "mocha", "ifca_mrmtl"})
#: each method's class (build one with `make_algorithm`, which validates its settings)
ALGORITHMS = {"local": Local, "fedavg": FedAvg, "mrmtl": MRMTL, "finetune": Finetune,
              "ditto": Ditto, "mocha": Mocha, "ifca": IFCA, "ifca_local": IFCALocal,
              "ifca_finetune": IFCAFinetune, "ifca_mrmtl": IFCAMRMTL,
              "weight_erosion": WeightErosion}


def make_algorithm(name: str, *, lam: float = 0.3, weighted: bool = True,
                   finetune_fraction: float = 0.5, clusters: int = 2,
                   selection_fraction: float = 0.03,
                   selection_rounds: float = 0.1, we_user: int | str | None = None,
                   we_p_s: float = 0.2, we_p_d: float = 0.01, aggregation: str = "mean",
                   attackers: int = 0, trim_fraction: float = 0.1,
                   clip_radius: float = 1.0) -> Algorithm:
    """Build an algorithm by name. `lam` is used by the LAMBDA_METHODS, `weighted` by the
    averaging ones, `finetune_fraction` (share of rounds spent federated) by the finetune
    variants, and `clusters`, `selection_fraction` (share of the silo's ε per selection) and
    `selection_rounds` (share of rounds with selection) by the IFCA variants, and `we_user`
    (the user silo u_0: name or index; required), `we_p_s` (size penalty) and `we_p_d`
    (distance penalty) by weight_erosion; `aggregation` (a rule of `robust.RULES`) with
    `attackers`, `trim_fraction` and `clip_radius` by the ROBUST_METHODS' server steps. Every
    value is validated whichever method uses it (a bad setting is an error even if unused;
    only weight_erosion needs a user)."""
    check_nonnegative("lambda (lam)", lam)
    check_nonnegative("weight_erosion size penalty p_s (we_p_s)", we_p_s)
    check_nonnegative("weight_erosion distance penalty p_d (we_p_d)", we_p_d)
    check_fraction("finetune_fraction", finetune_fraction, low_open=False, high_open=False)
    cluster = dict(clusters=clusters, selection_fraction=selection_fraction,
                   selection_rounds=selection_rounds, weighted=weighted)
    IFCA(**cluster)  # validates the cluster settings
    agg = Aggregator(aggregation, attackers, trim_fraction, clip_radius)
    if (agg.rule != "mean" or agg.attackers) and name in METHODS \
            and name not in (*ROBUST_METHODS, "local"):
        raise ConfigError(f"aggregation {agg.rule!r} applies to {', '.join(ROBUST_METHODS)}, "
                          f"but {name!r} averages with the plain mean; remove {name!r} from "
                          "the methods or set aggregation = 'mean' and attackers = 0")
    if name == "local":
        return Local()
    if name == "fedavg":
        return FedAvg(weighted, agg)
    if name == "mrmtl":
        return MRMTL(lam, weighted, agg)
    if name == "finetune":
        return Finetune(finetune_fraction, weighted)
    if name == "ditto":
        return Ditto(lam, weighted)
    if name == "mocha":
        return Mocha(lam)
    if name == "ifca":
        return IFCA(**cluster)
    if name == "ifca_local":
        return IFCALocal(**cluster)
    if name == "ifca_finetune":
        return IFCAFinetune(finetune_fraction=finetune_fraction, **cluster)
    if name == "ifca_mrmtl":
        return IFCAMRMTL(lam, **cluster)
    if name == "weight_erosion":
        return WeightErosion("" if we_user is None else we_user, we_p_s, we_p_d, agg)
    near = difflib.get_close_matches(name, list(METHODS), n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise ConfigError(f"unknown method {name!r}; choose from {', '.join(METHODS)}.{hint}")


__all__ = ["ALGORITHMS", "Aggregator", "Algorithm", "Attack", "Attacked", "Ditto", "FedAvg",
           "Finetune", "IFCA", "IFCAFinetune", "IFCALocal", "IFCAMRMTL", "LAMBDA_METHODS",
           "Local", "METHODS", "MRMTL", "Mocha", "ROBUST_METHODS", "RULES", "WeightErosion",
           "make_algorithm"]

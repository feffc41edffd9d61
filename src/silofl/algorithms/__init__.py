"""Federated algorithms, each a silo step and a server step over explicit state."""

import difflib
from collections.abc import Callable
from typing import Any

from silofl.algorithms.apfl import APFL
from silofl.algorithms.auto_lambda import check_lam
from silofl.algorithms.base import Algorithm, check_fraction, check_nonnegative
from silofl.algorithms.ditto import Ditto, ditto
from silofl.algorithms.fedavg import FedAvg
from silofl.algorithms.fedbn import FedBN
from silofl.algorithms.fedper import FedPer
from silofl.algorithms.fedprox import FedProx
from silofl.algorithms.fedrep import FedRep
from silofl.algorithms.finetune import Finetune
from silofl.algorithms.gbdt_method import DpGbdt, default_settings
from silofl.algorithms.ifca import IFCA, IFCAFinetune, IFCALocal
from silofl.algorithms.ifca_mrmtl import IFCAMRMTL
from silofl.algorithms.local import Local
from silofl.algorithms.mocha import Mocha
from silofl.algorithms.mrmtl import MRMTL, mrmtl
from silofl.algorithms.privatekt import FedAvgLDP, PrivateKT
from silofl.algorithms.robust import ROBUST_METHODS, RULES, Aggregator, Attack, Attacked
from silofl.algorithms.scaffold import Scaffold
from silofl.algorithms.uldp import ULDP
from silofl.algorithms.weight_erosion import WeightErosion
from silofl.errors import ConfigError

#: every method name a config may use, in the order figures list them
METHODS = ("local", "fedavg", "mrmtl", "finetune", "ditto", "mocha",
           "ifca", "ifca_local", "ifca_finetune", "ifca_mrmtl", "weight_erosion",
           "privatekt", "fedavg_ldp", "fedprox", "scaffold", "apfl", "fedper", "fedrep", "fedbn",
           "uldp", "dp_gbdt")
"""Every method name `make_algorithm`, a config's `[training] methods` and a sweep accept.

Local and FedAvg are the two ends; MR-MTL ("mrmtl") pulls personal models towards their
mean with strength λ; finetune, ditto, mocha and the IFCA family are personalization
baselines; weight_erosion serves one user silo; privatekt and fedavg_ldp use local DP
per upload instead of DP-SGD (each runs as a job of its own); fedprox, scaffold and apfl
are the peers' methods under silo-specific DP (FedProx's proximal pull μ and SCAFFOLD's
control variates are post-processing, free; APFL makes two passes per round); fedper and
fedrep share a body and keep a personal head, fedbn keeps personal normalization layers;
uldp weights each person's contributions across silos to ≤ 1 (ULDP-FL, person level,
SecAgg+ sum, one σ for the consortium); dp_gbdt trains DP federated gradient-boosted
trees (noisy histograms, `silofl.algorithms.dp_gbdt`; settings from [trees]).
All DP-SGD methods meet the
same per-silo target (σ calibrated to what each declares)."""
#: methods whose privacy is a fixed local-DP mechanism per upload (each runs as its own job)
LOCAL_DP_METHODS = frozenset({"privatekt", "fedavg_ldp"})
#: methods whose behaviour depends on the regularization strength λ (`lam`)
LAMBDA_METHODS = frozenset({"mrmtl", "ditto", "mocha", "ifca_mrmtl"})
#: each method's class (build one with `make_algorithm`, which validates its settings)
ALGORITHMS = {"local": Local, "fedavg": FedAvg, "mrmtl": MRMTL, "finetune": Finetune,
              "ditto": Ditto, "mocha": Mocha, "ifca": IFCA, "ifca_local": IFCALocal,
              "ifca_finetune": IFCAFinetune, "ifca_mrmtl": IFCAMRMTL,
              "weight_erosion": WeightErosion, "privatekt": PrivateKT,
              "fedavg_ldp": FedAvgLDP, "fedprox": FedProx, "scaffold": Scaffold,
              "apfl": APFL, "fedper": FedPer, "fedrep": FedRep, "fedbn": FedBN, "uldp": ULDP,
              "dp_gbdt": DpGbdt}


def make_algorithm(name: str, *, lam: float | str = 0.3, weighted: bool = True,
                   finetune_fraction: float = 0.5, clusters: int = 2,
                   selection_fraction: float = 0.03,
                   selection_rounds: float = 0.1, we_user: int | str | None = None,
                   we_p_s: float = 0.2, we_p_d: float = 0.01, aggregation: str = "mean",
                   attackers: int = 0, trim_fraction: float = 0.1,
                   clip_radius: float = 1.0, we_options: dict | None = None,
                   ldp_epsilon: float = 5.0, ldp_mechanism: str = "gaussian",
                   ldp_delta: float = 1e-5, client_fraction: float = 0.5,
                   max_participation: int = 0, kt_samples: int = 2, kt_buffer: int = 25,
                   kt_self_train: float = 0.1, kt_server_epochs: int = 5,
                   kt_server_lr: float = 0.0, public_seed: int = 0, prox_mu: float = 0.01,
                   apfl_alpha: float = 0.5, apfl_alpha_lr: float = 0.0,
                   uldp_weighting: str = "uniform", persons_in_silos: int = 0,
                   uldp_sample_rate: float = 1.0, trees: dict | None = None) -> Algorithm:
    """Build an algorithm by name, validating every setting.

    Every value is validated whichever method uses it (a bad setting is an error even if
    unused; only weight_erosion needs a user).

    Parameters
    ----------
    name : str
        One of `silofl.METHODS`: "local", "fedavg", "mrmtl", "finetune", "ditto", "mocha",
        "ifca", "ifca_local", "ifca_finetune", "ifca_mrmtl", "weight_erosion",
        "privatekt", "fedavg_ldp", "fedprox", "scaffold", "apfl", "fedper", "fedrep",
        "fedbn", "uldp", "dp_gbdt".
    lam : float or "auto", default 0.3
        Regularization strength λ ≥ 0 of mrmtl, ditto, mocha, ifca_mrmtl (λ = 0 is Local);
        "auto" (mrmtl, ditto): each silo's λ_k from the released updates, no privacy cost
        (``silofl.algorithms.auto_lambda``).
    weighted : bool, default True
        Averaging weights by training counts (False: uniform).
    finetune_fraction : float, default 0.5
        Share of rounds spent federated, in [0, 1] (the finetune variants).
    clusters : int, default 2
        IFCA's number of cluster models.
    selection_fraction : float, default 0.03
        Share of the silo's ε spent per private cluster selection (IFCA variants).
    selection_rounds : float, default 0.1
        Share of rounds with a selection (IFCA variants).
    we_user : int or str, optional
        weight_erosion's user silo u_0 (name or index; required by that method).
    we_p_s, we_p_d : float, default 0.2, 0.01
        weight_erosion's size and distance penalties.
    aggregation : str, default "mean"
        The server's rule (``silofl.algorithms.RULES``), for fedavg, mrmtl and
        weight_erosion.
    attackers : int, default 0
        Simulated attacking silos (robust aggregation experiments).
    trim_fraction : float, default 0.1
        Share trimmed by the trimmed-mean rule.
    clip_radius : float, default 1.0
        Radius of centered clipping.
    we_options : dict, optional
        Keyword arguments of ``WeightErosion``: update, participation, join_round,
        leave_round, count, newcomer, seed.
    ldp_epsilon : float, default 5.0
        Per-round ε of a client's upload (privatekt, fedavg_ldp).
    ldp_mechanism : {"gaussian", "laplace"}, default "gaussian"
        fedavg_ldp's mechanism.
    ldp_delta : float, default 1e-5
        fedavg_ldp's δ (Gaussian mechanism).
    client_fraction : float, default 0.5
        Share of clients selected per round (local-DP methods).
    max_participation : int, default 0
        Rounds a client may take part in (0: as many as its target allows).
    kt_samples, kt_buffer, kt_self_train, kt_server_epochs, kt_server_lr
        PrivateKT's settings (see ``silofl.algorithms.privatekt``).
    public_seed : int, default 0
        Seed of the public client selection (local-DP methods).
    prox_mu : float, default 0.01
        FedProx's proximal strength μ ≥ 0 (μ = 0 is FedAvg).
    apfl_alpha : float, default 0.5
        APFL's initial mixing weight α in [0, 1] (1: the personal model alone).
    apfl_alpha_lr : float, default 0.0
        APFL's step size for α ≥ 0 (0: the training lr).
    uldp_weighting : {"uniform", "linked"}, default "uniform"
        uldp's person weights: 1/M, or record proportions over linked persons.
    persons_in_silos : int, default 0
        uldp "uniform": M, the declared most silos one person is in (0: every silo).
    uldp_sample_rate : float, default 1.0
        uldp: the persons' Poisson sampling rate per round, the same in every silo (1: all).
    trees : dict, optional
        dp_gbdt: `train_dp_gbdt` keyword arguments over its defaults (the [trees] section,
        `silofl.experiments.run_trees.trees_kwargs`); checked for every method.

    Returns
    -------
    Algorithm
        The configured method.

    Raises
    ------
    ConfigError
        An unknown name (with the nearest valid one) or an invalid setting.
    """
    if check_lam(lam) == "auto" and name in LAMBDA_METHODS - {"mrmtl", "ditto"}:
        raise ConfigError(f"lam = \"auto\" is for mrmtl and ditto; {name!r} needs a number "
                          "λ ≥ 0 (or remove it from the methods)")
    num_lam = 0.0 if lam == "auto" else float(lam)
    check_nonnegative("weight_erosion size penalty p_s (we_p_s)", we_p_s)
    check_nonnegative("weight_erosion distance penalty p_d (we_p_d)", we_p_d)
    check_fraction("finetune_fraction", finetune_fraction, low_open=False, high_open=False)
    FedProx(prox_mu)  # validates μ
    APFL(apfl_alpha, apfl_alpha_lr)  # validates α and its step
    ULDP(uldp_weighting, persons_in_silos, sample_rate=uldp_sample_rate)  # validates them
    cluster: dict[str, Any] = dict(clusters=clusters, selection_fraction=selection_fraction,
                                   selection_rounds=selection_rounds, weighted=weighted)
    IFCA(**cluster)  # validates the cluster settings
    we_options = dict(we_options or {})
    WeightErosion(0, **we_options)  # validates the Weight Erosion options
    tree_settings = {**default_settings(), **(trees or {})}
    DpGbdt(tree_settings)  # validates the [trees] settings
    agg = Aggregator(aggregation, attackers, trim_fraction, clip_radius)
    kt: dict[str, Any] = dict(epsilon=ldp_epsilon, samples=kt_samples, buffer=kt_buffer,
                              self_train=kt_self_train, client_fraction=client_fraction,
                              server_epochs=kt_server_epochs, server_lr=kt_server_lr,
                              max_participation=max_participation, seed=public_seed)
    PrivateKT(**kt)  # validates the local-DP and PrivateKT settings
    if ldp_mechanism not in ("gaussian", "laplace") or not 0 < ldp_delta < 1:
        raise ConfigError(f"ldp_mechanism must be 'gaussian' or 'laplace' and 0 < ldp_delta "
                          f"< 1, got {ldp_mechanism!r}, {ldp_delta!r}")
    if (agg.rule != "mean" or agg.attackers) and name in METHODS \
            and name not in (*ROBUST_METHODS, "local"):
        raise ConfigError(f"aggregation {agg.rule!r} applies to {', '.join(ROBUST_METHODS)}, "
                          f"but {name!r} averages with the plain mean; remove {name!r} from "
                          "the methods or set aggregation = 'mean' and attackers = 0")
    build: dict[str, Callable[[], Algorithm[Any, Any]]] = {
        "local": lambda: Local(),
        "fedavg": lambda: FedAvg(weighted, agg),
        "mrmtl": lambda: mrmtl(lam, weighted, agg),
        "finetune": lambda: Finetune(finetune_fraction, weighted),
        "ditto": lambda: ditto(lam, weighted),
        "mocha": lambda: Mocha(num_lam),
        "ifca": lambda: IFCA(**cluster),
        "ifca_local": lambda: IFCALocal(**cluster),
        "ifca_finetune": lambda: IFCAFinetune(finetune_fraction=finetune_fraction, **cluster),
        "ifca_mrmtl": lambda: IFCAMRMTL(num_lam, **cluster),
        "weight_erosion": lambda: WeightErosion("" if we_user is None else we_user, we_p_s,
                                                we_p_d, agg, **we_options),
        "privatekt": lambda: PrivateKT(**kt),
        "fedper": lambda: FedPer(weighted),
        "fedrep": lambda: FedRep(weighted),
        "fedbn": lambda: FedBN(weighted),
        "fedavg_ldp": lambda: FedAvgLDP(ldp_epsilon, ldp_mechanism, ldp_delta, client_fraction,
                                        max_participation, public_seed),
        "fedprox": lambda: FedProx(prox_mu, weighted),
        "scaffold": lambda: Scaffold(weighted),
        "apfl": lambda: APFL(apfl_alpha, apfl_alpha_lr, weighted),
        "uldp": lambda: ULDP(uldp_weighting, persons_in_silos, sample_rate=uldp_sample_rate),
        "dp_gbdt": lambda: DpGbdt(tree_settings),
    }
    if name in build:
        return build[name]()
    near = difflib.get_close_matches(name, list(METHODS), n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise ConfigError(f"unknown method {name!r}; choose from {', '.join(METHODS)}.{hint}")


__all__ = ["ALGORITHMS", "APFL", "Aggregator", "Algorithm", "Attack", "Attacked", "Ditto", "DpGbdt",
           "FedAvg",
           "FedAvgLDP", "FedBN", "FedPer", "FedProx", "FedRep", "LOCAL_DP_METHODS", "PrivateKT",
           "Scaffold", "ULDP",
           "Finetune", "IFCA", "IFCAFinetune", "IFCALocal", "IFCAMRMTL", "LAMBDA_METHODS",
           "Local", "METHODS", "MRMTL", "Mocha", "ROBUST_METHODS", "RULES", "WeightErosion",
           "make_algorithm"]

"""The pandemic track's configuration: one section of the configuration model
(`silofl.config.base.section_dataclass`), validated where it is built."""

from __future__ import annotations

import numpy as np

from silofl.config.base import section_dataclass
from silofl.errors import ConfigError
from silofl.pandemic.engine import NODE_METHODS, method_of
from silofl.pandemic.features import check_S
from silofl.pandemic.inputs import POOLINGS
from silofl.pandemic.tables import declared_constants
from silofl.privacy.node_level import ADJACENCIES

NOISE_MODES = ("secure", "seeded")
PREPROCESSING = ("declared", "private", "uncharged")


@section_dataclass("pandemic")
class PandemicConfig:
    """Settings; units: lr per step, clip = L2 bound of a per-example gradient. A checked
    dataclass on the configuration model's rules (`silofl.config.section_dataclass`):
    unknown keys and wrong types are `ConfigError`s; `validate` adds the track's checks."""

    federated: bool = True      # one silo per region; False = centralized (one silo)
    S: int = 20                 # each person appears in ≤ S examples (own + S−1 others)
    priority: str = "random"    # pruning order: "random" or "duration" (longest contacts kept)
    pooling: str = "summary"    # "summary": recent-infection summaries (`summary_inputs`);
                                # "mean": own features + neighbour blocks averaged over slots;
                                # "concat": every neighbour slot kept (the thesis layout)
    t_window: int = 21          # days of infection history in each example
    rounds: int = 2
    local_epochs: float = 1.0
    batch_size: int = 512
    lr: float = 0.3             # for standardized inputs
    clip: float = 1.0
    lam: float = 0.1            # MR-MTL pull towards the mean model (keep lr · lam ≪ 1)
    standardize: bool = True    # centre/scale each model input (constants: `preprocessing`)
    bias_init: float = -5.0     # fixed prior log-odds guess, not computed from labels
    prior_weight: float = 0.1   # starting weight of every summary input (public prior: more
                                # infection around a person means more risk); summary only
    gamma: float = 2.0          # focal loss
    alpha: float = 0.75
    private: bool = True
    epsilon: float = 5.0        # node-level target for every region
    delta: float | None = None  # default 1/n of the region
    seed: int = 0
    noise: str = "secure"       # "secure": OS-entropy CSPRNG; "seeded": reproducible from
                                # (seed, region, round) — not a privacy guarantee
    adjacency: str = "node+edges"  # "node+edges": a person and their contacts (2S − 1
                                   # examples); "node": fixed public graph (S examples)
    preprocessing: str = "declared"  # data-dependent constants: "declared" (public
                                     # numbers), "private" (charged), "uncharged"
    preprocessing_share: float = 0.1  # "private": the share of epsilon its release costs
    declared: dict | None = None  # overrides of `features.DECLARED_CONSTANTS` by name
                                  # (e.g. another region's lon_mean/lat_mean)
    method: str = "mrmtl"       # the federated algorithm (`engine.NODE_METHODS`); lam is
                                # its λ where it has one (mrmtl, ditto, mocha)
    clusters: int = 2           # the IFCA family: cluster models (≤ regions)
    we_user: str | None = None  # weight_erosion: the user region u_0 (a region name)
    we_update: str = "gradient"  # weight_erosion: one node-level DP-SGD step per round
                                 # ("gradient") or a local pass ("local_sgd")

    def validate(self) -> None:
        check_S(self.S)
        if self.rounds < 1 or self.batch_size < 1:
            raise ConfigError("rounds and batch_size must be positive integers")
        if self.clip <= 0 or self.lr < 0 or self.lam < 0 or self.local_epochs <= 0:
            raise ConfigError("need clip > 0, lr ≥ 0, lam ≥ 0 and local_epochs > 0")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"pooling must be one of {', '.join(map(repr, POOLINGS))}, "
                              f"got {self.pooling!r}")
        if self.priority not in ("random", "duration"):
            raise ConfigError(f"priority must be 'random' or 'duration', got "
                              f"{self.priority!r}")
        if not np.isfinite(self.bias_init):
            raise ConfigError(f"bias_init must be a finite number, got {self.bias_init}")
        if not np.isfinite(self.prior_weight):
            raise ConfigError(f"prior_weight must be a finite number, got {self.prior_weight}")
        if self.private and not self.epsilon > 0:
            raise ConfigError(f"epsilon must be positive, got {self.epsilon}")
        if self.private and self.delta is not None:  # as [privacy] delta: (0, 0.5)
            from silofl.config.run import check_privacy_target
            check_privacy_target(self.epsilon, self.delta)
        if self.noise not in NOISE_MODES:
            raise ConfigError(f"noise must be 'secure' (OS entropy, the default) or 'seeded' "
                              f"(reproducible, not a privacy guarantee), got {self.noise!r}")
        if self.adjacency not in ADJACENCIES:
            raise ConfigError(f"adjacency must be one of {', '.join(map(repr, ADJACENCIES))}, "
                              f"got {self.adjacency!r}")
        if self.preprocessing not in PREPROCESSING:
            raise ConfigError(f"preprocessing must be one of "
                              f"{', '.join(map(repr, PREPROCESSING))}, got "
                              f"{self.preprocessing!r}")
        if self.preprocessing == "private" and not self.private:
            raise ConfigError("preprocessing='private' needs private=True (a non-private "
                              "run has no budget to charge it to); use 'declared'")
        if not 0 < self.preprocessing_share < 1:
            raise ConfigError(f"preprocessing_share must lie in (0, 1), got "
                              f"{self.preprocessing_share}")
        declared_constants(self)  # unknown names or bad values fail here
        if self.method not in NODE_METHODS:
            raise ConfigError(f"method must be one of {', '.join(NODE_METHODS)} (methods "
                              f"with node-level accounting), got {self.method!r}")
        method_of(self)  # the method's own settings (clusters, we_user) fail here

    @property
    def private_preprocessing(self) -> bool:
        return self.private and self.preprocessing == "private"

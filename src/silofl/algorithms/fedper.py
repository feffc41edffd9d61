"""FedPer (Arivazhagan et al. 2019) under silo-specific DP: a shared body, a personal head.

The model's parameters split into a *head* (`Model.param_groups()["head"]`: a torch net's
last Linear layer; a GLM's intercepts, the GLM analogue — shared weights, a personal
intercept per silo) and the *body* (everything else). Each round silo k starts from the
broadcast body and its own head, takes one DP-SGD pass on the whole model,

    (b, h_k) ← DP-SGD pass from (b̄, h_k),

keeps the new head and uploads only the body's change (the head's coordinates zeroed);
the server averages bodies and never sees or averages a head. Silo k's model is
(b̄, h_k), b̄ the current shared body.

Privacy: one DP-SGD pass per round, as FedAvg and Local (the default `privacy_events`);
the upload is a function of that pass (post-processing), the head never leaves the silo.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.base import Algorithm, ServerState, SiloState, apply_mean_update
from silofl.errors import ConfigError

if TYPE_CHECKING:
    from silofl.models.base import Model
    from silofl.training.trainer import LocalTrainer


def personal_part(model: Model, group: str, method: str) -> np.ndarray:
    """The (P,) boolean mask of `model`'s parameter group `group` (kept personal by
    `method`); ConfigError when the model has no such group or it is all of the model."""
    mask = model.param_groups().get(group)
    why = {"head": "a model with a head (a torch net's last Linear layer, a GLM's "
                   "intercepts)",
           "norm": "a torch model with normalization layers (LayerNorm or GroupNorm with "
                   "affine parameters: model 'mlp_norm')"}
    if mask is None or not np.any(mask):
        raise ConfigError(f"{method} needs {why.get(group, group)}; model {model.name!r} "
                          f"has none. Set [model] name = 'mlp_norm' or choose another method")
    mask = np.asarray(mask, dtype=bool)
    if mask.all():
        raise ConfigError(f"{method}: model {model.name!r} is all {group!r}, nothing is "
                          "left to share; choose a model with more than one layer")
    return mask


class FedPer(Algorithm[SiloState, ServerState]):
    """FedPer: a shared body averaged on the server, a personal head kept at each silo."""

    name = "fedper"
    #: the parameter group kept personal (FedBN: "norm")
    group = "head"

    def __init__(self, weighted: bool = True) -> None:
        self.weighted = bool(weighted)
        self.keep: np.ndarray | None = None  # (P,) bool: the personal coordinates

    def bind_model(self, model: Model) -> None:
        """Read the personal coordinates off `model` (before planning: a model without
        them fails before any budget is spent).

        Parameters
        ----------
        model : Model
            The run's model; its `param_groups()[group]` is kept personal.

        Raises
        ------
        ConfigError
            The model has no such group, or nothing else to share.
        """
        self.keep = personal_part(model, self.group, self.name)

    def _keep(self, trainer: LocalTrainer) -> np.ndarray:
        if self.keep is None:
            self.bind_model(trainer.model)
        assert self.keep is not None
        return self.keep

    def start(self, silos: SiloState, message: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """(K, P): the broadcast shared part with each silo's own personal coordinates."""
        return np.where(keep, silos.params, message[None, :])

    def silo_step(self, silos: SiloState, message: np.ndarray, trainer: LocalTrainer,
                  round: int) -> tuple[SiloState, np.ndarray]:
        keep = self._keep(trainer)
        start = self.start(silos, message, keep)
        new = trainer.run(start, round=round)
        return SiloState(new), np.where(keep, 0.0, new - start)

    def server_step(self, server: ServerState, update: np.ndarray | None,
                    weights: np.ndarray) -> ServerState:
        if update is None:
            return server
        if self.keep is not None:  # personal coordinates are never averaged, whatever came
            update = np.where(self.keep, 0.0, update)
        return apply_mean_update(server, update, weights)

    def personal_models(self, silos: SiloState, server: ServerState) -> np.ndarray:
        if self.keep is None:  # no step yet: every model is still the starting one
            return silos.params
        return np.where(self.keep, silos.params, server.params[None, :])

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "weighted": self.weighted, "personal": self.group}

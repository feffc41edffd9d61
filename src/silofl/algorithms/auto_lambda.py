"""λ without spending: each silo's λ_k from the silos' released updates (``lam = "auto"``).

MR-MTL and Ditto pull a personal model towards the shared one with strength λ. With
``lam = "auto"`` the server sets each silo's λ_k after every round from what the thesis's
closed form for the best λ needs (App. D.5, Eq. D.30: each silo's noise level and the
heterogeneity τ² between the silos' optima), estimated from the released, noised updates
and public settings only (`silofl.algorithms.lambda_estimate` states the model, the
estimators and the rule). That is post-processing: it reads no data and is charged
nothing (ε cost 0); the ledgers of an auto-λ run equal those of the same run at a fixed λ.
This module is the algorithm side: the λ setting, the public noise header each silo sends
with its update, the broadcast of λ_k, the server step and the wire form of λ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from silofl.algorithms.base import ServerState, check_nonnegative
from silofl.algorithms.lambda_estimate import Estimate, LambdaEstimator, burn_in
from silofl.config.base import did_you_mean
from silofl.errors import ConfigError

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer

#: the value of `lam` that asks for the estimator
AUTO = "auto"
#: where an auto λ comes from, as the outputs say
SOURCE = "auto: from released updates (post-processing), ε cost 0"
#: columns of a silo's header: DP noise variance per coordinate per step, lr, steps, q
HEADER = 4


def check_lam(value: Any, name: str = "lambda (lam)") -> float | str:
    """A λ setting: a number ≥ 0, or exactly ``"auto"``.

    Parameters
    ----------
    value : float or str
        The setting as given.
    name : str
        How to name the setting in an error.

    Returns
    -------
    float or str
        The number as a float, or ``"auto"``.

    Raises
    ------
    ConfigError
        Anything else (a near miss such as ``"Auto "`` says how to write it).
    """
    if isinstance(value, str):
        if value == AUTO:
            return AUTO
        hint = ("did you mean \"auto\"? write it exactly as \"auto\" (lower case, no spaces)"
                if did_you_mean(value.strip().lower(), [AUTO], cutoff=0.7) else
                "give a number ≥ 0 (0: Local; larger federates more) or \"auto\" (λ from "
                "the released updates, no privacy cost)")
        raise ConfigError(f"{name} must be a number ≥ 0 or \"auto\", got {value!r}: {hint}")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{name} must be a number ≥ 0 or \"auto\", got {value!r}")
    return check_nonnegative(name, float(value))


def noise_header(trainer: LocalTrainer) -> np.ndarray:
    """What each hosted silo sends with its update: [V_k, lr, T_k, q_k] (K, 4).

    V_k = (σ_k·C / B_k)² is the DP noise variance per coordinate of one step's gradient
    (0 in the non-private mode), lr the step size, T_k the steps per pass, q_k = b/n_k the
    sampling rate — all public.
    """
    K = len(trainer.steps_per_round)
    var = np.zeros(K)
    if trainer.rule.private:
        var = (trainer.rule.noise_std() / trainer.expected_batch) ** 2
    return np.column_stack([var, np.full(K, float(trainer.lr)),
                            np.asarray(trainer.steps_per_round, float),
                            np.broadcast_to(np.asarray(trainer.q, float), (K,))])


@dataclass
class AutoServer(ServerState):
    """The server of an auto-λ method: the shared model `params` (P,), the λ_k of the next
    round `lam` (K,) and of the round just run `used` (K,) (∞: FedAvg), each silo's personal
    model as its releases define it `W` (K, P) (MR-MTL; Ditto: unused), the running
    statistics `est`, and the λ path and estimates per round."""

    lam: np.ndarray = field(default_factory=lambda: np.zeros(0))
    used: np.ndarray = field(default_factory=lambda: np.zeros(0))
    W: np.ndarray | None = None
    est: Estimate | None = None
    header: np.ndarray | None = None
    path: list = field(default_factory=list)
    estimates: dict = field(default_factory=dict)
    total_rounds: int = 0


@dataclass
class AutoMessage:
    """The broadcast: the shared model (P,) and each silo's λ_k (K,), ∞ for FedAvg (silo
    k's cut carries its own λ_k only, shape (1,))."""

    params: np.ndarray
    lam: np.ndarray


@dataclass
class AutoUpdate:
    """What silos send: their released changes `delta` (K, P) (NaN rows: absent) and the
    public `header` (K, 4) of `noise_header`."""

    delta: np.ndarray
    header: np.ndarray


def start_points(W: np.ndarray, shared: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """Each silo's pass start (K, P): the shared model where λ_k = ∞ (FedAvg), else W_k."""
    fed = np.isinf(np.asarray(lam, float))
    return np.where(fed[:, None], shared[None, :], W)


def finite_pull(lam: np.ndarray) -> np.ndarray:
    """The pull a pass uses: λ_k, or 0 where λ_k = ∞ (a FedAvg pass has no pull)."""
    lam = np.asarray(lam, float)
    return np.where(np.isinf(lam), 0.0, lam)


def wire_lam(lam: np.ndarray) -> np.ndarray:
    """λ for the wire (finite float64 only): ∞ → −1."""
    lam = np.asarray(lam, float)
    return np.where(np.isinf(lam), -1.0, lam)


def unwire_lam(code: np.ndarray) -> np.ndarray:
    """Inverse of `wire_lam`; any negative code is ∞ (FedAvg)."""
    code = np.asarray(code, float)
    return np.where(code < 0, np.inf, code)


def json_lam(lam: np.ndarray) -> list:
    """λ values for JSON outputs: ∞ written as the string "inf" (FedAvg)."""
    return [float(v) if math.isfinite(v) else "inf" for v in np.asarray(lam, float)]


def auto_describe(server_path: list, estimates: dict) -> dict[str, Any]:
    """The describe() fields of an auto-λ run: source, λ path per round, final λ_k."""
    return {"lam": AUTO, "lam_source": SOURCE,
            "lam_path": server_path,
            "lam_final": server_path[-1] if server_path else None,
            "lam_estimates": estimates}


class AutoLambda:
    """The server side shared by MR-MTL and Ditto with ``lam = "auto"`` (a mixin on top of
    their Algorithm): the broadcast carries λ_k, the server step folds the released
    updates into the estimate and sets the next round's λ_k. Subclasses say where each
    pass started (`pass_starts`) and which pull the released pass used (`released_pull`).
    """

    weighted: bool
    tracks_models: bool = True  # MR-MTL: the server follows each personal model

    def auto_init(self, params0: np.ndarray, num_silos: int,
                  rounds: int | None) -> AutoServer:
        """The initial server: λ = 0 until the estimate is measurable."""
        if rounds is None:
            raise ConfigError(f"{getattr(self, 'name', 'method')} with lam = \"auto\" needs "
                              "the number of rounds: call init(params0, num_silos, rounds=...)")
        self.path: list = []
        self.estimates: dict = {}
        K, P = num_silos, params0.shape[0]
        return AutoServer(params0.copy(), lam=np.zeros(K), used=np.zeros(K),
                          W=np.tile(params0, (K, 1)) if self.tracks_models else None,
                          est=Estimate.empty(K, P), header=np.zeros((K, HEADER)),
                          total_rounds=int(rounds))

    def broadcast(self, server: Any) -> Any:
        """The shared model and every silo's λ_k (`AutoMessage`)."""
        return AutoMessage(server.params, server.lam)

    def pass_starts(self, server: AutoServer) -> np.ndarray:
        """(K, P) where the released passes of this round started."""
        assert server.W is not None
        return start_points(server.W, server.params, server.lam)

    def released_pull(self, server: AutoServer) -> np.ndarray:
        """(K,) the pull the released passes used."""
        return finite_pull(server.lam)

    def server_step(self, server: Any, update: Any, weights: np.ndarray) -> Any:
        """Fold the round's released updates (`AutoUpdate`) into the estimate, move the
        shared model by their weighted mean and set the next round's λ_k (`AutoServer`)."""
        if update is None:
            return server
        assert server.est is not None and server.header is not None
        delta = np.asarray(update.delta, float)
        present = np.all(np.isfinite(delta), axis=1)
        starts = self.pass_starts(server)
        header = server.header.copy()
        header[present] = update.header[present]
        estimator = LambdaEstimator(server.total_rounds)
        est = server.est
        if len(server.path) >= burn_in(server.total_rounds):  # past the common transient
            est = estimator.observe(est, starts, np.where(present[:, None], delta, 0),
                                    self.released_pull(server), server.params, header,
                                    present)
        w = np.where(present, np.asarray(weights, float), 0.0)
        shared = server.params + (w[:, None] * np.where(present[:, None], delta, 0)).sum(0) \
            / max(w.sum(), 1e-300)
        W = server.W
        if W is not None:
            W = W.copy()
            W[present] = starts[present] + delta[present]
        lam, info = estimator.lambdas(est, header)
        # mirrored on the algorithm for describe(); the server state keeps its own copy
        self.path = [*server.path, json_lam(server.lam)]
        self.estimates = {"h": info["h"], "tau2": info["tau2"], "s": info["s"],
                          "s_stat": info["s_stat"], "psi": info.get("psi"), "model": info.get("model"),
                          "tau2_dir": info.get("tau2_dir"),
                          "next_lam": json_lam(lam)}
        return AutoServer(shared, lam=lam, used=server.lam, W=W, est=est, header=header,
                          path=self.path, estimates=self.estimates,
                          total_rounds=server.total_rounds)

    def auto_personal(self, silos_params: np.ndarray, server: AutoServer) -> np.ndarray:
        """Personal models: the shared model for the silos that ran as FedAvg (λ = ∞)."""
        used = np.asarray(getattr(server, "used", np.zeros(len(silos_params))), float)
        if used.shape != (silos_params.shape[0],):  # a silo's view: its own λ only
            used = np.broadcast_to(used[-1:] if used.size else np.zeros(1),
                                   (silos_params.shape[0],))
        return np.where(np.isinf(used)[:, None], server.params[None, :], silos_params)

    def describe_auto(self) -> dict[str, Any]:
        return auto_describe(getattr(self, "path", []), getattr(self, "estimates", {}))

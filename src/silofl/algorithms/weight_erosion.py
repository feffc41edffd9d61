"""Weight Erosion (Algorithm 1 of the seed's section 4.5): one model personalized for a
single user silo u_0, trained by SGD on a weighted mean of all silos' gradients.

Every silo starts with weight α_i = 1. Each round r every silo computes one gradient g_i at
the current global model on a batch of expected size b; the server computes
    d_i = ‖g_i − g_0‖ / ‖g_0‖                      (g_0: the user's gradient)
    Δα_i = (1 + p_s·⌊(r − 1)·b / |S_i|⌋) · p_d · d_i
    α_i ← max(0, α_i − Δα_i)
    w ← w − lr·Σ α_i g_i / Σ α_i.
The user's own distance is 0, so α_0 stays 1 and Σ α_i ≥ 1. p_d (distance penalty) sets how
fast dissimilar silos lose weight; p_s (size penalty) erodes faster once a silo's examples
have been seen ⌊(r − 1)b/|S_i|⌋ times, so small silos are not over-represented. p_d = 0 is
SGD on the plain mean of the silos' gradients. When ‖g_0‖ = 0 the distance is +∞ (the
seed's Example 4) for every silo whose gradient differs from g_0.

Privacy. Each g_i is one DP-SGD gradient under silo i's own target (`LocalTrainer.gradients`:
one Poisson-sampled Gaussian step per round, charged before the data is read); distances,
weights and the update are post-processing. The plan fixes one step per round whatever
`local_epochs` says. The server uses |S_i| (training counts, as weighted FedAvg does).

Robustness. A gradient that is not finite or not of shape (P,) is dropped from the round
(its α unchanged, counted in `aggregation.rejected`); without the user's gradient there is
no reference, so the round leaves w and α as they are. A robust `aggregation` rule replaces
the α-weighted mean by the rule over the silos still holding weight (α_i > 0), unweighted:
erosion decides who takes part, the rule bounds what any one of them can do.

The result is the global model w, personalized for u_0: `personal_models` gives it to every
silo, so the other silos' metrics show how u_0's model does on their data.

`alpha_history` holds α (K,) after every server step since the last `init`, one entry per
round (a resumed run holds the rounds after resuming only). α is computed from DP
gradients: post-processing, as the model. `round_log` keeps, per round, what was released
and public on the server: the broadcast model `params` (P,), the released gradients `grads`
(K, P) (rows dropped by screening are NaN), α after the round and the step size `lr` (the
contribution report is computed from these alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np

from silofl.algorithms.base import Algorithm, ServerState, SiloState, check_nonnegative
from silofl.algorithms.robust import Aggregator, screen
from silofl.errors import ConfigError, PrivacyError


@dataclass
class ErosionServer(ServerState):
    alpha: np.ndarray  # (K,) the silos' weights α_i after the last round
    last_step: np.ndarray | None = None  # (P,) the previous ḡ (centered clipping's centre)


@dataclass
class ErosionUpdate:
    grads: np.ndarray   # (K, P) each silo's gradient at the broadcast model
    epochs: np.ndarray  # (K,) ⌊(r − 1)·b / |S_i|⌋: times each silo's examples were used
    lr: float           # the (public) step size of the global update


def relative_distances(grads: np.ndarray, user: int) -> np.ndarray:
    """(K,) d_i = ‖g_i − g_0‖ / ‖g_0‖; +∞ where ‖g_0‖ = 0 and g_i ≠ g_0, 0 where g_i = g_0."""
    diff = np.linalg.norm(grads - grads[user], axis=1)
    norm0 = np.linalg.norm(grads[user])
    if norm0 > 0:
        return diff / norm0
    return np.where(diff > 0, np.inf, 0.0)


def erode(alpha: np.ndarray, grads: np.ndarray, epochs: np.ndarray, user: int,
          p_s: float, p_d: float) -> tuple[np.ndarray, np.ndarray]:
    """One round of Algorithm 1's aggregation: (new α (K,), ḡ (P,))."""
    d = relative_distances(grads, user)
    if p_d == 0:
        step = np.zeros_like(d)  # 0·∞ would be NaN; no distance penalty means no erosion
    else:
        step = (1.0 + p_s * np.asarray(epochs, dtype=float)) * p_d * d
    new = np.maximum(0.0, alpha - step)
    return new, (new[:, None] * grads).sum(0) / new.sum()


class WeightErosion(Algorithm):
    name = "weight_erosion"
    weighted = False  # ḡ is weighted by α only, not by silo sizes
    fixed_steps_per_pass = 1  # one DP-SGD gradient per silo per round

    def __init__(self, user: int | str, p_s: float = 0.2, p_d: float = 0.01,  # the seed's
                 aggregation: Aggregator | None = None):
        if isinstance(user, bool) or not isinstance(user, (int, np.integer, str)) \
                or user == "":
            raise ConfigError(f"weight_erosion needs the user silo u_0 (we_user): a silo "
                              f"name or index, got {user!r}")
        if not isinstance(user, str) and user < 0:
            raise ConfigError(f"weight_erosion: user index must be >= 0, got {user}")
        self.user = user if isinstance(user, str) else int(user)
        self.p_s = check_nonnegative("weight_erosion size penalty p_s (we_p_s)", p_s)
        self.p_d = check_nonnegative("weight_erosion distance penalty p_d (we_p_d)", p_d)
        self.user_index: int | None = None if isinstance(user, str) else self.user
        self.aggregation = aggregation or Aggregator()
        self.alpha_history: list[np.ndarray] = []  # α after each round since `init`
        self.round_log: list[dict] = []  # released, per round (see module docstring)

    def bind_silos(self, names: list[str]) -> None:
        if isinstance(self.user, str):
            if self.user not in names:
                raise ConfigError(f"weight_erosion: user {self.user!r} is not a silo of this "
                                  f"federation; silos are {', '.join(names)}")
            self.user_index = names.index(self.user)

    def check_plan(self, num_silos, rounds, accountant):
        if self.user_index is None:
            raise ConfigError(f"weight_erosion: user {self.user!r} is a silo name; plan with "
                              "the federation (plan_silos / simulate) to resolve it")
        if self.user_index >= num_silos:
            raise ConfigError(f"weight_erosion: user index {self.user_index} is not a silo of "
                              f"this federation of {num_silos} silos (indices 0..{num_silos - 1})")
        self.aggregation.check(num_silos)

    def privacy_events(self, round_event, rounds, target=None):
        if not isinstance(round_event, dpa.PoissonSampledDpEvent):
            raise PrivacyError("weight_erosion takes one DP-SGD step per round: its round "
                               f"event must be one Poisson-sampled step, got {round_event}")
        return dpa.SelfComposedDpEvent(round_event, rounds)

    def init(self, params0, num_silos, rounds=None):
        self.check_plan(num_silos, rounds, None)
        self.alpha_history = []
        self.round_log = []
        return (SiloState(np.tile(params0, (num_silos, 1))),
                ErosionServer(params0.copy(), np.ones(num_silos)))

    def silo_step(self, silos, message, trainer, round):
        start = np.tile(message, (silos.params.shape[0], 1))
        grads = trainer.gradients(start, round=round)
        epochs = np.floor((round - 1) * trainer.batch_size / trainer.data.n)
        return SiloState(start), ErosionUpdate(grads, epochs, float(trainer.lr))

    def server_step(self, server, update, weights):
        agg, last = self.aggregation, getattr(server, "last_step", None)
        keep, grads = screen(update.grads, server.params.shape[0])
        agg.rejected += int((~keep).sum())
        released = np.full((keep.shape[0], server.params.shape[0]), np.nan)
        released[keep] = grads[keep]
        if not keep[self.user_index]:  # no reference gradient: skip the round
            self.alpha_history.append(server.alpha.copy())
            self._log(server.params, released, server.alpha, update.lr)
            return ErosionServer(server.params.copy(), server.alpha.copy(), last)
        idx = np.flatnonzero(keep)
        epochs = np.broadcast_to(np.asarray(update.epochs, float), keep.shape)[idx]
        user = int(np.searchsorted(idx, self.user_index))
        kept_alpha, gbar = erode(server.alpha[idx], grads[idx], epochs, user,
                                 self.p_s, self.p_d)
        alpha = server.alpha.copy()
        alpha[idx] = kept_alpha
        if agg.rule != "mean":  # α_0 = 1 always, so at least the user takes part
            gbar = agg.combine(grads[idx][kept_alpha > 0], center=last)
        self.alpha_history.append(alpha.copy())
        self._log(server.params, released, alpha, update.lr)
        return ErosionServer(server.params - update.lr * gbar, alpha, gbar)

    def _log(self, params, released, alpha, lr) -> None:
        self.round_log.append({"params": params.copy(), "grads": released,
                               "alpha": alpha.copy(), "lr": float(lr)})

    def personal_models(self, silos, server):
        return np.tile(server.params, (silos.params.shape[0], 1))

    def describe(self):
        return {"name": self.name, "user": self.user, "user_index": self.user_index,
                "p_s": self.p_s, "p_d": self.p_d, **self.aggregation.describe_if_used()}

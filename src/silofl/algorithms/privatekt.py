"""PrivateKT (seed 001, Algorithm 1, Eqs. 2–6) and its baseline, FedAvg with local DP on
clipped model updates: two methods whose privacy comes from a *local* mechanism applied to
what a client uploads each round, not from DP-SGD.

PrivateKT, round t (global model Θ_t, K knowledge-transfer indices into the public set D_p):
  1. the server selects round(fraction·N) clients among those whose budget covers one more
     upload (public randomness);
  2. each selected client trains Θ_t on its own data by plain SGD (local_epochs), predicts
     the K public samples and uploads the one-hot predictions through randomized response
     with β of Eq. 6 (ε/K per label, ε per round);
  3. the server estimates the mean prediction per sample by Eq. 3, appends the K
     (sample, estimate) pairs to a FIFO buffer of size B, fine-tunes Θ_t on the buffer
     (soft labels: the estimate clipped at 0 and renormalized) → Θ'_t, self-trains Θ'_t on
     M public samples drawn with weights ∝ exp(−u) (Eq. 5; labels argmax of Θ'_t) → Θ_{t+1},
     and draws the next K samples with weights ∝ exp(u) (Eq. 4), u the entropy of Θ_{t+1}'s
     prediction.

FedAvg-LDP, round t: the same selection; each selected client trains Θ_t by plain SGD,
clips Δ = θ − Θ_t (L2 for Gaussian, L1 for Laplace, to `clip`) and adds the mechanism's
noise at sensitivity 2·clip (`privacy.ldp`); the server adds the mean noisy Δ.

Privacy (both): a client's upload in a round is ε-LDP for its whole local dataset (so also
example-level). Each client's ledger is charged the round's event (`rr_round_event` /
`update_event`) before its data is read, for every round it is selected, and nothing else
leaves it. The plan reserves, per client, as many rounds as fit its target for the job
(at most the run's rounds, or `max_participation`); a client whose reservation is used up is
no longer selected. Composition over rounds is counted — the seed's claim that shuffling
avoids accumulation is *not* assumed. Selection, the KT samples and self-training use public
randomness and public data only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import dp_accounting as dpa
import numpy as np

from silofl.algorithms.base import Algorithm, ServerState, SiloState, check_fraction
from silofl.errors import ConfigError
from silofl.models.base import Model
from silofl.privacy import ldp
from silofl.privacy.ledger import tightest
from silofl.training import local_dp

if TYPE_CHECKING:
    from silofl.data.federation import Federation
    from silofl.privacy.targets import PrivacyTarget
    from silofl.training.trainer import LocalTrainer


# --- the pure pieces (Eqs. 3–5, the buffer) ---------------------------------------------------

def entropy(probs: np.ndarray) -> np.ndarray:
    """(n,) u = −Σ_j p_j log p_j of (n, C) class probabilities (0·log 0 = 0)."""
    p = np.clip(np.asarray(probs, dtype=float), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(p), 0.0).sum(1)


def kt_weights(u: np.ndarray) -> np.ndarray:
    """Eq. 4: w^d ∝ exp(u) — uncertain public samples are chosen for knowledge transfer."""
    z = np.exp(u - u.max())
    return z / z.sum()


def self_train_weights(u: np.ndarray) -> np.ndarray:
    """Eq. 5: w^s ∝ exp(−u) — confident public samples are chosen for self-training."""
    z = np.exp(u.min() - u)
    return z / z.sum()


def push_fifo(idx: np.ndarray, soft: np.ndarray, new_idx: np.ndarray, new_soft: np.ndarray,
              size: int) -> tuple[np.ndarray, np.ndarray]:
    """Append rows to a FIFO buffer (oldest first) and keep the newest `size`."""
    idx = np.concatenate([idx, new_idx])[-size:]
    soft = np.concatenate([soft, new_soft])[-size:]
    return idx, soft


def class_probs(model: Model, w: np.ndarray, X: np.ndarray) -> np.ndarray:
    """(n, C) class probabilities of one model (binary models give P(1): C = 2)."""
    p = np.asarray(model.predict(w, X), dtype=float)
    return np.stack([1.0 - p, p], 1) if p.ndim == 1 else p


def check_distribution(model: Model, w: np.ndarray, X: np.ndarray, num_classes: int,
                       who: str) -> None:
    """ConfigError unless the model outputs a distribution over `num_classes` classes."""
    raw = np.asarray(model.predict(w, X), dtype=float)
    ok = raw.ndim == 1 and num_classes == 2 or raw.ndim == 2 and raw.shape[1] == num_classes
    if ok:
        p = class_probs(model, w, X)
        ok = bool(np.all(np.isfinite(p)) and np.all(p >= -1e-9)
                  and np.allclose(p.sum(1), 1.0, atol=1e-6))
    if not ok:
        raise ConfigError(f"{who} needs a classifier whose prediction is a distribution over "
                          f"the {num_classes} classes (rows of probabilities summing to 1), "
                          f"but model {getattr(model, 'name', model)!r} outputs something else "
                          f"(shape {raw.shape}); use a classification model (softmax, logistic, "
                          "mlp, convnet) on binary or multiclass data")


def soft_sgd(model: Model, w: np.ndarray, X: np.ndarray, soft: np.ndarray, epochs: int,
             batch: int, lr: float, rng: np.random.Generator) -> np.ndarray:
    """SGD of one model w (P,) on public examples X (n, ...) with soft labels (n, C): the loss
    of an example is Σ_c soft_c·loss(x, c), computed as C weighted rows. Returns (P,)."""
    n, C = soft.shape
    if n == 0 or epochs <= 0:
        return w
    w = np.array(w, dtype=float, copy=True)
    labels = np.arange(C, dtype=float)
    for _ in range(epochs):
        order = rng.permutation(n)
        for a in range(0, n, batch):
            i = order[a:a + batch]
            wt = soft[i].reshape(-1)
            keep = wt > 0  # hard labels: one row per example
            Xb = np.repeat(X[i], C, axis=0)[keep]
            yb = np.tile(labels, len(i))[keep]
            g = model.grad_sum(w[None], Xb[None], yb[None], wt[keep][None])[0]
            w -= lr * g / len(i)
    return w


# --- PrivateKT ----------------------------------------------------------------------------

@dataclass
class KTServer(ServerState):
    kt: np.ndarray           # (K,) indices into D_p of this round's knowledge-transfer samples
    buffer_idx: np.ndarray   # (≤ B,) public indices in the FIFO buffer, oldest first
    buffer_soft: np.ndarray  # (≤ B, C) their Eq. 3 estimates
    round: int = 0           # rounds completed
    participation: np.ndarray | None = None  # (N,) rounds each client took part in


@dataclass
class KTUpdate:
    clients: np.ndarray  # (k,) the selected clients
    labels: np.ndarray   # (k, K) their perturbed labels (Eq. 2): all that leaves them
    beta: float          # the (public) keep probability they used (1: non-private run)
    lr: float            # public training settings the server reuses (training.lr, b)
    batch: int


def participation_cap(event: dpa.DpEvent, rounds: int, target: PrivacyTarget | None,
                      limit: int = 0) -> int:
    """Largest c ≤ min(rounds, limit or rounds) with c uploads within `target` (the figure
    ledgers and the budget store check: `ledger.tightest`)."""
    hi = min(rounds, limit) if limit else rounds
    if target is None:
        return hi

    def fits(c: int) -> bool:
        return c == 0 or tightest(dpa.SelfComposedDpEvent(event, c),
                                  target.delta)[0] <= target.epsilon
    if fits(hi):
        return hi
    lo = 0
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


#: a local-DP method's server state
_ServerT = TypeVar("_ServerT", bound=ServerState)


class _LocalDP(Algorithm[SiloState, _ServerT]):
    """What PrivateKT and FedAvg-LDP share: client selection, per-round local events,
    participation caps."""
    #: privacy from a fixed local mechanism per upload: no DP-SGD noise to calibrate
    calibrated = False
    weighted = False

    def __init__(self, epsilon: float, client_fraction: float, max_participation: int,
                 seed: int) -> None:
        self.epsilon = ldp.check_epsilon("ldp_epsilon", epsilon)
        self.client_fraction = check_fraction("client_fraction (share of clients per round)",
                                              client_fraction, low_open=True, high_open=False)
        if isinstance(max_participation, bool) or not isinstance(
                max_participation, (int, np.integer)) or max_participation < 0:
            raise ConfigError(f"max_participation must be an integer >= 0 (0 = as many "
                              f"rounds as the target allows), got {max_participation!r}")
        self.max_participation = int(max_participation)
        self.seed = int(seed)

    def upload_event(self) -> dpa.DpEvent:
        raise NotImplementedError

    def privacy_events(self, round_event: dpa.DpEvent, rounds: int,
                       target: PrivacyTarget | None = None) -> dpa.DpEvent:
        cap = participation_cap(self.upload_event(), rounds, target, self.max_participation)
        return dpa.SelfComposedDpEvent(self.upload_event(), cap) if cap else dpa.NoOpDpEvent()

    def _select(self, trainer: LocalTrainer, round: int) -> np.ndarray:
        return self.select_clients(local_dp.eligible(trainer, self.upload_event()), round)

    def select_clients(self, eligible: np.ndarray, round: int) -> np.ndarray:
        """The server's public choice of this round's clients among the (N,) eligible ones
        (also what a networked server asks: `runtime.network.hosting`)."""
        return local_dp.select(eligible, self.client_fraction,
                               np.random.default_rng([self.seed, round, 0x5e1]))

    def personal_models(self, silos: SiloState, server: _ServerT) -> np.ndarray:
        return np.tile(server.params, (silos.params.shape[0], 1))


class PrivateKT(_LocalDP[KTServer]):
    name = "privatekt"

    def __init__(self, epsilon: float = 5.0, samples: int = 2, buffer: int = 25,
                 self_train: float = 0.1, client_fraction: float = 0.5,
                 server_epochs: int = 5, server_lr: float = 0.0, max_participation: int = 0,
                 seed: int = 0, public: np.ndarray | None = None) -> None:
        super().__init__(epsilon, client_fraction, max_participation, seed)
        for key, v, lo in (("kt_samples (K)", samples, 1), ("kt_buffer (B)", buffer, 1),
                           ("kt_server_epochs", server_epochs, 0)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ConfigError(f"privatekt: {key} must be an integer >= {lo}, got {v!r}")
        self.samples, self.buffer, self.server_epochs = int(samples), int(buffer), \
            int(server_epochs)
        self.self_train = check_fraction("kt_self_train (share M/|D_p| of public samples "
                                         "self-trained on per round)", self_train,
                                         low_open=False, high_open=False)
        if not (math.isfinite(server_lr) and server_lr >= 0):
            raise ConfigError(f"kt_server_lr must be >= 0 (0 = training.lr), got {server_lr}")
        self.server_lr = float(server_lr)
        self.public = None if public is None else np.asarray(public)
        self.model: Model | None = None
        self.num_classes: int | None = None

    def _bound(self) -> tuple[np.ndarray, Model, int]:
        """The public set, the model and C, once `bind_data` has run."""
        if self.public is None or self.model is None or self.num_classes is None:
            raise ConfigError("privatekt: call bind_data(fed, model) before planning "
                              "(simulate and `silofl run` do)")
        return self.public, self.model, self.num_classes

    # -- binding to the data (before planning: errors spend nothing) --------------------
    def bind_data(self, fed: Federation, model: Model) -> None:
        """Take the public set (`public` given to the constructor, else fed.meta["public_X"])
        and the model, and check them."""
        if self.public is None:
            self.public = fed.meta.get("public_X")
        public = self.public
        if public is None or len(public) == 0:
            raise ConfigError("privatekt needs an unlabeled public set D_p and there is none: "
                              "use data.source = 'mnist_dirichlet' with data.public_fraction > 0, "
                              "or pass PrivateKT(public=X) / fed.meta['public_X'] from Python")
        if fed.task not in ("binary", "multiclass"):
            raise ConfigError(f"privatekt transfers class predictions, but the data is a "
                              f"{fed.task} task; use classification data")
        if tuple(public.shape[1:]) != tuple(fed.silos[0].X_train.shape[1:]):
            raise ConfigError(f"privatekt: public examples have shape {public.shape[1:]} "
                              f"but the clients' have {fed.silos[0].X_train.shape[1:]}")
        n = len(public)
        if self.samples > n:
            raise ConfigError(f"privatekt: kt_samples K = {self.samples} is larger than the "
                              f"public set ({n} examples); lower kt_samples or enlarge D_p")
        self.num_classes = max(int(fed.num_classes), 2)
        check_distribution(model, model.init_params(), public[:4], self.num_classes,
                           "privatekt")
        self.model = model

    def check_plan(self, num_silos: int, rounds: int | None,
                   accountant: str | None) -> None:
        if self.model is None:
            raise ConfigError("privatekt: call bind_data(fed, model) before planning "
                              "(simulate and `silofl run` do)")
        if accountant is not None and self.beta >= 1.0:  # privacy review: RR without noise
            raise ConfigError(
                f"privatekt: ldp_epsilon / kt_samples = {self.epsilon:g}/{self.samples} per "
                f"label is so large that randomized response keeps every label (β = 1 in "
                "floating point): the uploads would be the true predictions, with no privacy. "
                "Lower ldp_epsilon or raise kt_samples (ε/K ≤ 30)")

    def upload_event(self) -> dpa.DpEvent:
        return ldp.rr_round_event(self.epsilon, self.samples, self._bound()[2])

    @property
    def beta(self) -> float:
        """The randomized-response keep probability of one uploaded label."""
        return ldp.rr_keep_probability(self.epsilon, self.samples, self._bound()[2])

    # -- the algorithm ----------------------------------------------------------------
    def init(self, params0: np.ndarray, num_silos: int,
             rounds: int | None = None) -> tuple[SiloState, KTServer]:
        self.check_plan(num_silos, rounds, None)
        public, _, C = self._bound()
        rng = np.random.default_rng([self.seed, 0x6b74])  # public: line 3 of Algorithm 1
        kt = rng.choice(len(public), self.samples, replace=False)
        return (SiloState(np.tile(params0, (num_silos, 1))),
                KTServer(params0.copy(), kt, np.zeros(0, dtype=np.int64), np.zeros((0, C)),
                         0, np.zeros(num_silos, dtype=np.int64)))

    def broadcast(self, server: KTServer) -> KTServer:
        return server

    def silo_step(self, silos: SiloState, message: KTServer, trainer: LocalTrainer,
                  round: int) -> tuple[SiloState, KTUpdate]:
        public, _, C = self._bound()
        clients = self._select(trainer, round)
        private = trainer.ledgers is not None
        local_dp.charge(trainer, clients, self.upload_event(), round)
        W = local_dp.local_sgd(trainer, np.tile(message.params, (len(clients), 1)), clients)
        X = public[message.kt]
        labels = np.stack([class_probs(trainer.model, w, X).argmax(1) for w in W]) \
            if len(clients) else np.zeros((0, self.samples), dtype=np.int64)
        if private:  # non-private runs upload the true predictions (β = 1)
            labels = ldp.randomized_response(labels, self.beta, C, trainer.rng)
        return silos, KTUpdate(clients, labels, self.beta if private else 1.0,
                               float(trainer.lr), int(trainer.batch_size))

    def server_step(self, server: KTServer, update: KTUpdate,
                    weights: np.ndarray) -> KTServer:
        public, model, C = self._bound()
        t = server.round + 1
        rng = np.random.default_rng([self.seed, t, 0x5e7])  # public
        lr, batch = self.server_lr or update.lr, update.batch
        idx, soft = server.buffer_idx, server.buffer_soft
        if server.participation is None:  # a silo's decoded view (runtime.network.hosting)
            raise ValueError("PrivateKT's server step needs the server's participation counts")
        part = server.participation.copy()
        part[update.clients] += 1
        if len(update.clients):
            counts = np.stack([np.bincount(update.labels[:, i], minlength=C)
                               for i in range(self.samples)])            # (K, C)
            est = ldp.debias(counts, len(update.clients), update.beta)   # Eq. 3
            idx, soft = push_fifo(idx, soft, server.kt, est, self.buffer)
        w = server.params
        if len(idx):  # fine-tune on the buffer: Θ_t → Θ'_t
            target = np.clip(soft, 0.0, None)
            target /= np.maximum(target.sum(1, keepdims=True), 1e-12)
            w = soft_sgd(model, w, public[idx], target, self.server_epochs,
                         batch, lr, rng)
        m = int(np.floor(self.self_train * len(public) + 0.5))
        if m:  # self-training on M confident public samples (Eq. 5): Θ'_t → Θ_{t+1}
            p = class_probs(model, w, public)
            pick = rng.choice(len(public), m, replace=False, p=self_train_weights(entropy(p)))
            hard = np.eye(C)[p[pick].argmax(1)]
            w = soft_sgd(model, w, public[pick], hard, 1, batch, lr, rng)
        p = class_probs(model, w, public)
        kt = rng.choice(len(public), self.samples, replace=False,
                        p=kt_weights(entropy(p)))                      # Eq. 4
        return KTServer(w, kt, idx, soft, t, part)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "ldp_epsilon": self.epsilon, "kt_samples": self.samples,
                "kt_buffer": self.buffer, "kt_self_train": self.self_train,
                "client_fraction": self.client_fraction, "kt_server_epochs": self.server_epochs,
                "kt_server_lr": self.server_lr, "max_participation": self.max_participation,
                "rr_keep_probability": self.beta if self.num_classes else None}


# --- FedAvg with local DP on clipped updates -------------------------------------------------

@dataclass
class LDPUpdate:
    clients: np.ndarray  # (k,)
    delta: np.ndarray    # (k, P) clipped, noised model changes: all that leaves them


class FedAvgLDP(_LocalDP[ServerState]):
    name = "fedavg_ldp"

    def __init__(self, epsilon: float = 5.0, mechanism: str = "gaussian",
                 delta: float = 1e-5, client_fraction: float = 0.5,
                 max_participation: int = 0, seed: int = 0) -> None:
        super().__init__(epsilon, client_fraction, max_participation, seed)
        if mechanism not in ldp.MECHANISMS:
            raise ConfigError(f"ldp_mechanism must be one of {', '.join(ldp.MECHANISMS)}, "
                              f"got {mechanism!r}")
        if mechanism == "gaussian" and not (0 < delta < 1):
            raise ConfigError(f"ldp_delta must be in (0, 1) for the Gaussian mechanism, "
                              f"got {delta}")
        self.mechanism, self.delta = mechanism, float(delta)
        self._event = ldp.update_event(mechanism, self.epsilon, self.delta)

    def upload_event(self) -> dpa.DpEvent:
        return self._event

    def silo_step(self, silos: SiloState, message: np.ndarray, trainer: LocalTrainer,
                  round: int) -> tuple[SiloState, LDPUpdate]:
        clients = self._select(trainer, round)
        local_dp.charge(trainer, clients, self._event, round)
        start = np.tile(message, (len(clients), 1))
        delta = local_dp.local_sgd(trainer, start, clients) - start
        if trainer.ledgers is not None:
            delta = ldp.noisy_updates(delta, self._event, trainer.rule.clip, trainer.rng)
        return silos, LDPUpdate(clients, delta)

    def server_step(self, server: ServerState, update: LDPUpdate,
                    weights: np.ndarray) -> ServerState:
        if not len(update.clients):
            return server
        return ServerState(server.params + update.delta.mean(0))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "ldp_epsilon": self.epsilon, "ldp_mechanism": self.mechanism,
                "ldp_delta": self.delta if self.mechanism == "gaussian" else None,
                "client_fraction": self.client_fraction,
                "max_participation": self.max_participation,
                "noise_multiplier": self._event.noise_multiplier,
                "sensitivity": "2·clip (clipped update, any two local datasets)"}

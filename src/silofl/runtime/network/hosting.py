"""One silo's share of an algorithm's state and randomness — what a networked silo hosts,
and what the simulator's per-silo mode hosts for every silo, so both run the same code.

`silo_randomness` gives each silo its own stream: secure (OS entropy) by default; in the
reproducible "seeded" mode keyed by (seed, silo name), so a silo process and the
simulator's per-silo mode draw the same batches and noise for that silo.
"""

from __future__ import annotations

import dataclasses
import zlib
from types import SimpleNamespace
from typing import TYPE_CHECKING, Protocol, TypeGuard

import numpy as np

from silofl.algorithms.base import Algorithm, SiloState
from silofl.errors import ConfigError
from silofl.privacy.randomness import Randomness
from silofl.runtime.network.secagg import SECAGG_ONLY

if TYPE_CHECKING:
    import dp_accounting as dpa

#: methods that run over the network: their silo step runs on one silo's share of the
#: state, and their update travels as one row per silo (`encode_update`)
NETWORK_METHODS = ("local", "fedavg", "mrmtl", "ditto", "finetune", "ifca", "ifca_local",
                   "ifca_finetune", "ifca_mrmtl", "mocha", "weight_erosion", "privatekt",
                   "fedavg_ldp", "fedprox", "scaffold", "apfl", "fedper", "fedrep", "fedbn")


def check_network_method(name: str) -> None:
    """ConfigError for a method the network cannot run. `uldp` runs only inside a SecAgg+
    sum (`secagg.SECAGG_ONLY`); the server's config and every silo's round check that."""
    if name not in NETWORK_METHODS and name not in SECAGG_ONLY and name != "dp_gbdt":
        raise ConfigError(
            f"method {name!r} does not run over the network. Network methods: "
            f"{', '.join(NETWORK_METHODS)}, dp_gbdt (and {', '.join(SECAGG_ONLY)} with [server] "
            f"secagg = true); run {name!r} in the simulator (`silofl run`)")


def consortium_method(algorithm) -> bool:
    """A consortium-wide mechanism (ULDP): each silo sends its share of one noisy sum, which
    only SecAgg+ may reveal; one σ for every silo."""
    return bool(getattr(algorithm, "consortium", False))


def uldp_refusal(masked: bool, own: float, used: float | None, sigma: float) -> str | None:
    """Why a silo refuses a uldp round request (None: it runs it): not SecAgg+-masked, the
    consortium's σ below the silo's own σ_k (its target would not hold), or another σ than
    its earlier rounds ran with (one σ per job)."""
    if not masked:
        return ("uldp rounds run only inside a SecAgg+ sum (the server may see only the sum "
                "of the silos' shares); this round is not masked")
    if sigma < own or (own == 0.0 and sigma != 0.0):
        return (f"the consortium's sigma {sigma!r} is below this silo's own {own!r} "
                "(calibrated for its (ε, δ))")
    if used is not None and sigma != used:
        return f"sigma {sigma!r} ≠ {used!r}, the σ of this silo's earlier rounds (one σ per job)"
    return None


# --- one silo's view of the broadcast, and the silos' updates on the wire ----------------
# The algorithms' own silo_step/server_step run unchanged; these functions only cut the
# broadcast to what silo k's step needs, and put the per-silo updates back together for the
# server step. The wire carries one float64 vector per message (`messages.check_array`).

def _family(algorithm) -> str:
    from silofl.algorithms.auto_lambda import AutoLambda
    from silofl.algorithms.ifca import IFCA
    from silofl.algorithms.mocha import Mocha
    from silofl.algorithms.privatekt import FedAvgLDP, PrivateKT
    from silofl.algorithms.scaffold import Scaffold
    from silofl.algorithms.weight_erosion import WeightErosion
    for cls, fam in ((IFCA, "ifca"), (Mocha, "mocha"), (WeightErosion, "erosion"),
                     (PrivateKT, "kt"), (FedAvgLDP, "ldp"), (Scaffold, "scaffold"),
                     (AutoLambda, "autolam")):
        if isinstance(algorithm, cls):
            return fam
    return "mean"


def silo_message(algorithm, message, k: int):
    """What silo k's `silo_step` (on its one-silo state) receives: Mocha's (W, Ω) with the
    row index k (its penalty couples it to the other silos' released models); others as is."""
    if _family(algorithm) == "mocha":
        W, omega = message[:2]
        return W, omega, np.array([k])
    if _family(algorithm) == "autolam":  # the model and silo k's own λ_k
        return dataclasses.replace(message, lam=np.asarray(message.lam)[k:k + 1])
    return message


def round_events(algorithm, pass_event, t: int, rounds: int, target):
    """What round t of `rounds` costs one silo (reserved in its store before the round):
    the round's local passes, plus for the IFCA family in a selection round its private
    cluster selection (ε_sel = selection_fraction·ε_k); other methods' one-round events."""
    if local_dp_family(algorithm):  # one upload through the local mechanism
        import dp_accounting as dpa
        return dpa.SelfComposedDpEvent(algorithm.upload_event(), 1)
    if _family(algorithm) == "ifca":
        import dp_accounting as dpa

        from silofl.training import selection
        train = dpa.SelfComposedDpEvent(pass_event, algorithm.passes_per_round)
        if t > algorithm.schedule(rounds).select_until:
            return train
        eps = algorithm.selection_fraction * target.epsilon
        return dpa.ComposedDpEvent((train, selection.selection_event(eps)))
    return algorithm.privacy_events(pass_event, 1, target=target)


class LocalDpAlgorithm(Protocol):
    """What the local-DP family (PrivateKT, FedAvg-LDP) offers the hosting code."""

    def upload_event(self) -> dpa.DpEvent: ...

    def select_clients(self, eligible: np.ndarray, round: int) -> np.ndarray: ...


def local_dp_family(algorithm: object) -> TypeGuard[LocalDpAlgorithm]:
    """PrivateKT and FedAvg-LDP: the server picks each round's clients (public randomness)
    among those whose plan covers one more upload; only those are asked."""
    return _family(algorithm) in ("kt", "ldp")


def erosion_schedule(algorithm) -> bool:
    """Weight Erosion with a participation schedule (participation < 1, join or leave
    rounds): each round only the silos of its public schedule (`present`) take part."""
    return _family(algorithm) == "erosion" and algorithm.scheduled


def asks_subset(algorithm) -> bool:
    """Whether the server asks only a public subset of the silos each round (local-DP
    selection, Weight Erosion's schedule): `min_silos` then counts among those asked."""
    return local_dp_family(algorithm) or erosion_schedule(algorithm)


def select_silos(algorithm, eligible: np.ndarray, round: int) -> np.ndarray:
    """Indices of the silos asked in `round`: the local-DP methods' public selection among
    the (K,) eligible silos; Weight Erosion's scheduled silos (its own public `present`)
    among them; every eligible silo for the other methods."""
    if local_dp_family(algorithm):
        return algorithm.select_clients(np.asarray(eligible, bool), round)
    if erosion_schedule(algorithm):
        return np.flatnonzero(np.asarray(eligible, bool) & algorithm.present(round))
    return np.flatnonzero(eligible)


def not_scheduled(algorithm, round: int, k: int) -> str | None:
    """Why silo k must not run `round` (None: it may): Weight Erosion's public schedule
    leaves it out. The silo computes this itself, so a server cannot make it spend budget
    on a round it does not take part in."""
    if not erosion_schedule(algorithm) or algorithm.present(round)[k]:
        return None
    return (f"this silo is absent from round {round} in Weight Erosion's public schedule "
            f"(we_participation {algorithm.participation:g}, we_join_round "
            f"{algorithm.join_round}, we_leave_round {algorithm.leave_round}, schedule seed "
            f"{algorithm.seed}); a round it does not take part in is not run, nothing was "
            "charged")


class _AsRowK:
    """Silo k's one-silo trainer posing as row k of K hosted silos, for a step that masks
    and counts all K silos (Weight Erosion's schedule): calls run on row k only (its entry
    of the `silos` mask), results come back in row k (the other rows: NaN gradients,
    unchanged models, never read or charged); `data.n` (K,) holds silo k's count in row k
    (the other entries are placeholders whose results are dropped)."""

    def __init__(self, trainer, k: int, K: int):
        self._trainer, self._k = trainer, k
        n = np.ones(K)
        n[k] = trainer.data.n[0]
        self.data = SimpleNamespace(n=n)

    def __getattr__(self, name):
        return getattr(self._trainer, name)

    def _row(self, a):
        return None if a is None else np.asarray(a)[self._k:self._k + 1]

    def gradients(self, W, round=0, label="dpsgd", silos=None):
        out = np.full(np.shape(W), np.nan)
        out[self._k:self._k + 1] = self._trainer.gradients(
            self._row(W), round=round, label=label, silos=self._row(silos))
        return out

    def run(self, W0, anchor=None, lam=0.0, round=0, label=None, silos=None):
        out = np.array(W0, dtype=float, copy=True)
        lam = lam if np.ndim(lam) == 0 else self._row(lam)
        out[self._k:self._k + 1] = self._trainer.run(
            self._row(W0), self._row(anchor), lam, round=round, label=label,
            silos=self._row(silos))
        return out


def own_step(algorithm, state: SiloState, view, trainer, round: int, k: int):
    """`algorithm.silo_step` of silo k on its one-silo `state` and `trainer`, `view` its
    cut of the broadcast (`silo_message`): (state, update). Weight Erosion's scheduled
    step masks and counts all K silos: it runs on a K-row stand-in (`_AsRowK`, only row k
    computed) and silo k keeps its own row of the result. (ULDP's networked silo sends a
    share instead: `ULDP.share_step`, called by the silo program; the simulator's per-silo
    hosting refuses uldp.)"""
    if not erosion_schedule(algorithm):
        return algorithm.silo_step(state, view, trainer, round)
    K = len(algorithm.present(round))
    wide = dataclasses.replace(state, params=np.repeat(state.params, K, axis=0))
    wide, update = algorithm.silo_step(wide, view, _AsRowK(trainer, k, K), round)
    row = slice(k, k + 1)
    epochs = np.asarray(update.epochs, float)
    update = dataclasses.replace(update, grads=update.grads[row],
                                 epochs=epochs[row] if epochs.ndim else epochs)
    return dataclasses.replace(wide, params=wide.params[row]), update


def encode_message(algorithm, message) -> np.ndarray:
    """The broadcast as one flat float64 vector: (P,), IFCA's (G·P,), Mocha's (K·P + K²,),
    PrivateKT's (P + K_kt,) model and indices of this round's public KT samples, SCAFFOLD's
    (2P,) model and control variate."""
    fam = _family(algorithm)
    if fam == "scaffold":
        return np.concatenate([message[0], message[1]]).astype(np.float64)
    if fam == "mocha":
        W, omega = message[:2]
        return np.concatenate([np.ravel(W), np.ravel(omega)]).astype(np.float64)
    if fam == "kt":
        return np.concatenate([message.params, message.kt]).astype(np.float64)
    if fam == "autolam":  # [model, λ per silo] (∞ as −1: the wire is finite)
        from silofl.algorithms.auto_lambda import wire_lam
        return np.concatenate([message.params, wire_lam(message.lam)]).astype(np.float64)
    return np.ravel(np.asarray(message, dtype=np.float64))


def decode_message(algorithm, flat: np.ndarray, K: int, P: int):
    """Inverse of `encode_message` for K silos and P parameters."""
    fam = _family(algorithm)
    if fam == "scaffold":
        return flat[:P], flat[P:]
    if fam == "mocha":
        return flat[:K * P].reshape(K, P), flat[K * P:].reshape(K, K)
    if fam == "ifca":
        return flat.reshape(-1, P)
    if fam == "kt":  # what a client's step reads: the model and the KT indices
        from silofl.algorithms.privatekt import KTServer
        C = algorithm.num_classes
        idx = flat[P:]
        kt = idx.astype(np.int64) if np.all(idx == np.floor(idx)) else np.full(len(idx), -1)
        return KTServer(flat[:P], kt, np.zeros(0, np.int64), np.zeros((0, C)))
    if fam == "autolam":
        from silofl.algorithms.auto_lambda import AutoMessage, unwire_lam
        return AutoMessage(flat[:P], unwire_lam(flat[P:]))
    return flat


def server_view(algorithm, decoded):
    """A server-state stand-in built from a decoded broadcast, enough for
    `personal_models` at a silo (IFCA: the cluster models; Mocha: W; SCAFFOLD: x and c;
    others: the model)."""
    from silofl.algorithms.base import ServerState
    fam = _family(algorithm)
    if fam == "ifca":
        from silofl.algorithms.ifca import ClusterServer
        return ClusterServer(decoded)
    if fam == "kt":
        return decoded
    if fam == "scaffold":
        from silofl.algorithms.scaffold import ScaffoldServer
        return ScaffoldServer(*decoded)
    if fam == "autolam":  # the λ decides whether a silo's model is the shared one
        from silofl.algorithms.auto_lambda import AutoServer
        return AutoServer(decoded.params, lam=decoded.lam, used=decoded.lam)
    return ServerState(decoded[0] if fam == "mocha" else decoded)


def message_size(algorithm, K: int, P: int) -> int:
    fam = _family(algorithm)
    return {"mocha": K * P + K * K, "ifca": getattr(algorithm, "clusters", 1) * P,
            "kt": P + getattr(algorithm, "samples", 0), "scaffold": 2 * P,
            "autolam": P + K}.get(fam, P)


def encode_update(algorithm, update) -> np.ndarray | None:
    """One silo's update as a (1, M) row: IFCA [choice, Δ] (the choice is the DP-selected
    cluster, charged), Weight Erosion [epochs, lr, g] (public counters and its DP gradient),
    others the (1, P) row itself. None stays None (a round without upload)."""
    if update is None:
        return None
    fam = _family(algorithm)
    if fam == "ifca":
        return np.concatenate([update.choice[:, None].astype(float), update.delta], axis=1)
    if fam == "erosion":
        e = np.broadcast_to(np.asarray(update.epochs, float), (update.grads.shape[0],))
        return np.concatenate([e[:, None], np.full((len(e), 1), update.lr), update.grads], 1)
    if fam == "kt":  # [uploaded?, its K_kt randomized-response labels, β, lr, b]
        up = len(update.clients)
        labels = update.labels[0] if up else np.zeros(algorithm.samples)
        return np.concatenate([[up], labels, [update.beta, update.lr, update.batch]])[None]
    if fam == "ldp":  # [uploaded?, its clipped and noised change]
        up = len(update.clients)
        return np.concatenate([[up], update.delta[0] if up else
                               np.zeros(update.delta.shape[1])])[None].astype(np.float64)
    if fam == "autolam":  # [V, lr, T, q (the public noise header), Δ]
        return np.concatenate([update.header, update.delta], axis=1).astype(np.float64)
    return np.asarray(update, dtype=np.float64)


def check_row(algorithm, row: np.ndarray, *, lr: float, batch: int, n: int,
              round: int, silo: int = 0) -> str | None:
    """Why silo `silo`'s (1, M) row is malformed for the algorithm (None: fine). The public
    fields a silo sends along must be the ones the server expects: IFCA's cluster index an
    integer in [0, G); Weight Erosion's epoch counter ⌊(r − 1)·b/n⌋ (r: the round, or with
    count = "participated" the rounds the silo took part in, from the public schedule) and
    the job's lr; the local-DP flag 0/1, PrivateKT's labels classes in [0, C) and β, lr, b
    the job's."""
    fam, r = _family(algorithm), row[0]
    if fam == "ifca" and not (r[0] == int(r[0]) and 0 <= r[0] < algorithm.clusters):
        return f"cluster index {r[0]!r} is not one of the {algorithm.clusters} clusters"
    if fam == "erosion":
        used = round
        if algorithm.count == "participated" and erosion_schedule(algorithm):
            used = int(algorithm.taken_part(round)[silo])
        if r[0] != np.floor((used - 1) * batch / n) or r[1] != lr:
            return "epoch counter or step size differs from the job's"
    if fam == "autolam" and not (r[0] >= 0 and r[1] == lr and r[2] >= 1
                                 and r[2] == int(r[2]) and 0 < r[3] <= 1):
        return "noise variance, step size, steps per pass or sampling rate is not the job's"
    if fam in ("kt", "ldp") and r[0] not in (0.0, 1.0):
        return f"upload flag {r[0]!r} is not 0 or 1"
    if fam == "kt":
        labels, beta = r[1:-3], r[-3]
        if not (np.all(labels == np.floor(labels)) and np.all(labels >= 0)
                and np.all(labels < algorithm.num_classes)):
            return "labels are not classes of the task"
        if beta != algorithm.beta or r[-2] != lr or r[-1] != batch:
            return "β, lr or batch size differs from the job's"
    return None


def check_message(algorithm, decoded) -> str | None:
    """Why a decoded broadcast is malformed (None: fine): PrivateKT's KT indices must be
    distinct integers indexing the public set."""
    if _family(algorithm) == "kt":
        kt = decoded.kt
        n = len(algorithm.public)
        if len(set(kt.tolist())) != len(kt) or np.any(kt < 0) or np.any(kt >= n):
            return f"knowledge-transfer indices must be distinct, in [0, {n})"
    return None


def update_width(algorithm, P: int) -> int:
    return {"ifca": P + 1, "erosion": P + 2, "kt": getattr(algorithm, "samples", 0) + 4,
            "ldp": P + 1, "scaffold": 2 * P, "autolam": P + 4}.get(_family(algorithm), P)


def merge_updates(algorithm, rows: dict[int, np.ndarray | None], weights: dict[int, float],
                  K: int, round: int):
    """The server step's (update, weights) from the encoded rows of the silos k that answered
    (`rows[k]`, (1, M)): IFCA over the answering silos only; Weight Erosion and Mocha over all
    K silos (an absent silo: NaN gradient and `present` False / a zero change); the
    averaging methods over the answering silos' rows, weights renormalized over them."""
    ks = sorted(rows)
    fam = _family(algorithm)
    if any(rows[k] is None for k in ks):
        return None, np.array([weights[k] for k in ks], float)
    if not ks and fam in ("kt", "ldp"):
        raise ConfigError(f"{algorithm.name}: no silo is eligible for another upload (every "
                          "plan's uploads are spent); the run cannot go on")
    w = np.array([weights[k] for k in ks], float)
    if not ks:  # the averaging methods merge nothing; the others need a row to merge
        if fam not in ("mean", "scaffold"):
            raise ConfigError(f"{algorithm.name}: no silo answered round {round}; the "
                              "run cannot go on")
        return None, w
    R = np.concatenate([rows[k] for k in ks])
    if fam == "ifca":
        from silofl.algorithms.ifca import ClusterUpdate
        return ClusterUpdate(R[:, 1:], R[:, 0].astype(np.int64)), w
    if fam == "erosion":
        from silofl.algorithms.weight_erosion import ErosionUpdate
        P = R.shape[1] - 2
        grads, epochs = np.full((K, P), np.nan), np.zeros(K)
        grads[ks], epochs[ks] = R[:, 2:], R[:, 0]
        # who sent a row; always a mask under a schedule (its server step places newcomers)
        present = None if len(ks) == K and not erosion_schedule(algorithm) else \
            np.isin(np.arange(K), ks)
        return ErosionUpdate(grads, epochs, float(R[0, 1]), present, round), np.ones(K)
    if fam == "mocha":
        full = np.zeros((K, R.shape[1]))
        full[ks] = R
        return full, np.ones(K)
    if fam == "autolam":  # all K rows, NaN (weight 0) for the silos that did not answer
        from silofl.algorithms.auto_lambda import HEADER, AutoUpdate
        full, wk = np.full((K, R.shape[1]), np.nan), np.zeros(K)
        full[ks], wk[ks] = R, w
        header = np.nan_to_num(full[:, :HEADER])
        return AutoUpdate(full[:, HEADER:], header), wk
    if fam in ("kt", "ldp"):
        from silofl.algorithms.privatekt import KTUpdate, LDPUpdate
        up = [i for i, k in enumerate(ks) if R[i, 0] == 1]
        clients = np.array([ks[i] for i in up], dtype=np.int64)
        if fam == "ldp":
            return LDPUpdate(clients, R[up, 1:]), np.ones(len(up))
        labels = R[up, 1:-3].astype(np.int64)
        return KTUpdate(clients, labels, float(R[0, -3]), float(R[0, -2]),
                        int(R[0, -1])), np.ones(len(up))
    return R, w


def silo_randomness(mode: str, seed: int, name: str) -> Randomness:
    """Silo `name`'s own stream: secure, or seeded by (seed, CRC-32 of the name)."""
    if mode == "secure":
        return Randomness.secure()
    return Randomness.for_mode(mode, [int(seed), zlib.crc32(name.encode("utf-8"))])


def slice_state(state: SiloState, k: int) -> SiloState:
    """Silo k's share of a (K, ...) state: every array field's row k (kept 2-D)."""
    changes = {f.name: getattr(state, f.name)[k:k + 1] for f in dataclasses.fields(state)
               if isinstance(getattr(state, f.name), np.ndarray)
               and getattr(state, f.name).ndim >= 1}
    return dataclasses.replace(state, **changes)


def stack_states(parts: list[SiloState]) -> SiloState:
    """The (K, ...) state of silos given one by one (scalar fields from the first)."""
    first = parts[0]
    changes = {f.name: np.concatenate([getattr(p, f.name) for p in parts])
               for f in dataclasses.fields(first)
               if isinstance(getattr(first, f.name), np.ndarray)
               and getattr(first, f.name).ndim >= 1}
    return dataclasses.replace(first, **changes)


def per_silo_step(algorithm: Algorithm, silos: SiloState, message, trainers: list,
                  round: int):
    """`algorithm.silo_step` run by each silo on its own one-silo trainer (as the network
    does), results stacked: (state of K silos, (K, P) update or None)."""
    states, rows = [], {}
    ok = np.ones(len(trainers), bool)
    if local_dp_family(algorithm):  # eligible: plans covering one more upload
        from silofl.training import local_dp
        ok = np.array([local_dp.eligible(tr, algorithm.upload_event())[0] for tr in trainers])
    # the server's selection (local DP) or schedule (Weight Erosion), as a networked one asks
    asked = set(select_silos(algorithm, ok, round).tolist())
    for k, trainer in enumerate(trainers):
        if k not in asked:
            states.append(slice_state(silos, k))
            continue
        s, u = own_step(algorithm, slice_state(silos, k), silo_message(algorithm, message, k),
                        trainer, round, k)
        states.append(s)
        rows[k] = encode_update(algorithm, u)
    K = len(trainers)
    update, _ = merge_updates(algorithm, rows, dict.fromkeys(range(K), 1.0), K, round)
    return stack_states(states), update


def per_silo_trainers(fed, model, cfg, plans, ledgers) -> list:
    """One one-silo `LocalTrainer` per silo of `fed`, each with its own stream
    (`silo_randomness`) and ledger — what each silo process of a networked run hosts."""
    from silofl.runtime.rules import gradient_rule
    from silofl.runtime.sources import training_source
    from silofl.training.trainer import LocalTrainer
    mode = "secure" if cfg.private and cfg.noise == "secure" else "seeded"
    return [LocalTrainer(
        model=model, data=training_source([s], cfg.privacy_unit, cfg.max_rows_per_person,
                                          cfg.seed),
        rule=gradient_rule(cfg, [p]),
        batch_size=cfg.batch_size, steps_per_round=np.array([p.steps_per_pass]), lr=cfg.lr,
        l2=cfg.l2, rng=silo_randomness(mode, cfg.seed, s.name),
        ledgers=None if ledgers is None else [ledgers[k]])
        for k, (s, p) in enumerate(zip(fed.silos, plans))]

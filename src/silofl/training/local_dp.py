"""The client side of methods whose privacy comes from a local DP mechanism on what a
client uploads (PrivateKT, FedAvg with local DP on updates), not from DP-SGD.

Such a round, for the clients the server selected: charge each one's ledger for the
round's upload event (all can pay or none is charged), *then* read its data and train the
received model by plain (non-private) minibatch SGD; what leaves the client is only the
output of the local mechanism applied afterwards (by the algorithm). Reads go through
`SiloArrays.gather`, like every other read of private rows.

Eligibility: a client whose ledger cannot cover one more upload (its reservation for this
run is used up) is not eligible; the server never selects it, so nothing of it is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dp_accounting as dpa
import numpy as np

from silofl.errors import BudgetExceeded
from silofl.privacy.critical import deferred_signals

if TYPE_CHECKING:  # the trainer imports nothing of this module; annotations only
    from silofl.training.trainer import LocalTrainer

UPLOAD_LABEL = "ldp-upload"


def eligible(trainer: LocalTrainer, event: dpa.DpEvent) -> np.ndarray:
    """(N,) bool: the hosted clients whose budget covers one more `event` (all of them in
    the non-private mode, which has no ledgers)."""
    N = len(trainer.data.n)
    if trainer.ledgers is None:
        return np.ones(N, dtype=bool)
    ok = np.zeros(N, dtype=bool)
    for k, led in enumerate(trainer.ledgers):
        try:
            led.check(event, label=UPLOAD_LABEL)
            ok[k] = True
        except BudgetExceeded:
            pass
    return ok


def select(eligible_mask: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """The server's choice of round(fraction·N) clients (at least one) among the eligible,
    uniformly with public randomness; sorted indices (fewer if fewer are eligible)."""
    N = len(eligible_mask)
    m = max(1, int(np.floor(fraction * N + 0.5)))
    order = rng.permutation(N)
    return np.sort(order[eligible_mask[order]][:m])


def charge(trainer: LocalTrainer, clients: np.ndarray, event: dpa.DpEvent, round: int,
           label: str = UPLOAD_LABEL) -> None:
    """Charge `event` to each selected client's ledger before its data is read: every one
    is checked first, so either all are charged or none (BudgetExceeded)."""
    if trainer.ledgers is None:
        return
    for k in clients:
        trainer.ledgers[k].check(event, round=round, label=label)
    with deferred_signals():  # all the clients' charges, or a signal waits until they are
        for k in clients:
            trainer.ledgers[k].charge(event, round=round, label=label)


def local_sgd(trainer: LocalTrainer, W0: np.ndarray, clients: np.ndarray) -> np.ndarray:
    """Non-private minibatch SGD for the selected clients from W0 (k, P): client c takes
    `trainer.steps_per_round[c]` steps (local_epochs passes) of batches of
    `trainer.batch_size` rows in reshuffled epochs, w ← w − lr·(mean gradient + l2·w).
    Returns (k, P). Call `charge` first."""
    W = np.array(W0, dtype=float, copy=True)
    clients = np.asarray(clients, dtype=np.int64)
    if clients.size == 0:
        return W
    b = int(trainer.batch_size)
    n = trainer.data.n[clients]
    steps = trainer.steps_per_round[clients]
    S = int(steps.max())
    order = np.zeros((len(clients), S * b), dtype=np.int64)
    for j, (nj, sj) in enumerate(zip(n, steps)):  # concatenated epoch permutations
        need = int(sj) * b
        perms = [np.argsort(trainer.rng.uniform(int(nj))) for _ in range(-(-need // nj))]
        order[j, :need] = np.concatenate(perms)[:need]
    for s in range(S):
        active = steps > s
        sel = np.flatnonzero(active)
        idx = order[sel, s * b:(s + 1) * b]
        X, y, _ = trainer.data.gather(clients[sel], idx)
        mask = np.ones(idx.shape)
        g = trainer.model.grad_sum(W[sel], X, y, mask) / b
        if trainer.l2:
            g = g + trainer.l2 * W[sel]
        W[sel] = W[sel] - trainer.lr * g
    return W

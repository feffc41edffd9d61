"""The silo side of ULDP-FL weighting (`algorithms.uldp`): one weighted clipped gradient
sum over *all* of a silo's persons per round, charged first, with the silo's share of the
aggregate's noise.

Silo k's release in a round, at the broadcast model w:

    u_k = Σ_p w_{p,k} · (1/r_p) Σ_{i ∈ p} clip_C(g_i(w))  +  N(0, σ²C²/K · I)

r_p the rows of person p in silo k, w_{p,k} ∈ [0, 1] the person's weight in this silo (Σ_k
w_{p,k} ≤ 1 over the consortium). Each row's weight w_{p,k}/r_p goes into the models'
float-mask clipped sum (`models.base.Model.clipped_grad_sum`), so person p adds a vector of
norm ≤ w_{p,k}·C. By default every person of every silo takes part every round; with a
sampling rate q < 1 a person takes part in a round in every silo or in none
(`consortium_sample`: a keyed PRF of the person's id and the round), their weight set to 0
otherwise. `max_rows_per_person` does not apply (all of a person's rows are averaged).

Reads go through the person source's `gather`, after every hosted silo's ledger has been
checked and charged (all or none).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import dp_accounting as dpa
import numpy as np

from silofl.errors import ConfigError
from silofl.privacy.uldp import ULDP_LABEL

if TYPE_CHECKING:  # annotations only
    from silofl.models.base import Model
    from silofl.training.persons import PersonSource
    from silofl.training.trainer import LocalTrainer

#: rows per gather when a silo sums over all its persons (bounds memory on large silos)
ROW_CHUNK = 8192


def consortium_sample(key: bytes, ids: np.ndarray, round: int, q: float) -> np.ndarray:
    """Which persons take part in `round`: the same decision in every silo that holds them.

    u_p = BLAKE2b-64 keyed by the consortium secret `key` over (id, round), as a fraction
    of 2^64; person p is sampled iff u_p < q. Every silo computes it for its own persons;
    the server, without the key, cannot.

    Parameters
    ----------
    key : bytes
        The consortium secret (16 to 64 bytes).
    ids : numpy.ndarray
        Shape (n,): person ids (pseudonyms in a deployment; equal ids = the same person).
    round : int
        The round.
    q : float
        The sampling rate in (0, 1].

    Returns
    -------
    numpy.ndarray
        Shape (n,) bool.
    """
    if q >= 1.0:
        return np.ones(len(ids), dtype=bool)
    tail = b"\x1f" + int(round).to_bytes(8, "little", signed=True)
    words = [int.from_bytes(hashlib.blake2b(str(i).encode() + tail, key=key,
                                            digest_size=8).digest(), "little") for i in ids]
    u = (np.array(words, dtype=np.uint64) >> np.uint64(11)).astype(float) / 2.0 ** 53
    return u < q


def row_weights(source: PersonSource, k: int, person_weights: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """All rows of silo k and their weights w_{p,k}/r_p.

    Parameters
    ----------
    source : PersonSource
        The hosted silos' rows grouped by person.
    k : int
        The silo (row of the source).
    person_weights : numpy.ndarray
        Shape (n_persons_k,): w_{p,k} in the person order of the source (`PersonIndex`:
        sorted person ids).

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        Row indices (1, n_rows) int64 and weights (1, n_rows) float64.
    """
    n = int(source.n[k])
    w = np.asarray(person_weights, dtype=float)
    if w.shape != (n,):
        raise ConfigError(f"uldp: silo {k} has {n} persons but {w.shape} person weights; "
                          "give one weight per person, in sorted person-id order")
    idx, inv_r = source.everyone(k)  # all rows, 1/r_p each
    starts = source.index.starts[k, : n + 1]
    person = np.searchsorted(starts, idx[0], side="right") - 1
    return idx, inv_r * w[person][None, :]


def weighted_sums(model: Model, W: np.ndarray, source: PersonSource,
                  weights: list[np.ndarray], clip: float | None) -> np.ndarray:
    """Σ_p w_{p,k}·(1/r_p)Σ_{i∈p} clip_C(g_i) for every hosted silo k (no noise, no charge:
    callers charge first; the sensitivity tests call it directly).

    Parameters
    ----------
    model : Model
    W : numpy.ndarray
        Shape (K, P): the model each silo evaluates at.
    source : PersonSource
        The K hosted silos' rows grouped by person.
    weights : list of numpy.ndarray
        K arrays (n_persons_k,) of person weights.
    clip : float or None
        C; None: no clipping (the non-private mode).

    Returns
    -------
    numpy.ndarray
        Shape (K, P).
    """
    K = len(source.n)
    if len(weights) != K:
        raise ConfigError(f"uldp: {len(weights)} weight arrays for {K} hosted silos")
    out = np.zeros(np.shape(W), dtype=float)
    for k in range(K):
        idx, w = row_weights(source, k, weights[k])
        silo = np.array([k])
        for lo in range(0, idx.shape[1], ROW_CHUNK):  # the sum is linear: chunk it
            sl = slice(lo, lo + ROW_CHUNK)
            X, y, sq = source.gather(silo, idx[:, sl])
            if clip is None:
                out[k] += model.grad_sum(W[k: k + 1], X, y, w[:, sl])[0]
            else:
                aux = {} if sq is None else {"x_sqnorm": sq}
                out[k] += model.clipped_grad_sum(W[k: k + 1], X, y, w[:, sl], clip, **aux)[0]
    return out


def silo_release(trainer: LocalTrainer, W: np.ndarray, weights: list[np.ndarray],
                 event: dpa.DpEvent | None, share_std: float, round: int) -> np.ndarray:
    """Every hosted silo's ULDP share u_k: charge `event` to all ledgers (all or none),
    then read, sum and add N(0, share_std²) per coordinate.

    Parameters
    ----------
    trainer : LocalTrainer
        Hosts the silos; its data must be a `PersonSource` (unit = "person").
    W : numpy.ndarray
        Shape (K, P): the broadcast model, one row per hosted silo.
    weights : list of numpy.ndarray
        K arrays (n_persons_k,) of person weights.
    event : dp_accounting.DpEvent or None
        What the round costs each silo (`privacy.uldp.round_event`); None: non-private.
    share_std : float
        σC/√K, the std of each silo's share of the aggregate's noise (0: non-private).
    round : int
        The round, for the ledger.

    Returns
    -------
    numpy.ndarray
        Shape (K, P): the shares, each for the SecAgg+ sum only.
    """
    source = trainer.data
    if not hasattr(source, "everyone") or not hasattr(source, "index"):
        raise ConfigError("uldp weights persons: set [privacy] unit = \"person\" and [data] "
                          "person_column (the trainer reads rows, not persons)")
    if event is not None:
        ledgers = trainer.private_ledgers
        for led in ledgers:  # every hosted silo can pay, or none is charged
            led.check(event, round=round, label=ULDP_LABEL)
        for led in ledgers:
            led.charge(event, round=round, label=ULDP_LABEL)
    clip = float(trainer.rule.clip) if trainer.rule.private else None
    sums = weighted_sums(trainer.model, W, source, weights, clip)  # type: ignore[arg-type]
    if share_std > 0:
        sums += trainer.rng.normal(sums.shape) * share_std
    trainer.steps_done += 1
    return sums


__all__ = ["ROW_CHUNK", "consortium_sample", "row_weights", "silo_release", "weighted_sums"]

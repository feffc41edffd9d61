"""The person-level privacy unit: DP-SGD that protects all rows of one person of a silo.

A silo's rows are grouped by the person they belong to (`[data] person_column`). Each step
Poisson-samples *persons* (rate q = b / n_persons, the same sampler as example level), reads
the rows of every sampled person (at most m of them, a uniformly random subset when
`max_rows_per_person` = m > 0), and gives each read row the weight 1/r, r the rows read of
its person. The models' clipped sum is then Σ_i w_i·clip_C(g_i) (`models.base.Model`): each
person adds the *average* of their rows' clipped gradients, a vector of norm ≤ C. Adding or
removing every row of one person therefore moves the sum by at most C, exactly what one
example moves it by at example level, and the noise N(0, σ²C²) and the division by the
expected batch q·n_persons are unchanged. The accounting is the same Poisson-subsampled
Gaussian event with q over persons (`privacy.accounting.dpsgd_event`): the events are the
example-level ones, the *unit* they protect is the person.

Which rows of a person a capped step reads does not enter the guarantee (any subset keeps
the person's contribution ≤ C), so that choice uses ordinary (non-DP) randomness -- but its
seed is public, so a person's choice must depend on that person alone: it is keyed by a
hash of the person's id and one draw per step, never by their position in the batch (which
moves when another person is sampled, and would move the others' rows with it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PersonIndex:
    """Where each person's rows lie in silos whose rows are sorted by person.

    Attributes
    ----------
    starts : numpy.ndarray
        Shape (K, P_max + 1) int64: person p of silo k owns rows starts[k, p] to
        starts[k, p + 1] − 1 (padded persons own no rows).
    n : numpy.ndarray
        Shape (K,) int64: persons per silo.
    cap : int
        The most rows of one person a step reads (0: all of them).
    keys : numpy.ndarray or None
        Shape (K, P_max) uint64: a hash of each person's id (keys a capped person's rows).
    """

    starts: np.ndarray
    n: np.ndarray
    cap: int = 0
    keys: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def group(cls, ids: list[np.ndarray], cap: int = 0) -> tuple[PersonIndex, list[np.ndarray]]:
        """Group each silo's rows by person.

        Parameters
        ----------
        ids : list of numpy.ndarray
            One (n_k,) array of person ids per silo (any sortable values).
        cap : int, default 0
            `max_rows_per_person` (0: all rows of a sampled person).

        Returns
        -------
        (PersonIndex, list of numpy.ndarray)
            The index and, per silo, the (n_k,) row order that sorts its rows by person
            (apply it to the silo's X and y before stacking them).
        """
        if cap < 0:
            raise ValueError(f"max_rows_per_person must be ≥ 0, got {cap}")
        orders, counts, uniq = [], [], []
        for a in ids:
            a = np.asarray(a)
            if a.ndim != 1 or a.size == 0:
                raise ValueError("every silo needs a (n,) person id per training row")
            u, inverse, count = np.unique(a, return_inverse=True, return_counts=True)
            orders.append(np.argsort(inverse, kind="stable"))
            counts.append(count)
            uniq.append(u)
        n = np.array([len(c) for c in counts], dtype=np.int64)
        starts = np.zeros((len(ids), int(n.max()) + 1), dtype=np.int64)
        keys = np.zeros((len(ids), int(n.max())), dtype=np.uint64)
        for k, c in enumerate(counts):
            starts[k, 1: len(c) + 1] = np.cumsum(c)
            starts[k, len(c) + 1:] = starts[k, len(c)]
            if cap:
                keys[k, : len(c)] = [_id_key(v) for v in uniq[k].tolist()]
        return cls(starts, n, int(cap), keys if cap else None), orders

    def take(self, silos: np.ndarray) -> PersonIndex:
        """The index of the silos `silos` (k,) alone (private tuning's pseudo-silos)."""
        return PersonIndex(self.starts[silos], self.n[silos], self.cap,
                           None if self.keys is None else self.keys[silos])

    def rows_per_person(self) -> list[np.ndarray]:
        """Per silo, each person's number of rows (n_persons,) (private: for tests and the
        silo's own use, never an output)."""
        return [np.diff(self.starts[k, : int(self.n[k]) + 1]) for k in range(len(self.n))]

    def expand(self, silos: np.ndarray, persons: np.ndarray, mask: np.ndarray,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The rows a step reads for sampled persons, and their weights.

        Parameters
        ----------
        silos : numpy.ndarray
            Shape (k,): the silo (row of this index) of each batch row.
        persons : numpy.ndarray
            Shape (k, M) int: sampled person indices (`training.sampling.poisson_batches`).
        mask : numpy.ndarray
            Shape (k, M) bool: which entries of `persons` are real.
        rng : numpy.random.Generator
            Picks a capped person's rows (not a privacy-relevant draw).

        Returns
        -------
        (numpy.ndarray, numpy.ndarray)
            Row indices (k, R) int64 into the silos' person-sorted rows and weights (k, R)
            float64: 1/r on each of a person's r rows read, 0 on padding.
        """
        silos = np.asarray(silos)
        k, M = persons.shape
        st = self.starts[silos[:, None], persons]                  # (k, M)
        total = self.starts[silos[:, None], persons + 1] - st
        total = np.where(mask, total, 0)
        read = total if not self.cap else np.minimum(total, self.cap)
        per_silo = read.sum(1)
        R = max(int(per_silo.max()) if k else 0, 1)
        flat = read.ravel()
        n_read = int(flat.sum())
        owner = np.repeat(np.arange(k * M), flat)                   # batch entry of each row
        first = np.cumsum(flat) - flat
        within = np.arange(n_read) - np.repeat(first, flat)         # 0..r−1 inside a person
        tot = total.ravel()[owner]
        if self.cap:  # a random cyclic window of the person's rows (any subset keeps ≤ C),
            # keyed by the person's id and one draw per step, not by batch position
            if self.keys is None:
                raise ValueError("a capped PersonIndex needs its person keys (group())")
            salt = np.uint64(int(rng.integers(0, 2 ** 63)))
            u = _uniform(self.keys[silos[:, None], persons].ravel(), salt)
            offset = np.floor(u * np.maximum(total.ravel(), 1)).astype(np.int64)
            within = (within + offset[owner]) % np.maximum(tot, 1)
        row = st.ravel()[owner] + within
        silo_of = owner // M
        pos = np.arange(n_read) - np.repeat(np.cumsum(per_silo) - per_silo, per_silo)
        idx = np.zeros((k, R), dtype=np.int64)
        weights = np.zeros((k, R))
        idx[silo_of, pos] = row
        weights[silo_of, pos] = 1.0 / read.ravel()[owner]
        return idx, weights


def _id_key(person_id: object) -> int:
    """A 64-bit hash of a person id (an int and its decimal text alike)."""
    return int.from_bytes(hashlib.blake2b(str(person_id).encode(), digest_size=8).digest(),
                          "little")


def _uniform(keys: np.ndarray, salt: np.uint64) -> np.ndarray:
    """(n,) uniforms in [0, 1), one per key, from splitmix64(key ^ salt)."""
    with np.errstate(over="ignore"):
        x = keys ^ salt
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / 2.0 ** 53


class PersonSource:
    """A trainer data source whose units are persons: `n` (K,) counts persons, batches of
    person indices are expanded to their rows (`expand`) before `gather` reads them.

    Parameters
    ----------
    rows : SiloSource
        The silos' training rows, each silo's sorted by person (`PersonIndex.group`).
    index : PersonIndex
        Where each person's rows lie.
    seed : int, default 0
        Seeds the choice of a capped person's rows (not a privacy-relevant draw).
    """

    def __init__(self, rows: Any, index: PersonIndex, seed: int = 0) -> None:
        self.rows, self.index = rows, index
        self.n = index.n
        self._rng = np.random.default_rng([int(seed), 23])

    def expand(self, silos: np.ndarray, persons: np.ndarray,
               mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows (k, R) and weights (k, R) of the sampled persons (`PersonIndex.expand`)."""
        return self.index.expand(silos, persons, mask, self._rng)

    @property
    def stream_state(self) -> dict:
        """The state of the capped-row choice stream (a checkpoint keeps it, so that a
        resumed run reads the rows an uninterrupted one reads)."""
        return dict(self._rng.bit_generator.state)

    @stream_state.setter
    def stream_state(self, state: dict) -> None:
        self._rng.bit_generator.state = state

    def gather(self, silos: np.ndarray,
               idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Rows idx (k, R) (already expanded) of silos `silos` (k,): X, y, ‖x‖² or None."""
        return self.rows.gather(silos, idx)

    def everyone(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """All rows of silo k with their weights: (1, n_rows) indices and weights, each
        person's rows weighing 1/r in all (a private selection's score over persons)."""
        p = np.arange(int(self.n[k]))[None, :]
        cap = self.index.cap
        full = PersonIndex(self.index.starts, self.index.n, 0) if cap else self.index
        return full.expand(np.array([k]), p, np.ones(p.shape, dtype=bool), self._rng)

    def take(self, silos: np.ndarray) -> PersonSource:
        """The silos `silos` (k,) alone (a copy of their rows: private tuning's trials)."""
        out = PersonSource(self.rows.take(silos), self.index.take(silos))
        out._rng = self._rng
        return out

"""How many silos each person appears in: a private overlap histogram, and per-person
weights across silos.

**Who sees what.** Each silo pseudonymizes its person ids with the consortium key
(`silofl.data.pseudonyms`) and hands its *set* of pseudonyms to a linkage party. The
linkage party sees pseudonyms, never identities, and does not hold the key (with it, ids
could be guessed and tested). It is trusted with the exact overlap it computes; only the
noisy histogram below leaves it.

**The released statistic.** h[m] = number of persons present in exactly m silos,
m = 1..K (K, the number of silos, is public). Neighbouring data, as each silo's own
guarantee defines it: one person added to or removed from one silo. If that person is in
j other silos, their multiplicity moves between j and j + 1: bin j loses (gains) one and
bin j + 1 gains (loses) one — two released bins for 1 ≤ j ≤ K − 1, one bin for j = 0
(bin 0 is not released). So ‖h − h'‖₂ ≤ √2, the L2 sensitivity, and adding
N(0, (z·√2)²) to every bin is the Gaussian mechanism with noise multiplier z:
`dp_accounting.GaussianDpEvent(z)` per silo. (Adding a record of a person the silo
already holds leaves the set unchanged, so the bound also holds at the example level.)
The event is charged to every silo's ledger before anything is computed — all silos are
checked first, so either all pay or none is charged and nothing is released.

**Per-person weights.** ULDP-FL style weighting (Kato et al., VLDB 2024) bounds a
person's total contribution to a weighted sum across silos: w_{p,k} = n_{k,p} / Σ_j n_{j,p}
(n_{k,p} = rows of person p at silo k) sums to one over silos. Giving silo k its weights
tells it, for each of its own persons, how many records the other silos hold about them
(n_{k,p}/w_{p,k} − n_{k,p}) — a fact about other silos' data that no DP mechanism covers
here. The data-independent alternative is the uniform weight 1/M for the declared M
(`uniform_weight`), which needs no linkage at all.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np

from silofl.errors import PrivacyError
from silofl.privacy import calibration
from silofl.privacy.ledger import Ledger
from silofl.privacy.randomness import Randomness

#: L2 sensitivity of the multiplicity histogram (module docstring)
SENSITIVITY = math.sqrt(2.0)


def multiplicities(sets: Mapping[str, Iterable[Hashable]]) -> Counter:
    """Pseudonym → number of silos holding it (exact: stays with the linkage party).

    Parameters
    ----------
    sets : mapping of str to iterable of hashable
        Silo name → its pseudonyms (repeats, e.g. one per row, count once).

    Returns
    -------
    collections.Counter
        Pseudonym → multiplicity in 1..K.
    """
    out: Counter = Counter()
    for members in sets.values():
        out.update(set(members))
    return out


def histogram(sets: Mapping[str, Iterable[Hashable]]) -> np.ndarray:
    """Exact histogram of multiplicities (never released as is; see `release_overlap`).

    Parameters
    ----------
    sets : mapping of str to iterable of hashable
        Silo name → the (pseudonymous) person keys of that silo, K silos.

    Returns
    -------
    numpy.ndarray of int64, shape (K,)
        Entry m − 1 = number of persons present in exactly m of the K silos.
    """
    k = len(sets)
    counts = np.bincount(np.fromiter(multiplicities(sets).values(), dtype=np.int64),
                         minlength=k + 1)
    return counts[1:k + 1].astype(np.int64)


def overlap_event(noise_multiplier: float) -> dpa.DpEvent:
    """The privacy event of one noisy overlap histogram, charged to every silo.

    Parameters
    ----------
    noise_multiplier : float
        σ of the Gaussian noise in units of the histogram's L2 sensitivity.

    Returns
    -------
    dp_accounting.DpEvent
        ``GaussianDpEvent(noise_multiplier)``.

    Raises
    ------
    PrivacyError
        The multiplier is not a positive finite number.
    """
    if not (isinstance(noise_multiplier, (int, float)) and noise_multiplier > 0
            and math.isfinite(noise_multiplier)):
        raise PrivacyError(f"the overlap histogram's noise multiplier must be a positive "
                           f"number, got {noise_multiplier!r}")
    return dpa.GaussianDpEvent(float(noise_multiplier))


def noise_for(epsilon: float, delta: float) -> float:
    """Smallest noise multiplier z whose overlap release alone is (ε, δ)-DP per silo.

    Parameters
    ----------
    epsilon, delta : float
        The share of each silo's budget spent on the release.

    Returns
    -------
    float
        z; the noise std per bin is z·√2 persons.
    """
    return calibration.calibrate(dpa.GaussianDpEvent, epsilon, delta)


@dataclass(frozen=True)
class OverlapRelease:
    """A released overlap histogram.

    Attributes
    ----------
    noisy : numpy.ndarray of float, shape (K,)
        Noisy count of persons present in exactly m silos, m = 1..K.
    noise_multiplier : float
        z of the charged `GaussianDpEvent`.
    std : float
        Noise standard deviation per bin (persons): z·√2.
    silos : tuple of str
        The K silos, in the order of the sets given.
    """

    noisy: np.ndarray
    noise_multiplier: float
    std: float
    silos: tuple[str, ...]

    @property
    def event(self) -> dpa.DpEvent:
        """What each silo was charged."""
        return overlap_event(self.noise_multiplier)

    def counts(self) -> np.ndarray:
        """(K,) the noisy counts rounded and clipped at 0 (post-processing: free)."""
        return np.maximum(np.rint(self.noisy), 0).astype(np.int64)

    def to_dict(self) -> dict:
        """JSON-ready description (the noisy figures only)."""
        return {"persons_in_exactly_m_silos": [float(v) for v in self.noisy],
                "m": list(range(1, len(self.noisy) + 1)), "noise_std": self.std,
                "noise_multiplier": self.noise_multiplier, "sensitivity_l2": SENSITIVITY,
                "silos": list(self.silos)}


def release_overlap(sets: Mapping[str, Iterable[Hashable]], ledgers: Sequence[Ledger],
                    noise_multiplier: float, rng: Randomness, *, round: int = -1,
                    label: str = "overlap") -> OverlapRelease:
    """Charge every silo, then release the noisy multiplicity histogram.

    Parameters
    ----------
    sets : mapping of str to iterable of hashable
        Silo name → its pseudonyms (at the linkage party).
    ledgers : sequence of Ledger
        One ledger per silo of `sets` (matched by `Ledger.silo`).
    noise_multiplier : float
        z > 0: noise std z·√2 per bin.
    rng : Randomness
        The noise stream (`Randomness.secure()` for deployments).
    round, label
        Written on each ledger line.

    Returns
    -------
    OverlapRelease

    Raises
    ------
    PrivacyError
        Ledgers that do not match the silos one to one.
    BudgetExceeded
        A silo cannot pay: no silo is charged and nothing is computed.
    """
    event = overlap_event(noise_multiplier)
    names = tuple(sets)
    by_name = {led.silo: led for led in ledgers}
    if len(by_name) != len(ledgers) or set(by_name) != set(names):
        raise PrivacyError(
            f"release_overlap needs exactly one ledger per silo: silos {sorted(names)}, "
            f"ledgers {sorted(led.silo for led in ledgers)}")
    order = [by_name[n] for n in names]
    for led in order:  # all silos can pay, or none is charged
        led.check(event, round=round, label=label)
    for led in order:
        led.charge(event, round=round, label=label)
    exact = histogram(sets)
    std = float(noise_multiplier) * SENSITIVITY
    noisy = exact + std * np.asarray(rng.normal(len(names)), dtype=float)
    return OverlapRelease(noisy, float(noise_multiplier), std, names)


def record_weights(rows: Mapping[str, Sequence[Hashable]]) -> dict[str, dict[Hashable, float]]:
    """Record-proportion weights w_{p,k} = n_{k,p} / Σ_j n_{j,p} (sum to 1 over silos).

    Parameters
    ----------
    rows : mapping of str to sequence of hashable
        Silo name → the pseudonym of each of its rows, shape (n_k,).

    Returns
    -------
    dict of str to dict
        Silo name → {pseudonym: w_{p,k}} for that silo's persons. Handing silo k its
        dict discloses to it the other silos' record counts of its persons (module
        docstring); `uniform_weight` is the data-independent alternative.
    """
    per_silo = {name: Counter(list(r)) for name, r in rows.items()}
    total: Counter = Counter()
    for c in per_silo.values():
        total.update(c)
    return {name: {p: n / total[p] for p, n in c.items()} for name, c in per_silo.items()}


def uniform_weight(declared_m: int) -> float:
    """The data-independent weight of each person at each silo.

    Parameters
    ----------
    declared_m : int
        The declared M ≥ 1: the most silos one person is seen by.

    Returns
    -------
    float
        1/M: any person in at most M silos gets a total weight ≤ 1.
    """
    if isinstance(declared_m, bool) or not isinstance(declared_m, int) or declared_m < 1:
        raise PrivacyError(f"the declared number of silos per person must be an integer "
                           f"≥ 1, got {declared_m!r}")
    return 1.0 / declared_m

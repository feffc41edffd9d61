"""The range of privacy targets silofl accepts, checked in one place.

Why these bounds:

* δ < 0.5. A mechanism that publishes a random half of the records outright satisfies
  (0, 0.5)-DP, so δ ≥ 0.5 promises nothing; and calibrating against it drives the noise
  multiplier towards 0, where the PLD accountant's grid (one point per 1e-5 of privacy
  loss) grows without bound and runs out of memory.
* 0 < ε ≤ 100. ε = 100 already allows a likelihood ratio of e^100 ≈ 2.7e43 between
  neighbouring datasets, i.e. no protection; beyond ~709 the Gaussian trade-off
  Φ(..) − e^ε Φ(..) overflows a float, and σ falls below the accountants' working range.
  `silofl account` uses the same ceiling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from silofl.errors import PrivacyError

#: The neighbouring relation of every example-level guarantee (a run's cards and reports)
ADJACENCY = ("per row: add/remove one record (example-level DP within each silo; each "
             "silo's guarantee covers the records in its own data)")
#: ... and of every person-level guarantee ([privacy] unit = "person")
PERSON_ADJACENCY = ("per person: add/remove all rows of one person in one silo (person-level "
                    "DP within each silo; each silo's guarantee covers the persons in its "
                    "own data, whatever number of rows each has)")
#: what every job's guarantees take as public or leave unprivatized (cards and reports)
ASSUMPTIONS = (
    "Silo sizes n_k (rows; at the person level persons, and rows too) are treated as "
    "public: they set the sampling rate q = b/n_k (n_k in the unit sampled), the noise "
    "calibration, the averaging weights (weighted = true) and IFCA's score sensitivity.",
    "Per-round test metrics are computed on each silo's held-out test rows for the "
    "researcher and are not privatized: release the models, not those metrics. The same "
    "holds for the baselines beside them in summary.json (majority-class rate, test-label "
    "variance, positive rate) and the per-silo test sizes.",
    "DP noise is drawn in floating point (the usual floating-point caveat of Mironov 2012 "
    "applies).",
)
EPSILON_MAX = 100.0
DELTA_MAX = 0.5


def _number(value: Any, name: str, where: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise PrivacyError(f"{where}{name} must be a number, got {value!r}") from None
    if math.isnan(v):
        raise PrivacyError(f"{where}{name} must be a number, got nan")
    return v


def check_epsilon(epsilon: Any, where: str = "", name: str = "epsilon") -> float:
    """`epsilon` as a float in (0, EPSILON_MAX]; PrivacyError naming `where` otherwise.

    Parameters
    ----------
    epsilon : the value (any number-like).
    where : a prefix naming the setting, e.g. ``"'privacy.' "`` or ``"--"``.
    name : the setting's name inside `where`.
    """
    e = _number(epsilon, name, where)
    if not e > 0:
        raise PrivacyError(f"{where}{name} must be positive, got {e:g}: ε = 0 would need "
                           "infinite noise; use e.g. epsilon = 1.0 (smaller is more private)")
    if not e <= EPSILON_MAX:
        raise PrivacyError(
            f"{where}{name} must be in (0, {EPSILON_MAX:g}], got {e:g}: ε above "
            f"{EPSILON_MAX:g} protects nobody (a likelihood ratio of e^{EPSILON_MAX:g}) and "
            "makes the noise calibration overflow; use e.g. epsilon = 1.0 (smaller is "
            "more private)")
    return e


def check_delta(delta: Any, where: str = "", name: str = "delta") -> float:
    """`delta` as a float in (0, DELTA_MAX); PrivacyError naming `where` otherwise."""
    d = _number(delta, name, where)
    if not d > 0:
        raise PrivacyError(f"{where}{name} must be positive, got {d:g}: the Gaussian "
                           "mechanism needs δ > 0; use a value well below 1/n, e.g. "
                           "delta = 1e-5")
    if not d < DELTA_MAX:
        raise PrivacyError(
            f"{where}{name} must be in (0, {DELTA_MAX:g}), got {d:g}: δ ≥ {DELTA_MAX:g} is "
            "met by publishing half the records outright (and exhausts the accountant's "
            "memory); use a value well below 1/n, e.g. delta = 1e-5")
    return d


def check_target(epsilon: Any, delta: Any, where: str = "") -> tuple[float, float]:
    """Both checks: (ε, δ) as floats, or PrivacyError naming the setting."""
    return check_epsilon(epsilon, where), check_delta(delta, where)


@dataclass(frozen=True)
class PrivacyTarget:
    """A silo's own (ε, δ) for example-level DP on its own records.

    Parameters
    ----------
    epsilon : float
        ε > 0 (dimensionless; smaller is more private). A job accepts 0 < ε ≤ 100,
        checked when it is planned, before any data is read.
    delta : float
        δ in (0, 1); a job accepts δ < 0.5. Use a value well below 1/n for n records
        (planning warns at δ ≥ 1/n).

    Raises
    ------
    PrivacyError
        ε not a positive finite number, or δ outside (0, 1).

    Notes
    -----
    Neighbouring datasets differ by adding or removing one record of this silo; see
    the documentation's concepts page, "The guarantee, stated precisely".
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not np.isfinite(self.epsilon) or self.epsilon <= 0:
            raise PrivacyError(f"epsilon must be a positive number, got {self.epsilon}; "
                               "use e.g. epsilon = 1.0 (smaller is more private)")
        if not (0 < self.delta < 1):
            raise PrivacyError(f"delta must lie strictly between 0 and 1, got {self.delta}; "
                               "use a value well below 1/n, e.g. delta = 1e-5")

"""The one place that reaches into dp_accounting's internals.

dp_accounting's public API gives ε and δ of a `PrivacyLossDistribution`, but not its
probability mass functions, and it has no public RepeatAndSelect formula for an RDP curve
that is not a dp_accounting event. silofl needs both: the PLD accountant composes PMFs
itself (FFT exponentiation on an adaptive grid, `pld_eval`), and repeat-and-select on a
node-level curve (`selection.NodeRepeatAndSelectEvent`) applies Papernot & Steinke's bound
to its own curve. Every such use is here, behind plain functions, and
tests/test_dpa_adapter.py pins each against an independent computation, so a dp_accounting
release that changes them fails that test rather than silently changing a figure.
Supported dp_accounting: the range pinned in pyproject.toml.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from dp_accounting import pld
from dp_accounting.pld import pld_pmf
from dp_accounting.rdp import rdp_privacy_accountant as _rdp_lib

#: a dense PMF as plain data: (lower loss index, probabilities, mass at +∞, grid interval)
DensePmf = tuple[int, np.ndarray, float, float]


def pld_of(accountant: pld.PLDAccountant) -> pld.PrivacyLossDistribution:
    """The privacy loss distribution a `PLDAccountant` has composed so far."""
    return accountant._pld


def dense_pmfs(d: pld.PrivacyLossDistribution) -> tuple[DensePmf, DensePmf]:
    """(remove, add) PMFs of a PLD as dense arrays; ``add is remove`` when symmetric."""
    rem = _arrays(d._pmf_remove.to_dense_pmf())
    add = rem if d._symmetric else _arrays(d._pmf_add.to_dense_pmf())
    return rem, add


def compose_dense(a: DensePmf, b: DensePmf, tail_mass_truncation: float) -> DensePmf:
    """Composition of two dense PMFs: dp_accounting's `DensePLDPmf.compose` (convolution,
    pessimistic truncation of `tail_mass_truncation`)."""
    pa = pld_pmf.DensePLDPmf(a[3], a[0], np.array(a[1]), a[2], True)
    pb = pld_pmf.DensePLDPmf(b[3], b[0], np.array(b[1]), b[2], True)
    return _arrays(pa.compose(pb, tail_mass_truncation))


def _arrays(pmf: pld_pmf.DensePLDPmf) -> DensePmf:
    probs = np.asarray(pmf._probs, dtype=float)
    probs.flags.writeable = False
    return (int(pmf._lower_loss), probs, float(pmf._infinity_mass),
            float(pmf._discretization))


def repeat_and_select_rdp(orders: npt.ArrayLike, rdp: npt.ArrayLike, mean: float,
                          shape: float) -> np.ndarray:
    """RDP of RepeatAndSelect (Papernot & Steinke 2022, Theorems 2 and 6) of one run whose
    RDP at `orders` is `rdp`: dp_accounting's own formula, for curves that are not
    dp_accounting events.

    Parameters
    ----------
    orders : sequence of float, shape (A,)
        Rényi orders (> 1), ascending.
    rdp : sequence of float, shape (A,)
        RDP of one run at `orders` (nats).
    mean : float
        E[h], the mean number of runs (≥ 1).
    shape : float
        η of the truncated negative binomial (0: logarithmic, 1: geometric), ``inf`` for
        Poisson.

    Returns
    -------
    numpy.ndarray, shape (A,)
        RDP of the best-of-h release at `orders` (nats).
    """
    return np.asarray(_rdp_lib._compute_rdp_repeat_and_select(orders, rdp, mean, shape),
                      dtype=float)


def tnb_gamma(shape: float, mean: float) -> float:
    """γ of the truncated negative binomial TNB(η = shape, γ) with mean `mean`, solved as
    dp_accounting solves it (so a vectorized RepeatAndSelect agrees with its own)."""
    return float(_rdp_lib._gamma_truncated_negative_binomial(shape, mean))

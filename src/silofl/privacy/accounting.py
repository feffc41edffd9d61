"""DP-SGD as dp_accounting events; ε under PLD and RDP; σ calibration — the public face.

Every private operation is described as a `dp_accounting.DpEvent` and handed to an
accountant. Two accountants, both built on Google's `dp-accounting`:

* **PLD** (the default): privacy loss distributions (`silofl.privacy.pld_eval`),
  dp_accounting's pessimistic connect-the-dots discretization of every base event, composed
  by FFT exponentiation on a grid chosen per composition (`pld_grid`).
* **RDP**: Rényi DP (`silofl.privacy.rdp_curves`) at dp_accounting's default orders plus
  the integer orders this module used before.

Events PLD has no model for — zCDP (IFCA's private selection) and `RdpCurveDpEvent`s
(node-level DP-SGD, repeat-and-select on a curve; `silofl.privacy.curves`) — fall back to
RDP (`silofl.privacy.evaluate`). σ is calibrated by one calibrator for every unit
(`silofl.privacy.calibration`). This module gathers the public names; the work is done in
those modules.
"""

from __future__ import annotations

from silofl.privacy import calibration as _calibration
from silofl.privacy import evaluate as _evaluate
from silofl.privacy import pld_eval as _pld
from silofl.privacy import rdp_curves as _rdp
from silofl.privacy.calibration import SIGMA_MAX, calibrate, calibrate_dpsgd
from silofl.privacy.evaluate import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    Accountant,
    accountant_for,
    epsilon,
    epsilons,
    guarantee,
    make_accountant,
    pld_grid,
)
from silofl.privacy.events import dpsgd_event, steps_for_epochs
from silofl.privacy.pld_eval import PLD_BASE_GRID, PLD_DISCRETIZATION
from silofl.privacy.rdp_curves import (
    _V1_ORDERS,
    RDP_ORDERS,
    RDP_ORDERS_FINE,
    _base_rdp,
    rdp_to_epsilon,
    rr_rdp,
)


def clear_caches() -> None:
    """Forget every memoized curve, PMF, ε and σ (for benchmarks: cold-start timings)."""
    for f in (_evaluate._epsilon_cached, _pld._pld_search, _pld._base_pmfs, _pld._loss_std,
              _evaluate._pld_supports, _rdp._fast_rdp, _calibration.calibrate_dpsgd):
        f.cache_clear()
    _pld._COMPOSED.clear()
    _rdp._RDP_VALUES.clear()


__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_ACCOUNTANT",
    "PLD_BASE_GRID",
    "PLD_DISCRETIZATION",
    "RDP_ORDERS",
    "RDP_ORDERS_FINE",
    "SIGMA_MAX",
    "_V1_ORDERS",
    "Accountant",
    "_base_rdp",
    "accountant_for",
    "calibrate",
    "calibrate_dpsgd",
    "clear_caches",
    "dpsgd_event",
    "epsilon",
    "epsilons",
    "guarantee",
    "make_accountant",
    "pld_grid",
    "rdp_to_epsilon",
    "rr_rdp",
    "steps_for_epochs",
]

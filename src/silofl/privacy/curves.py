"""Events that bring their own RDP curve, as proper `dp_accounting.DpEvent`s, and the
accountant rule that composes them.

dp_accounting has no event type for node-level DP-SGD (a hypergeometric-sampled Gaussian
under replacement adjacency) or for repeat-and-select of such a run: their RDP is known
in closed form or by a formula applied to a curve. `RdpCurveDpEvent` is the DpEvent
subclass for them: it knows its RDP at any orders. `CurveRdpAccountant` is a
`dp_accounting.PrivacyAccountant` that composes such events with dp_accounting's own
`ZCDpEvent` (ρ-zCDP with ξ is (α, ξ + ρα)-RDP at every order) and its composition events
(`ComposedDpEvent`, `SelfComposedDpEvent`, `NoOpDpEvent`) through the public
accountant interface (`compose`, `supports`, `get_epsilon`, `get_delta`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np
import numpy.typing as npt
from dp_accounting.rdp.rdp_privacy_accountant import compute_delta

from silofl.errors import PrivacyError
from silofl.privacy.rdp_curves import RDP_ORDERS_FINE, rdp_to_epsilon

CURVE_EVENT = "rdp_curve"


class RdpCurveDpEvent(dpa.DpEvent):
    """A `DpEvent` whose RDP curve the event itself computes.

    Subclasses are frozen, hashable dataclasses (base events of ledgers) and implement
    `rdp`, `to_dict` and a `from_dict` classmethod (ledgers on disk, `events.from_dict`).
    """

    def rdp(self, orders: npt.ArrayLike) -> np.ndarray:
        """RDP (nats) at `orders` (each > 1), shape of `orders`."""
        raise NotImplementedError

    def to_dict(self) -> dict:
        """JSON-ready description with an ``"event"`` name (`events.CUSTOM_EVENTS`)."""
        raise NotImplementedError


@dataclass(frozen=True)
class FixedRdpCurveEvent(RdpCurveDpEvent):
    """A release known only by its RDP curve at fixed orders (e.g. what a silo spends
    besides its training, composed in by a calibration).

    Parameters
    ----------
    orders : tuple of float, shape (A,)
        The orders the curve is given at; `rdp` answers only at these.
    values : tuple of float, shape (A,)
        RDP (nats) at `orders`.
    """

    orders: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        orders = tuple(float(a) for a in self.orders)
        values = tuple(float(v) for v in self.values)
        if len(orders) != len(values):
            raise PrivacyError(f"an RDP curve needs one value per order: {len(orders)} "
                               f"orders, {len(values)} values")
        object.__setattr__(self, "orders", orders)
        object.__setattr__(self, "values", values)

    def rdp(self, orders: npt.ArrayLike) -> np.ndarray:
        if tuple(float(a) for a in np.asarray(orders, dtype=float)) != self.orders:
            raise PrivacyError("this RDP curve is known only at the orders it was given at")
        return np.asarray(self.values, dtype=float)

    def to_dict(self) -> dict:
        return {"event": CURVE_EVENT, "orders": list(self.orders),
                "values": list(self.values)}

    @classmethod
    def from_dict(cls, d: dict) -> FixedRdpCurveEvent:
        if d.get("event") != CURVE_EVENT:
            raise PrivacyError(f"not a {CURVE_EVENT} event: {d.get('event')!r}")
        return cls(tuple(d["orders"]), tuple(d["values"]))


class CurveRdpAccountant(dpa.PrivacyAccountant):
    """RDP accountant for `RdpCurveDpEvent`s and zCDP events at `orders`.

    Parameters
    ----------
    orders : sequence of float, shape (A,)
        Rényi orders (> 1); default `RDP_ORDERS_FINE` (dense near 1, where small σ puts
        the optimum of node-level curves).
    neighboring_relation : dp_accounting.NeighboringRelation
        The relation the composed events' guarantees are stated under (node-level
        events: replacement of one person).
    """

    def __init__(self, orders: Sequence[float] = RDP_ORDERS_FINE,
                 neighboring_relation: dpa.NeighboringRelation =
                 dpa.NeighboringRelation.REPLACE_ONE):
        super().__init__(neighboring_relation)
        self._orders = np.asarray(orders, dtype=float)
        self._rdp = np.zeros(self._orders.size)

    @property
    def orders(self) -> np.ndarray:
        """The Rényi orders, shape (A,)."""
        return self._orders

    @property
    def rdp(self) -> np.ndarray:
        """The composed RDP (nats) at `orders`, shape (A,)."""
        return self._rdp

    def _maybe_compose(self, event: dpa.DpEvent, count: int, do_compose: bool
                       ) -> dpa.PrivacyAccountant.CompositionErrorDetails | None:
        if isinstance(event, dpa.NoOpDpEvent):
            return None
        if isinstance(event, dpa.SelfComposedDpEvent):
            return self._maybe_compose(event.event, count * event.count, do_compose)
        if isinstance(event, dpa.ComposedDpEvent):
            for e in event.events:
                err = self._maybe_compose(e, count, do_compose)
                if err is not None:
                    return err
            return None
        if isinstance(event, dpa.ZCDpEvent):
            if do_compose:
                self._rdp = self._rdp + count * (event.xi + event.rho * self._orders)
            return None
        if isinstance(event, RdpCurveDpEvent):
            if do_compose:
                curve = np.asarray(event.rdp(self._orders), dtype=np.float64)
                self._rdp = self._rdp + count * curve
            return None
        return self.CompositionErrorDetails(
            invalid_event=event,
            error_message="curve events compose only with zCDP events and compositions")

    def get_epsilon(self, target_delta: float) -> float:
        """ε (≥ 0) at `target_delta` by `rdp_curves.rdp_to_epsilon` over `orders`."""
        return rdp_to_epsilon(self._orders, self._rdp, target_delta)[0]

    def get_delta(self, target_epsilon: float) -> float:
        """δ at `target_epsilon` by dp_accounting's public `compute_delta`."""
        return float(compute_delta(self._orders, self._rdp, target_epsilon)[0])


def is_curve_event(event: object) -> bool:
    """Whether `event` is a base event with its own RDP curve (e.g. node-level DP-SGD)."""
    return isinstance(event, RdpCurveDpEvent)


__all__ = ["CurveRdpAccountant", "FixedRdpCurveEvent", "RdpCurveDpEvent", "is_curve_event"]

"""Stock levels and reservations.

Placing an order reserves units so two customers cannot buy the last item twice. A
reservation holds its units until it is committed (the goods ship and leave the
warehouse) or released (the order is cancelled).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import InsufficientStock, ReservationError


@dataclass(frozen=True)
class Reservation:
    """Units of one SKU held for an order."""

    id: str
    sku: str
    quantity: int
    order_id: str


class Warehouse:
    """On-hand counts per SKU and the reservations against them."""

    def __init__(self, on_hand: Mapping[str, int] | None = None) -> None:
        self._on_hand: dict[str, int] = {}
        self._reservations: dict[str, Reservation] = {}
        self._ids = (f"R{n:05d}" for n in itertools.count(1))
        for sku, quantity in (on_hand or {}).items():
            self.receive(sku, quantity)

    def receive(self, sku: str, quantity: int) -> None:
        """Add delivered units to the on-hand count."""
        if quantity <= 0:
            raise ValueError(f"received quantity must be positive, got {quantity}")
        self._on_hand[sku] = self._on_hand.get(sku, 0) + quantity

    def on_hand(self, sku: str) -> int:
        return self._on_hand.get(sku, 0)

    def reserved(self, sku: str) -> int:
        """Units of ``sku`` held by reservations."""
        return sum(r.quantity for r in self._reservations.values() if r.sku == sku)

    def available(self, sku: str) -> int:
        return self.on_hand(sku) - self.reserved(sku)

    def reserve(self, sku: str, quantity: int, order_id: str) -> Reservation:
        """Hold ``quantity`` units for ``order_id``; fails if they are not available."""
        if quantity <= 0:
            raise ValueError(f"reserved quantity must be positive, got {quantity}")
        available = self.available(sku)
        if quantity > available:
            raise InsufficientStock(sku, quantity, available)
        reservation = Reservation(id=next(self._ids), sku=sku, quantity=quantity, order_id=order_id)
        self._reservations[reservation.id] = reservation
        return reservation

    def get(self, reservation_id: str) -> Reservation:
        try:
            return self._reservations[reservation_id]
        except KeyError:
            raise ReservationError(f"no reservation {reservation_id!r}") from None

    def release(self, reservation_id: str) -> None:
        """Give the units back."""
        self.get(reservation_id)
        del self._reservations[reservation_id]

    def commit(self, reservation_id: str) -> None:
        """Take the reserved units out of stock."""
        reservation = self.get(reservation_id)
        del self._reservations[reservation_id]
        self._on_hand[reservation.sku] -= reservation.quantity

    def reservations_for(self, order_id: str) -> list[Reservation]:
        return [r for r in self._reservations.values() if r.order_id == order_id]

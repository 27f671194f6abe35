"""Stock levels and reservations.

Placing an order reserves units so two customers cannot buy the last item twice. A
reservation holds its units until it is committed (the goods ship and leave the
warehouse), released (the order is cancelled) or it expires: a checkout that is
abandoned must not hold stock forever.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from .errors import InsufficientStock, ReservationError

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Reservation:
    """Units of one SKU held for an order until ``expires_at``."""

    id: str
    sku: str
    quantity: int
    order_id: str
    expires_at: datetime

    def is_expired(self, now: datetime) -> bool:
        return now >= self.expires_at


class Warehouse:
    """On-hand counts per SKU and the reservations against them.

    ``ttl`` is how long a reservation lives; ``clock`` returns the current time and is
    injectable so tests can move time forward.
    """

    def __init__(
        self,
        on_hand: Mapping[str, int] | None = None,
        *,
        ttl: timedelta = timedelta(minutes=15),
        clock: Clock = utc_now,
    ) -> None:
        if ttl <= timedelta(0):
            raise ValueError(f"reservation ttl must be positive, got {ttl}")
        self._on_hand: dict[str, int] = {}
        self._reservations: dict[str, Reservation] = {}
        self._ids = (f"R{n:05d}" for n in itertools.count(1))
        self.ttl = ttl
        self.clock = clock
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
        """Units of ``sku`` held by reservations that have not expired."""
        now = self.clock()
        return sum(r.quantity for r in self._reservations.values() if r.sku == sku and not r.is_expired(now))

    def available(self, sku: str) -> int:
        return self.on_hand(sku) - self.reserved(sku)

    def reserve(self, sku: str, quantity: int, order_id: str) -> Reservation:
        """Hold ``quantity`` units for ``order_id``; fails if they are not available."""
        if quantity <= 0:
            raise ValueError(f"reserved quantity must be positive, got {quantity}")
        available = self.available(sku)
        if quantity > available:
            raise InsufficientStock(sku, quantity, available)
        reservation = Reservation(
            id=next(self._ids),
            sku=sku,
            quantity=quantity,
            order_id=order_id,
            expires_at=self.clock() + self.ttl,
        )
        self._reservations[reservation.id] = reservation
        return reservation

    def get(self, reservation_id: str) -> Reservation:
        try:
            return self._reservations[reservation_id]
        except KeyError:
            raise ReservationError(f"no reservation {reservation_id!r}") from None

    def release(self, reservation_id: str) -> None:
        """Give the units back; releasing an expired reservation is allowed."""
        self.get(reservation_id)
        del self._reservations[reservation_id]

    def commit(self, reservation_id: str) -> None:
        """Take the reserved units out of stock. Expired reservations cannot be committed."""
        reservation = self.get(reservation_id)
        if reservation.is_expired(self.clock()):
            raise ReservationError(f"reservation {reservation_id} expired at {reservation.expires_at}")
        del self._reservations[reservation_id]
        self._on_hand[reservation.sku] -= reservation.quantity

    def expire(self) -> list[Reservation]:
        """Drop every expired reservation and return them, oldest first."""
        now = self.clock()
        expired = [r for r in self._reservations.values() if r.is_expired(now)]
        for reservation in expired:
            del self._reservations[reservation.id]
        return expired

    def reservations_for(self, order_id: str) -> list[Reservation]:
        return [r for r in self._reservations.values() if r.order_id == order_id]

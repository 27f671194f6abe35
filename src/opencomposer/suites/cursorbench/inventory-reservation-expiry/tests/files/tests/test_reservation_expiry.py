from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from inventory import (
    Catalog,
    OrderService,
    OrderStatus,
    Product,
    ReservationError,
    TaxTable,
    Warehouse,
)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs: float) -> None:
        self.now += timedelta(**kwargs)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def warehouse(clock):
    return Warehouse({"KET-1": 3, "TEA-1": 40}, clock=clock)


def test_default_ttl_is_fifteen_minutes(warehouse, clock):
    reservation = warehouse.reserve("KET-1", 3, "o-1")
    assert reservation.expires_at == clock.now + timedelta(minutes=15)
    clock.advance(minutes=14, seconds=59)
    assert warehouse.available("KET-1") == 0
    clock.advance(seconds=1)
    assert warehouse.reserved("KET-1") == 0
    assert warehouse.available("KET-1") == 3
    warehouse.reserve("KET-1", 3, "o-2")


def test_ttl_is_configurable(clock):
    warehouse = Warehouse({"KET-1": 1}, ttl=timedelta(minutes=2), clock=clock)
    reservation = warehouse.reserve("KET-1", 1, "o-1")
    assert reservation.is_expired(clock.now + timedelta(minutes=2))
    assert not reservation.is_expired(clock.now + timedelta(minutes=1))
    with pytest.raises(ValueError, match="ttl"):
        Warehouse(ttl=timedelta(0), clock=clock)


def test_expired_reservation_cannot_be_committed_but_can_be_released(warehouse, clock):
    reservation = warehouse.reserve("KET-1", 1, "o-1")
    clock.advance(minutes=20)
    with pytest.raises(ReservationError, match="expired"):
        warehouse.commit(reservation.id)
    assert warehouse.on_hand("KET-1") == 3
    warehouse.release(reservation.id)


def test_live_reservation_commits(warehouse, clock):
    reservation = warehouse.reserve("KET-1", 2, "o-1")
    clock.advance(minutes=14)
    warehouse.commit(reservation.id)
    assert warehouse.on_hand("KET-1") == 1


def test_expire_drops_and_returns_expired_oldest_first(warehouse, clock):
    first = warehouse.reserve("TEA-1", 1, "o-1")
    clock.advance(minutes=1)
    second = warehouse.reserve("TEA-1", 1, "o-2")
    clock.advance(minutes=10)
    fresh = warehouse.reserve("TEA-1", 1, "o-3")
    clock.advance(minutes=5)
    assert warehouse.expire() == [first, second]
    assert warehouse.expire() == []
    assert warehouse.reservations_for("o-3") == [fresh]
    with pytest.raises(ReservationError):
        warehouse.get(first.id)


def test_fulfil_commits_nothing_when_any_reservation_expired(warehouse, clock):
    catalog = Catalog(
        [
            Product("KET-1", "Kettle", Decimal("39.99"), category="kitchen"),
            Product("TEA-1", "Green tea", Decimal("4.50"), category="food"),
        ]
    )
    service = OrderService(catalog, warehouse, TaxTable.default())
    order = service.create_order("o-1", "CA")
    service.add_line(order, "KET-1", 1)
    service.add_line(order, "TEA-1", 2)
    service.place(order)
    clock.advance(minutes=10)
    kettle, tea = order.reservation_ids
    warehouse.release(kettle)
    order.reservation_ids[0] = warehouse.reserve("KET-1", 1, "o-1").id
    clock.advance(minutes=6)
    with pytest.raises(ReservationError, match=tea):
        service.fulfil(order)
    assert order.status is OrderStatus.PLACED
    assert warehouse.on_hand("KET-1") == 3
    assert warehouse.on_hand("TEA-1") == 40

import pytest

from inventory import InsufficientStock, ReservationError, Warehouse


def test_reserve_reduces_availability_not_on_hand(warehouse):
    reservation = warehouse.reserve("KET-1", 2, "o-1")
    assert reservation.id == "R00001"
    assert warehouse.on_hand("KET-1") == 3
    assert warehouse.reserved("KET-1") == 2
    assert warehouse.available("KET-1") == 1


def test_cannot_reserve_more_than_available(warehouse):
    warehouse.reserve("KET-1", 2, "o-1")
    with pytest.raises(InsufficientStock) as info:
        warehouse.reserve("KET-1", 2, "o-2")
    assert (info.value.requested, info.value.available) == (2, 1)
    assert "only 1 available" in str(info.value)


def test_unknown_sku_has_nothing_available(warehouse):
    assert warehouse.available("NOPE") == 0
    with pytest.raises(InsufficientStock):
        warehouse.reserve("NOPE", 1, "o-1")


def test_release_gives_units_back(warehouse):
    reservation = warehouse.reserve("KET-1", 3, "o-1")
    warehouse.release(reservation.id)
    assert warehouse.available("KET-1") == 3
    with pytest.raises(ReservationError):
        warehouse.release(reservation.id)


def test_commit_takes_units_out_of_stock(warehouse):
    reservation = warehouse.reserve("KET-1", 2, "o-1")
    warehouse.commit(reservation.id)
    assert warehouse.on_hand("KET-1") == 1
    assert warehouse.available("KET-1") == 1
    assert warehouse.reservations_for("o-1") == []


def test_receive_and_validation():
    warehouse = Warehouse()
    warehouse.receive("X", 2)
    warehouse.receive("X", 3)
    assert warehouse.on_hand("X") == 5
    with pytest.raises(ValueError):
        warehouse.receive("X", 0)
    with pytest.raises(ValueError):
        warehouse.reserve("X", -1, "o")

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from inventory import Catalog, OrderService, PriceBreak, Product, TaxTable, Warehouse


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs: float) -> None:
        self.now += timedelta(**kwargs)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def catalog() -> Catalog:
    return Catalog(
        [
            Product("TEA-1", "Green tea", Decimal("4.50"), category="food"),
            Product(
                "MUG-1",
                "Stoneware mug",
                Decimal("12.00"),
                category="kitchen",
                price_breaks=(PriceBreak(6, Decimal("10.00")), PriceBreak(24, Decimal("9.00"))),
            ),
            Product("KET-1", "Kettle", Decimal("39.99"), category="kitchen"),
            Product("BAG-1", "Tote bag", Decimal("8.25")),
        ]
    )


@pytest.fixture
def warehouse(clock: FakeClock) -> Warehouse:
    return Warehouse({"TEA-1": 40, "MUG-1": 30, "KET-1": 3, "BAG-1": 10}, clock=clock)


@pytest.fixture
def service(catalog: Catalog, warehouse: Warehouse) -> OrderService:
    return OrderService(catalog, warehouse, TaxTable.default())

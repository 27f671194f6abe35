"""Orders, pricing, tax and stock reservations for a small shop."""

from .catalog import Catalog, PriceBreak, Product
from .errors import (
    InsufficientStock,
    InvalidCoupon,
    InventoryError,
    OrderStateError,
    ReservationError,
    UnknownProduct,
)
from .money import allocate, format_money, to_money
from .orders import Order, OrderLine, OrderService, OrderStatus, Quote
from .pricing import AmountOff, BuyXGetY, PercentOff, price_lines
from .stock import Reservation, Warehouse
from .tax import TaxTable

__all__ = [
    "AmountOff",
    "BuyXGetY",
    "Catalog",
    "InsufficientStock",
    "InvalidCoupon",
    "InventoryError",
    "Order",
    "OrderLine",
    "OrderService",
    "OrderStateError",
    "OrderStatus",
    "PercentOff",
    "PriceBreak",
    "Product",
    "Quote",
    "Reservation",
    "ReservationError",
    "TaxTable",
    "UnknownProduct",
    "Warehouse",
    "allocate",
    "format_money",
    "price_lines",
    "to_money",
]

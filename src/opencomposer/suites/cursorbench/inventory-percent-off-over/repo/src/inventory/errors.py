"""Exceptions raised by the inventory package.

Every error derives from :class:`InventoryError` so callers can catch the whole family.
"""


class InventoryError(Exception):
    """Base class for all inventory errors."""


class UnknownProduct(InventoryError, KeyError):
    """A SKU that is not in the catalog."""

    def __init__(self, sku: str) -> None:
        super().__init__(sku)
        self.sku = sku

    def __str__(self) -> str:
        return f"unknown product {self.sku!r}"


class InsufficientStock(InventoryError):
    """Not enough unreserved units of a SKU to satisfy a request."""

    def __init__(self, sku: str, requested: int, available: int) -> None:
        super().__init__(f"cannot reserve {requested} x {sku}: only {available} available")
        self.sku = sku
        self.requested = requested
        self.available = available


class ReservationError(InventoryError):
    """A reservation that does not exist or can no longer be used."""


class InvalidCoupon(InventoryError):
    """A coupon code that is unknown or cannot be applied to this order."""


class OrderStateError(InventoryError):
    """An operation that is not allowed in the order's current status."""

"""Orders and the service that prices, places and cancels them.

An order starts as a draft: lines and coupons can change and :meth:`OrderService.quote`
prices it at any time. :meth:`OrderService.place` reserves stock for every line (all or
nothing); :meth:`OrderService.fulfil` commits the reservations and
:meth:`OrderService.cancel` releases them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from .catalog import Catalog
from .errors import InsufficientStock, InvalidCoupon, OrderStateError
from .pricing import Adjustment, PricedLine, Rule, price_lines
from .stock import Warehouse
from .tax import TaxTable


class OrderStatus(enum.Enum):
    DRAFT = "draft"
    PLACED = "placed"
    FULFILLED = "fulfilled"
    CANCELLED = "cancelled"


@dataclass
class OrderLine:
    sku: str
    quantity: int


@dataclass
class Order:
    """A customer's order. ``region`` selects the tax rates."""

    id: str
    region: str
    lines: list[OrderLine] = field(default_factory=list)
    coupons: list[str] = field(default_factory=list)
    status: OrderStatus = OrderStatus.DRAFT
    reservation_ids: list[str] = field(default_factory=list)

    def line_for(self, sku: str) -> OrderLine | None:
        return next((line for line in self.lines if line.sku == sku), None)


@dataclass(frozen=True)
class Quote:
    """What the customer pays: ``total = subtotal - discount + tax``."""

    subtotal: Decimal
    discount: Decimal
    tax: Decimal
    adjustments: tuple[Adjustment, ...] = ()

    @property
    def total(self) -> Decimal:
        return self.subtotal - self.discount + self.tax


class OrderService:
    """Prices and places orders against a catalog, a warehouse and a tax table.

    ``rules`` apply to every order, before any coupon; ``coupons`` maps coupon codes to
    the rule each one stands for.
    """

    def __init__(
        self,
        catalog: Catalog,
        warehouse: Warehouse,
        tax_table: TaxTable,
        *,
        rules: Sequence[Rule] = (),
        coupons: Mapping[str, Rule] | None = None,
    ) -> None:
        self.catalog = catalog
        self.warehouse = warehouse
        self.tax_table = tax_table
        self.rules = list(rules)
        self.coupons = dict(coupons or {})

    def create_order(self, order_id: str, region: str) -> Order:
        self.tax_table.rate_for(region, "general")  # fail early on an unknown region
        return Order(order_id, region)

    def add_line(self, order: Order, sku: str, quantity: int) -> None:
        """Add units of a product; adding a SKU that is already there increases its quantity."""
        self._require(order, OrderStatus.DRAFT, "add lines to")
        if quantity <= 0:
            raise ValueError(f"quantity must be positive, got {quantity}")
        self.catalog.get(sku)
        existing = order.line_for(sku)
        if existing is None:
            order.lines.append(OrderLine(sku, quantity))
        else:
            existing.quantity += quantity

    def remove_line(self, order: Order, sku: str) -> None:
        self._require(order, OrderStatus.DRAFT, "remove lines from")
        line = order.line_for(sku)
        if line is None:
            raise KeyError(f"order {order.id} has no line for {sku!r}")
        order.lines.remove(line)

    def apply_coupon(self, order: Order, code: str) -> None:
        """Attach a coupon; codes are case-insensitive and each can be used once per order."""
        self._require(order, OrderStatus.DRAFT, "apply coupons to")
        normalised = code.strip().upper()
        if normalised not in self.coupons:
            raise InvalidCoupon(f"unknown coupon {code!r}")
        if normalised in order.coupons:
            raise InvalidCoupon(f"coupon {normalised} is already applied to order {order.id}")
        order.coupons.append(normalised)

    def priced_lines(self, order: Order) -> list[PricedLine]:
        """The order's lines at catalog prices (with quantity breaks), before discounts."""
        lines = []
        for line in order.lines:
            product = self.catalog.get(line.sku)
            lines.append(
                PricedLine(
                    sku=product.sku,
                    category=product.category,
                    quantity=line.quantity,
                    unit_price=product.unit_price_for(line.quantity),
                )
            )
        return lines

    def quote(self, order: Order) -> Quote:
        """Price the order: automatic rules, then coupons in the order they were applied, then tax."""
        rules = [*self.rules, *(self.coupons[code] for code in order.coupons)]
        result = price_lines(self.priced_lines(order), rules)
        tax = self.tax_table.tax_for(result.lines, order.region)
        return Quote(
            subtotal=result.subtotal,
            discount=result.discount,
            tax=tax,
            adjustments=tuple(result.adjustments),
        )

    def place(self, order: Order) -> Quote:
        """Reserve stock for every line and mark the order placed.

        Either every line is reserved or none is: if one line is short, the reservations
        already made for this order are released and :class:`InsufficientStock` propagates.
        """
        self._require(order, OrderStatus.DRAFT, "place")
        if not order.lines:
            raise OrderStateError(f"order {order.id} has no lines")
        quote = self.quote(order)
        made = []
        try:
            for line in order.lines:
                made.append(self.warehouse.reserve(line.sku, line.quantity, order.id))
        except InsufficientStock:
            for reservation in made:
                self.warehouse.release(reservation.id)
            raise
        order.reservation_ids = [r.id for r in made]
        order.status = OrderStatus.PLACED
        return quote

    def fulfil(self, order: Order) -> None:
        """Ship a placed order: its reservations leave the warehouse for good."""
        self._require(order, OrderStatus.PLACED, "fulfil")
        for reservation_id in order.reservation_ids:
            self.warehouse.commit(reservation_id)
        order.reservation_ids = []
        order.status = OrderStatus.FULFILLED

    def cancel(self, order: Order) -> None:
        """Cancel a draft or placed order, giving back any reserved stock."""
        if order.status not in (OrderStatus.DRAFT, OrderStatus.PLACED):
            raise OrderStateError(f"cannot cancel order {order.id}: it is {order.status.value}")
        for reservation_id in order.reservation_ids:
            self.warehouse.release(reservation_id)
        order.reservation_ids = []
        order.status = OrderStatus.CANCELLED

    @staticmethod
    def _require(order: Order, status: OrderStatus, action: str) -> None:
        if order.status is not status:
            raise OrderStateError(
                f"cannot {action} order {order.id}: it is {order.status.value}, not {status.value}"
            )

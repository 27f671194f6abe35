"""Products and the catalog that holds them.

A product has a list price and optional quantity price breaks: buying at least
``min_quantity`` units switches every unit to the break's price.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal

from .errors import UnknownProduct
from .money import to_money


@dataclass(frozen=True)
class PriceBreak:
    """Unit price that applies from ``min_quantity`` units upwards."""

    min_quantity: int
    unit_price: Decimal


@dataclass(frozen=True)
class Product:
    """A sellable item. ``category`` drives tax overrides and category discounts."""

    sku: str
    name: str
    unit_price: Decimal
    category: str = "general"
    price_breaks: tuple[PriceBreak, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.sku:
            raise ValueError("a product needs a non-empty sku")
        if self.unit_price < 0:
            raise ValueError(f"{self.sku}: unit price must not be negative, got {self.unit_price}")
        for price_break in self.price_breaks:
            if price_break.min_quantity < 2:
                raise ValueError(f"{self.sku}: price breaks start at 2 units, got {price_break.min_quantity}")

    def unit_price_for(self, quantity: int) -> Decimal:
        """The unit price when buying ``quantity`` units: the best break that applies."""
        if quantity <= 0:
            raise ValueError(f"quantity must be positive, got {quantity}")
        price = self.unit_price
        for price_break in sorted(self.price_breaks, key=lambda b: b.min_quantity):
            if quantity >= price_break.min_quantity:
                price = price_break.unit_price
        return to_money(price)


class Catalog:
    """Products by SKU."""

    def __init__(self, products: Iterable[Product] = ()) -> None:
        self._products: dict[str, Product] = {}
        for product in products:
            self.add(product)

    def add(self, product: Product) -> None:
        """Add a product; adding a SKU twice is an error (use :meth:`replace`)."""
        if product.sku in self._products:
            raise ValueError(f"duplicate sku {product.sku!r}")
        self._products[product.sku] = product

    def replace(self, product: Product) -> None:
        """Replace an existing product, e.g. after a price change."""
        if product.sku not in self._products:
            raise UnknownProduct(product.sku)
        self._products[product.sku] = product

    def get(self, sku: str) -> Product:
        try:
            return self._products[sku]
        except KeyError:
            raise UnknownProduct(sku) from None

    def __contains__(self, sku: object) -> bool:
        return sku in self._products

    def __iter__(self) -> Iterator[Product]:
        return iter(self._products.values())

    def __len__(self) -> int:
        return len(self._products)

    def in_category(self, category: str) -> list[Product]:
        """Products of one category, sorted by SKU."""
        return sorted((p for p in self if p.category == category), key=lambda p: p.sku)

    def search(self, text: str) -> list[Product]:
        """Products whose name or SKU contains ``text``, case-insensitively."""
        needle = text.casefold()
        return [p for p in self if needle in p.name.casefold() or needle in p.sku.casefold()]

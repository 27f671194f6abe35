"""Sales tax by region, with per-category overrides.

Tax is computed on each line's net amount (after discounts) and rounded per line,
half-up, which is what the receipt shows; the order's tax is the sum of the lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from .money import ZERO, percent_of, to_money
from .pricing import PricedLine


class TaxTable:
    """Tax rates in percent by region code, with optional per-category overrides."""

    def __init__(
        self,
        rates: Mapping[str, Decimal],
        category_rates: Mapping[tuple[str, str], Decimal] | None = None,
    ) -> None:
        for region, rate in rates.items():
            if rate < 0:
                raise ValueError(f"tax rate for {region} must not be negative, got {rate}")
        self._rates = dict(rates)
        self._category_rates = dict(category_rates or {})

    @classmethod
    def default(cls) -> TaxTable:
        """A small table of US state rates; groceries are exempt in CA, NY and TX."""
        return cls(
            rates={
                "CA": Decimal("7.25"),
                "NY": Decimal("4"),
                "TX": Decimal("6.25"),
                "OR": Decimal("0"),
            },
            category_rates={
                ("CA", "food"): Decimal("0"),
                ("NY", "food"): Decimal("0"),
                ("TX", "food"): Decimal("0"),
            },
        )

    @property
    def regions(self) -> list[str]:
        return sorted(self._rates)

    def rate_for(self, region: str, category: str) -> Decimal:
        """The rate that applies to ``category`` in ``region``."""
        if region not in self._rates:
            raise ValueError(f"no tax rate for region {region!r}; known: {', '.join(self.regions)}")
        return self._category_rates.get((region, category), self._rates[region])

    def line_tax(self, line: PricedLine, region: str) -> Decimal:
        """Tax on one line's net amount, rounded to the cent."""
        return to_money(percent_of(line.net, self.rate_for(region, line.category)))

    def tax_for(self, lines: Iterable[PricedLine], region: str) -> Decimal:
        """Total tax of ``lines`` in ``region``: the sum of rounded line taxes."""
        return sum((self.line_tax(line, region) for line in lines), ZERO)

"""Text output: amounts and aligned tables."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal


def format_amount(amount: Decimal) -> str:
    """``1234.5`` → ``1,234.50``; negative amounts keep their minus sign."""
    return f"{amount:,.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, align: str | None = None) -> str:
    """Render rows as a plain-text table with two spaces between columns.

    ``align`` has one letter per column, ``l`` or ``r`` (default: all left). Trailing
    spaces are stripped from every line.
    """
    if align is None:
        align = "l" * len(headers)
    if len(align) != len(headers):
        raise ValueError(f"align has {len(align)} letters for {len(headers)} columns")
    cells = [[str(h) for h in headers]] + [[str(cell) for cell in row] for row in rows]
    for number, row in enumerate(cells[1:], start=1):
        if len(row) != len(headers):
            raise ValueError(f"row {number} has {len(row)} cells, expected {len(headers)}")
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [
            cell.rjust(width) if how == "r" else cell.ljust(width)
            for cell, width, how in zip(row, widths, align, strict=True)
        ]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)

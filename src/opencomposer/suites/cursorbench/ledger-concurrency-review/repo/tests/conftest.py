import io
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest

from ledger.cli import main
from ledger.models import Entry

TODAY = date(2024, 3, 15)


def make_entry(entry_id: int, day: str, amount: str, category: str, description: str = "", tags=()) -> Entry:
    return Entry(
        id=entry_id,
        date=date.fromisoformat(day),
        amount=Decimal(amount),
        category=category,
        description=description,
        tags=frozenset(tags),
    )


@pytest.fixture
def entries() -> list[Entry]:
    return [
        make_entry(1, "2024-01-31", "2500.00", "salary"),
        make_entry(2, "2024-02-01", "-1200.00", "rent"),
        make_entry(3, "2024-02-03", "-54.20", "food/groceries", "weekly shop", ["home"]),
        make_entry(4, "2024-02-14", "-78.00", "food/restaurants", "Valentine's dinner", ["treat"]),
        make_entry(5, "2024-02-29", "2500.00", "salary"),
        make_entry(6, "2024-03-01", "-4.50", "food/coffee", "Flat white", ["treat"]),
        make_entry(7, "2024-03-02", "-1200.00", "rent"),
    ]


class Cli:
    """Runs ``ledger`` against one file and captures what it prints."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(["--file", str(self.path), *argv], stdout=out, stderr=err, today=TODAY)
        return code, out.getvalue(), err.getvalue()


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "ledger.json")

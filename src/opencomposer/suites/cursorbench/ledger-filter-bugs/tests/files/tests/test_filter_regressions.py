from datetime import date
from decimal import Decimal

from ledger.models import Entry
from ledger.query import Filter, parse_period, select


def test_category_filter_matches_whole_path_segments():
    categories = ["food", "food/coffee", "foodtruck", "food-bank"]
    entries = [Entry(n, date(2024, 3, 1), Decimal("-5"), c) for n, c in enumerate(categories, start=1)]
    assert [e.id for e in select(entries, Filter(category="food"))] == [1, 2]


def test_every_quarter_covers_three_months():
    for quarter, (start, end) in {
        1: ("2024-01-01", "2024-03-31"),
        2: ("2024-04-01", "2024-06-30"),
        3: ("2024-07-01", "2024-09-30"),
        4: ("2024-10-01", "2024-12-31"),
    }.items():
        period = parse_period(f"2024-Q{quarter}")
        assert (period.start, period.end) == (date.fromisoformat(start), date.fromisoformat(end))


def test_cli_top_lists_biggest_expenses_first(cli):
    cli("add", "-5", "coffee", "--date", "2024-03-01")
    cli("add", "-900", "rent", "--date", "2024-03-01")
    cli("add", "-60", "food", "--date", "2024-03-02")
    cli("add", "1000", "salary", "--date", "2024-03-02")
    _, out, _ = cli("report", "top")
    assert [line.split()[1] for line in out.splitlines()[1:]] == ["rent", "food", "coffee"]

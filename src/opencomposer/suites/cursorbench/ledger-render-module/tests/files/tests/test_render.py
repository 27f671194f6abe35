import importlib

import pytest
from ledger import reports


@pytest.fixture
def render():
    return importlib.import_module("ledger.render")


def test_entries_table(render, entries):
    lines = render.entries_table(entries[4:6]).splitlines()
    assert lines == [
        "#  date        category       amount  description",
        "5  2024-02-29  salary       2,500.00",
        "6  2024-03-01  food/coffee     -4.50  Flat white",
    ]
    assert render.entries_table([]) == "no entries"


def test_categories_table(render, entries):
    text = render.categories_table(reports.by_category(entries, depth=1))
    assert text.splitlines() == [
        "category      total",
        "rent      -2,400.00",
        "food        -136.70",
        "salary     5,000.00",
    ]


def test_monthly_table(render, entries):
    text = render.monthly_table(reports.monthly(entries))
    assert text.splitlines() == [
        "month      income   expenses        net",
        "2024-01  2,500.00       0.00   2,500.00",
        "2024-02  2,500.00  -1,332.20   1,167.80",
        "2024-03      0.00  -1,204.50  -1,204.50",
    ]


def test_top_table(render, entries):
    text = render.top_table(reports.largest_expenses(entries, 2))
    assert text.splitlines() == [
        "date        category     amount  description",
        "2024-02-01  rent      -1,200.00",
        "2024-03-02  rent      -1,200.00",
    ]


def test_cli_prints_exactly_the_rendered_views(render, cli):
    cli("add", "2500", "salary", "--date", "2024-02-29")
    cli("add", "-4.50", "food/coffee", "Flat white", "--date", "2024-03-01")
    from ledger import storage

    book = storage.load(cli.path)
    assert cli("list")[1] == render.entries_table(list(book)) + "\n"
    assert cli("report", "monthly")[1] == render.monthly_table(reports.monthly(book)) + "\n"
    assert cli("report", "categories")[1] == render.categories_table(reports.by_category(book)) + "\n"
    assert cli("report", "top")[1] == render.top_table(reports.largest_expenses(book)) + "\n"


def test_cli_no_longer_builds_tables_itself():
    import ledger.cli

    assert not hasattr(ledger.cli, "table")

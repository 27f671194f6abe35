from decimal import Decimal

import pytest
from ledger.query import Filter, select


def test_filter_bounds_are_inclusive_and_ignore_sign(entries):
    assert [e.id for e in select(entries, Filter(min_amount=Decimal("78.00")))] == [1, 2, 4, 5, 7]
    assert [e.id for e in select(entries, Filter(max_amount=Decimal("78.00")))] == [3, 4, 6]
    both = Filter(min_amount=Decimal("50"), max_amount=Decimal("100"))
    assert [e.id for e in select(entries, both)] == [3, 4]


def test_defaults_match_everything(entries):
    assert select(entries, Filter()) == entries


@pytest.fixture
def seeded(cli):
    cli("add", "-4.50", "food/coffee", "--date", "2024-03-01")
    cli("add", "-80", "food/groceries", "--date", "2024-03-02")
    cli("add", "120", "gift", "--date", "2024-03-03")
    cli("add", "-1200", "rent", "--date", "2024-03-04")
    return cli


def ids(out):
    return [line.split()[0] for line in out.splitlines()[1:]]


def test_list_min_and_max(seeded):
    _, out, _ = seeded("list", "--min", "50")
    assert ids(out) == ["2", "3", "4"]
    _, out, _ = seeded("list", "--min", "50", "--max", "200")
    assert ids(out) == ["2", "3"]
    _, out, _ = seeded("list", "--max", "-80")
    assert ids(out) == ["1", "2"]


def test_balance_and_report_take_the_bounds_too(seeded):
    assert seeded("balance", "--max", "100") == (0, "-84.50\n", "")
    _, out, _ = seeded("report", "categories", "--min", "100")
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["rent", "gift"]


def test_bad_bounds(seeded):
    code, _, err = seeded("list", "--min", "lots")
    assert code == 1 and "not an amount" in err
    code, _, err = seeded("list", "--min", "100", "--max", "10")
    assert code == 1 and "--min" in err

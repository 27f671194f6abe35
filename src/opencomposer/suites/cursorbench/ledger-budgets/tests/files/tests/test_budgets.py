import json


def seed(cli):
    cli("add", "2500", "salary", "--date", "2024-03-01")
    cli("add", "-54.20", "food/groceries", "--date", "2024-03-03")
    cli("add", "-4.50", "food/coffee", "--date", "2024-03-04")
    cli("add", "10", "food/groceries", "refund", "--date", "2024-03-05")
    cli("add", "-1200", "rent", "--date", "2024-03-02")
    cli("add", "-99", "food/groceries", "--date", "2024-02-28")


def rows(out):
    return [line.split() for line in out.splitlines()[1:]]


def test_show_compares_spending_with_budgets(cli):
    seed(cli)
    assert cli("budget", "set", "food", "300")[0] == 0
    cli("budget", "set", "rent", "1000")
    cli("budget", "set", "fun", "50")
    code, out, err = cli("budget", "show", "--month", "2024-03")
    assert (code, err) == (0, "")
    assert out.splitlines()[0].split() == ["category", "budget", "spent", "left"]
    assert rows(out) == [
        ["food", "300.00", "58.70", "241.30"],
        ["fun", "50.00", "0.00", "50.00"],
        ["rent", "1,000.00", "1,200.00", "-200.00"],
    ]


def test_show_defaults_to_the_current_month(cli):
    seed(cli)
    cli("budget", "set", "food", "100")
    _, out, _ = cli("budget", "show")
    assert rows(out) == [["food", "100.00", "58.70", "41.30"]]
    _, out, _ = cli("budget", "show", "--month", "2024-02")
    assert rows(out) == [["food", "100.00", "99.00", "1.00"]]


def test_subcategory_budgets(cli):
    seed(cli)
    cli("budget", "set", "food/coffee", "20")
    _, out, _ = cli("budget", "show", "--month", "2024-03")
    assert rows(out) == [["food/coffee", "20.00", "4.50", "15.50"]]


def test_budgets_are_saved_in_the_ledger_file(cli):
    cli("budget", "set", "Food", "300")
    cli("budget", "set", "rent", "950.5")
    data = json.loads(cli.path.read_text())
    assert data["budgets"] == {"food": "300.00", "rent": "950.50"}
    cli("budget", "set", "food", "250")
    assert json.loads(cli.path.read_text())["budgets"]["food"] == "250.00"


def test_remove(cli):
    cli("budget", "set", "food", "300")
    assert cli("budget", "remove", "food")[0] == 0
    assert json.loads(cli.path.read_text())["budgets"] == {}
    code, _, err = cli("budget", "remove", "food")
    assert code == 1 and "no budget for food" in err
    assert cli("budget", "show") == (0, "no budgets\n", "")


def test_bad_budgets_are_rejected(cli):
    code, _, err = cli("budget", "set", "food", "-5")
    assert code == 1 and "positive" in err
    code, _, err = cli("budget", "set", "food", "lots")
    assert code == 1 and "not an amount" in err
    code, _, err = cli("budget", "show", "--month", "2024")
    assert code == 1 and "YYYY-MM" in err
    assert not cli.path.exists()


def test_old_files_without_budgets_still_load(cli):
    cli.path.write_text(json.dumps({"version": 1, "next_id": 1, "entries": []}))
    assert cli("budget", "show") == (0, "no budgets\n", "")
    assert cli("add", "-3", "food")[0] == 0

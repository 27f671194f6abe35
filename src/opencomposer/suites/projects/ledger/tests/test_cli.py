import json

import pytest

from ledger.cli import main


def test_add_then_list(cli):
    assert cli("add", "2500", "salary", "--date", "2024-03-01") == (0, "added #1\n", "")
    assert cli("add", "-4.50", "Food/Coffee", "flat white", "--date", "2024-03-02", "--tags", "treat")[0] == 0
    code, out, _ = cli("list")
    assert code == 0
    assert out.splitlines() == [
        "#  date        category       amount  description",
        "1  2024-03-01  salary       2,500.00",
        "2  2024-03-02  food/coffee     -4.50  flat white",
    ]


def test_add_defaults_to_today(cli):
    cli("add", "10", "gift")
    stored = json.loads(cli.path.read_text())["entries"][0]
    assert stored["date"] == "2024-03-15"


def test_add_rejects_bad_input_without_writing(cli):
    code, out, err = cli("add", "ten", "food")
    assert code == 1 and out == ""
    assert err == "ledger: error: not an amount: 'ten'\n"
    assert not cli.path.exists()


def test_list_filters(cli):
    cli("add", "-10", "food/groceries", "market", "--date", "2024-02-10")
    cli("add", "-20", "transport", "train", "--date", "2024-03-10")
    cli("add", "-30", "food/restaurants", "pizza", "--date", "2024-03-12")
    _, out, _ = cli("list", "--period", "2024-03")
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["2", "3"]
    _, out, _ = cli("list", "--category", "food", "--search", "MARK")
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["1"]
    assert cli("list", "--period", "2020") == (0, "no entries\n", "")


def test_balance_and_reports(cli):
    cli("add", "100", "salary", "--date", "2024-02-01")
    cli("add", "-30", "food/groceries", "--date", "2024-02-02")
    cli("add", "-20", "food/coffee", "--date", "2024-03-02")
    assert cli("balance") == (0, "50.00\n", "")
    assert cli("balance", "--period", "2024-03")[1] == "-20.00\n"
    _, out, _ = cli("report", "categories", "--depth", "1")
    assert out.splitlines() == ["category   total", "food      -50.00", "salary    100.00"]
    _, out, _ = cli("report", "monthly")
    assert out.splitlines() == [
        "month    income  expenses     net",
        "2024-02  100.00    -30.00   70.00",
        "2024-03    0.00    -20.00  -20.00",
    ]
    _, out, _ = cli("report", "top")
    assert out.splitlines()[1].split() == ["2024-02-02", "food/groceries", "-30.00"]


def test_remove(cli):
    cli("add", "-5", "misc", "--date", "2024-03-01")
    assert cli("remove", "1") == (0, "removed #1 (2024-03-01 misc -5.00)\n", "")
    assert cli("remove", "1") == (1, "", "ledger: error: no entry #1\n")
    assert cli("list")[1] == "no entries\n"


def test_bad_period_is_an_error(cli):
    code, _, err = cli("balance", "--period", "March")
    assert code == 1 and "not a period" in err


def test_usage_errors_exit_with_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_file_comes_from_environment(monkeypatch, tmp_path):
    import io
    from datetime import date

    monkeypatch.setenv("LEDGER_FILE", str(tmp_path / "env.json"))
    assert main(["add", "1", "misc"], stdout=io.StringIO(), today=date(2024, 1, 1)) == 0
    assert (tmp_path / "env.json").exists()

import csv
import io
import json


def seed(cli):
    cli("add", "2500", "salary", "--date", "2024-02-29")
    cli("add", "-4.50", "food/coffee", "flat white, large", "--date", "2024-03-01", "--tags", "treat,morning")
    cli("add", "-1200", "rent", "--date", "2024-03-02")


def test_csv_to_stdout(cli):
    seed(cli)
    code, out, err = cli("export")
    assert (code, err) == (0, "")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == ["id", "date", "amount", "category", "description", "tags"]
    assert [r["id"] for r in rows] == ["1", "2", "3"]
    assert rows[1] == {
        "id": "2",
        "date": "2024-03-01",
        "amount": "-4.50",
        "category": "food/coffee",
        "description": "flat white, large",
        "tags": "morning;treat",
    }
    assert rows[2]["tags"] == ""


def test_json_matches_the_ledger_file_entries(cli):
    seed(cli)
    code, out, _ = cli("export", "--format", "json")
    assert code == 0
    exported = json.loads(out)
    stored = json.loads(cli.path.read_text())["entries"]
    assert exported == stored


def test_export_takes_the_list_filters(cli):
    seed(cli)
    _, out, _ = cli("export", "--period", "2024-03", "--category", "food")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["id"] for r in rows] == ["2"]
    _, out, _ = cli("export", "--format", "json", "--tag", "nope")
    assert json.loads(out) == []


def test_export_to_a_file(cli, tmp_path):
    seed(cli)
    target = tmp_path / "out.csv"
    code, out, _ = cli("export", "--output", str(target), "--period", "2024-03")
    assert code == 0
    assert "2" in out and str(target) in out
    rows = list(csv.DictReader(io.StringIO(target.read_text())))
    assert [r["category"] for r in rows] == ["food/coffee", "rent"]


def test_export_does_not_modify_the_ledger(cli):
    seed(cli)
    before = cli.path.read_text()
    cli("export", "--format", "json")
    assert cli.path.read_text() == before


def test_empty_ledger_exports_just_a_header(cli):
    code, out, _ = cli("export")
    assert code == 0
    assert out.strip() == "id,date,amount,category,description,tags"

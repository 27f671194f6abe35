import json

import pytest

from ledger import storage
from ledger.models import LedgerError


def test_missing_file_is_an_empty_book(tmp_path):
    book = storage.load(tmp_path / "none.json")
    assert len(book) == 0 and book.next_id == 1


def test_save_and_load_round_trip(tmp_path, entries):
    path = tmp_path / "sub" / "ledger.json"
    book = storage.Book(entries)
    storage.save(book, path)
    loaded = storage.load(path)
    assert list(loaded) == list(book)
    assert loaded.next_id == 8
    assert json.loads(path.read_text())["version"] == 1


def test_add_assigns_fresh_ids_and_ids_are_never_reused(entries):
    book = storage.Book(entries)
    stored = book.add(entries[0])
    assert stored.id == 8
    book.remove(8)
    assert book.add(entries[0]).id == 9


def test_book_iterates_by_date_then_id(entries):
    book = storage.Book(list(reversed(entries)))
    assert [e.id for e in book] == [1, 2, 3, 4, 5, 6, 7]


def test_get_and_remove_unknown(entries):
    book = storage.Book(entries)
    with pytest.raises(LedgerError, match="#99"):
        book.remove(99)
    assert book.categories() == ["food/coffee", "food/groceries", "food/restaurants", "rent", "salary"]


def test_save_leaves_no_temporary_files(tmp_path, entries):
    path = tmp_path / "ledger.json"
    storage.save(storage.Book(entries), path)
    storage.save(storage.Book(entries[:2]), path)
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]
    assert len(storage.load(path)) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"version": 2, "entries": []}', "version 1"),
        ('{"version": 1, "entries": [{"id": 1}]}', "malformed"),
    ],
    ids=["invalid-json", "wrong-version", "malformed-entry"],
)
def test_load_reports_bad_files(tmp_path, content, message):
    path = tmp_path / "ledger.json"
    path.write_text(content)
    with pytest.raises(LedgerError, match=message):
        storage.load(path)


def test_default_path_uses_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LEDGER_FILE", str(tmp_path / "x.json"))
    assert storage.default_path() == tmp_path / "x.json"
    monkeypatch.delenv("LEDGER_FILE")
    assert storage.default_path().name == ".ledger.json"

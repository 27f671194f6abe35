"""The ledger file: a JSON document holding every entry.

The file is rewritten whole on every change. Writes go to a temporary file in the same
directory which then replaces the original, so a crash mid-write leaves the old file
intact rather than a truncated one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .models import Entry, LedgerError

FORMAT_VERSION = 1


class Book:
    """All entries of one ledger, with the next id to hand out."""

    def __init__(self, entries: list[Entry] | None = None, next_id: int | None = None) -> None:
        self._entries = {entry.id: entry for entry in entries or []}
        highest = max(self._entries, default=0)
        self.next_id = max(next_id or 1, highest + 1)

    def __iter__(self) -> Iterator[Entry]:
        """Entries by date, then by id."""
        return iter(sorted(self._entries.values(), key=lambda e: (e.date, e.id)))

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, entry: Entry) -> Entry:
        """Store ``entry`` under a fresh id (its own ``id`` is ignored) and return the stored entry."""
        stored = Entry(
            id=self.next_id,
            date=entry.date,
            amount=entry.amount,
            category=entry.category,
            description=entry.description,
            tags=entry.tags,
        )
        self._entries[stored.id] = stored
        self.next_id += 1
        return stored

    def get(self, entry_id: int) -> Entry:
        try:
            return self._entries[entry_id]
        except KeyError:
            raise LedgerError(f"no entry #{entry_id}") from None

    def remove(self, entry_id: int) -> Entry:
        entry = self.get(entry_id)
        del self._entries[entry_id]
        return entry

    def categories(self) -> list[str]:
        return sorted({entry.category for entry in self._entries.values()})


def load(path: Path) -> Book:
    """Read a ledger file; a missing file is an empty ledger."""
    if not path.exists():
        return Book()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise LedgerError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
        raise LedgerError(f"{path} is not a version {FORMAT_VERSION} ledger file")
    try:
        entries = [Entry.from_dict(item) for item in data.get("entries", [])]
    except (KeyError, ValueError, ArithmeticError) as exc:
        raise LedgerError(f"{path} has a malformed entry: {exc!r}") from None
    return Book(entries, next_id=int(data.get("next_id", 1)))


def save(book: Book, path: Path) -> None:
    """Write ``book`` to ``path`` atomically."""
    data = {
        "version": FORMAT_VERSION,
        "next_id": book.next_id,
        "entries": [entry.to_dict() for entry in book],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def default_path() -> Path:
    """``$LEDGER_FILE`` if set, else ``~/.ledger.json``."""
    return Path(os.environ.get("LEDGER_FILE") or Path.home() / ".ledger.json")

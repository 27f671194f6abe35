"""The ``ledger`` command line.

``main`` parses arguments, runs one subcommand against the ledger file and returns the
exit status: 0 on success, 1 for a :class:`LedgerError` (printed as ``ledger: error:``),
2 for bad usage (argparse's convention).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import TextIO

from . import __version__, reports, storage
from .formatting import format_amount, table
from .models import Entry, LedgerError, parse_amount, parse_category, parse_date, parse_tags
from .query import Filter, parse_period, select


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ledger", description="Track income and expenses.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--file", type=Path, help="ledger file (default: $LEDGER_FILE or ~/.ledger.json)")
    commands = parser.add_subparsers(dest="command", required=True)

    add = commands.add_parser("add", help="record an entry")
    add.add_argument("amount", help="positive for income, negative for an expense")
    add.add_argument("category", help="e.g. food/groceries")
    add.add_argument("description", nargs="?", default="")
    add.add_argument("--date", default="today", help="YYYY-MM-DD, today or yesterday")
    add.add_argument("--tags", default="", help="comma-separated tags")

    list_ = commands.add_parser("list", help="show entries")
    _add_filter_options(list_)

    balance = commands.add_parser("balance", help="print income minus expenses")
    _add_filter_options(balance)

    report = commands.add_parser("report", help="summaries")
    report.add_argument("kind", choices=["categories", "monthly", "top"])
    report.add_argument("--depth", type=int, help="fold categories to this many levels")
    _add_filter_options(report)

    remove = commands.add_parser("remove", help="delete an entry")
    remove.add_argument("id", type=int)
    return parser


def _add_filter_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--period", help="2024, 2024-03, 2024-Q1 or START..END")
    parser.add_argument("--category", help="a category and its subcategories")
    parser.add_argument("--search", help="text the description must contain")
    parser.add_argument("--tag", help="only entries with this tag")


def _filter_from(args: argparse.Namespace) -> Filter:
    return Filter(
        period=parse_period(args.period) if args.period else None,
        category=parse_category(args.category) if args.category else None,
        text=args.search,
        tag=args.tag,
    )


def cmd_add(args: argparse.Namespace, book: storage.Book, out: TextIO, today: date) -> bool:
    entry = Entry(
        id=0,
        date=parse_date(args.date, today=today),
        amount=parse_amount(args.amount),
        category=parse_category(args.category),
        description=args.description.strip(),
        tags=parse_tags(args.tags),
    )
    stored = book.add(entry)
    print(f"added #{stored.id}", file=out)
    return True


def cmd_list(args: argparse.Namespace, book: storage.Book, out: TextIO, today: date) -> bool:
    entries = select(book, _filter_from(args))
    if not entries:
        print("no entries", file=out)
        return False
    rows = [(e.id, e.date.isoformat(), e.category, format_amount(e.amount), e.description) for e in entries]
    print(table(["#", "date", "category", "amount", "description"], rows, align="rllrl"), file=out)
    return False


def cmd_balance(args: argparse.Namespace, book: storage.Book, out: TextIO, today: date) -> bool:
    print(format_amount(reports.balance(select(book, _filter_from(args)))), file=out)
    return False


def cmd_report(args: argparse.Namespace, book: storage.Book, out: TextIO, today: date) -> bool:
    entries = select(book, _filter_from(args))
    if args.kind == "categories":
        rows = [
            (name, format_amount(total)) for name, total in reports.by_category(entries, depth=args.depth)
        ]
        print(table(["category", "total"], rows, align="lr"), file=out)
    elif args.kind == "monthly":
        rows = [
            (m.month, format_amount(m.income), format_amount(m.expenses), format_amount(m.net))
            for m in reports.monthly(entries)
        ]
        print(table(["month", "income", "expenses", "net"], rows, align="lrrr"), file=out)
    else:
        rows = [
            (e.date.isoformat(), e.category, format_amount(e.amount), e.description)
            for e in reports.largest_expenses(entries)
        ]
        print(table(["date", "category", "amount", "description"], rows, align="llrl"), file=out)
    return False


def cmd_remove(args: argparse.Namespace, book: storage.Book, out: TextIO, today: date) -> bool:
    entry = book.remove(args.id)
    print(
        f"removed #{entry.id} ({entry.date.isoformat()} {entry.category} {format_amount(entry.amount)})",
        file=out,
    )
    return True


COMMANDS = {
    "add": cmd_add,
    "list": cmd_list,
    "balance": cmd_balance,
    "report": cmd_report,
    "remove": cmd_remove,
}


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    today: date | None = None,
) -> int:
    """Run the command line; each command returns whether it changed the book (then it is saved)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    args = build_parser().parse_args(argv)
    path = args.file or storage.default_path()
    try:
        book = storage.load(path)
        changed = COMMANDS[args.command](args, book, out, today or date.today())
        if changed:
            storage.save(book, path)
    except LedgerError as exc:
        print(f"ledger: error: {exc}", file=err)
        return 1
    return 0

"""The ``--quick`` mode every benchmark has: its whole path in seconds, its files in a temporary folder.

A quick run is a smoke test, not a measurement (``tests/test_benchmarks_quick.py`` runs every
script this way, so that none rots when an API it calls moves): tiny sizes, one repeat, and its
outputs in a fresh temporary folder, never over the measured numbers in ``benchmarks/results/``.
Scripts import this module by its bare name: Python puts a script's own folder on ``sys.path``.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def parse_args(parser: argparse.ArgumentParser, sizes: dict[str, Any],
               argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with a ``--quick`` flag added. With it, each of ``sizes``
    replaces the parsed value of that name; ``args.results_dir`` is then a fresh temporary
    folder, else ``benchmarks/results``."""
    shown = ", ".join(f"{name}={value}" for name, value in sizes.items())
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke test of the whole path in seconds, not a measurement ({shown or 'as is'}); "
                             "results go to a temporary folder, never to benchmarks/results")
    args = parser.parse_args(argv)
    for name, value in sizes.items() if args.quick else ():
        if not hasattr(args, name):
            raise AttributeError(f"quick size {name!r} is not an option of {parser.prog}")
        setattr(args, name, value)
    args.results_dir = Path(tempfile.mkdtemp(prefix="opencomposer-quick-")) if args.quick else RESULTS
    return args

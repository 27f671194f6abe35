"""``opencomposer report RUN_DIR``: draw an RL run's curves to PNG (``rl.report``). A folder that is
not an RL run folder (no ``metrics.jsonl``) is one line and exit 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(args: argparse.Namespace) -> int:
    from opencomposer.rl.report import draw_report

    try:
        paths = draw_report(Path(args.run))
    except FileNotFoundError as e:  # names the file it lacks and the folder
        print(f"opencomposer report: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(paths) - 1} panels to {paths[0].parent} and {paths[-1]}")
    return 0

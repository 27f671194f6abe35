"""``opencomposer report RUN_DIR``: draw an RL run's curves to PNG (``rl.report``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def main(args: argparse.Namespace) -> int:
    from opencomposer.rl.report import draw_report

    paths = draw_report(Path(args.run))
    print(f"wrote {len(paths) - 1} panels to {paths[0].parent} and {paths[-1]}")
    return 0

"""Handlers of ``opencomposer tasks ...``: check a suite, import from and export to other formats."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opencomposer.config import load_recipe
from opencomposer.tasks.format import TaskFormatError, load_suite


def check_main(args: argparse.Namespace) -> int:
    try:
        tasks = load_suite(args.suite)
    except TaskFormatError as e:
        print(f"opencomposer tasks check: {e}", file=sys.stderr)
        return 2
    for task in tasks:
        print(f"{task.id}: {len(task.fail_to_pass)} fail->pass, {len(task.pass_to_pass)} pass->pass, "
              f"gold patch: {'yes' if task.gold_patch else 'no'}")
    print(f"{len(tasks)} task(s) OK")
    return 0


def import_main(args: argparse.Namespace) -> int:
    from opencomposer.tasks import importers

    out = Path(args.out)
    try:
        if args.format == "humaneval":
            tasks = importers.import_humaneval(out, limit=args.limit, overwrite=args.overwrite)
        elif args.format == "swebench":
            if not args.repo:
                print("opencomposer tasks import swebench: --repo CHECKOUT is required", file=sys.stderr)
                return 2
            tasks = importers.import_swebench(Path(args.source), Path(args.repo), out, overwrite=args.overwrite)
        else:
            config = load_recipe(args.recipe, args.overrides)
            tasks = importers.import_harbor(Path(args.source), out, config.sandbox,
                                            run_solutions=not args.no_solutions, overwrite=args.overwrite)
    except (TaskFormatError, FileExistsError) as e:
        print(f"opencomposer tasks import: {e}", file=sys.stderr)
        return 2
    print(f"imported {len(tasks)} task(s) into {out}")
    return 0


def export_main(args: argparse.Namespace) -> int:
    from opencomposer.tasks import exporters

    try:
        if args.format == "harbor":
            tasks = load_suite(args.source)
            for task in tasks:
                exporters.export_harbor(task, Path(args.out) / task.id)
            print(f"exported {len(tasks)} task(s) to {args.out}")
        else:
            count = exporters.export_swebench_predictions(Path(args.source), Path(args.out), args.model_name)
            print(f"wrote {count} prediction(s) to {args.out}")
    except (TaskFormatError, FileExistsError, ValueError) as e:
        print(f"opencomposer tasks export: {e}", file=sys.stderr)
        return 2
    return 0

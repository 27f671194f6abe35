"""``opencomposer basecheck``: the base-model selection checks of docs/recipe.md §2 (``bench.basecheck``).

Runs codebase NLL, state tracking and FreshBench-like QA on every ``--model``, prints a table and
writes ``--out`` as JSON: ``{MODEL: {"codebase_nll_per_byte", "state_tracking_distance",
"freshbench_accuracy", "detail"}}``. The sizes are the recipe's ``[basecheck]``, each field also a
flag (declared in ``cli.py``). Bad input (a model that is neither a kind nor a checkpoint folder, a
repository that is not one, an unknown package) stops the run before any model loads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from opencomposer.config import load_recipe


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from opencomposer.bench.basecheck import results_table, run_basecheck, write_results

    config = load_recipe(args.recipe, args.overrides)
    results = run_basecheck(args.model, config.basecheck, progress=True)
    Console().print(results_table(results))
    write_results(results, Path(args.out))
    print(f"results: {args.out}")
    return 0

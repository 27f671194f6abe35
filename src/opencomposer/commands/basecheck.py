"""``opencomposer basecheck``: the base-model selection checks of docs/recipe.md §2 (``bench.basecheck``).

Runs codebase NLL, state tracking and FreshBench-like QA on every ``--model``, prints a table and
writes ``--out`` as JSON: ``{MODEL: {"codebase_nll_per_byte", "state_tracking_distance",
"freshbench_accuracy", "detail"}}``. Bad input (a model that is neither a kind nor a checkpoint
folder, a repository that is not one, an unknown package) stops the run before any model loads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from opencomposer.bench.basecheck import BasecheckError, BasecheckSettings, results_table, run_basecheck

    settings = BasecheckSettings(
        window=args.window, nll_repos=args.nll_repo, nll_bytes=args.nll_bytes, history_repos=args.history_repo,
        histories=args.histories, repo_histories=args.repo_histories, questions=args.questions,
        packages=args.package, seed=args.seed, device=args.device, threads=args.threads,
    )
    out = Path(args.out)
    if out.is_dir():
        print(f"opencomposer basecheck: --out {out}: is a folder; expected a JSON file path", file=sys.stderr)
        return 2
    try:
        results = run_basecheck(args.model, settings, progress=True)
    except BasecheckError as e:
        print(f"opencomposer basecheck: {e}", file=sys.stderr)
        return 2
    Console().print(results_table(results))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {out}")
    return 0

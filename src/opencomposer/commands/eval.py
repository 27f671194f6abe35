"""``opencomposer eval``: run one or several policies over a task suite and score them (``bench.eval``).

``--suite``, ``--policy`` (repeatable), ``--samples`` (``--passes``), ``--price`` (repeatable),
``--after``, ``--workers``, ``--limit`` and ``--out`` are shorthands for ``--set eval.*`` (declared in
``cli.py``), so everything here comes from the resolved recipe. A suite or output folder that is
not there was refused by ``cli.main`` already; the recipe's model paths are checked here, where a
policy says whether it loads that model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from opencomposer.config import ConfigError, load_recipe
from opencomposer.config.bench import parse_date, policy_prices
from opencomposer.config.paths import MODEL_PATHS, check_recipe_paths
from opencomposer.tasks.format import load_suite
from opencomposer.types import Task


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from opencomposer.agent.policy import make_policy
    from opencomposer.bench.eval import run_eval
    from opencomposer.bench.pareto import write_report
    from opencomposer.bench.summary import comparison_table, summary_table

    config = load_recipe(args.recipe, args.overrides)
    settings = config.eval
    if not settings.suite:
        raise ConfigError("eval.suite: no suite given; pass --suite DIR (a folder of task folders)")
    if "local" in settings.policy_specs:  # the recipe's model; local:CHECKPOINT names its own folder
        check_recipe_paths(config, MODEL_PATHS)
    loaded = load_suite(settings.suite)
    tasks = tasks_after(loaded, settings.after) if settings.after else loaded
    if settings.limit:
        tasks = tasks[: settings.limit]
    console = Console()
    if settings.after:
        console.print(f"--after {settings.after}: {len(tasks)} of {len(loaded)} tasks dated on or after it")
    policies = [make_policy(spec, config) for spec in settings.policy_specs]
    out_dir = Path(settings.out_dir) if settings.out_dir else config.run.path / "eval"
    result = run_eval(tasks, policies, config, out_dir, passes=settings.passes, workers=settings.workers,
                      prices=policy_prices(settings.prices, len(policies)))
    for name, summary in result.summaries.items():
        console.print(summary_table(summary, title=f"{name} on {settings.suite}"))
    if len(result.summaries) > 1:
        console.print(comparison_table(result.summaries, title=f"{len(policies)} policies on {settings.suite}"))
    after = f", tasks dated on or after {settings.after}" if settings.after else ""
    page = write_report(out_dir, result.summaries, title=f"opencomposer eval: {settings.suite}",
                        note=f"{len(tasks)} tasks × {settings.passes} samples per policy{after}; "
                             f"the same seeds for every policy.", cost=result.cost)
    print(f"results: {out_dir / 'results.jsonl'}\nreport:  {page}")
    return 0


def tasks_after(tasks: list[Task], after: str) -> list[Task]:
    """The tasks whose ``metadata.date`` is on or after ``after`` (``YYYY-MM-DD``); an undated task
    is left out, since nothing shows it is newer than a model's training data."""
    cutoff = parse_date(after, "eval.after").isoformat()
    return [task for task in tasks if task.metadata.get("date", "") >= cutoff]

"""``opencomposer eval``: run a policy over a task suite and score it (``bench.eval``).

``--suite``, ``--policy``, ``--passes``, ``--workers``, ``--limit`` and ``--out`` are shorthands for
``--set eval.*`` (declared in ``cli.py``), so everything here comes from the resolved recipe. A suite
or output folder that is not there was refused by ``cli.main`` already; the recipe's model paths
are checked here, where the policy says whether it loads that model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from opencomposer.config import ConfigError, load_recipe
from opencomposer.config.paths import MODEL_PATHS, check_recipe_paths
from opencomposer.tasks.format import load_suite


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from opencomposer.agent.policy import make_policy
    from opencomposer.bench.eval import run_eval
    from opencomposer.bench.summary import summary_table

    config = load_recipe(args.recipe, args.overrides)
    if not config.eval.suite:
        raise ConfigError("eval.suite: no suite given; pass --suite DIR (a folder of task folders)")
    if config.eval.policy == "local":  # the recipe's model; local:CHECKPOINT names its own folder
        check_recipe_paths(config, MODEL_PATHS)
    tasks = load_suite(config.eval.suite)
    if config.eval.limit:
        tasks = tasks[: config.eval.limit]
    policy = make_policy(config.eval.policy, config)
    out_dir = Path(config.eval.out_dir) if config.eval.out_dir else config.run.path / "eval"
    result = run_eval(tasks, policy, config, out_dir, passes=config.eval.passes, workers=config.eval.workers)
    Console().print(summary_table(result.summary, title=f"{policy.name} on {config.eval.suite}"))
    print(f"results: {out_dir / 'results.jsonl'}")
    return 0

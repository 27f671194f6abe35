"""``opencomposer serve --model PATH``: an OpenAI-compatible server over a checkpoint
(``serve.server``). Exits 2 with a one-line message for an unknown model or a taken port."""

from __future__ import annotations

import argparse
import sys


def main(args: argparse.Namespace) -> int:
    from opencomposer.serve.server import ServeError, ServerConfig, serve

    try:
        serve(ServerConfig(model=args.model, host=args.host, port=args.port))
    except ServeError as e:
        print(f"opencomposer serve: {e}", file=sys.stderr)
        return 2
    return 0

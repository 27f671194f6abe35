"""The handlers of the ``opencomposer`` command, one module per command.

Each handler takes the parsed ``argparse.Namespace``, turns it into typed arguments (a ``Config``
from the recipe and ``--set`` overrides, paths, counts) and calls the library; no library module
imports argparse. ``cli.py`` declares the arguments and imports a handler only when it runs.
"""

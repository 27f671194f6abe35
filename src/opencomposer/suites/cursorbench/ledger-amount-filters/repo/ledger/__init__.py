"""A command-line ledger of income and expenses kept in a JSON file."""

__version__ = "0.3.1"

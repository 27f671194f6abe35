"""Python source parsed from several threads at once.

CPython 3.11 keeps the counter that guards the AST converter's recursion in interpreter-wide
state, so two threads in ``ast.parse`` (or ``ast.literal_eval`` of text) at once can fail with
"SystemError: AST constructor recursion depth mismatch" (fixed in later CPython releases). Task
generation, grading and the agent's tools parse code in worker threads (generation indices,
rollouts, graders), so every parse of the package goes through one lock here.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

_LOCK = threading.Lock()


def parse(text: str, mode: str = "exec") -> ast.AST:
    """``ast.parse(text, mode=mode)``, one thread at a time."""
    with _LOCK:
        return ast.parse(text, mode=mode)


def literal_eval(node_or_text: ast.AST | str) -> Any:
    """``ast.literal_eval``, one thread at a time (it parses text)."""
    with _LOCK:
        return ast.literal_eval(node_or_text)

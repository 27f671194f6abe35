"""``opencomposer.pysource``: every parse of Python text in the package goes through its lock.

CPython 3.11's AST converter keeps its recursion counter in interpreter-wide state; two threads in
``ast.parse`` at once can fail with "SystemError: AST constructor recursion depth mismatch" (seen in
the task generators' threaded test). The race is too rare to provoke on demand, so the defence is
structural: no module of the package but ``pysource`` calls ``ast.parse`` or ``ast.literal_eval``
(the checker's control: it finds such a call in a module that makes one)."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

from opencomposer import pysource

PACKAGE = Path(pysource.__file__).resolve().parent


def direct_calls(tree: ast.AST) -> list[int]:
    """Lines that call ``ast.parse`` or ``ast.literal_eval`` (the module ``ast``'s functions)."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "ast"
            and node.func.attr in ("parse", "literal_eval")]


def test_no_module_but_pysource_parses_python_itself():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "suites" or path.name == "pysource.py":  # task data, and the lock's own module
            continue
        found += [f"{relative}:{line}" for line in direct_calls(ast.parse(path.read_text()))]
    assert not found, "call opencomposer.pysource.parse / literal_eval instead: " + ", ".join(found)
    control = "import ast\ndef f(text):\n    return ast.parse(text), ast.literal_eval('1')\n"
    assert direct_calls(ast.parse(control)) == [3, 3]


def test_parse_and_literal_eval_from_many_threads():
    text = "x = " + "(" * 30 + "1" + ")" * 30 + "\n" + "def f():\n    return [i for i in range(3)]\n" * 50
    expected = ast.dump(ast.parse(text))
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(ast.dump(pysource.parse(text)) == expected and pysource.literal_eval("[1, (2, 3)]") == [1, (2, 3)])
        except Exception as error:  # noqa: BLE001 - any failure in a thread is the test's failure
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(results) == 80 and all(results)
    assert isinstance(pysource.parse("1 + 2", mode="eval"), ast.Expression)

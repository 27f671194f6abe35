"""``tasks.mutation``: mutants of a gold change's own lines, and a score that tells strong tests
from weak ones.

The example change adds ``letter`` (two thresholds, three returns) to a module that already has
``double``. Only the added lines are mutated, every mutant compiles and differs from the gold text,
and the draw is deterministic. Scored through the real sandbox (``generators.common.Lab``), tests
that pin ``letter`` down on both sides of each threshold reject every mutant; a test that only
checks the type of one result lets most through. (A ``clamp`` would be a poor example: ``x < low``
-> ``x <= low`` returns the same value at the bound, an equivalent mutant no test can reject.)
"""

from __future__ import annotations

import ast

import pytest

from opencomposer.tasks.generators.common import Lab
from opencomposer.tasks.mutation import MUTATION_FLOOR, added_lines, file_mutants, mutants, score

BEFORE = "def double(x):\n    return x * 2\n"
AFTER = BEFORE + ('\n\ndef letter(score):\n    if score >= 90:\n        return "A"\n'
                  '    if score >= 80:\n        return "B"\n    return "C"\n')
TREE_BEFORE = {"calc.py": BEFORE.encode()}
TREE_AFTER = {"calc.py": AFTER.encode()}
STRONG = ("from calc import letter\n\n\ndef test_inside():\n    assert letter(95) == 'A'\n\n\n"
          "def test_bounds():\n    assert [letter(s) for s in (90, 89, 80, 79)] == ['A', 'B', 'B', 'C']\n")
WEAK = "from calc import letter\n\n\ndef test_inside():\n    assert letter(95) is not None\n"


def test_added_lines_are_the_new_lines_of_the_file():
    assert added_lines(BEFORE, AFTER) == {3, 4, 5, 6, 7, 8, 9, 10}
    assert added_lines("a\nb\n", "a\nc\n") == {2}


def test_only_the_changed_lines_are_mutated_and_every_mutant_compiles():
    found = file_mutants("calc.py", AFTER, added_lines(BEFORE, AFTER))
    assert found and all(m.line >= 5 for m in found)  # `return x * 2` (line 2) is never touched
    descriptions = {m.description for m in found}
    assert "calc.py:6 GtE -> Gt" in descriptions and "calc.py:8 GtE -> Gt" in descriptions
    assert "calc.py:6 90 -> 91" in descriptions and "calc.py:7 'A' -> ''" in descriptions
    assert "calc.py:6 If condition negated" in descriptions
    assert "calc.py:7 return value dropped" in descriptions
    for mutant in found:
        ast.parse(mutant.source)
        assert mutant.source != AFTER
        assert mutant.source.startswith(BEFORE)  # the rest of the file keeps its text
    assert "if (score > 90):" in next(m.source for m in found if m.description == "calc.py:6 GtE -> Gt")


def test_the_draw_is_capped_deterministic_and_spread_over_operators():
    first = mutants(TREE_BEFORE, TREE_AFTER, limit=4, seed="x")
    assert first == mutants(TREE_BEFORE, TREE_AFTER, limit=4, seed="x")
    assert len(first) == 4 and len({m.operator for m in first}) >= 3
    assert len(mutants(TREE_BEFORE, TREE_AFTER, limit=100)) == len(file_mutants("calc.py", AFTER, added_lines(BEFORE, AFTER)))
    assert mutants(TREE_BEFORE, TREE_BEFORE) == []


@pytest.mark.integration
def test_strong_tests_reject_the_mutants_and_weak_ones_do_not():
    lab = Lab()
    chosen = mutants(TREE_BEFORE, TREE_AFTER, limit=5, seed=0)

    def runner(state):
        return lab.run(state, "python -m pytest -q -p no:cacheprovider").passed

    strong_state = {**TREE_AFTER, "test_calc.py": STRONG.encode()}
    strong = score(strong_state, chosen, {"test_calc.py::test_inside", "test_calc.py::test_bounds"}, runner)
    weak = score({**TREE_AFTER, "test_calc.py": WEAK.encode()}, chosen, {"test_calc.py::test_inside"}, runner)
    assert strong.mutants == weak.mutants == 5
    assert strong.score == 1.0 and strong.survivors == []
    assert weak.score < MUTATION_FLOOR and len(weak.survivors) >= 3

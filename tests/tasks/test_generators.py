"""The generators' code analysis and edits, exactly, without running any test suite.

What each operator of bug injection changes, what feature deletion removes (and that no trace of
it is left), what the refactors rewrite, how visible tests are stripped, and that every random
draw is a pure function of its keys. The end-to-end generation through the sandbox is in
``test_generators_tasks.py``.
"""

from __future__ import annotations

import ast

import pytest

from opencomposer.sandbox.patch import diff_stats
from opencomposer.tasks.generators.bugs import (
    OPERATORS,
    apply_mutations,
    bug_report,
    find_mutations,
    hide_tests,
)
from opencomposer.tasks.generators.common import code_patch, rng_for
from opencomposer.tasks.generators.deletion import delete_feature, find_features, signature, visible_tests
from opencomposer.tasks.generators.edits import function_of, humanize, mentioning, strip_tests
from opencomposer.tasks.generators.refactor import (
    default_plans,
    new_name,
    plan_rename,
    rename_plans,
    thread_plans,
)
from opencomposer.tasks.generators.source import (
    find_traces,
    is_test_path,
    load_source,
    project,
    project_names,
    protected_roots,
    read_tree,
)

CLAMP = '''def clamp(value, low, high):
    """Keep value in range."""
    if value < low:
        return low
    if value > high and high is not None:
        return high
    total = value + 1
    return min(total - 1, high)
'''

PRICE = '''from decimal import Decimal


def price(amount, rush=False):
    step = Decimal("0.05")
    if rush:
        step = step * 2
    done = True
    for i in range(len(amount)):
        amount[i] -= step
    return round(amount[0], 2), done
'''


def mutations(text: str) -> list[tuple[str, int, str, str]]:
    return [(m.operator, m.line, m.before, m.after) for m in find_mutations("m.py", text)]


# --------------------------------------------------------------------------- bug injection


def test_every_operator_on_a_guarded_function():
    assert mutations(CLAMP) == [
        ("dropped_condition", 3, "    if value < low:\n        return low\n", ""),
        ("comparison", 3, "<", "<="),
        ("dropped_return", 4, "return low", "pass"),
        ("dropped_condition", 5, "    if value > high and high is not None:\n        return high\n", ""),
        ("boolean_operator", 5, "and", "or"),
        ("dropped_condition", 5, "value > high and high is not None", "value > high"),
        ("dropped_condition", 5, "value > high and high is not None", "high is not None"),
        ("comparison", 5, ">", ">="),
        ("comparison", 5, "is not", "is"),
        ("dropped_return", 6, "return high", "pass"),
        ("binary_operator", 7, "+", "-"),
        ("off_by_one", 7, "1", "2"),
        ("off_by_one", 7, "1", "0"),
        ("swapped_arguments", 8, "total - 1, high", "high, total - 1"),
        ("binary_operator", 8, "-", "+"),
        ("off_by_one", 8, "1", "2"),
        ("off_by_one", 8, "1", "0"),
    ]


def test_constants_augmented_assignment_and_numeric_strings():
    assert mutations(PRICE) == [
        ("constant", 5, "0.05", "0.06"),
        ("binary_operator", 7, "*", "/"),
        ("off_by_one", 7, "2", "3"),
        ("off_by_one", 7, "2", "1"),
        ("constant", 8, "True", "False"),
        ("binary_operator", 10, "-=", "+="),
        ("swapped_arguments", 11, "amount[0], 2", "2, amount[0]"),
        ("off_by_one", 11, "0", "1"),
        ("constant", 11, "2", "4"),
    ]


def test_module_level_code_docstrings_and_fstrings_are_left_alone():
    text = 'LIMIT = 10 + 1\n\n\ndef f(x):\n    """Doc 1 + 2."""\n    return f"{x + 1}"\n'
    assert mutations(text) == []


def test_applied_mutations_change_only_their_site_and_still_parse():
    tree = {"m.py": CLAMP.encode()}
    every = find_mutations("m.py", CLAMP)
    for mutation in every:
        changed = apply_mutations(tree, [mutation])["m.py"].decode()
        ast.parse(changed)
        assert changed != CLAMP
    swap = next(m for m in every if m.operator == "comparison" and m.before == "<")
    off = next(m for m in every if m.operator == "off_by_one" and m.line == 7 and m.after == "2")
    both = apply_mutations(tree, [swap, off])["m.py"].decode()
    assert both == CLAMP.replace("value < low", "value <= low").replace("value + 1", "value + 2")


def test_every_project_offers_every_operator():
    for name in project_names():
        source = project(name)
        operators = {m.operator for path in source.code_files
                     for m in find_mutations(path, source.tree[path].decode())}
        assert operators == set(OPERATORS), (name, set(OPERATORS) - operators)


def test_bug_report_names_behaviours_never_test_code():
    source = project("inventory")
    mutation = next(m for m in find_mutations("src/inventory/pricing.py",
                                              source.tree["src/inventory/pricing.py"].decode())
                    if m.function == "PercentOff.apply")
    failing = ["tests/test_pricing.py::test_percent_off_all_lines", "tests/test_pricing.py::test_rules_apply_in_order"]
    assert bug_report(source, [mutation], failing, "function", 2) == (
        'Bug in `PercentOff.apply` (src/inventory/pricing.py): "percent off all lines" is broken. Please fix.')
    assert bug_report(source, [mutation], failing, "behaviour", 0) == (
        '"percent off all lines" is broken in inventory since the last merge. Please fix.')


# --------------------------------------------------------------------------- tests stripping

TESTS = '''import pytest

from pkg import alpha, beta, gamma


def helper():
    return beta(1)


def test_alpha():
    assert alpha(1) == 2


def test_beta():
    assert helper() == 3


class TestGamma:
    def test_one(self):
        assert gamma() == 1

    def test_two(self):
        assert gamma() == 1
'''


def test_strip_tests_removes_tests_and_the_imports_only_they_used():
    assert strip_tests(TESTS, {"test_alpha", "TestGamma.test_one"}) == (
        "import pytest\n\nfrom pkg import beta, gamma\n\n\ndef helper():\n    return beta(1)\n\n\n"
        "def test_beta():\n    assert helper() == 3\n\n\nclass TestGamma:\n    def test_two(self):\n"
        "        assert gamma() == 1\n"
    )
    assert strip_tests(TESTS, {"test_alpha", "TestGamma.test_one", "TestGamma.test_two"}) == (
        "import pytest\n\nfrom pkg import beta\n\n\ndef helper():\n    return beta(1)\n\n\n"
        "def test_beta():\n    assert helper() == 3\n"
    )
    assert strip_tests(TESTS, {"test_alpha", "test_beta", "TestGamma.test_one", "TestGamma.test_two"}) is None


def test_mentioning_follows_helpers_and_fixtures():
    assert mentioning(TESTS, {"beta"}) == {"helper", "test_beta"}
    assert mentioning(TESTS, {"gamma"}) == {"TestGamma.test_one", "TestGamma.test_two"}


def test_hide_tests_drops_files_left_without_tests():
    tests = {"tests/test_a.py": TESTS.encode(), "tests/conftest.py": b"import pytest\n"}
    visible = hide_tests(tests, {"tests/test_a.py": {"test_alpha", "test_beta", "TestGamma.test_one",
                                                     "TestGamma.test_two"}})
    assert visible == {"tests/conftest.py": b"import pytest\n"}


def test_node_ids_and_names():
    assert function_of("tests/test_x.py::TestA::test_b[case-1]") == "TestA.test_b"
    assert function_of("tests/test_x.py::test_c") == "test_c"
    assert humanize("test_percent_off_rounds_half_up[x]") == "percent off rounds half up"
    assert humanize("testParseHTTPResponse") == "parse httpresponse"


# --------------------------------------------------------------------------- feature deletion


def test_deletable_features_of_textkit():
    labels = [f.label for f in find_features(project("textkit"))]
    assert "src/textkit/case.py:to_camel + src/textkit/filters.py:camel" in labels  # spans two files
    assert "src/textkit/case.py:detect_case" in labels
    assert not any(label.endswith(":register") for label in labels)  # module-level code uses it
    assert not any(":_" in label for label in labels)  # private helpers go with a feature, never alone


def test_deleting_a_feature_removes_its_export_and_leaves_no_trace():
    source = project("textkit")
    feature = next(f for f in find_features(source) if f.label == "src/textkit/case.py:detect_case")
    broken = delete_feature(source, feature)
    changed = sorted(p for p in broken if broken[p] != source.tree[p])
    assert changed == ["src/textkit/__init__.py", "src/textkit/case.py"]
    patch = code_patch(broken, source.code_tree())
    assert patch.count("\n+def detect_case(identifier: str) -> str:\n") == 1
    assert '+    "detect_case",\n' in patch and "+from .case import detect_case, split_words" in patch
    for path, data in broken.items():
        assert b"def detect_case" not in data, path
    assert signature(feature.units[0]) == "detect_case(identifier: str) -> str"


def test_spanning_feature_deletes_the_caller_and_prunes_imports():
    source = project("textkit")
    feature = next(f for f in find_features(source)
                   if f.label == "src/textkit/case.py:to_camel + src/textkit/filters.py:camel")
    broken = delete_feature(source, feature)
    filters = broken["src/textkit/filters.py"].decode()
    assert "def camel(" not in filters and "def kebab(" in filters
    assert "to_camel" not in broken["src/textkit/__init__.py"].decode()


def test_visible_tests_keep_what_does_not_use_the_deleted_name():
    source = project("textkit")
    tests = source.tests_tree()
    failing = [f"tests/test_case.py::{n}" for n in ("test_split_words", "test_detect_case", "test_to_snake")]
    visible = visible_tests(tests, failing, frozenset({"detect_case"}))
    text = visible["tests/test_case.py"].decode()
    assert "detect_case" not in text and "def test_split_words" in text
    assert visible["tests/test_slug.py"] == tests["tests/test_slug.py"]


# --------------------------------------------------------------------------- refactors


def test_new_names_keep_the_identifier_style():
    assert new_name("get_filter") == "fetch_filter"
    assert new_name("PriceBreak") == "CostBreak"
    assert new_name("OrderService") == "PurchaseService"
    assert new_name("xyzzy") is None


def test_rename_touches_every_module_that_uses_the_name():
    source = project("textkit")
    assert ("src/textkit/filters.py", "get_filter", "fetch_filter") in rename_plans(source)
    plan = plan_rename(source, "src/textkit/filters.py", "get_filter", "fetch_filter")
    assert plan.files == ["src/textkit/filters.py", "src/textkit/template.py"]
    patch = code_patch(source.code_tree(), plan.gold_code)
    assert "+def fetch_filter(name: str) -> Filter:" in patch
    assert "+            func = filter_registry.fetch_filter(name)" in patch
    assert (diff_stats(patch).lines_added, diff_stats(patch).lines_removed) == (2, 2)
    check = plan.grading_tests["tests/test_rename_get_filter.py"].decode()
    assert "assert not hasattr(module, 'get_filter')" in check


def test_rename_skips_names_that_mean_something_else():
    plans = {old for _, old, _ in rename_plans(project("confkit"))}
    assert "merge" in plans
    assert "length" not in plans  # also a parameter or attribute name elsewhere


def test_thread_passes_the_keyword_through_every_caller():
    source = project("textkit")
    [plan] = thread_plans(source)
    assert plan.label == "thread lowercase of slugify"
    assert plan.files == ["src/textkit/filters.py", "src/textkit/slug.py"]
    patch = code_patch(source.code_tree(), plan.gold_code)
    assert "+def slugify_(value: Any, *, lowercase: bool = True) -> str:" in patch
    assert "+    return slug.slugify(str(value), lowercase=lowercase)" in patch
    assert patch.count("lowercase=lowercase") == 3
    check = plan.grading_tests["tests/test_thread_lowercase.py"].decode()
    assert 'module.unique_slug("Hello World", [], lowercase=False)' in check


def test_default_change_follows_the_forwarding_chain_and_pins_old_callers():
    source = project("textkit")
    plans = {p.label: p for p in default_plans(source)}
    assert sorted(plans) == ["default break_long_words True -> False", "default width 70 -> 140"]
    width = plans["default width 70 -> 140"]
    patch = code_patch(source.code_tree(), width.gold_code)
    assert patch.count("+    width: int = 140,") == 2 and "+def fill_paragraphs(text: str, width: int = 140)" in patch
    assert width.grading_tests["tests/test_wrapping.py"] == source.tree["tests/test_wrapping.py"]  # all pass it
    pinned = plans["default break_long_words True -> False"].grading_tests["tests/test_wrapping.py"].decode()
    assert 'assert wrap(text, 10, break_long_words=True) == ["The quick"' in pinned
    assert "break_long_words=False)" in pinned  # a call that already passes it keeps its own value


# --------------------------------------------------------------------------- sources


def test_test_paths_and_protected_roots():
    assert is_test_path("tests/test_a.py") and is_test_path("pkg/tests/data.json")
    assert is_test_path("conftest.py") and is_test_path("lib/thing_test.py")
    assert not is_test_path("src/pkg/testing_utils.py") and not is_test_path("src/pkg/contest.py")
    assert protected_roots(["tests/test_a.py", "tests/sub/x.py", "conftest.py", "pkg/test_b.py"]) == [
        "conftest.py", "pkg/test_b.py", "tests"]


def test_reading_a_repository_skips_caches_and_history(tmp_path):
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "core.py").write_text("def f():\n    return 1\n")
    (tmp_path / "pkg" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / ".mypy_cache").mkdir()
    (tmp_path / ".mypy_cache" / "core.data.json").write_text("{}")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_core.py").write_text("from pkg.core import f\n\n\ndef test_f():\n    assert f() == 1\n")
    assert sorted(read_tree(tmp_path)) == ["pkg/__init__.py", "pkg/core.py", "tests/test_core.py"]
    assert find_traces(tmp_path) == [".git", ".mypy_cache", "pkg/__pycache__", "pkg/__pycache__/core.cpython-311.pyc"]
    source = load_source(tmp_path, "demo")
    assert source.code_files == ["pkg/__init__.py", "pkg/core.py"] and source.package == "pkg"
    assert source.task_command == "python -m pytest -q --continue-on-collection-errors"


def test_a_folder_without_tests_is_not_a_source(tmp_path):
    (tmp_path / "m.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="no test files"):
        load_source(tmp_path)


def test_random_draws_are_a_function_of_their_keys():
    assert rng_for(0, "kind", 3).random() == rng_for(0, "kind", 3).random()
    assert rng_for(0, "kind", 3).random() != rng_for(1, "kind", 3).random()
    assert [rng_for("bugs", "train", 0, 5, 0).randrange(1000) for _ in range(2)] == [
        rng_for("bugs", "train", 0, 5, 0).randrange(1000)] * 2

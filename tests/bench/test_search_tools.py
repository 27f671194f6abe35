"""``benchmarks/search_tools.py``'s prompt-only explorer: the words it greps for, the order grep
gives, its turns to the first edit, and the random order's expectation against enumeration."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

from tests.bench import BENCHMARKS, load_benchmark

sys.path.insert(0, str(BENCHMARKS))  # the script imports its helper (_quick) by name
search_tools = load_benchmark("search_tools")


def test_the_request_words_are_the_identifier_like_ones_without_common_english():
    words = search_tools.prompt_words("Add a `--no-color` flag to the CLI and use it for the echo() output")
    assert words == ["no-color", "flag", "cli", "echo", "output"]


def test_grep_ranks_files_by_the_words_they_hold_ties_in_path_order(tmp_path: Path):
    for name, text in {"b.py": "color\n", "a.py": "color flag\n", "c.py": "nothing\n", "d.py": "FLAG\n"}.items():
        (tmp_path / name).write_text(text)
    assert search_tools.grep_words(tmp_path, "the color flag") == ["a.py", "b.py", "d.py", "c.py"]
    assert search_tools.turns_to_first_edit(["a.py", "b.py", "d.py", "c.py"], ["d.py"]) == 5  # search, 3 reads, edit
    assert search_tools.completed(["c.py"], tmp_path) == ["c.py", "a.py", "b.py", "d.py"]


def test_the_random_orders_expected_turns_match_enumeration():
    for n, g in ((5, 1), (6, 2), (7, 3)):
        files = [str(i) for i in range(n)]
        gold = files[:g]
        orders = list(itertools.permutations(files))
        mean = sum(search_tools.turns_to_first_edit(list(order), gold) for order in orders) / len(orders)
        assert math.isclose(search_tools.random_turns(n, g), mean)

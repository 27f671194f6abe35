"""``tasks stats`` with several suites: side by side with the report's medians, histograms overlaid,
and the mutation scores of mined tasks.

Two suites built here (each a few task folders with a gold patch and a prompt of known size, one
with mutation scores) give medians computed by hand; the comparison table must print them in each
suite's column beside CursorBench's and SWE-bench's, and the figure grows a fourth panel for the
mutation scores.
"""

from __future__ import annotations

import argparse

from opencomposer.commands.tasks import stats_main
from opencomposer.tasks.format import write_task


def gold_patch(lines: int, files: int) -> str:
    """A patch adding ``lines`` lines spread over ``files`` new files."""
    parts = []
    for f in range(files):
        count = lines // files + (1 if f < lines % files else 0)
        body = "".join(f"+x{i} = {i}\n" for i in range(count))
        parts.append(f"diff --git a/m{f}.py b/m{f}.py\nnew file mode 100644\n--- /dev/null\n+++ b/m{f}.py\n"
                     f"@@ -0,0 +1,{count} @@\n{body}")
    return "".join(parts)


def make_suite(root, name, rows):
    for i, (lines, files, chars, score) in enumerate(rows):
        metadata = {"source": "mined", "mutation_score": score} if score is not None else {}
        write_task(root / name / f"{name}-{i}", task_id=f"{name}-{i}", instruction="p" * chars,
                   repo={"README.md": "x\n"}, fail_to_pass=["tests/test_a.py::test_a"], pass_to_pass=[],
                   metadata=metadata, gold_patch=gold_patch(lines, files))
    return root / name


def test_two_suites_side_by_side(tmp_path, capsys):
    small = make_suite(tmp_path, "small", [(4, 1, 900, None), (8, 1, 1500, None), (12, 2, 2000, None)])
    mined = make_suite(tmp_path, "mined", [(100, 2, 200, 0.5), (180, 3, 390, 0.75), (300, 4, 500, 1.0)])
    png = tmp_path / "compare.png"
    args = argparse.Namespace(suite=[str(small), str(mined)], png=str(png), recipe=None, overrides=[])
    assert stats_main(args) == 0
    printed = capsys.readouterr().out
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in printed.splitlines() if line.startswith("│") and "│" in line[1:]}
    assert rows["lines"] == ["8 [6-10]", "180 [140-240]", "181", "7-10"]
    assert rows["files"] == ["1 [1-1.5]", "3 [2.5-3.5]", "-", "-"]
    assert rows["prompt chars"] == ["1500 [1200-1750]", "390 [295-445]", "390", "1,185-3,055"]
    assert rows["mutation score"] == ["-", "0.75 [0.625-0.875]", "-", "-"]
    assert "mined: mutation score of 3 task(s): median 0.75, min 0.5; <0.5: 0, 0.5-0.75: 1, 0.75-1: 1, 1.0: 1" in printed
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000

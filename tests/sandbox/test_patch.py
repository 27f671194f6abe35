"""Unified diffs between folders and applying them back (golden texts, round trips, bad input)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opencomposer.sandbox.patch import (
    PatchError,
    apply_patch,
    comment_text,
    diff_stats,
    diff_trees,
    parse_patch,
)


def write(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_golden_diff_of_a_one_line_change(tmp_path: Path):
    old = write(tmp_path / "a", {"m.py": "a = 1\nb = 2\nc = 3\n"})
    new = write(tmp_path / "b", {"m.py": "a = 1\nb = 20\nc = 3\n"})
    assert diff_trees(old, new) == (
        "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a = 1\n-b = 2\n+b = 20\n c = 3\n"
    )


def test_executable_bit_and_binary_files(tmp_path: Path):
    old = write(tmp_path / "a", {"run.sh": "echo hi\n"})
    new = write(tmp_path / "b", {"run.sh": "echo hi\n"})
    (new / "run.sh").chmod(0o755)
    (new / "blob.bin").write_bytes(b"\0\1\2")
    diff = diff_trees(old, new)
    # git's blob id of b"\0\1\2" (git hash-object), which git apply checks before taking binary data
    assert "index 0000000000000000000000000000000000000000..8352675d67aed6625ece79af41c27fdb4ee2e867\n" \
           "GIT binary patch\nliteral 3\n" in diff
    assert "old mode 100644\nnew mode 100755\n" in diff
    target = tmp_path / "c"
    shutil.copytree(old, target)
    apply_patch(target, diff)
    assert (target / "run.sh").stat().st_mode & 0o111 and (target / "blob.bin").read_bytes() == b"\0\1\2"


def test_a_binary_change_without_data_is_refused(tmp_path: Path):
    root = write(tmp_path, {"x.txt": "keep\n"})
    with pytest.raises(PatchError, match="blob.bin: the patch says this binary file changed but carries no data"):
        apply_patch(root, "diff --git a/blob.bin b/blob.bin\nnew file mode 100644\n"
                          "Binary files /dev/null and b/blob.bin differ\n")
    assert [p.name for p in root.iterdir()] == ["x.txt"]


FILE_TEXT = st.lists(st.sampled_from(["x = 1", "y = 2", "", "def f():", "    return 3", "# note", "z"]),
                     max_size=12).map("\n".join) | st.just("")
TREES = st.dictionaries(st.sampled_from(["a.py", "b.txt", "pkg/c.py", "pkg/d/e.md"]), FILE_TEXT, max_size=4)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], database=None)
@given(before=TREES, after=TREES)
def test_diff_then_apply_round_trips(before: dict[str, str], after: dict[str, str]):
    with tempfile.TemporaryDirectory() as tmp:
        old, new = write(Path(tmp) / "old", before), write(Path(tmp) / "new", after)
        work = Path(tmp) / "work"
        shutil.copytree(old, work)
        apply_patch(work, diff_trees(old, new))
        got = {p.relative_to(work).as_posix(): p.read_text() for p in work.rglob("*") if p.is_file()}
        assert got == after


SWEBENCH_STYLE = """\
diff --git a/src/old_name.py b/src/new_name.py
similarity index 90%
rename from src/old_name.py
rename to src/new_name.py
--- a/src/old_name.py
+++ b/src/new_name.py
@@ -1,2 +1,2 @@
-def f(): return 1
+def f(): return 2
 X = 1
diff --git a/lib.py b/lib.py
index 83db48f..bf269f4 100644
--- a/lib.py
+++ b/lib.py
@@ -3,3 +3,4 @@ def g():
     a = 1
     b = 2
     return a + b
+# end
"""


def test_applies_renames_and_shifted_hunks(tmp_path: Path):
    root = write(tmp_path, {"src/old_name.py": "def f(): return 1\nX = 1\n",
                            "lib.py": "import os\n\n\ndef g():\n    a = 1\n    b = 2\n    return a + b\n"})
    changed = apply_patch(root, SWEBENCH_STYLE)
    assert changed == ["lib.py", "src/new_name.py", "src/old_name.py"]
    assert not (root / "src" / "old_name.py").exists()
    assert (root / "src" / "new_name.py").read_text() == "def f(): return 2\nX = 1\n"
    assert (root / "lib.py").read_text().endswith("    return a + b\n# end\n")  # the hunk moved by 2 lines


def test_a_patch_that_does_not_match_changes_nothing(tmp_path: Path):
    root = write(tmp_path, {"src/old_name.py": "something else\n", "lib.py": "x\n"})
    with pytest.raises(PatchError, match=r"src/new_name.py: hunk 1 .* does not match"):
        apply_patch(root, SWEBENCH_STYLE)
    assert (root / "src" / "old_name.py").read_text() == "something else\n" and (root / "lib.py").read_text() == "x\n"


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "a/../../x"])
def test_unsafe_paths_are_refused(path: str):
    with pytest.raises(PatchError, match="unsafe path"):
        parse_patch(f"--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n".replace("a//", "/").replace("b//", "/"))


def test_truncated_hunk_is_an_error():
    with pytest.raises(PatchError, match="truncated hunk|ended early"):
        parse_patch("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n")


def test_diff_stats_counts_lines_and_added_text():
    stats = diff_stats(SWEBENCH_STYLE)
    assert (stats.files_changed, stats.lines_added, stats.lines_removed) == (2, 2, 1)
    assert stats.paths == ["src/new_name.py", "lib.py"]
    assert stats.added_lines == {"src/new_name.py": ["def f(): return 2"], "lib.py": ["# end"]}


MIXED_LANGUAGES = """\
diff --git a/app/core.py b/app/core.py
--- a/app/core.py
+++ b/app/core.py
@@ -1,4 +1,6 @@
 import os
-# old note
+# Let me handle the empty case
+    # TODO: cache this
 def load(path):
-    return open(path).read()
+    return open(path).read()  # code first: not a comment line
+x = "# inside a string"
diff --git a/scripts/run.sh b/scripts/run.sh
new file mode 100755
--- /dev/null
+++ b/scripts/run.sh
@@ -0,0 +1,3 @@
+#!/bin/bash
+# FIXME: quote the arguments
+exec python -m app "$@"
diff --git a/web/ui.js b/web/ui.js
--- a/web/ui.js
+++ b/web/ui.js
@@ -1,3 +1,5 @@
--- counter;
+/* wait, this breaks on null
+ * when the list is empty */
+// XXX remove before release
+let n = 0; // TODO
 render();
-// old comment
diff --git a/old.py b/old.py
deleted file mode 100644
--- a/old.py
+++ /dev/null
@@ -1,2 +0,0 @@
-# gone
-x = 1
"""


def test_diff_stats_against_a_count_by_hand():
    stats = diff_stats(MIXED_LANGUAGES)
    assert stats.paths == ["app/core.py", "scripts/run.sh", "web/ui.js", "old.py"]
    # added: 4 in core.py, 3 in run.sh, 4 in ui.js; removed: 2, 0, 2 ("-- counter;" is a line, not a
    # file header), 2 (a deleted file's lines count under its old path)
    assert {p: len(lines) for p, lines in stats.added_lines.items()} == {
        "app/core.py": 4, "scripts/run.sh": 3, "web/ui.js": 4, "old.py": 0}
    assert stats.removed_lines == {"app/core.py": ["# old note", "    return open(path).read()"],
                                   "scripts/run.sh": [], "web/ui.js": ["-- counter;", "// old comment"],
                                   "old.py": ["# gone", "x = 1"]}
    assert (stats.files_changed, stats.lines_added, stats.lines_removed, stats.lines_changed) == (4, 11, 6, 17)
    # comment lines: core.py 2 (the indented one too; not code followed by "#", not "#" in a string),
    # run.sh 2 (the shebang is a "#" line), ui.js 3 (a block comment's "/*" and " *" lines, "//")
    assert stats.comment_lines_added() == 7
    # lines with a marker: TODO in core.py, FIXME in run.sh, XXX and TODO (after code) in ui.js
    assert stats.todo_lines_added() == 4


@pytest.mark.parametrize(
    ("path", "line", "text"),
    [
        ("a.py", "    # note", "note"),
        ("a.py", "x = 1  # note", None),
        ("a.py", "// not python", None),
        ("a.sh", "#!/bin/sh", "!/bin/sh"),
        ("a.js", " * continued", "continued"),
        ("a.js", "/* opened", "opened"),
        ("a.js", "# not js", None),
        ("README.md", "# A heading", None),  # a suffix without a comment syntax: never a comment
        ("Makefile", "# rule", None),
    ],
)
def test_comment_lines_by_suffix(path: str, line: str, text: str | None):
    assert comment_text(path, line) == text

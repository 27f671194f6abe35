"""Diffs round-trip byte for byte: ``apply_patch(copy of old, diff_trees(old, new))`` is ``new``.

Trees are read back here by a walker of the test's own (lstat, readlink, bytes, executable bit),
not by ``sandbox.patch``, and git is the second opinion both ways: ``git apply`` must turn our
diffs into the same tree, and ``apply_patch`` must apply what ``git diff --binary`` writes.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opencomposer.sandbox import gitformat, patch
from opencomposer.sandbox.patch import (
    DiffRoundTripError,
    PatchError,
    apply_patch,
    copy_tree,
    diff_stats,
    diff_trees,
    is_ignored_name,
)
from opencomposer.sandbox.workspace import Sandbox

GIT_ENV = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}

# A tree as the test writes and reads it: path -> ("file", bytes, executable) or ("link", target bytes)
Tree = dict[str, tuple]


def write_tree(root: Path, tree: Tree) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, entry in tree.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if entry[0] == "link":
            os.symlink(entry[1], os.fsencode(path))
        else:
            path.write_bytes(entry[1])
            path.chmod(0o755 if entry[2] else 0o644)
    return root


def read_tree(root: Path) -> Tree:
    """Files and links under ``root`` (links not followed), without .git; empty folders are not kept."""
    tree: Tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                tree[rel] = ("link", os.readlink(os.fsencode(path)))
            elif stat.S_ISREG(mode):
                tree[rel] = ("file", path.read_bytes(), bool(mode & stat.S_IXUSR))
    return tree


def copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, symlinks=True)
    return target


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, env=GIT_ENV)
    assert proc.returncode == 0, f"git {' '.join(args)} failed: {proc.stderr.decode(errors='replace')}"
    return proc.stdout


def git_apply(root: Path, diff: str) -> None:
    git(root, "apply", "--allow-empty", "--whitespace=nowarn", "-", stdin=diff.encode("utf-8"))


def git_diff(old: Tree, new: Tree, work: Path) -> str:
    """``git diff --binary`` of two trees, through a repository (no rename detection)."""
    repo = write_tree(work, old)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "old")
    for item in repo.iterdir():
        if item.name != ".git":
            shutil.rmtree(item) if item.is_dir() and not item.is_symlink() else item.unlink()
    write_tree(repo, new)
    git(repo, "add", "-A")
    return git(repo, "diff", "--cached", "--binary", "--no-renames").decode("utf-8", "surrogateescape")


# ----------------------------------------------------------------------------------------------
# Random trees

NAME = st.text(alphabet=["a", "b", "é", "中", " ", '"', "'", "\\", "\t", "\n", "-", ".", "\u2028", "\udcff"],
               min_size=1, max_size=4).filter(lambda n: n not in (".", "..") and not is_ignored_name(n))
PATH = st.lists(NAME, min_size=1, max_size=3).map("/".join)
LINE_PIECES = ["x", "y = 1", "", "\r", "a\x0cb", "\x0b", "\x1c\x1d\x1e", "\x85", "\u2028\u2029", "é", "\0", "\r\n"]
TEXT = st.builds(lambda lines, end: ("\n".join(lines) + end).encode("utf-8"),
                 st.lists(st.sampled_from(LINE_PIECES), max_size=8), st.sampled_from(["", "\n"]))
CONTENT = TEXT | st.binary(max_size=40)
FILE = st.tuples(st.just("file"), CONTENT, st.booleans())
LINK = st.tuples(st.just("link"), st.sampled_from([b"/etc/passwd", b"../outside", b"a", b"missing/x", b"t\xc3\xa9 x",
                                                   b"a\nb"]))
ENTRY = FILE | FILE | LINK


def consistent(tree: Tree) -> Tree:
    """Drop paths that would need a file (or link) and a folder of the same name."""
    kept: Tree = {}
    for rel, entry in tree.items():
        prefixes = {"/".join(rel.split("/")[:k]) for k in range(1, rel.count("/") + 1)}
        if prefixes & kept.keys() or any(other.startswith(rel + "/") for other in kept):
            continue
        kept[rel] = entry
    return kept


TREE = st.dictionaries(PATH, ENTRY, max_size=6).map(consistent)


@st.composite
def tree_pairs(draw) -> tuple[Tree, Tree]:
    """A tree and a changed copy: entries kept, edited, made executable or not, deleted or replaced
    (a file by a link, say), plus new paths (maybe a folder where a deleted file was)."""
    before = draw(TREE)
    after: Tree = {}
    for rel, entry in before.items():
        action = draw(st.sampled_from(["keep", "edit", "mode", "delete", "replace"]))
        if action == "keep":
            after[rel] = entry
        elif action == "edit" and entry[0] == "file":
            at = draw(st.integers(0, len(entry[1])))
            after[rel] = ("file", entry[1][:at] + draw(CONTENT) + entry[1][at + draw(st.integers(0, 3)):], entry[2])
        elif action == "mode" and entry[0] == "file":
            after[rel] = ("file", entry[1], not entry[2])
        elif action == "replace":
            after[rel] = draw(ENTRY)
    after.update(draw(TREE))
    return before, consistent(after)


@settings(max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=tree_pairs().filter(lambda pair: pair[0] != pair[1]))
def test_our_diff_rebuilds_the_new_tree_with_us_and_with_git_apply(pair: tuple[Tree, Tree]):
    before, after = pair
    with tempfile.TemporaryDirectory() as tmp:
        old, new = write_tree(Path(tmp) / "old", before), write_tree(Path(tmp) / "new", after)
        diff = diff_trees(old, new)
        diff.encode("utf-8")  # no lone surrogates: the text can go to JSON, files and hashes as UTF-8
        ours = copy(old, Path(tmp) / "ours")
        apply_patch(ours, diff)
        assert read_tree(ours) == after
        theirs = copy(old, Path(tmp) / "git")
        git_apply(theirs, diff)
        assert read_tree(theirs) == after


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=tree_pairs().filter(lambda pair: pair[0] != pair[1]))
def test_we_apply_what_git_diff_binary_writes(pair: tuple[Tree, Tree]):
    before, after = pair
    with tempfile.TemporaryDirectory() as tmp:
        diff = git_diff(before, after, Path(tmp) / "repo")
        target = write_tree(Path(tmp) / "target", before)
        apply_patch(target, diff)
        assert read_tree(target) == after


# ----------------------------------------------------------------------------------------------
# Each case by name

CASES: dict[str, tuple[Tree, Tree]] = {
    "crlf line endings": ({"w.txt": ("file", b"a\r\nb\r\n", False)}, {"w.txt": ("file", b"a\r\nB\r\n", False)}),
    "characters str.splitlines breaks at": (
        {"s.txt": ("file", b"1\x0b2\x0c3\x1c4\x1d5\x1e6\xc2\x857\xe2\x80\xa88\xe2\x80\xa99\r0\n", False)},
        {"s.txt": ("file", b"1\x0b2\x0cX\x1c4\x1d5\x1e6\xc2\x857\xe2\x80\xa88\xe2\x80\xa99\r0\n", False)}),
    "no final newline": ({"n.txt": ("file", b"a\nb", False)}, {"n.txt": ("file", b"a\nc", False)}),
    "a final newline added": ({"n.txt": ("file", b"a", False)}, {"n.txt": ("file", b"a\n", False)}),
    "names git quotes": ({}, {'sp ace/t\tab"q\\u\né中': ("file", b"x\n", False), "\udcff.bin": ("file", b"y", False)}),
    "binary: NUL and invalid UTF-8": ({"b": ("file", b"\0\xff\xfe", False)}, {"b": ("file", b"\0\xff\xfd\n", False)}),
    "text becomes binary": ({"t": ("file", b"text\n", False)}, {"t": ("file", b"\xff\n", False)}),
    "executable bit": ({"run.sh": ("file", b"echo\n", False)}, {"run.sh": ("file", b"echo\n", True)}),
    "a link out of the tree": ({}, {"leak": ("link", b"/etc/passwd"), "up": ("link", b"../../outside")}),
    "a link retargeted": ({"l": ("link", b"a")}, {"l": ("link", b"b")}),
    "a file becomes a link and back": ({"f": ("file", b"x\n", False), "l": ("link", b"f")},
                                       {"f": ("link", b"l"), "l": ("file", b"x\n", True)}),
    "a link becomes a folder": ({"-": ("link", b"x")}, {"-/\\": ("link", b"/etc/passwd")}),
    "a folder becomes a link to a folder": ({"d/x": ("file", b"x\n", False), "e/y": ("file", b"y\n", False)},
                                            {"d": ("link", b"e"), "e/y": ("file", b"y\n", False)}),
    "a file becomes a folder": ({"p": ("file", b"x\n", False)}, {"p/q": ("file", b"x\n", False)}),
    "a folder becomes a file": ({"p/q/r": ("file", b"x\n", False)}, {"p": ("file", b"x\n", False)}),
    "deletion and rename": ({"old.py": ("file", b"a = 1\n", False), "gone": ("file", b"\0", True)},
                            {"new.py": ("file", b"a = 1\n", False)}),
    "empty files": ({"full": ("file", b"x\n", False), "empty": ("file", b"", False)},
                    {"full": ("file", b"", False), "new-empty": ("file", b"", True)}),
    "a folder emptied": ({"d/e/f": ("file", b"1\n", False), "d/g": ("file", b"2\n", False)}, {}),
}


@pytest.mark.parametrize("case", CASES)
def test_each_case_round_trips_with_us_and_with_git(case: str, tmp_path: Path):
    before, after = CASES[case]
    old, new = write_tree(tmp_path / "old", before), write_tree(tmp_path / "new", after)
    diff = diff_trees(old, new)
    for name, applier in (("ours", apply_patch), ("git", git_apply)):
        target = copy(old, tmp_path / name)
        applier(target, diff)
        assert read_tree(target) == after, name
    target = write_tree(tmp_path / "from-git", before)
    apply_patch(target, git_diff(before, after, tmp_path / "repo"))
    assert read_tree(target) == after


def test_crlf_and_form_feeds_are_text_lines_as_git_writes_them(tmp_path: Path):
    old = write_tree(tmp_path / "old", {"w.txt": ("file", b"a\r\nb\x0cc\r\n", False)})
    new = write_tree(tmp_path / "new", {"w.txt": ("file", b"a\r\nB\x0cc\r\n\xe2\x80\xa8\n", False)})
    diff = diff_trees(old, new)
    assert diff == ("diff --git a/w.txt b/w.txt\n--- a/w.txt\n+++ b/w.txt\n@@ -1,2 +1,3 @@\n a\r\n"
                    "-b\x0cc\r\n+B\x0cc\r\n+\u2028\n")
    stats = diff_stats(diff)
    assert (stats.lines_added, stats.lines_removed) == (2, 1) and stats.added_lines["w.txt"] == ["B\x0cc\r", "\u2028"]


def test_a_delta_from_git_applies(tmp_path: Path):
    blob = bytes(range(256)) * 64
    before = {"data.bin": ("file", blob, False)}
    after = {"data.bin": ("file", blob[:5000] + b"\0changed\0" + blob[5000:], False)}
    diff = git_diff(before, after, tmp_path / "repo")
    assert "\ndelta " in diff  # git chose a delta against the old contents
    target = write_tree(tmp_path / "target", before)
    apply_patch(target, diff)
    assert read_tree(target) == after
    target = write_tree(tmp_path / "other", {"data.bin": ("file", blob[1:] + b"!", False)})
    with pytest.raises(PatchError, match="data.bin: the binary patch is for blob"):
        apply_patch(target, diff)


def test_a_patch_never_writes_through_a_symbolic_link(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = write_tree(tmp_path / "root", {"keep": ("file", b"k\n", False)})
    new_link = (f"diff --git a/d b/d\nnew file mode 120000\n--- /dev/null\n+++ b/d\n@@ -0,0 +1 @@\n+{outside}\n"
                f"{patch.NO_NEWLINE}\n")
    file_under_d = "diff --git a/d/x b/d/x\nnew file mode 100644\n--- /dev/null\n+++ b/d/x\n@@ -0,0 +1 @@\n+pwned\n"
    with pytest.raises(PatchError, match="d/x: the patch makes d both a file and a folder"):
        apply_patch(root, new_link + file_under_d)
    (root / "d").symlink_to(outside)
    with pytest.raises(PatchError, match="d/x: beyond the symbolic link d"):
        apply_patch(root, file_under_d)
    assert read_tree(root) == {"keep": ("file", b"k\n", False), "d": ("link", os.fsencode(outside))}
    assert list(outside.iterdir()) == []


def test_a_diff_that_does_not_round_trip_is_a_harness_bug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    old = write_tree(tmp_path / "old", {"a.txt": ("file", b"a\n", False)})
    new = write_tree(tmp_path / "new", {"a.txt": ("file", b"a\n", False), "b.bin": ("file", b"\0", False)})
    monkeypatch.setattr(patch, "encode_literal", lambda data: gitformat.encode_literal(data + b"!"))
    with pytest.raises(DiffRoundTripError, match=r"harness bug: the diff of .* does not apply to its own old tree") \
            as caught:
        diff_trees(old, new)
    assert caught.value.paths == ["b.bin"] and "GIT binary patch" in caught.value.diff


def test_ignored_names_are_left_out_on_both_sides_of_a_copy_and_a_diff(tmp_path: Path):
    tree = {"pkg/m.py": ("file", b"x = 1\n", False), "pkg/__pycache__/m.cpython-312.pyc": ("file", b"\0", False),
            "d.orig/a.py": ("file", b"old\n", False), "m.py~": ("file", b"old\n", False),
            ".pytest_cache/v": ("file", b"{}", False), "cache~": ("link", b"pkg")}
    source = write_tree(tmp_path / "source", tree)
    copied = tmp_path / "copy"
    copy_tree(source, copied)
    assert read_tree(copied) == {"pkg/m.py": tree["pkg/m.py"]}
    (copied / "pkg" / "m.py").write_text("x = 2\n")
    (copied / "new.rej").write_text("rejected hunk\n")
    diff = diff_trees(source, copied)
    assert diff_stats(diff).paths == ["pkg/m.py"]


@pytest.mark.bwrap
def test_a_sandbox_diff_excludes_what_its_copy_left_out(tmp_path: Path):
    source = write_tree(tmp_path / "repo", {"m.py": ("file", b"x = 1\r\n", False),
                                            "d.orig/a.py": ("file", b"old\n", False),
                                            "__pycache__/m.pyc": ("file", b"\0", False)})
    with Sandbox(source) as sb:
        assert not (sb.workspace / "d.orig").exists() and not (sb.workspace / "__pycache__").exists()
        (sb.workspace / "m.py").write_bytes(b"x = 2\r\n")
        (sb.workspace / "blob").write_bytes(b"\0\xff")
        (sb.workspace / "leak").symlink_to("/etc/passwd")
        diff = sb.diff()
    assert diff_stats(diff).paths == ["blob", "leak", "m.py"]
    graded = copy(source, tmp_path / "fresh")
    apply_patch(graded, diff)
    assert read_tree(graded)["m.py"] == ("file", b"x = 2\r\n", False)
    assert read_tree(graded)["leak"] == ("link", b"/etc/passwd") and read_tree(graded)["blob"][1] == b"\0\xff"

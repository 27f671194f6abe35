"""Unified diffs between two folders, and applying them back, in pure Python.

``diff_trees(old, new)`` writes the change from one folder to another as a git-style unified diff
(``a/``/``b/`` prefixes, ``/dev/null`` for added and deleted files, ``\\ No newline at end of file``
markers, executable-bit changes). ``apply_patch(root, text)`` applies such a diff, or a SWE-bench
gold patch (renames included), to a folder. The agent's change travels as this text: the grader
applies it to a fresh copy of the task repository, the oracle policy replays gold patches with it.
``diff_stats(text)`` measures a diff (lines added and removed per file); with ``comment_text`` and
``TODO_MARKER`` it is the one reading of a diff that grading, the RL reward and task statistics share.

Not handled, on purpose: binary contents (a diff only says ``Binary files ... differ`` and the
applier skips them), symbolic links (skipped on both sides) and fuzzy matching (a hunk must match
its context exactly; only its line offset may move). Caches (``__pycache__``, ``.pytest_cache``,
...) and ``.git`` are never part of a diff.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

IGNORED_NAMES = frozenset(
    {".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis", ".opencomposer"}
)
IGNORED_SUFFIXES = (".pyc", ".pyo")
NO_NEWLINE = "\\ No newline at end of file"


class PatchError(ValueError):
    """A diff that cannot be parsed or does not apply; the message names the file and the hunk."""


def is_ignored(relpath: str) -> bool:
    parts = relpath.split("/")
    return any(part in IGNORED_NAMES for part in parts) or relpath.endswith(IGNORED_SUFFIXES)


def list_files(root: Path) -> dict[str, Path]:
    """Regular files under ``root`` by POSIX relative path, skipping caches, ``.git`` and symlinks."""
    files: dict[str, Path] = {}
    if not root.is_dir():
        return files
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_NAMES)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if is_ignored(rel) or path.is_symlink() or not path.is_file():
                continue
            files[rel] = path
    return files


def _read_text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _mode(path: Path) -> str:
    return "100755" if path.stat().st_mode & stat.S_IXUSR else "100644"


def file_diff(rel: str, old: str | None, new: str | None, old_mode: str = "100644", new_mode: str = "100644") -> str:
    """The git-style diff of one file; ``old``/``new`` None means absent (added or deleted)."""
    header = [f"diff --git a/{rel} b/{rel}\n"]
    if old is None:
        header.append(f"new file mode {new_mode}\n")
    elif new is None:
        header.append(f"deleted file mode {old_mode}\n")
    elif old_mode != new_mode:
        header += [f"old mode {old_mode}\n", f"new mode {new_mode}\n"]
    old_lines = (old or "").splitlines(keepends=True)
    new_lines = (new or "").splitlines(keepends=True)
    body = list(
        difflib.unified_diff(
            old_lines,
            new_lines,
            fromfile="/dev/null" if old is None else f"a/{rel}",
            tofile="/dev/null" if new is None else f"b/{rel}",
            n=3,
        )
    )
    if not body and len(header) == 1:
        return ""
    out = "".join(header)
    for line in body:
        out += line if line.endswith("\n") else line + "\n" + NO_NEWLINE + "\n"
    return out


def diff_trees(old_root: Path, new_root: Path) -> str:
    """Unified diff turning ``old_root`` into ``new_root`` (files in sorted path order)."""
    old_files, new_files = list_files(Path(old_root)), list_files(Path(new_root))
    chunks = []
    for rel in sorted(set(old_files) | set(new_files)):
        old_path, new_path = old_files.get(rel), new_files.get(rel)
        old = _read_text(old_path) if old_path else None
        new = _read_text(new_path) if new_path else None
        if (old_path and old is None) or (new_path and new is None):
            if old_path and new_path and old_path.read_bytes() == new_path.read_bytes():
                continue
            chunks.append(f"diff --git a/{rel} b/{rel}\nBinary files a/{rel} and b/{rel} differ\n")
            continue
        old_mode = _mode(old_path) if old_path else "100644"
        new_mode = _mode(new_path) if new_path else "100644"
        if old == new and old_mode == new_mode:
            continue
        chunks.append(file_diff(rel, old, new, old_mode, new_mode))
    return "".join(chunks)


# ----------------------------------------------------------------------------------------------
# Parsing and applying


@dataclass
class Hunk:
    old_start: int  # 1-based line of the first old line (0 for an empty old range)
    old_lines: list[str] = field(default_factory=list)  # with their newlines, as in the file
    new_lines: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)  # the "+" lines, without newlines
    removed: list[str] = field(default_factory=list)  # the "-" lines, without newlines


@dataclass
class FilePatch:
    old_path: str | None  # None: the file is created
    new_path: str | None  # None: the file is deleted
    hunks: list[Hunk] = field(default_factory=list)
    new_mode: str | None = None
    binary: bool = False

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _strip_prefix(raw: str, where: str) -> str | None:
    raw = raw.split("\t", 1)[0].rstrip("\n")
    if raw == "/dev/null":
        return None
    if raw.startswith(("a/", "b/")):
        raw = raw[2:]
    if not raw or raw.startswith("/") or ".." in raw.split("/"):
        raise PatchError(f"{where}: unsafe path {raw!r} (expected a relative path without '..')")
    return raw


def parse_patch(text: str) -> list[FilePatch]:
    """Split a unified diff into per-file patches; raises ``PatchError`` on malformed input."""
    lines = text.splitlines(keepends=True)
    patches: list[FilePatch] = []
    current: FilePatch | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(\S+) b/(\S+)", line)
            if not m:
                raise PatchError(f"line {i + 1}: cannot read file names from {line.rstrip()!r}")
            current = FilePatch(old_path=_strip_prefix(m.group(1), f"line {i + 1}"),
                                new_path=_strip_prefix(m.group(2), f"line {i + 1}"))
            patches.append(current)
        elif line.startswith("new file mode ") and current is not None:
            current.old_path, current.new_mode = None, line.split()[-1]
        elif line.startswith("deleted file mode ") and current is not None:
            current.new_path = None
        elif line.startswith("new mode ") and current is not None:
            current.new_mode = line.split()[-1]
        elif line.startswith("rename from ") and current is not None:
            current.old_path = _strip_prefix(line[len("rename from "):], f"line {i + 1}")
        elif line.startswith("rename to ") and current is not None:
            current.new_path = _strip_prefix(line[len("rename to "):], f"line {i + 1}")
        elif line.startswith("Binary files ") and current is not None:
            current.binary = True
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old = _strip_prefix(line[4:], f"line {i + 1}")
            new = _strip_prefix(lines[i + 1][4:], f"line {i + 2}")
            if current is None or current.hunks or (current.path not in (old, new)):
                current = FilePatch(old_path=old, new_path=new)
                patches.append(current)
            else:
                current.old_path, current.new_path = old, new
            i += 1
        elif line.startswith("@@"):
            if current is None:
                raise PatchError(f"line {i + 1}: hunk before any file header")
            i = _parse_hunk(lines, i, current)
            continue
        i += 1
    return patches


def _parse_hunk(lines: list[str], i: int, patch: FilePatch) -> int:
    m = _HUNK_RE.match(lines[i])
    if not m:
        raise PatchError(f"line {i + 1}: malformed hunk header {lines[i].rstrip()!r}")
    old_count = int(m.group(2)) if m.group(2) is not None else 1
    new_count = int(m.group(4)) if m.group(4) is not None else 1
    hunk = Hunk(old_start=int(m.group(1)))
    i += 1
    seen_old = seen_new = 0
    while i < len(lines) and (seen_old < old_count or seen_new < new_count):
        line = lines[i]
        tag, body = line[:1], line[1:]
        if line.startswith(NO_NEWLINE):
            i += 1
            continue
        if tag == " " or line == "\n":
            body = body if tag == " " else "\n"
            hunk.old_lines.append(body)
            hunk.new_lines.append(body)
            seen_old += 1
            seen_new += 1
        elif tag == "-":
            hunk.old_lines.append(body)
            hunk.removed.append(body.rstrip("\n"))
            seen_old += 1
        elif tag == "+":
            hunk.new_lines.append(body)
            hunk.added.append(body.rstrip("\n"))
            seen_new += 1
        else:
            raise PatchError(
                f"{patch.path}: hunk at line {i + 1} ended early: expected {old_count} old and "
                f"{new_count} new lines, got {seen_old} and {seen_new}"
            )
        i += 1
        # a "\ No newline" marker applies to the line just read
        if i < len(lines) and lines[i].startswith(NO_NEWLINE):
            if tag in (" ", "-"):
                hunk.old_lines[-1] = hunk.old_lines[-1].rstrip("\n")
            if tag in (" ", "+"):
                hunk.new_lines[-1] = hunk.new_lines[-1].rstrip("\n")
            i += 1
    if seen_old != old_count or seen_new != new_count:
        raise PatchError(f"{patch.path}: truncated hunk @@ -{hunk.old_start},{old_count} @@")
    patch.hunks.append(hunk)
    return i


def apply_hunks(text: str, hunks: list[Hunk], name: str) -> str:
    """Apply hunks to a file's text; each must match exactly, at its line or shifted."""
    lines = text.splitlines(keepends=True)
    offset = 0
    for number, hunk in enumerate(hunks, 1):
        want = max(hunk.old_start - 1, 0) + offset
        if hunk.old_start == 0 and not hunk.old_lines:
            want = 0
        at = _find_block(lines, hunk.old_lines, want)
        if at is None:
            raise PatchError(
                f"{name}: hunk {number} (@@ -{hunk.old_start} @@) does not match the file; "
                f"expected these lines near line {want + 1}: {''.join(hunk.old_lines)[:200]!r}"
            )
        lines[at : at + len(hunk.old_lines)] = hunk.new_lines
        offset = at - max(hunk.old_start - 1, 0) + len(hunk.new_lines) - len(hunk.old_lines)
    return "".join(lines)


def _find_block(lines: list[str], block: list[str], want: int) -> int | None:
    n = len(block)
    candidates = sorted(range(len(lines) - n + 1), key=lambda start: abs(start - want))
    for start in candidates:
        if lines[start : start + n] == block:
            return start
    return None


def apply_patch(root: Path, text: str) -> list[str]:
    """Apply a unified diff to the files under ``root``; returns the paths it changed.

    All files are computed before any is written, so a patch that fails leaves ``root`` untouched.
    """
    root = Path(root)
    writes: dict[str, tuple[str | None, str | None]] = {}  # path -> (new text or None = delete, mode)
    for fp in parse_patch(text):
        if fp.binary:
            continue
        old_text = ""
        if fp.old_path is not None:
            source = root / fp.old_path
            if fp.old_path in writes:
                old_text = writes[fp.old_path][0] or ""
            elif source.is_file() and not source.is_symlink():
                old_text = source.read_text(encoding="utf-8")
            else:
                raise PatchError(f"{fp.old_path}: the patch changes a file that does not exist")
        elif (root / fp.new_path).exists():
            raise PatchError(f"{fp.new_path}: the patch creates a file that already exists")
        new_text = apply_hunks(old_text, fp.hunks, fp.path)
        if fp.old_path is not None and fp.old_path != fp.new_path:
            writes[fp.old_path] = (None, None)
        if fp.new_path is not None:
            writes[fp.new_path] = (new_text, fp.new_mode)
    for rel, (content, mode) in writes.items():
        target = root / rel
        _check_inside(root, target)
        if content is None:
            if target.is_file() or target.is_symlink():
                target.unlink()
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        target.write_text(content, encoding="utf-8")
        if mode is not None:
            target.chmod(0o755 if mode == "100755" else 0o644)
    return sorted(writes)


def _check_inside(root: Path, target: Path) -> None:
    real_root = os.path.realpath(root)
    real_parent = os.path.realpath(target.parent)
    if real_parent != real_root and not real_parent.startswith(real_root + os.sep):
        raise PatchError(f"{target.relative_to(root)}: resolves outside the folder being patched")


# ----------------------------------------------------------------------------------------------
# Measuring a diff: the one place that says what a diff added, removed, and what a comment is


TODO_MARKER = re.compile(r"\b(?:TODO|FIXME|XXX)\b")
COMMENT_PREFIXES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys((".py", ".sh", ".toml", ".yaml", ".yml", ".cfg", ".rb", ".pl"), ("#",)),
    **dict.fromkeys((".js", ".ts", ".tsx", ".jsx", ".c", ".h", ".cc", ".cpp", ".go", ".rs", ".java", ".kt",
                     ".swift"), ("//", "/*", "*")),
}
"""Line-comment openers by file suffix; a line of a block comment (``/*``, `` * ...``) counts in the
C family. Files of other suffixes have no comment lines: guessing would count Markdown headings."""


def comment_text(path: str, line: str) -> str | None:
    """The text of ``line`` after its comment opener when it is a comment line of file ``path``
    (by suffix, ``COMMENT_PREFIXES``), else None. Code followed by a comment is not a comment line."""
    stripped = line.strip()
    for prefix in COMMENT_PREFIXES.get(PurePosixPath(path).suffix, ()):
        if stripped.startswith(prefix):
            return stripped[len(prefix) :].strip()
    return None


@dataclass
class DiffStats:
    """What a unified diff changes, file by file (``diff_stats``).

    ``paths`` lists every file the diff touches, binary ones included, in diff order;
    ``added_lines``/``removed_lines`` hold, per path, the texts of its "+" and "-" lines without
    their newlines (a deleted file's lines are under its old path)."""

    paths: list[str] = field(default_factory=list)
    added_lines: dict[str, list[str]] = field(default_factory=dict)
    removed_lines: dict[str, list[str]] = field(default_factory=dict)

    @property
    def files_changed(self) -> int:
        return len(self.paths)

    @property
    def lines_added(self) -> int:
        return sum(len(lines) for lines in self.added_lines.values())

    @property
    def lines_removed(self) -> int:
        return sum(len(lines) for lines in self.removed_lines.values())

    @property
    def lines_changed(self) -> int:
        """Added plus removed lines: the size of a change (``reward.json``'s ``lines_changed``)."""
        return self.lines_added + self.lines_removed

    def added(self) -> list[tuple[str, str]]:
        """Every added line as (path, text), in diff order."""
        return [(path, line) for path, lines in self.added_lines.items() for line in lines]

    def removed(self) -> list[tuple[str, str]]:
        """Every removed line as (path, text), in diff order."""
        return [(path, line) for path, lines in self.removed_lines.items() for line in lines]

    def comment_lines_added(self) -> int:
        """Added lines that are comment lines (``comment_text``)."""
        return sum(comment_text(path, line) is not None for path, line in self.added())

    def todo_lines_added(self) -> int:
        """Added lines carrying a TODO, FIXME or XXX marker."""
        return sum(bool(TODO_MARKER.search(line)) for _, line in self.added())


def diff_stats(text: str) -> DiffStats:
    """Measure a unified diff (parsed by ``parse_patch``, so hunk headers give the line counts and a
    removed line that starts with "--" is never taken for a file header); raises ``PatchError`` on
    malformed input."""
    stats = DiffStats()
    for fp in parse_patch(text):
        stats.paths.append(fp.path)
        added = stats.added_lines.setdefault(fp.path, [])
        removed = stats.removed_lines.setdefault(fp.path, [])
        for hunk in fp.hunks:
            added += hunk.added
            removed += hunk.removed
    return stats


def copy_tree(source: Path, target: Path) -> None:
    """Copy a folder without caches (``__pycache__``, ``*.pyc``, ...), keeping symlinks as links."""
    shutil.copytree(
        source,
        target,
        symlinks=True,
        ignore=lambda d, names: {n for n in names if n in IGNORED_NAMES - {".git"} or n.endswith(IGNORED_SUFFIXES)},
        dirs_exist_ok=True,
    )

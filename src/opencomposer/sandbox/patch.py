"""Diffs between two folders, byte for byte, and applying them back.

``diff_trees(old, new)`` writes the change from one folder to another in the format of
``git diff --binary``; ``apply_patch(root, text)`` applies such a diff, or one that git or a
SWE-bench instance made (renames and copies included), to a folder. The agent's change travels as
this text: the grader applies it to a fresh copy of the task repository, the oracle policy replays
gold patches with it, task folders store setup patches with it. ``diff_stats(text)`` measures a
diff (lines added and removed per file); with ``comment_text`` and ``TODO_MARKER`` it is the one
reading of a diff that grading, the RL reward and task statistics share.

A tree is what git would track: regular files (their bytes and executable bit) and symbolic links
(their target, never followed: a link out of the folder is a link, not its target's contents), by
relative path. Empty folders, other permission bits, FIFOs, sockets and devices are not part of
it; nor are caches (``__pycache__``, ``.pytest_cache``, ...), bytecode, editor and patch backups
(``*~``, ``*.orig``, ``*.rej``, ``.*.swp``) and ``.git``: ``is_ignored_name`` is the one rule, applied
to every path component, for diffs, for ``copy_tree`` and for the sandbox's copy of a repository.

How ``diff_trees`` writes each change, as git does:

- a file whose both sides are UTF-8 without NUL bytes: text hunks (``difflib``, 3 lines of
  context). Lines end at ``\\n`` only: CR, form feed, ``\\x0b``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028 and
  U+2029, which ``str.splitlines`` would break at, are characters of a line. A last line without a
  newline is followed by ``\\ No newline at end of file``;
- any other file (NUL bytes, invalid UTF-8): a ``GIT binary patch`` of its literal contents, with
  the full blob ids on the ``index`` line (``sandbox.gitformat``);
- a symbolic link: mode 120000, its target as the text of the file (no final newline);
- a file that becomes a link or the reverse: a deletion, then an addition of the same path;
- a rename: a deletion and an addition (no rename detection); the executable bit: ``old mode`` /
  ``new mode``; an empty file: a header without hunks;
- names with control characters, ``"``, ``\\`` or non-ASCII bytes: C-quoted (``gitformat``); a name
  with a space is quoted on the ``diff --git`` line too, and gets git's tab after it on the
  ``---``/``+++`` lines.

The invariant: applying ``diff_trees(old, new)`` to a copy of ``old`` gives ``new`` byte for byte.
``diff_trees`` checks it on every diff it writes, by applying the text in memory to what it read,
and raises ``DiffRoundTripError`` (a harness bug, never the policy's doing) when it fails.
``git apply`` turns these diffs into the same trees, and ``apply_patch`` applies ``git diff
--binary``'s (``tests/sandbox/test_patch_round_trip.py`` checks both on random trees).

Applying: the whole patch is computed in memory before anything is written, so a patch that fails
leaves the folder untouched. Deletions come first and folders they empty are removed, then files
and links are written, never through a symbolic link (a path under a link is refused, as by
``git apply``). A hunk must match its context exactly; only its line offset may move (no fuzz). A
binary change without data (``Binary files ... differ``) is refused: it cannot be applied.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from opencomposer.sandbox.gitformat import (
    NULL_ID,
    apply_delta,
    blob_id,
    decode_hunk_data,
    encode_literal,
    from_bytes,
    quote_path,
    to_bytes,
    unquote_path,
)

IGNORED_NAMES = frozenset(
    {".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis", ".opencomposer"}
)
IGNORED_SUFFIXES = (".pyc", ".pyo", "~", ".orig", ".rej", ".swp", ".swo")
"""Bytecode, and editor and patch backups (``x.py~``, ``x.py.orig``, ``x.py.rej``, ``.x.py.swp``):
copies of code that may be older than the file beside them."""
NO_NEWLINE = "\\ No newline at end of file"
FILE_MODE, EXEC_MODE, LINK_MODE = "100644", "100755", "120000"


class PatchError(ValueError):
    """A diff that cannot be parsed or does not apply; the message names the file and the hunk."""


class DiffRoundTripError(RuntimeError):
    """A bug of the harness: a diff ``diff_trees`` wrote does not turn the old tree into the new one.

    Never the policy's doing, so neither scored as its failure nor dropped quietly as an
    infrastructure error: ``episode.run_episode`` logs it as an error and grades the workspace
    itself (``Grade.diff_round_trip_failed``). ``diff`` is the text, ``paths`` the paths it gets wrong."""

    def __init__(self, message: str, diff: str, paths: list[str]):
        super().__init__(message)
        self.diff = diff
        self.paths = paths


def is_ignored_name(name: str) -> bool:
    """A cache, bytecode or backup name (``IGNORED_NAMES``, ``IGNORED_SUFFIXES``), or ``.git``."""
    return name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES)


def is_ignored(relpath: str) -> bool:
    """Whether any component of the POSIX relative path is an ignored name."""
    return any(is_ignored_name(part) for part in relpath.split("/"))


def ignore_names(directory: str, names: list[str]) -> set[str]:
    """``shutil.copytree``'s ``ignore``: the ignored names, except ``.git``, which copies keep."""
    return {name for name in names if name != ".git" and is_ignored_name(name)}


def _walk(root: Path) -> dict[str, Path]:
    """Regular files and symbolic links under ``root`` by POSIX relative path, in sorted order,
    skipping ignored names; a link to a folder is an entry and is never descended into."""
    entries: dict[str, Path] = {}
    if not root.is_dir():
        return entries
    for dirpath, dirnames, filenames in os.walk(root):
        folder = Path(dirpath)
        descend = []
        for name in dirnames:
            if is_ignored_name(name):
                continue
            if (folder / name).is_symlink():
                entries[(folder / name).relative_to(root).as_posix()] = folder / name
            else:
                descend.append(name)
        dirnames[:] = sorted(descend)
        for name in filenames:
            path = folder / name
            if is_ignored_name(name) or _kind(path) not in ("file", "link"):
                continue
            entries[path.relative_to(root).as_posix()] = path
    return dict(sorted(entries.items()))


def list_files(root: Path) -> dict[str, Path]:
    """Regular files under ``root`` by POSIX relative path, skipping ignored names and symlinks."""
    return {rel: path for rel, path in _walk(Path(root)).items() if not path.is_symlink()}


def _kind(path: Path) -> str | None:
    """What ``path`` itself is (a link is not followed): dir, file, link, other, or None if absent."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(mode):
        return "link"
    return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


@dataclass(frozen=True)
class Entry:
    """One path of a tree: a regular file (mode 100644 or 100755, its bytes) or a symbolic link
    (mode 120000, its target's bytes)."""

    mode: str
    data: bytes

    @property
    def is_link(self) -> bool:
        return self.mode == LINK_MODE


def read_entry(path: Path) -> Entry | None:
    """The entry at ``path``, a link read and never followed; None when absent or neither a regular
    file nor a link."""
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            return Entry(LINK_MODE, os.readlink(os.fsencode(path)))
        if not stat.S_ISREG(info.st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced since the lstat
            return None
        return Entry(EXEC_MODE if info.st_mode & stat.S_IXUSR else FILE_MODE, f.read())


def split_lines(text: str) -> list[str]:
    """Lines with their newlines, ending at ``\\n`` only (git's lines; ``str.splitlines`` would also
    break at ``\\r``, ``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028 and U+2029)."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def _text(entry: Entry | None) -> str | None:
    """The entry's contents as text when they are UTF-8 without NUL bytes, else None."""
    if entry is None or b"\0" in entry.data:
        return None
    try:
        return entry.data.decode("utf-8")
    except UnicodeDecodeError:
        return None


# ----------------------------------------------------------------------------------------------
# Writing diffs


def _git_header(rel: str, old_mode: str | None, new_mode: str | None) -> str:
    """``diff --git`` and its mode lines; a mode None means the side is absent. A name with a space
    is quoted there, unlike git: ``git apply`` cannot split ``diff --git a/ /x b/ /x`` when no
    ``---`` line follows (an empty file, a mode change, a binary patch), but reads quotes anywhere."""
    spaced = " " in rel
    header = f"diff --git {quote_path('a/' + rel, spaced)} {quote_path('b/' + rel, spaced)}\n"
    if old_mode is None:
        header += f"new file mode {new_mode}\n"
    elif new_mode is None:
        header += f"deleted file mode {old_mode}\n"
    elif old_mode != new_mode:
        header += f"old mode {old_mode}\nnew mode {new_mode}\n"
    return header


def _label(marker: str, prefix: str, rel: str, absent: bool) -> str:
    if absent:
        return f"{marker} /dev/null\n"
    return f"{marker} {quote_path(prefix + rel)}{chr(9) if ' ' in rel else ''}\n"  # git's tab after a space


def file_diff(rel: str, old: str | None, new: str | None, old_mode: str = FILE_MODE, new_mode: str = FILE_MODE) -> str:
    """The git-style diff of one text file; ``old``/``new`` None means absent (added or deleted)."""
    header = _git_header(rel, None if old is None else old_mode, None if new is None else new_mode)
    body = list(difflib.unified_diff(split_lines(old or ""), split_lines(new or ""), n=3))[2:]  # [2:]: its ---/+++
    if not body and header.count("\n") == 1:
        return ""
    out = [header]
    if body:
        out += [_label("---", "a/", rel, old is None), _label("+++", "b/", rel, new is None)]
    out += [line if line.endswith("\n") else line + "\n" + NO_NEWLINE + "\n" for line in body]
    return "".join(out)


def _binary_diff(rel: str, before: Entry | None, after: Entry | None) -> str:
    """A ``GIT binary patch`` of one path: the new contents, then the old (git's reverse hunk)."""
    old, new = (before.data if before else b""), (after.data if after else b"")
    index = f"index {blob_id(old) if before else NULL_ID}..{blob_id(new) if after else NULL_ID}"
    if before is not None and after is not None and before.mode == after.mode:
        index += f" {after.mode}"
    header = _git_header(rel, before.mode if before else None, after.mode if after else None)
    return f"{header}{index}\nGIT binary patch\n{encode_literal(new)}{encode_literal(old)}"


def _entry_diff(rel: str, before: Entry | None, after: Entry | None) -> str:
    if before is not None and after is not None and before.is_link != after.is_link:
        return _entry_diff(rel, before, None) + _entry_diff(rel, None, after)  # a type change, as git writes it
    old, new = _text(before), _text(after)
    if (before is None or old is not None) and (after is None or new is not None):
        return file_diff(rel, old, new, before.mode if before else FILE_MODE, after.mode if after else FILE_MODE)
    return _binary_diff(rel, before, after)


def diff_trees(old_root: Path, new_root: Path) -> str:
    """The diff turning the tree under ``old_root`` into the one under ``new_root`` (paths in sorted
    order); raises ``DiffRoundTripError`` if the text would not rebuild ``new_root`` exactly."""
    old_paths, new_paths = _walk(Path(old_root)), _walk(Path(new_root))
    changes: dict[str, tuple[Entry | None, Entry | None]] = {}
    chunks = []
    for rel in sorted(old_paths.keys() | new_paths.keys()):
        before = read_entry(old_paths[rel]) if rel in old_paths else None
        after = read_entry(new_paths[rel]) if rel in new_paths else None
        if before != after:
            changes[rel] = (before, after)
            chunks.append(_entry_diff(rel, before, after))
    text = "".join(chunks)
    _check_round_trip(text, changes, f"{old_root} -> {new_root}")
    return text


def _check_round_trip(text: str, changes: dict[str, tuple[Entry | None, Entry | None]], what: str) -> None:
    """Apply ``text`` in memory to the old sides of ``changes``; every changed path, and no other,
    must come out as its new side."""
    try:
        plan = _plan(parse_patch(text), lambda rel: changes[rel][0] if rel in changes else None)
    except PatchError as e:
        raise DiffRoundTripError(f"harness bug: the diff of {what} does not apply to its own old tree: {e}",
                                 text, sorted(changes)) from e
    wrong = sorted(rel for rel in changes.keys() | plan.keys()
                   if rel not in plan or rel not in changes or plan[rel] != changes[rel][1])
    if wrong:
        raise DiffRoundTripError(f"harness bug: the diff of {what} does not rebuild {len(wrong)} path(s): "
                                 f"{', '.join(map(repr, wrong[:5]))}", text, wrong)


# ----------------------------------------------------------------------------------------------
# Parsing


@dataclass
class Hunk:
    old_start: int  # 1-based line of the first old line (for an empty old range: the line it follows)
    old_lines: list[str] = field(default_factory=list)  # with their newlines, as in the file
    new_lines: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)  # the "+" lines, without newlines
    removed: list[str] = field(default_factory=list)  # the "-" lines, without newlines


@dataclass
class BinaryHunk:
    method: str  # "literal": ``data`` is the new contents; "delta": a git delta against the old ones
    data: bytes


@dataclass
class FilePatch:
    old_path: str | None  # None: the file is created
    new_path: str | None  # None: the file is deleted
    hunks: list[Hunk] = field(default_factory=list)
    new_mode: str | None = None  # FILE_MODE, EXEC_MODE or LINK_MODE when the patch sets it
    binary: bool = False  # a binary change, with its data in ``binary_hunk`` or, if None, without any
    binary_hunk: BinaryHunk | None = None
    old_id: str | None = None  # blob ids of the ``index`` line
    new_id: str | None = None
    copy: bool = False  # "copy from"/"copy to": the old path stays

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_INDEX_RE = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)")
_BINARY_RE = re.compile(r"^(literal|delta) (\d+)\n?$")


def _safe(name: str, where: str) -> str:
    if not name or name.startswith("/") or "\0" in name or any(p in ("", ".", "..") for p in name.split("/")):
        raise PatchError(f"{where}: unsafe path {name!r} (expected a relative path without '..')")
    return name


def _name(raw: str, where: str, prefix: str = "") -> str | None:
    """A file name as a patch line gives it (C-quoted, or up to a tab); None for /dev/null."""
    raw = raw.rstrip("\n")
    if raw.startswith('"'):
        try:
            name = unquote_path(raw)[0]
        except ValueError as e:
            raise PatchError(f"{where}: {e}") from None
    else:
        name = raw.split("\t", 1)[0]
    if name == "/dev/null":
        return None
    if prefix and name.startswith(prefix):
        name = name[len(prefix) :]
    return _safe(name, where)


def _header_names(rest: str, where: str) -> tuple[str, str]:
    """The two names of ``diff --git a/X b/Y``: quoted ones are read as such; two unquoted ones,
    which may hold spaces, split where the halves name the same file (``rename from`` and ``---``
    lines correct the split for a rename)."""
    try:
        if rest.startswith('"'):
            old, tail = unquote_path(rest)
            if not tail.startswith(" "):
                raise PatchError(f"{where}: cannot read file names from {rest!r}")
            new = tail[1:]
            new = unquote_path(new)[0] if new.startswith('"') else new
        else:
            old, new = _split_unquoted(rest)
    except ValueError as e:
        raise PatchError(f"{where}: {e}") from None
    old = old[2:] if old.startswith("a/") else old
    new = new[2:] if new.startswith("b/") else new
    return _safe(old, where), _safe(new, where)


def _split_unquoted(rest: str) -> tuple[str, str]:
    for at in (i for i in range(len(rest)) if rest.startswith(' "', i)):  # only the second name quoted
        try:
            name, tail = unquote_path(rest[at + 1 :])
        except ValueError:
            continue
        if not tail:
            return rest[:at], name
    half = (len(rest) - 1) // 2
    old, new = rest[:half], rest[half + 1 :]
    same = old == new or ((old[:2], new[:2]) == ("a/", "b/") and old[2:] == new[2:])
    if len(rest) % 2 and rest[half] == " " and same:
        return old, new
    at = rest.find(" b/")
    if at < 0:
        at = rest.find(" ")
    if at < 0:
        raise ValueError(f"cannot read two file names from {rest!r}")
    return rest[:at], rest[at + 1 :]


def _mode(line: str, where: str) -> str:
    value = line.split()[-1]
    if not re.fullmatch(r"[0-7]{6}", value):
        raise PatchError(f"{where}: {value!r} is not a file mode (expected e.g. 100644, 100755, 120000)")
    if value == LINK_MODE:
        return LINK_MODE
    return EXEC_MODE if int(value, 8) & stat.S_IXUSR else FILE_MODE


def parse_patch(text: str) -> list[FilePatch]:
    """Split a unified diff into per-file patches; raises ``PatchError`` on malformed input."""
    lines = split_lines(text)
    patches: list[FilePatch] = []
    current: FilePatch | None = None
    i = 0
    while i < len(lines):
        line, where = lines[i], f"line {i + 1}"
        if line.startswith("diff --git "):
            current = FilePatch(*_header_names(line[len("diff --git ") :].rstrip("\n"), where))
            patches.append(current)
        elif current is not None and line.startswith("new file mode "):
            current.old_path, current.new_mode = None, _mode(line, where)
        elif current is not None and line.startswith("deleted file mode "):
            current.new_path = None
        elif current is not None and line.startswith("new mode "):
            current.new_mode = _mode(line, where)
        elif current is not None and line.startswith(("rename from ", "copy from ")):
            current.old_path = _name(line.split(" ", 2)[2], where)
            current.copy = line.startswith("copy")
        elif current is not None and line.startswith(("rename to ", "copy to ")):
            current.new_path = _name(line.split(" ", 2)[2], where)
        elif current is not None and line.startswith("index "):
            ids = _INDEX_RE.match(line)
            if ids:
                current.old_id, current.new_id = ids.group(1), ids.group(2)
        elif current is not None and line.startswith("Binary files "):
            current.binary = True
        elif current is not None and line == "GIT binary patch\n":
            i = _parse_binary(lines, i + 1, current)
            continue
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old = _name(line[4:], where, "a/")
            new = _name(lines[i + 1][4:], f"line {i + 2}", "b/")
            if current is None or current.hunks or current.binary or current.path not in (old, new):
                current = FilePatch(old_path=old, new_path=new)
                patches.append(current)
            else:
                current.old_path, current.new_path = old, new
            i += 1
        elif line.startswith("@@"):
            if current is None:
                raise PatchError(f"{where}: hunk before any file header")
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
        if tag == "\\":  # a stray "\ No newline" marker
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
        # a "\ No newline at end of file" marker applies to the line just read
        if i < len(lines) and lines[i].startswith("\\"):
            if tag in (" ", "-"):
                hunk.old_lines[-1] = hunk.old_lines[-1].removesuffix("\n")
            if tag in (" ", "+"):
                hunk.new_lines[-1] = hunk.new_lines[-1].removesuffix("\n")
            i += 1
    if seen_old != old_count or seen_new != new_count:
        raise PatchError(f"{patch.path}: truncated hunk @@ -{hunk.old_start},{old_count} @@")
    patch.hunks.append(hunk)
    return i


def _parse_binary(lines: list[str], i: int, patch: FilePatch) -> int:
    """Read the forward hunk after ``GIT binary patch`` and skip the optional reverse one."""
    patch.binary = True
    patch.binary_hunk, i = _binary_hunk(lines, i, patch)
    if patch.binary_hunk is None:
        raise PatchError(f"{patch.path}: 'GIT binary patch' at line {i} is not followed by a literal or delta hunk")
    return _binary_hunk(lines, i, patch)[1]


def _binary_hunk(lines: list[str], i: int, patch: FilePatch) -> tuple[BinaryHunk | None, int]:
    header = _BINARY_RE.match(lines[i]) if i < len(lines) else None
    if header is None:
        return None, i
    start, data_lines = i, []
    i += 1
    while i < len(lines) and lines[i] != "\n":
        data_lines.append(lines[i].rstrip("\n"))
        i += 1
    try:
        data = decode_hunk_data(int(header.group(2)), data_lines)
    except ValueError as e:
        raise PatchError(f"{patch.path}: binary hunk at line {start + 1}: {e}") from None
    return BinaryHunk(header.group(1), data), i + 1


# ----------------------------------------------------------------------------------------------
# Applying


def apply_hunks(text: str, hunks: list[Hunk], name: str) -> str:
    """Apply hunks to a file's text; each must match exactly, at its line or shifted."""
    lines = split_lines(text)
    offset = 0
    for number, hunk in enumerate(hunks, 1):
        # 0-based index of the hunk's first old line; an empty old range follows line old_start
        expected = hunk.old_start if not hunk.old_lines else max(hunk.old_start - 1, 0)
        want = expected + offset
        at = _find_block(lines, hunk.old_lines, want)
        if at is None:
            raise PatchError(
                f"{name}: hunk {number} (@@ -{hunk.old_start} @@) does not match the file; "
                f"expected these lines near line {want + 1}: {''.join(hunk.old_lines)[:200]!r}"
            )
        lines[at : at + len(hunk.old_lines)] = hunk.new_lines
        offset = at - expected + len(hunk.new_lines) - len(hunk.old_lines)
    return "".join(lines)


def _find_block(lines: list[str], block: list[str], want: int) -> int | None:
    n = len(block)
    candidates = sorted(range(len(lines) - n + 1), key=lambda start: abs(start - want))
    for start in candidates:
        if lines[start : start + n] == block:
            return start
    return None


Reader = Callable[[str], "Entry | None"]


def _plan(patches: list[FilePatch], read: Reader) -> dict[str, Entry | None]:
    """The final state of every path the patches touch (None: absent), computed without writing;
    ``read`` gives a path's state before the patch."""
    plan: dict[str, Entry | None] = {}

    def now(rel: str) -> Entry | None:
        return plan[rel] if rel in plan else read(rel)

    for fp in patches:
        before = None
        if fp.old_path is not None:
            before = now(fp.old_path)
            if before is None:
                raise PatchError(f"{fp.old_path}: the patch changes a file that does not exist")
        if fp.new_path is not None and fp.new_path != fp.old_path and now(fp.new_path) is not None:
            raise PatchError(f"{fp.new_path}: the patch creates a file that already exists")
        after = _patched(fp, before)
        if fp.old_path is not None and fp.old_path != fp.new_path and not fp.copy:
            plan[fp.old_path] = None
        if fp.new_path is not None:
            plan[fp.new_path] = after
    return plan


def _patched(fp: FilePatch, before: Entry | None) -> Entry | None:
    """What one file patch makes of ``before`` (None: the file is deleted)."""
    old = before.data if before is not None else b""
    if fp.binary_hunk is not None and before is not None and fp.old_id and len(fp.old_id) == 40:
        if blob_id(old) != fp.old_id:
            raise PatchError(f"{fp.path}: the binary patch is for blob {fp.old_id[:12]}, the file is "
                             f"blob {blob_id(old)[:12]}")
    if fp.new_path is None:  # a deletion: hunks, when given, must remove everything
        if fp.hunks and _patched_text(fp, before):
            raise PatchError(f"{fp.old_path}: the patch deletes the file but its hunks leave some of it")
        return None
    mode = fp.new_mode or (before.mode if before is not None else FILE_MODE)
    if not fp.binary:
        return Entry(mode, _patched_text(fp, before))
    if fp.binary_hunk is None:
        raise PatchError(f"{fp.path}: the patch says this binary file changed but carries no data "
                         "(a patch that can be applied is made with `git diff --binary`)")
    try:
        data = fp.binary_hunk.data if fp.binary_hunk.method == "literal" else apply_delta(old, fp.binary_hunk.data)
    except ValueError as e:
        raise PatchError(f"{fp.path}: {e}") from None
    if fp.new_id and len(fp.new_id) == 40 and blob_id(data) != fp.new_id:
        raise PatchError(f"{fp.path}: the binary patch makes blob {blob_id(data)[:12]}, its index line says "
                         f"{fp.new_id[:12]}")
    return Entry(mode, data)


def _patched_text(fp: FilePatch, before: Entry | None) -> bytes:
    text = from_bytes(before.data) if before is not None else ""
    try:
        return to_bytes(apply_hunks(text, fp.hunks, fp.path))
    except UnicodeEncodeError as e:
        raise PatchError(f"{fp.path}: the patch holds a character that is no text: {e}") from None


def apply_patch(root: Path, text: str) -> list[str]:
    """Apply a diff to the tree under ``root``; returns the paths it changed (written or removed).

    All of it is computed before anything is written, so a patch that fails leaves ``root``
    untouched (short of an operating-system error while writing)."""
    root = Path(root)

    def read(rel: str) -> Entry | None:  # nothing is beyond a link: it is never followed
        return None if _link_above(root, rel) else read_entry(root / rel)

    plan = _plan(parse_patch(text), read)
    _check_writable(root, plan)
    for rel, entry in plan.items():
        if entry is None:
            _remove(root, rel)
    for rel in sorted(rel for rel, entry in plan.items() if entry is not None):
        _put(root, rel, plan[rel])
    return sorted(plan)


def _link_above(root: Path, rel: str) -> bool:
    parts = rel.split("/")
    for k in range(1, len(parts)):
        kind = _kind(root / "/".join(parts[:k]))
        if kind != "dir":
            return kind == "link"
    return False


def _check_writable(root: Path, plan: dict[str, Entry | None]) -> None:
    """Every written path must have folders above it once the deletions are done, and no folder of
    tracked files where it goes."""
    for rel, entry in plan.items():
        if entry is None:
            continue
        parts = rel.split("/")
        for k in range(1, len(parts)):
            prefix = "/".join(parts[:k])
            if plan.get(prefix) is not None:
                raise PatchError(f"{rel}: the patch makes {prefix} both a file and a folder")
            if prefix in plan:  # removed before anything is written
                continue
            kind = _kind(root / prefix)
            if kind == "link":
                raise PatchError(f"{rel}: beyond the symbolic link {prefix}; a patch never goes through a link")
            if kind in ("file", "other"):
                raise PatchError(f"{rel}: {prefix} is a file, not a folder")
            if kind is None:
                break
        if _kind(root / rel) == "dir":
            kept = [sub for sub in _walk(root / rel) if f"{rel}/{sub}" not in plan]
            if kept:
                raise PatchError(f"{rel}: the patch puts a file where a folder holds {kept[0]}")


def _remove(root: Path, rel: str) -> None:
    path = root / rel
    if _kind(path) in ("file", "link", "other"):
        path.unlink()
    folder = path.parent
    while folder != root and _kind(folder) == "dir" and not any(folder.iterdir()):
        folder.rmdir()  # a folder the patch empties goes too, as with git apply
        folder = folder.parent


def _put(root: Path, rel: str, entry: Entry) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)  # no link above it: _check_writable
    _check_inside(root, path)
    kind, permissions = _kind(path), None
    if kind == "dir":  # holds only untracked files (_check_writable)
        shutil.rmtree(path)
    elif kind is not None:
        if kind == "file":
            permissions = stat.S_IMODE(os.lstat(path).st_mode)
        path.unlink()
    if entry.is_link:
        os.symlink(entry.data, os.fsencode(path))
        return
    executable = entry.mode == EXEC_MODE
    if permissions is None:
        permissions = 0o755 if executable else 0o644
    else:  # keep the other bits of the file it replaces; git tracks only the executable bit
        permissions = permissions | 0o100 | (permissions & 0o044) >> 2 if executable else permissions & ~0o111
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(entry.data)
    os.chmod(path, permissions)


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

    ``paths`` lists every file the diff touches, binary ones and links included, once each, in diff
    order;
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
        if fp.path not in stats.paths:  # a file that becomes a link is a deletion and an addition
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
        ignore=ignore_names,
        dirs_exist_ok=True,
    )

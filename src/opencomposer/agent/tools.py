"""The agent's tools: read, list, search, edit and write files, run commands, finish.

Every tool acts on one ``Sandbox``. File tools run on the host but only through
``Sandbox.resolve`` (paths stay inside the workspace: no ``..``, no symlink out, regular files
only); ``grep`` and ``run`` execute inside the jail. ``codebase_search`` (ranked retrieval,
``agent.search``) and ``find_files`` (glob) walk the workspace from the host without following or
listing symbolic links. ``agent.tools`` chooses which tools an episode has (``DEFAULT_TOOLS``
unless a recipe says otherwise); the prompt lists exactly those, and a call of another is refused.
Arguments are checked strictly (unknown, missing or mistyped arguments are refused) and every
refusal is a ``ToolError`` whose message tells the model what to change; the loop sends it back as
the tool's result.

``finish`` raises ``Submitted``; the loop ends the episode with its message.
"""

from __future__ import annotations

import errno
import os
import shlex
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opencomposer.agent.errors import Submitted
from opencomposer.agent.search import (
    INDEX_MAX_FILE_BYTES,
    CodeIndex,
    Embedder,
    GlobError,
    glob_match,
    glob_parts,
    literal_prefix,
    openai_embedder,
    snippet,
    tokenize,
    walk_files,
)
from opencomposer.config.agent import DEFAULT_TOOLS, AgentConfig
from opencomposer.sandbox.patch import IGNORED_NAMES
from opencomposer.sandbox.workspace import PathOutsideWorkspace, Sandbox
from opencomposer.types import ToolCall

READ_DEFAULT_LINES = 400
READ_MAX_LINES = 2000
READ_MAX_LINE_CHARS = 2000
EDIT_MAX_BYTES = 8 << 20
GREP_MAX_MATCHES = 200
GREP_MAX_LINE_CHARS = 300
SEARCH_DEFAULT_RESULTS = 10
SEARCH_MAX_RESULTS = 50
SEARCH_MAX_QUERY_CHARS = 2000
SEARCH_SNIPPET_LINES = 4
FIND_MAX_RESULTS = 200


class ToolError(Exception):
    """A tool call that could not be carried out; the message is shown to the model."""


@dataclass(frozen=True)
class Param:
    name: str
    kind: type  # str, int or float
    description: str
    required: bool = True


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    params: tuple[Param, ...] = field(default_factory=tuple)

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling schema (also what the chat template lists in ``<tools>``)."""
        json_type = {str: "string", int: "integer", float: "number"}
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {
                        p.name: {"type": json_type[p.kind], "description": p.description} for p in self.params
                    },
                    "required": [p.name for p in self.params if p.required],
                },
            },
        }


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "read_file",
        "Read a text file of the workspace. Lines come numbered (number, tab, text); the numbers are "
        "not part of the file.",
        (
            Param("path", str, "File path, relative to the workspace root."),
            Param("offset", int, "First line to show, counting from 1 (default 1).", required=False),
            Param("limit", int, f"How many lines to show (default {READ_DEFAULT_LINES}, at most {READ_MAX_LINES}).",
                  required=False),
        ),
    ),
    ToolSpec(
        "list_dir",
        "List a folder of the workspace: sub-folders end with '/', files show their size in bytes.",
        (Param("path", str, "Folder path, relative to the workspace root ('.' is the root)."),),
    ),
    ToolSpec(
        "grep",
        "Search file contents with an extended regular expression (grep -E); prints path:line:text.",
        (
            Param("pattern", str, "Extended regular expression."),
            Param("path", str, "File or folder to search (default: the whole workspace).", required=False),
        ),
    ),
    ToolSpec(
        "edit",
        "Replace one exact occurrence of `old` with `new` in a file. `old` must match the file "
        "exactly (whitespace included) and occur exactly once; include surrounding lines to make it unique.",
        (
            Param("path", str, "File path, relative to the workspace root."),
            Param("old", str, "The exact text to replace."),
            Param("new", str, "The replacement text."),
        ),
    ),
    ToolSpec(
        "write_file",
        "Create or overwrite a file with the given content (parent folders are created).",
        (
            Param("path", str, "File path, relative to the workspace root."),
            Param("content", str, "The whole new content of the file."),
        ),
    ),
    ToolSpec(
        "run",
        "Run a shell command (bash) from the workspace root, without network access, and return its "
        "exit code and output. Each call starts a fresh shell: background processes and `cd` do not persist.",
        (
            Param("command", str, "The command line."),
            Param("timeout_s", float, "Seconds before the command is killed (default 60).", required=False),
        ),
    ),
    ToolSpec(
        "finish",
        "End the task. Call it once the work is done (or cannot be done), with a short message for the user.",
        (Param("message", str, "What you did, or your answer."),),
    ),
    ToolSpec(
        "codebase_search",
        "Ranked search of the workspace's code and text: returns the functions, classes and passages that "
        "best match a description or identifiers, each with its path, line range, symbol and first lines. "
        "Use it to find where something is implemented; use grep for an exact text.",
        (
            Param("query", str, "What you are looking for, in words or identifiers (e.g. 'parse config file')."),
            Param("limit", int, f"How many results (default {SEARCH_DEFAULT_RESULTS}, at most {SEARCH_MAX_RESULTS}).",
                  required=False),
            Param("glob", str, "Only search files whose path matches this glob (e.g. 'src/**/*.py').", required=False),
        ),
    ),
    ToolSpec(
        "find_files",
        "List the workspace's files whose path matches a glob, sorted. '*' matches within one folder name, "
        "'**' any number of folders: '**/*.py', 'src/**/test_*.py'.",
        (Param("pattern", str, "Glob, relative to the workspace root."),),
    ),
)
TOOL_NAMES = tuple(spec.name for spec in TOOLS)


def tool_schemas(names: Sequence[str] = DEFAULT_TOOLS) -> list[dict[str, Any]]:
    """The schemas of the tools ``names`` (``agent.tools``), in ``TOOLS`` order."""
    unknown = sorted(set(names) - set(TOOL_NAMES))
    if unknown:
        raise ValueError(f"unknown tool {unknown[0]!r}; the tools are: {', '.join(TOOL_NAMES)}")
    return [spec.schema() for spec in TOOLS if spec.name in names]


def check_arguments(call: ToolCall, enabled: Sequence[str] = DEFAULT_TOOLS) -> dict[str, Any]:
    """Validate a call against its spec; returns the arguments or raises ``ToolError``. A tool
    not in ``enabled`` (``agent.tools``) is refused like an unknown one, naming the enabled tools."""
    spec = next((s for s in TOOLS if s.name == call.name), None)
    shown = ", ".join(name for name in TOOL_NAMES if name in enabled)
    if spec is None:
        raise ToolError(f"unknown tool {call.name!r}; the tools are: {shown}")
    if spec.name not in enabled:
        raise ToolError(f"tool {call.name!r} is not enabled in this environment; the tools are: {shown}")
    if not isinstance(call.arguments, dict):
        raise ToolError(f"{call.name}: arguments must be a JSON object, got {type(call.arguments).__name__}")
    params = {p.name: p for p in spec.params}
    unknown = sorted(set(call.arguments) - set(params))
    if unknown:
        raise ToolError(
            f"{call.name}: unknown argument {unknown[0]!r}; valid arguments: {', '.join(params) or 'none'}"
        )
    for p in spec.params:
        if p.name not in call.arguments:
            if p.required:
                raise ToolError(f"{call.name}: missing required argument {p.name!r} ({p.description})")
            continue
        value = call.arguments[p.name]
        ok = (
            isinstance(value, str)
            if p.kind is str
            else isinstance(value, int) and not isinstance(value, bool)
            if p.kind is int
            else isinstance(value, int | float) and not isinstance(value, bool)
        )
        if not ok:
            expected = {str: "a string", int: "an integer", float: "a number"}[p.kind]
            raise ToolError(f"{call.name}: argument {p.name!r} must be {expected}, got {value!r}")
    return dict(call.arguments)


PATH_ERRORS = frozenset({errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP})
"""What the operating system says of a path the model wrote (a name over 255 bytes, a file used as
a folder, a symlink where a file must be): a tool error shown to the model, like a missing file."""


class Toolbox:
    """Runs tool calls against one sandbox. ``default_timeout_s`` applies to ``run`` without one;
    ``config`` gives the enabled tools (``agent.tools``) and the search ranker (``agent.search``);
    ``embedder`` replaces the ranker's embeddings endpoint (a local model, a test's fake)."""

    def __init__(self, sandbox: Sandbox, default_timeout_s: float | None = None, *,
                 config: AgentConfig | None = None, embedder: Embedder | None = None):
        self.sandbox = sandbox
        self.default_timeout_s = default_timeout_s or sandbox.config.timeout_s
        self.config = config or AgentConfig()
        self.tools = tuple(self.config.tools)
        search = self.config.search
        if embedder is None and search.ranker != "bm25":
            embedder = openai_embedder(search.base_url or self.config.http.base_url,
                                       search.embeddings.removeprefix("openai:"),
                                       os.environ.get(search.api_key_env), search.request_timeout_s)
        self.embedder = embedder
        self._index: CodeIndex | None = None  # built by the first codebase_search, refreshed by each

    def execute(self, call: ToolCall) -> str:
        """The tool's result text; raises ``ToolError`` (shown to the model) or ``Submitted``."""
        args = check_arguments(call, self.tools)
        try:
            return getattr(self, f"_{call.name}")(**args)
        except PathOutsideWorkspace as e:
            raise ToolError(f"{call.name}: {e}") from None
        except FileNotFoundError as e:
            raise ToolError(f"{call.name}: {e.args[0] if e.args else e}") from None
        except IsADirectoryError:
            raise ToolError(f"{call.name}: {args.get('path')!r} is a folder, not a file") from None
        except UnicodeDecodeError:
            raise ToolError(f"{call.name}: {args.get('path')!r} is not a UTF-8 text file") from None
        except FileExistsError:  # making the folders of a path through a file
            raise ToolError(f"{call.name}: {args.get('path')!r}: a file stands where a folder of it must be") from None
        except OSError as e:
            if e.errno not in PATH_ERRORS:
                raise  # the host's trouble (a full disk, an I/O error), not the model's: never a tool error
            raise ToolError(f"{call.name}: {args.get('path')!r}: {os.strerror(e.errno)}") from None

    # --- files -----------------------------------------------------------------------------

    def _open_regular(self, path: str, flags: int) -> int:
        host = self.sandbox.resolve(path)
        try:
            st = os.stat(host)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no such file") from None
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{path!r} is not a regular file")
        return os.open(host, flags | os.O_NOFOLLOW | os.O_NONBLOCK)

    def _read_text(self, path: str, max_bytes: int | None = None) -> str:
        fd = self._open_regular(path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            data = f.read(max_bytes + 1) if max_bytes is not None else f.read()
        if max_bytes is not None and len(data) > max_bytes:
            raise ToolError(f"{path!r} is larger than {max_bytes >> 20} MiB; change it with `run` instead")
        if b"\0" in data:
            raise ToolError(f"{path!r} is a binary file, not text")
        return data.decode("utf-8")

    def _write_text(self, path: str, content: str) -> None:
        limit = self.sandbox.config.file_size_mb << 20
        data = content.encode("utf-8")
        if len(data) > limit:
            raise ToolError(f"content is {len(data)} bytes; files are limited to {limit} bytes")
        host = self.sandbox.resolve(path)
        if host == self.sandbox.resolve("."):
            raise ToolError("write_file: a file path is required, not the workspace root")
        if host.exists() and not host.is_file():
            raise ToolError(f"{path!r} exists and is not a regular file")
        host.parent.mkdir(parents=True, exist_ok=True)
        self.sandbox.resolve(path)  # the parents just created must still be inside
        fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if self._index is not None:
            self._index.forget(self.sandbox.relpath(host))

    def _read_file(self, path: str, offset: int = 1, limit: int = READ_DEFAULT_LINES) -> str:
        if offset < 1:
            raise ToolError(f"read_file: offset must be >= 1 (lines count from 1), got {offset}")
        if not 1 <= limit <= READ_MAX_LINES:
            raise ToolError(f"read_file: limit must be between 1 and {READ_MAX_LINES}, got {limit}")
        text = self._read_text(path)
        lines = text.splitlines()
        if not lines:
            return f"[{path} is empty]"
        if offset > len(lines):
            raise ToolError(f"read_file: offset {offset} is past the end of {path} ({len(lines)} lines)")
        end = min(offset + limit - 1, len(lines))
        out = []
        for number in range(offset, end + 1):
            line = lines[number - 1]
            if len(line) > READ_MAX_LINE_CHARS:
                line = line[:READ_MAX_LINE_CHARS] + f" [... {len(line) - READ_MAX_LINE_CHARS} more characters]"
            out.append(f"{number:6d}\t{line}")
        if offset > 1 or end < len(lines):
            more = f"; call read_file with offset={end + 1} for more" if end < len(lines) else ""
            out.append(f"[lines {offset}-{end} of {len(lines)}{more}]")
        return "\n".join(out)

    def _list_dir(self, path: str) -> str:
        host = self.sandbox.resolve(path, must_exist=True)
        if not host.is_dir():
            raise ToolError(f"list_dir: {path!r} is a file, not a folder; use read_file")
        entries = []
        for entry in sorted(os.scandir(host), key=lambda e: e.name):
            if entry.name in IGNORED_NAMES - {".git"}:
                continue
            if entry.is_symlink():
                entries.append(f"{entry.name} -> {os.readlink(entry.path)}")
            elif entry.is_dir():
                entries.append(entry.name + "/")
            else:
                entries.append(f"{entry.name} ({entry.stat().st_size} bytes)")
        return "\n".join(entries) if entries else f"[{path} is empty]"

    def _grep(self, pattern: str, path: str = ".") -> str:
        if not pattern:
            raise ToolError("grep: pattern must not be empty")
        host = self.sandbox.resolve(path, must_exist=True)
        rel = self.sandbox.relpath(host)
        excludes = " ".join(f"--exclude-dir={shlex.quote(name)}" for name in sorted(IGNORED_NAMES))
        command = (
            f"grep -rnIE --color=never {excludes} -e {shlex.quote(pattern)} -- {shlex.quote(rel)} "
            f"| head -n {GREP_MAX_MATCHES + 1}"
        )
        result = self.sandbox.run(f"set -o pipefail 2>/dev/null; {command}", timeout_s=60)
        if result.timed_out:
            raise ToolError("grep: the search took longer than 60 s; narrow the pattern or the path")
        if result.exit_code == 2 or (result.exit_code not in (0, 1, 141) and not result.output):
            detail = result.output.strip().removeprefix("grep: ") or "invalid pattern"
            raise ToolError(f"grep: {detail}")
        lines = [line for line in result.output.splitlines() if line]
        if not lines:
            return f"no matches for {pattern!r} in {path}"
        shown = []
        for line in lines[:GREP_MAX_MATCHES]:
            line = line[2:] if line.startswith("./") else line
            shown.append(line if len(line) <= GREP_MAX_LINE_CHARS else line[:GREP_MAX_LINE_CHARS] + " [...]")
        if len(lines) > GREP_MAX_MATCHES:
            shown.append(f"[more than {GREP_MAX_MATCHES} matches; narrow the pattern or the path]")
        return "\n".join(shown)

    def _edit(self, path: str, old: str, new: str) -> str:
        if not old:
            raise ToolError("edit: `old` must not be empty; use write_file to create a file")
        if old == new:
            raise ToolError("edit: `old` and `new` are identical; nothing would change")
        text = self._read_text(path, max_bytes=EDIT_MAX_BYTES)
        count = text.count(old)
        if count == 0:
            hint = ""
            stripped = [line.strip() for line in old.strip().splitlines() if line.strip()]
            if stripped:
                for number, line in enumerate(text.splitlines(), 1):
                    if line.strip() == stripped[0]:
                        hint = (f" A line like the first line of `old` is at line {number}; check the "
                                "indentation and the exact characters (read_file shows them).")
                        break
            raise ToolError(f"edit: `old` was not found in {path}.{hint}")
        if count > 1:
            starts, at = [], -1
            for _ in range(min(count, 10)):
                at = text.index(old, at + 1)
                starts.append(text.count("\n", 0, at) + 1)
            raise ToolError(
                f"edit: `old` occurs {count} times in {path} (at lines {', '.join(map(str, starts))}); "
                "include more surrounding lines so that it occurs exactly once"
            )
        at = text.index(old)
        first = text.count("\n", 0, at) + 1
        self._write_text(path, text[:at] + new + text[at + len(old):])
        old_n, new_n = old.count("\n") + 1, new.count("\n") + 1
        return f"Edited {path}: replaced {old_n} line(s) starting at line {first} with {new_n} line(s)."

    def _write_file(self, path: str, content: str) -> str:
        existed = self.sandbox.resolve(path).exists()
        self._write_text(path, content)
        verb = "Overwrote" if existed else "Created"
        return f"{verb} {path} ({len(content.splitlines())} lines)."

    # --- search ------------------------------------------------------------------------------

    def _glob(self, tool: str, pattern: str) -> list[str]:
        """The pattern's segments, an absolute pattern under the workdir taken as relative."""
        if pattern.startswith(self.sandbox.workdir + "/"):
            pattern = pattern[len(self.sandbox.workdir) + 1:]
        try:
            return glob_parts(pattern)
        except GlobError as e:
            raise ToolError(f"{tool}: {e}") from None

    def _find_files(self, pattern: str) -> str:
        parts = self._glob("find_files", pattern)
        prefix = "/".join(literal_prefix(parts)) or "."
        root = self.sandbox.resolve(".")
        start = self.sandbox.resolve(prefix)
        if start != root.joinpath(prefix):  # a link on the way: its real path differs
            raise ToolError(f"find_files: {prefix!r} is a symbolic link; find_files does not follow links "
                            "(list_dir shows where it points)")
        files, truncated = walk_files(root, start) if start.is_dir() else ([], False)
        matches = [f.rel for f in files if glob_match(parts, f.rel.split("/"))]
        if not matches:
            hint = ""
            named = root.joinpath(*parts)
            if not any(c in pattern for c in "*?[") and named.is_dir() and not named.is_symlink():
                hint = f"; {pattern!r} is a folder: try '{pattern.rstrip('/')}/**'"
            elif len(parts) == 1 and parts[0] != "**":
                hint = f"; a pattern without '/' matches the root folder only: try '**/{pattern}'"
            return f"no files match {pattern!r}{hint}"
        shown = matches[:FIND_MAX_RESULTS]
        if len(matches) > FIND_MAX_RESULTS:
            shown.append(f"[{len(matches)} files match; the first {FIND_MAX_RESULTS} are shown: narrow the pattern]")
        if truncated:
            shown.append("[the workspace is too large to walk whole; give a pattern that starts with a folder]")
        return "\n".join(shown)

    def _codebase_search(self, query: str, limit: int = SEARCH_DEFAULT_RESULTS, glob: str | None = None) -> str:
        if not query.strip():
            raise ToolError("codebase_search: `query` must not be empty; describe what you are looking for")
        if len(query) > SEARCH_MAX_QUERY_CHARS:
            raise ToolError(f"codebase_search: `query` is {len(query)} characters; keep it under "
                            f"{SEARCH_MAX_QUERY_CHARS} (a few words or identifiers)")
        if not 1 <= limit <= SEARCH_MAX_RESULTS:
            raise ToolError(f"codebase_search: limit must be between 1 and {SEARCH_MAX_RESULTS}, got {limit}")
        only = self._glob("codebase_search", glob) if glob is not None else None
        words = set(tokenize(query))
        ranker = self.config.search.ranker
        if not words and ranker == "bm25":
            raise ToolError(f"codebase_search: {query!r} has no words to search for (only very common words or "
                            "punctuation); name identifiers or topics")
        if self._index is None:
            self._index = CodeIndex(self.sandbox.resolve("."), self.embedder)
        notes = []
        try:
            hits = self._index.search(query, limit, only, ranker)
        except (OSError, ValueError, KeyError, TypeError) as e:
            if ranker == "bm25":
                raise
            notes.append(f"[the embeddings endpoint failed ({type(e).__name__}: {e}); ranked by words alone]")
            hits = self._index.search(query, limit, only, "bm25") if words else []
        out = []
        for hit in hits:
            chunk = hit.chunk
            head = f"{chunk.path}:{chunk.start}-{chunk.end}" + (f" {chunk.symbol}" if chunk.symbol else "")
            lines = snippet(chunk, words, SEARCH_SNIPPET_LINES, GREP_MAX_LINE_CHARS)
            out.append("\n".join([head] + [f"{number:6d}\t{line}" for number, line in lines]))
        if not out:
            where = f" in files matching {glob!r}" if glob is not None else ""
            out.append(f"no results for {query!r}{where}; try other words, or grep for an exact text")
        if self._index.skipped:
            notes.append(f"[{len(self._index.skipped)} file(s) over {INDEX_MAX_FILE_BYTES >> 20} MiB are not searched, e.g. "
                         f"{self._index.skipped[0]}; use grep]")
        if self._index.truncated:
            notes.append("[the workspace is too large to index whole; some files are not searched]")
        return "\n\n".join(out + notes)

    # --- commands ----------------------------------------------------------------------------

    def _run(self, command: str, timeout_s: float | None = None) -> str:
        if not command.strip():
            raise ToolError("run: `command` must not be empty")
        limit = self.sandbox.config.max_timeout_s
        if timeout_s is not None and not 0 < timeout_s <= limit:
            raise ToolError(f"run: timeout_s must be in (0, {limit:g}], got {timeout_s}")
        result = self.sandbox.run(command, timeout_s=timeout_s or self.default_timeout_s)
        footer = f"[exit code {result.exit_code}]"
        if result.timed_out:
            footer = f"[timed out after {timeout_s or self.default_timeout_s:g} s; the command was killed]"
        return (result.output.rstrip("\n") + "\n" + footer) if result.output.strip() else footer

    def _finish(self, message: str) -> str:
        raise Submitted(message)

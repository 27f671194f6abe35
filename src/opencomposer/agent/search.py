"""Ranked retrieval over a workspace, for the ``codebase_search`` and ``find_files`` tools.

The index is a list of chunks: one per top-level function, class header and method of a Python
file (``ast``; decorators included), and windows of ``WINDOW_LINES`` lines for the rest of a
Python file and for every other text file. A chunk is ranked from its path, its symbol's name and
its text, tokenised for code: each identifier is kept whole (lower-cased) and split into its
snake_case and CamelCase words (``parse_config`` -> ``parse_config parse config``,
``HTTPServer`` -> ``httpserver http server``), with a plural ``s`` dropped so ``files`` finds
``file``. The default ranker is BM25 (``bm25s``), with test files' chunks weighted by
``TEST_WEIGHT`` (a request's words are in its tests too; the code to change is elsewhere); with
an embedding function (an
OpenAI-compatible ``/embeddings`` endpoint, ``[agent.search]``) chunks are ranked by the cosine
similarity of their embeddings to the query's, or by both (reciprocal-rank fusion, ``hybrid``).

The walk never follows a symbolic link and never lists one (a link may point anywhere; its target,
when it is inside the workspace, is indexed under its own path), skips ``IGNORED_NAMES`` and
ignored suffixes, reads regular files only (``O_NOFOLLOW``), and skips files larger than
``INDEX_MAX_FILE_BYTES``, binary and non-UTF-8 files. Chunks are kept between searches and a file
is chunked again when its size or mtime changed, or when the caller says it wrote it
(``CodeIndex.forget``: two writes within the file system's timestamp granularity can leave both
the same), so searching after an edit sees the edit.

This module knows nothing of ``Sandbox``: ``Toolbox`` resolves the paths the model gives through
``Sandbox.resolve`` and hands this module a folder inside the workspace.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import hashlib
import json
import os
import re
import stat
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from opencomposer.config.agent import SEARCH_RANKERS
from opencomposer.pysource import parse
from opencomposer.sandbox.patch import is_ignored_name

WINDOW_LINES = 40
INDEX_MAX_FILE_BYTES = 1 << 20
INDEX_MAX_FILES = 20_000
WALK_MAX_ENTRIES = 200_000
EMBED_MAX_CHARS = 4000
EMBED_BATCH = 64
RRF_K = 60  # reciprocal-rank fusion's constant (Cormack et al. 2009)
TEST_WEIGHT = 0.5
"""BM25 scores of chunks in test files are multiplied by this: a request names behaviour that the
tests exercise too, word for word, but the code to change is the implementation
(benchmarks/search_tools.py measures the effect)."""

Embedder = Callable[[list[str]], list[list[float]]]
"""Texts in, one vector per text out (any length, the same for every call)."""

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
# English words too common in requests to rank anything; code keywords are left to BM25's idf.
STOPWORDS = frozenset(
    "a an and are as at be been but by can could do does for from has have how i if in into is it its "
    "me my no not of on or our should so that the their them then there these this those to was we "
    "were what when where which while who why will with would you your".split()
)


DEFINES = "def:"  # the prefix of a definition word; no word of ``tokenize`` has a ':'


def query_tokens(query: str) -> list[str]:
    """A query's words, and the definition word of each identifier in it (``Chunk.tokens``)."""
    return tokenize(query) + [DEFINES + word.lower() for word in _WORD.findall(query)]


class GlobError(ValueError):
    """A glob pattern that cannot name workspace paths; the message says what to change."""


# ----------------------------------------------------------------------------------------------
# Tokens


def _normalise(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


@functools.lru_cache(maxsize=1 << 16)
def _word_tokens(word: str) -> tuple[str, ...]:
    """One identifier's words (cached: a codebase repeats its identifiers)."""
    whole = word.lower()
    tokens = [_normalise(whole)] if whole not in STOPWORDS else []
    parts = [p.lower() for piece in word.split("_") for p in _CAMEL.findall(piece)]
    if len(parts) > 1:
        tokens += [_normalise(p) for p in parts if len(p) > 1 and p not in STOPWORDS]
    return tuple(tokens)


def tokenize(text: str) -> list[str]:
    """Code-aware words: each identifier whole, then its snake_case and CamelCase parts."""
    return [token for word in _WORD.findall(text) for token in _word_tokens(word)]


# ----------------------------------------------------------------------------------------------
# Globs and the walk


def glob_parts(pattern: str) -> list[str]:
    """A workspace glob split into segments; ``**`` is any number of folders. Raises ``GlobError``."""
    if not pattern or "\0" in pattern:
        raise GlobError("the pattern is empty; give a glob such as '**/*.py'")
    if pattern.startswith("/"):
        raise GlobError(f"pattern {pattern!r} is absolute; give it relative to the workspace root, e.g. 'src/**/*.py'")
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise GlobError(f"pattern {pattern!r}: '..' is not allowed; patterns stay inside the workspace")
    if not parts:
        raise GlobError(f"pattern {pattern!r} names only the root; give a glob such as '**/*.py'")
    return parts


def glob_match(parts: Sequence[str], path: Sequence[str]) -> bool:
    """Whether the path's segments match the pattern's (``fnmatch`` per segment, ``**`` spans)."""
    if not parts:
        return not path
    if parts[0] == "**":
        return any(glob_match(parts[1:], path[i:]) for i in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], parts[0]) and glob_match(parts[1:], path[1:])


def literal_prefix(parts: Sequence[str]) -> list[str]:
    """The leading segments without wildcards: the folder a walk for the pattern can start from."""
    prefix = []
    for part in parts[:-1]:
        if any(c in part for c in "*?["):
            break
        prefix.append(part)
    return prefix


@dataclass(frozen=True)
class FileEntry:
    rel: str  # workspace-relative POSIX path
    host: str
    size: int
    mtime_ns: int


def walk_files(root: Path, start: Path, max_entries: int = WALK_MAX_ENTRIES) -> tuple[list[FileEntry], bool]:
    """Regular files under ``start`` (a folder inside ``root``), sorted by path, and whether the
    walk stopped at ``max_entries`` entries. Symbolic links are neither followed nor listed."""
    files: list[FileEntry] = []
    seen = 0
    root_text = os.fspath(root)
    stack = [os.fspath(start)]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            seen += 1
            if seen > max_entries:
                return sorted(files, key=lambda f: f.rel), True
            if is_ignored_name(entry.name) or entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                rel = os.path.relpath(entry.path, root_text).replace(os.sep, "/")
                files.append(FileEntry(rel, entry.path, st.st_size, st.st_mtime_ns))
    return sorted(files, key=lambda f: f.rel), False


def read_text_file(host: str, max_bytes: int) -> str | None:
    """The file's text, or None when it is not a regular file, larger than ``max_bytes``, binary
    or not UTF-8. Never follows a symbolic link (``O_NOFOLLOW``)."""
    try:
        fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


# ----------------------------------------------------------------------------------------------
# Chunks


@dataclass(frozen=True)
class Chunk:
    path: str
    start: int  # first line, counting from 1
    end: int  # last line, inclusive
    symbol: str  # "def parse", "class Config", "def Config.load"; "" for a window of lines
    text: str

    def document(self) -> str:
        """What is embedded: the path, the symbol and the text."""
        return f"{self.path}\n{self.symbol}\n{self.text}"

    def tokens(self) -> list[str]:
        """What BM25 ranks: the document's words, and a definition word for each name the symbol
        defines (``def:shoppingcart``, ``def:add_item``), so the chunk that defines a name outranks
        the chunks that only use it."""
        names = self.symbol.split(" ", 1)[-1].split(".") if self.symbol else []
        return tokenize(self.document()) + [DEFINES + name.lower() for name in names]


def _windows(path: str, lines: list[str], numbers: list[int]) -> list[Chunk]:
    """Windows over the given line numbers, blank lines at their edges left out; a gap in the
    numbers starts a new window."""
    chunks: list[Chunk] = []
    run: list[int] = []
    for number in numbers + [-1]:
        if run and (number != run[-1] + 1 or len(run) == WINDOW_LINES):
            kept = [n for n in run if lines[n - 1].strip()]
            if kept:
                chunks.append(Chunk(path, kept[0], kept[-1], "", "\n".join(lines[kept[0] - 1:kept[-1]])))
            run = []
        if number != -1:
            run.append(number)
    return chunks


def _python_symbols(tree: ast.Module) -> list[tuple[int, int, str]]:
    """(first line, last line, symbol) of each top-level def, class header and method."""
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    spans = []

    def first_line(node: ast.AST) -> int:
        return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])

    for node in tree.body:
        if isinstance(node, defs):
            spans.append((first_line(node), node.end_lineno, f"def {node.name}"))
        elif isinstance(node, ast.ClassDef):
            methods = [m for m in node.body if isinstance(m, defs)]
            header_end = first_line(methods[0]) - 1 if methods else node.end_lineno
            spans.append((first_line(node), header_end, f"class {node.name}"))
            for method in methods:
                spans.append((first_line(method), method.end_lineno, f"def {node.name}.{method.name}"))
    return spans


def chunk_file(path: str, text: str) -> list[Chunk]:
    """A file's chunks: Python symbols and windows of the lines between them, or windows only."""
    lines = text.splitlines()
    spans: list[tuple[int, int, str]] = []
    if path.endswith(".py"):
        try:
            spans = _python_symbols(parse(text))
        except (SyntaxError, ValueError, RecursionError):
            spans = []
    covered: set[int] = set()
    chunks = []
    for start, end, symbol in spans:
        end = max(start, min(end, len(lines)))
        while end > start and not lines[end - 1].strip():  # a class header's blank lines before its first method
            end -= 1
        chunks.append(Chunk(path, start, end, symbol, "\n".join(lines[start - 1:end])))
        covered.update(range(start, end + 1))
    chunks += _windows(path, lines, [n for n in range(1, len(lines) + 1) if n not in covered])
    return sorted(chunks, key=lambda c: c.start)


# ----------------------------------------------------------------------------------------------
# Embeddings


def openai_embedder(base_url: str, model: str, api_key: str | None = None, timeout_s: float = 60.0) -> Embedder:
    """An ``Embedder`` over an OpenAI-compatible ``POST {base_url}/embeddings``."""
    url = base_url.rstrip("/") + "/embeddings"

    def embed(texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for at in range(0, len(texts), EMBED_BATCH):
            batch = texts[at:at + EMBED_BATCH]
            headers = {"Content-Type": "application/json"}
            if api_key:
                headers["Authorization"] = f"Bearer {api_key}"
            body = json.dumps({"model": model, "input": batch}).encode()
            request = urllib.request.Request(url, data=body, headers=headers, method="POST")
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                reply = json.loads(response.read())
            data = sorted(reply["data"], key=lambda item: item["index"])
            if len(data) != len(batch):
                raise ValueError(f"{url} returned {len(data)} embeddings for {len(batch)} inputs")
            vectors += [item["embedding"] for item in data]
        return vectors

    return embed


# ----------------------------------------------------------------------------------------------
# The index


@dataclass(frozen=True)
class Hit:
    chunk: Chunk
    score: float


class CodeIndex:
    """The chunks of a workspace's files, refreshed from file stamps, ranked for a query."""

    def __init__(self, root: Path, embedder: Embedder | None = None):
        self.root = root
        self.embedder = embedder
        self.files: dict[str, tuple[tuple[int, int], list[Chunk]]] = {}  # rel -> (size, mtime_ns), chunks
        self._tokens: dict[str, list[list[str]]] = {}  # rel -> each chunk's Chunk.tokens()
        self.skipped: list[str] = []  # files over INDEX_MAX_FILE_BYTES at the last refresh
        self.truncated = False  # the walk or the file count hit its cap
        self.chunks: list[Chunk] = []
        self._bm25 = None
        self._weights = np.ones(0)  # [chunks], TEST_WEIGHT for test files' chunks
        self._vectors: dict[str, np.ndarray] = {}  # sha256 of a chunk's document -> unit vector

    def refresh(self) -> None:
        entries, self.truncated = walk_files(self.root, self.root)
        if len(entries) > INDEX_MAX_FILES:
            entries, self.truncated = entries[:INDEX_MAX_FILES], True
        changed = set(self.files) - {e.rel for e in entries}
        for rel in changed:
            del self.files[rel], self._tokens[rel]
        for entry in entries:
            stamp = (entry.size, entry.mtime_ns)
            if entry.rel in self.files and self.files[entry.rel][0] == stamp:
                continue
            text = read_text_file(entry.host, INDEX_MAX_FILE_BYTES)
            chunks = chunk_file(entry.rel, text) if text is not None else []
            self.files[entry.rel] = (stamp, chunks)
            self._tokens[entry.rel] = [c.tokens() for c in chunks]
            changed.add(entry.rel)
        self.skipped = [e.rel for e in entries if e.size > INDEX_MAX_FILE_BYTES]
        if changed or self._bm25 is None:
            self.chunks = [c for rel in sorted(self.files) for c in self.files[rel][1]]
            self._bm25 = None

    def forget(self, rel: str) -> None:
        """Chunk ``rel`` again at the next search, whatever its stamp says."""
        self.files.pop(rel, None)
        self._tokens.pop(rel, None)

    def _bm25_scores(self, query_tokens: list[str]) -> np.ndarray:  # [chunks]
        import bm25s

        if self._bm25 is None:
            self._bm25 = bm25s.BM25()
            tokens = [chunk for rel in sorted(self.files) for chunk in self._tokens[rel]]
            self._bm25.index([chunk or ["\0"] for chunk in tokens], show_progress=False)
            self._weights = np.array([TEST_WEIGHT if is_test_path(c.path) else 1.0 for c in self.chunks])
        return np.asarray(self._bm25.get_scores(query_tokens), dtype=np.float64) * self._weights

    def _cosine_scores(self, query: str) -> np.ndarray:  # [chunks]
        keys = [hashlib.sha256(c.document().encode()).hexdigest() for c in self.chunks]
        missing = [i for i, key in enumerate(keys) if key not in self._vectors]
        texts = [self.chunks[i].document()[:EMBED_MAX_CHARS] for i in missing] + [query[:EMBED_MAX_CHARS]]
        vectors = np.asarray(self.embedder(texts), dtype=np.float64)  # [missing + 1, D]
        if vectors.ndim != 2 or len(vectors) != len(texts):
            raise ValueError(f"the embedding function returned shape {vectors.shape} for {len(texts)} texts")
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        for i, vector in zip(missing, vectors[:-1], strict=True):
            self._vectors[keys[i]] = vector
        if not self.chunks:
            return np.zeros(0)
        matrix = np.stack([self._vectors[key] for key in keys])  # [chunks, D]
        return matrix @ vectors[-1]

    def search(self, query: str, limit: int, only: Sequence[str] | None = None, ranker: str = "bm25") -> list[Hit]:
        """The best ``limit`` chunks for ``query`` under ``ranker`` (``SEARCH_RANKERS``; with a BM25 score
        above zero for ``bm25``), among the files whose path matches the glob segments ``only``
        when given. The embedding rankers raise what the embedding function raises."""
        if ranker not in SEARCH_RANKERS or (ranker != "bm25" and self.embedder is None):
            raise ValueError(f"ranker {ranker!r}: expected one of {', '.join(SEARCH_RANKERS)}, with an embedding "
                             "function for the last two")
        self.refresh()
        if not self.chunks:
            return []
        allowed = np.ones(len(self.chunks), dtype=bool)
        if only is not None:
            allowed = np.array([glob_match(only, c.path.split("/")) for c in self.chunks])
        tokens = query_tokens(query)
        if ranker == "bm25":
            scores = self._bm25_scores(tokens)
            allowed &= scores > 0
        elif ranker == "embeddings":
            scores = self._cosine_scores(query)
        else:
            lexical, cosine = self._bm25_scores(tokens), self._cosine_scores(query)
            scores = _rrf(cosine) + np.where(lexical > 0, _rrf(lexical), 0.0)
        order = [i for i in np.argsort(-scores, kind="stable") if allowed[i]]
        return [Hit(self.chunks[i], float(scores[i])) for i in order[:limit]]


def is_test_path(path: str) -> bool:
    """A test file by the usual conventions: under ``tests/`` or ``test/``, ``test_*``, ``*_test.py``
    or ``conftest.py``."""
    *folders, name = path.split("/")
    return (any(f in ("tests", "test", "testing") for f in folders) or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


def _rrf(scores: np.ndarray) -> np.ndarray:  # [chunks] -> [chunks]
    """Reciprocal-rank fusion's term for each chunk: 1 / (RRF_K + its rank under ``scores``)."""
    ranks = np.empty(len(scores))
    ranks[np.argsort(-scores, kind="stable")] = np.arange(1, len(scores) + 1)
    return 1.0 / (RRF_K + ranks)


def snippet(chunk: Chunk, query_tokens: set[str], lines: int, max_chars: int) -> list[tuple[int, str]]:
    """A few numbered lines of the chunk: its first lines for a symbol, else from the first line
    that holds a query word."""
    text_lines = chunk.text.splitlines()
    first = 0
    if not chunk.symbol:
        first = next((i for i, line in enumerate(text_lines) if query_tokens & set(tokenize(line))), 0)
    shown = []
    for offset, line in enumerate(text_lines[first:first + lines]):
        line = line if len(line) <= max_chars else line[:max_chars] + " [...]"
        shown.append((chunk.start + first + offset, line))
    return shown


"""**State tracking** (``state_tracking_distance``, lower is better; LoCoDiff-like). A file's
history is shown as a sequence of unified diffs (``DIFF_CONTEXT`` = 1 context line, so the last
diff alone does not hold the file; the first diff creates the file from ``/dev/null``), and the
model, greedy, must write the final file. Score: the character-level Levenshtein distance
between its output and the true final file, divided by the longer of the two (0 = exact, 1 = no
overlap), averaged over histories. Histories come from two places: generated ones (a small
top-level function or class of a held-out project, then ``edits`` seeded line edits: delete a
line, insert a line borrowed from the project, rename an identifier), and real ones from any git
repository given (``git log --follow --name-status`` of its most-changed small files, each
version read with ``git show``; consecutive versions are re-diffed here, so merges do not leave
gaps and both kinds look alike). Every history is replayed with the sandbox's patch applier
before use: the diffs shown rebuild the final file exactly. Prompts stay short for small models
(``max_prompt_chars``); a long real history keeps its newest diffs and starts from a snapshot,
shown as a creation diff. The prompt format (``history_prompt``)::

    The history of the file `PATH`, as unified diffs in commit order; the first diff creates the
    file. Write the final content of the file.

    ```diff
    --- /dev/null
    +++ b/PATH
    @@ -0,0 +1,7 @@
    +...
    ```

    ```diff
    ...
    ```

    Final content of `PATH`:
    ```python

and the model's output is read up to the closing ```` ``` ```` (or its end-of-text token, or
``1.25 ×`` the target's token count + 8 new tokens).
"""

from __future__ import annotations

import ast
import difflib
import keyword
import random
import re
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from opencomposer.bench.basecheck.common import BasecheckError, heldout_project_roots, model_device, start_id
from opencomposer.config import BasecheckConfig
from opencomposer.pysource import parse

DIFF_CONTEXT = 1  # context lines of the diffs shown: with 1, the final file is not in the last diff
STOP_TEXT = "```"


@dataclass
class FileHistory:
    """Successive versions of one file. ``versions[0]`` is shown as created from nothing: the
    file's first version, or a snapshot where ``fit_history`` shortened a long history."""

    name: str  # where it comes from: "generated:ledger/ledger/models.py#3" or "REPO:path"
    path: str  # the path shown in the prompt
    versions: list[str]

    @property
    def final(self) -> str:
        return self.versions[-1]

    def diffs(self) -> list[str]:
        shown = [render_diff(self.path, None, self.versions[0])]
        shown += [render_diff(self.path, a, b) for a, b in zip(self.versions, self.versions[1:])]
        return shown


def render_diff(path: str, old: str | None, new: str, context: int = DIFF_CONTEXT) -> str:
    """The unified diff of one text file (``old`` None: created), as git writes its hunks."""
    from opencomposer.sandbox.patch import NO_NEWLINE, split_lines

    body = list(difflib.unified_diff(split_lines(old or ""), split_lines(new), n=context))[2:]
    head = f"--- {'/dev/null' if old is None else 'a/' + path}\n+++ b/{path}\n"
    return head + "".join(line if line.endswith("\n") else line + "\n" + NO_NEWLINE + "\n" for line in body)


def replay(history: FileHistory) -> str:
    """Apply the history's diffs to nothing, in order, with the sandbox's patch applier."""
    from opencomposer.sandbox.patch import apply_hunks, parse_patch

    text = ""
    for diff in history.diffs():
        (patch,) = parse_patch(diff)
        text = apply_hunks(text, patch.hunks, history.path)
    return text


def _language(path: str) -> str:
    return {".py": "python", ".md": "markdown", ".toml": "toml", ".json": "json", ".sh": "bash",
            ".js": "javascript", ".ts": "typescript", ".rs": "rust", ".go": "go", ".c": "c",
            ".h": "c", ".cpp": "cpp", ".yaml": "yaml", ".yml": "yaml"}.get(PurePosixPath(path).suffix, "")


def history_prompt(history: FileHistory) -> str:
    """The state-tracking prompt (format in the module doc); the model continues with the file."""
    head = (f"The history of the file `{history.path}`, as unified diffs in commit order; the first diff "
            "creates the file. Write the final content of the file.\n\n")
    body = "".join(f"```diff\n{diff}```\n\n" for diff in history.diffs())
    return f"{head}{body}Final content of `{history.path}`:\n```{_language(history.path)}\n"


def fit_history(history: FileHistory, max_prompt_chars: int) -> FileHistory | None:
    """The history itself if its prompt fits, else its newest diffs from a snapshot (shown as a
    creation diff); None when even the last change alone does not fit."""
    for start in range(len(history.versions) - 1):
        shorter = FileHistory(history.name, history.path, history.versions[start:])
        if len(history_prompt(shorter)) <= max_prompt_chars:
            return shorter
    return None


_IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


def _snippets(roots: list[Path], max_chars: int) -> list[tuple[str, str]]:
    """(shown path, text) of every top-level function or class of 5-14 lines in the projects."""
    from opencomposer.tasks.generators.source import read_tree

    found = []
    for root in roots:
        tree = read_tree(root)
        for rel in sorted(tree):
            if not rel.endswith(".py"):
                continue
            text = tree[rel].decode("utf-8")
            lines = text.splitlines(keepends=True)
            for node in parse(text).body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    snippet = "".join(lines[first - 1 : node.end_lineno])
                    if 5 <= node.end_lineno - first + 1 <= 14 and len(snippet) <= max_chars * 0.8:
                        found.append((f"{root.name}/{rel}", snippet))
    return found


def _edit(text: str, pool: list[str], words: list[str], rng: random.Random) -> str:
    """One line edit of ``text``: delete a line, insert a line from ``pool`` (indented like its
    neighbour), or rename one identifier of a line to a word of ``words``."""
    lines = text.splitlines(keepends=True)
    for _ in range(20):
        op = rng.choice(("delete", "insert", "rename"))
        at = rng.randrange(1, len(lines))  # never the first line: the def/class line stays
        if op == "delete" and len(lines) > 3:
            new = lines[:at] + lines[at + 1 :]
        elif op == "insert":
            indent = re.match(r"\s*", lines[at - 1]).group()
            if lines[at - 1].rstrip().endswith(":"):
                indent += "    "
            new = lines[:at] + [indent + rng.choice(pool).strip() + "\n"] + lines[at:]
        else:
            names = [m for m in _IDENTIFIER.finditer(lines[at]) if not keyword.iskeyword(m.group())]
            if not names:
                continue
            match = rng.choice(names)
            word = rng.choice(words)
            if word == match.group():
                continue
            line = lines[at]
            new = lines[:at] + [line[: match.start()] + word + line[match.end() :]] + lines[at + 1 :]
        result = "".join(new)
        if result != text:
            return result
    return text


def generated_histories(count: int, edits: int, seed: int, max_prompt_chars: int, max_final_chars: int,
                        roots: list[Path] | None = None) -> list[FileHistory]:
    """``count`` histories made from the held-out projects' code (module doc), a function of ``seed``."""
    roots = roots or heldout_project_roots()
    snippets = _snippets(roots, max_final_chars)
    pool = [line for _, text in snippets for line in text.splitlines() if line.strip() and len(line) < 70]
    words = sorted({w for line in pool for w in _IDENTIFIER.findall(line) if not keyword.iskeyword(w)})
    rng = random.Random(f"basecheck-histories-{seed}")
    order = list(range(len(snippets)))
    rng.shuffle(order)
    histories: list[FileHistory] = []
    for index in order:
        if len(histories) == count:
            break
        path, text = snippets[index]
        versions = [text]
        for _ in range(edits):
            changed = _edit(versions[-1], pool, words, rng)
            if changed != versions[-1]:
                versions.append(changed)
        history = FileHistory(f"generated:{path}#{index}", path, versions)
        if len(versions) > 1 and len(history.final) <= max_final_chars and \
                len(history_prompt(history)) <= max_prompt_chars and replay(history) == history.final:
            histories.append(history)
    if len(histories) < count:
        raise BasecheckError(f"histories: only {len(histories)} generated histories fit in {max_prompt_chars} "
                             f"prompt characters (asked for {count}); raise max_prompt_chars or lower --histories")
    return histories


def _git(repo: Path, *args: str) -> bytes:
    try:
        result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=120)
    except FileNotFoundError as e:
        raise BasecheckError("--history-repo: git is not installed") from e
    if result.returncode != 0:
        raise BasecheckError(f"--history-repo {repo}: git {' '.join(args[:2])} failed: "
                             f"{result.stderr.decode(errors='replace').strip()}")
    return result.stdout


def check_git_repo(repo: Path | str) -> Path:
    repo = Path(repo).expanduser()
    if not repo.is_dir():
        raise BasecheckError(f"--history-repo {repo}: not a folder")
    inside = subprocess.run(["git", "-C", str(repo), "rev-parse", "--is-inside-work-tree"],
                            capture_output=True, text=True)
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        raise BasecheckError(f"--history-repo {repo}: not a git work tree (git rev-parse failed)")
    return repo


def file_history(repo: Path, path: str) -> list[str] | None:
    """Versions of ``path`` (oldest first) along ``git log --follow``; None if one is not UTF-8 text.
    A deletion starts the history over: only versions after the last one are kept."""
    log = _git(repo, "log", "--follow", "-M", "--format=%x00%H", "--name-status", "--", path).decode()
    steps = []  # newest first: (commit, path at that commit, deleted)
    for block in log.split("\0")[1:]:
        lines = [line for line in block.splitlines() if line.strip()]
        if len(lines) < 2:
            continue
        fields = lines[1].split("\t")
        steps.append((lines[0], fields[-1], fields[0].startswith("D")))
    versions: list[str] = []
    for commit, rel, deleted in reversed(steps):
        if deleted:
            versions = []
            continue
        data = _git(repo, "show", f"{commit}:{rel}")
        if b"\0" in data:
            return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if not versions or versions[-1] != text:
            versions.append(text)
    return versions


def git_histories(repo: Path | str, count: int, max_prompt_chars: int, max_final_chars: int) -> list[FileHistory]:
    """Histories of up to ``count`` files of a git repository: the most often changed files (ties
    by path) whose current version is small, each fitted to the prompt budget (``fit_history``)."""
    repo = check_git_repo(repo)
    tracked = set(_git(repo, "ls-files", "-z").decode(errors="replace").split("\0")) - {""}
    touches = Counter(line for line in _git(repo, "log", "--format=", "--name-only").decode(errors="replace")
                      .splitlines() if line in tracked)
    histories: list[FileHistory] = []
    for path, times in sorted(touches.items(), key=lambda item: (-item[1], item[0])):
        if len(histories) == count or times < 2:
            break
        current = repo / path
        if current.is_symlink() or not current.is_file() or current.stat().st_size > max_final_chars:
            continue
        versions = file_history(repo, path)
        if not versions or len(versions) < 2 or not versions[-1].strip():
            continue
        history = fit_history(FileHistory(f"{repo.name}:{path}", path, versions), max_prompt_chars)
        if history is not None and replay(history) == history.final:
            histories.append(history)
    return histories


def edit_distance(predicted: str, target: str) -> float:
    """Character-level Levenshtein distance over the longer length: 0 = equal, 1 = nothing shared."""
    from rapidfuzz.distance import Levenshtein

    longest = max(len(predicted), len(target))
    return Levenshtein.distance(predicted, target) / longest if longest else 0.0


def greedy_completion(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int,
                      stop_text: str = STOP_TEXT) -> str:
    """Greedy continuation of ``prompt`` (after the start token), up to ``stop_text``, an
    end-of-text token or ``max_new_tokens`` tokens."""
    import torch

    from opencomposer.model.tokenizer import stop_token_ids

    stops = {*stop_token_ids(tokenizer), start_id(tokenizer)}
    ids = [start_id(tokenizer), *tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    device, new = model_device(model), []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=device), use_cache=True, logits_to_keep=1)
        for _ in range(max_new_tokens):
            token = int(out.logits[0, -1].argmax())
            if token in stops:
                break
            new.append(token)
            if stop_text in tokenizer.decode(new[-8:]):
                break
            out = model(input_ids=torch.tensor([[token]], device=device), cache=out.cache, use_cache=True)
    text = tokenizer.decode(new)
    return text[: text.index(stop_text)] if stop_text in text else text


def state_tracking(model: Any, tokenizer: Any, histories: list[FileHistory], progress: bool = False) -> dict:
    """Mean normalised edit distance between greedy outputs and the final files (module doc)."""
    from opencomposer.training.progress import ProgressBar

    rows = []
    with ProgressBar("state tracking", len(histories), status="distance {d:.3f}", enabled=progress) as bar:
        for n, history in enumerate(histories, 1):
            prompt = history_prompt(history)
            target_tokens = len(tokenizer(history.final, add_special_tokens=False)["input_ids"])
            output = greedy_completion(model, tokenizer, prompt, int(1.25 * target_tokens) + 8)
            rows.append({"history": history.name, "diffs": len(history.versions),
                         "prompt_tokens": len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) + 1,
                         "distance": edit_distance(output, history.final), "exact": output == history.final,
                         "output": output})
            bar.update(n, d=sum(r["distance"] for r in rows) / len(rows))
    return {"distance": sum(r["distance"] for r in rows) / len(rows),
            "exact": sum(r["exact"] for r in rows), "histories": rows}



def collect_histories(settings: BasecheckConfig) -> list[FileHistory]:
    """The generated histories, then ``repo_histories`` of each of ``history_repos``; every
    repository is checked before any history is made."""
    for repo in settings.history_repos:
        check_git_repo(repo)
    histories = generated_histories(settings.histories, settings.edits, settings.seed, settings.max_prompt_chars,
                                    settings.max_final_chars) if settings.histories else []
    for repo in settings.history_repos:
        found = git_histories(repo, settings.repo_histories, settings.max_prompt_chars, settings.max_final_chars)
        if settings.repo_histories and not found:
            raise BasecheckError(f"--history-repo {repo}: no file changed in two or more commits has a history "
                                 f"that fits {settings.max_prompt_chars} prompt characters with a final version "
                                 f"of at most {settings.max_final_chars} characters")
        histories += found
    return histories

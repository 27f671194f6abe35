"""Base-model selection checks (docs/recipe.md §2, report appendix B): three cheap measurements that say
which base model to start continued pretraining from, deliberately not agent benchmarks.

1. **Codebase NLL** (``codebase_nll_per_byte``, lower is better). A held-out repository's files
   (by default the held-out source projects, ``tasks.heldout_projects``: ``ledger`` and
   ``scheduler``, which no pretraining corpus here contains) are read as ``read_tree`` reads a
   source (caches and VCS folders skipped), UTF-8 text files only, concatenated in alphabetical path
   order, each ending with a newline. The text is tokenised once, preceded by the model's document
   separator (``<|endoftext|>``, as between pretraining documents) so that the first byte is
   predicted too, and scored with a rolling window: windows of ``window`` tokens start every
   ``stride`` tokens (default ``window // 2``), and each token is scored once, in the first window
   that reaches it, so every token after the first window sees at least ``window - stride`` tokens
   of context. The summed negative log-likelihood (nats) is divided by the text's UTF-8 bytes, so
   models with different tokenizers compare. Over several repositories: total nats / total bytes.

2. **State tracking** (``state_tracking_distance``, lower is better; LoCoDiff-like). A file's
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

3. **FreshBench-like QA** (``freshbench_accuracy``, higher is better). Questions about the internals
   of the installed versions of this project's own dependencies (``importlib.metadata`` requirements
   of ``opencomposer``, or the packages named), answerable only from their source, generated with
   ``ast`` and checked automatically (``verify_question`` re-derives every answer from the file).
   Four kinds, each written as the code a reader of the source would see, closed-book:

   - ``default``: the default value of parameter P of function F: ``def F(a, P=`` → ``None,``;
   - ``base``: the (first) base class of class C: ``class C(`` → ``Base)``;
   - ``raises``: an exception F raises: F's code up to one of its ``raise`` statements, then
     ``raise `` → ``ValueError(`` (earlier lines may hint at it: reading the source);
   - ``caller``: which function in the module calls G: ``# The function that calls `G()`:`` /
     ``def `` → ``F(``.

   Small models cannot write exact answers, so each question has ``candidates`` fixed choices: the
   answer and distractors drawn from the same module that the source shows are wrong (another
   parameter's default, a base of another class, an exception raised elsewhere, a function that
   does not call G). Every candidate is followed by the delimiter that ends the answer in the
   source (``,`` or ``)`` after a default, ``(`` after a called exception, ...), the same for all,
   so the **total** log-likelihood of candidate + delimiter is the model's probability of that
   exact answer, and the model's choice is the candidate where it is highest. Per-byte
   normalisation (lm-eval's ``acc_norm``), meant for continuations without a delimiter, is
   reported too (``accuracy_per_byte``) but is not the headline: measured here, it favours long
   candidates whose later tokens follow from their first (SmolLM2 picked long distractor
   exception names over ``ValueError``), and put briefly pretrained tiny models, whose 4096-token
   BPE cuts identifiers into many predictable pieces, at chance.
   Chance is ``1 / candidates``; an untrained model is not exactly at chance (its scores still
   depend on the candidates' tokens: 0.25-0.32 over four seeds on 96 questions), and a model
   pretrained for minutes beats it by little (0.33 against 0.28 on the same questions), while
   SmolLM2-135M reaches about 0.47: the check separates models that know code, not the briefest
   runs. Generation is deterministic given the seed and the installed versions; the package and
   version head every prompt (``# transformers 5.2.0, transformers/x.py``), which is what makes
   the questions fresh: a model knows them only if it read that code.

``run_basecheck`` runs the three checks on each model (``tiny_moe`` = an untrained tiny MoE,
``smollm2``, any checkpoint folder) over data built once for all models, so the numbers compare.
"""

from __future__ import annotations

import ast
import difflib
import functools
import keyword
import math
import random
import re
import subprocess
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

DIFF_CONTEXT = 1  # context lines of the diffs shown: with 1, the final file is not in the last diff
KINDS = ("default", "base", "raises", "caller")  # FreshBench question kinds, in quota order
MAX_ANSWER_CHARS = 60  # longer defaults or base expressions are skipped (multi-line literals, calls)
MAX_MODULE_BYTES = 200_000  # larger modules are skipped: generated tables, vendored bundles
STOP_TEXT = "```"


class BasecheckError(ValueError):
    """Bad input to the base-model checks: a model that is neither a kind nor a checkpoint folder,
    a repository that is not a folder or not a git work tree, an unknown package, bad sizes."""


@dataclass
class BasecheckSettings:
    """Sizes and data of a run (``opencomposer basecheck`` flags); module doc for the meaning."""

    window: int = 0
    """Tokens per NLL window; 0 takes the model's context (``max_position_embeddings``)."""
    stride: int = 0
    """Tokens between NLL window starts; 0 takes ``window // 2``."""
    nll_repos: list[str] = field(default_factory=list)
    """Repository folders for the codebase NLL; empty: the held-out source projects."""
    nll_bytes: int = 0
    """Score only the first N bytes of each repository's text (cut at a line end); 0: all of it."""
    history_repos: list[str] = field(default_factory=list)
    """Git repositories whose file histories join the generated ones."""
    histories: int = 8
    """Generated histories (from the held-out source projects)."""
    repo_histories: int = 4
    """Histories taken from each ``history_repos`` repository."""
    edits: int = 3
    """Edits after the creation of a generated history (so ``edits + 1`` diffs)."""
    questions: int = 48
    candidates: int = 4
    """Choices per FreshBench question: the answer and ``candidates - 1`` distractors."""
    packages: list[str] = field(default_factory=list)
    """Distributions the questions come from; empty: the installed dependencies of opencomposer."""
    seed: int = 0
    max_prompt_chars: int = 1600
    """Longest state-tracking prompt (about 400-600 tokens); FreshBench prompts get 1200."""
    max_final_chars: int = 600
    """Longest final file of a history (the model writes it, greedy, token by token)."""
    device: str = "auto"
    threads: int = 0
    """torch intra-op threads while models run; 0 keeps torch's default. On a shared CPU, 1 can be
    several times faster than two threads that wait on each other."""

    def validate(self) -> None:
        for name in ("window", "stride", "nll_bytes", "histories", "repo_histories", "edits", "questions", "threads"):
            if getattr(self, name) < 0:
                raise BasecheckError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.window == 1:
            raise BasecheckError("window: a window of 1 token has no context; use >= 2 (or 0: the model's)")
        if self.window and self.stride >= self.window:
            raise BasecheckError(f"stride: {self.stride} must be smaller than the window ({self.window})")
        if self.candidates < 2:
            raise BasecheckError(f"candidates: a question needs >= 2 choices, got {self.candidates}")
        if self.histories and not self.edits:
            raise BasecheckError("edits: generated histories need >= 1 edit")
        if self.max_prompt_chars < 200 or self.max_final_chars < 20:
            raise BasecheckError("max_prompt_chars and max_final_chars: too small to hold a history")
        if self.device not in ("auto", "cpu", "cuda"):
            raise BasecheckError(f"device: expected auto, cpu or cuda, got {self.device!r}")


# ----------------------------------------------------------------------------------------------
# Models


def check_model_spec(spec: str) -> str:
    """Refuse, before anything is loaded, a model that is neither a kind nor a checkpoint folder."""
    from opencomposer.model.loading import MODEL_KINDS

    kinds = [kind for kind in MODEL_KINDS if kind != "hf"]
    if spec in kinds:
        return spec
    path = Path(spec).expanduser()
    if not path.exists():
        raise BasecheckError(f"--model {spec}: no such folder, and not a model kind ({', '.join(kinds)})")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise BasecheckError(f"--model {spec}: not a checkpoint folder (no config.json); expected a folder "
                             "that save_checkpoint or save_pretrained wrote, or a kind: " + ", ".join(kinds))
    return str(path)


def start_id(tokenizer: Any) -> int:
    """The token every scored sequence starts with: the document separator of pretraining."""
    from opencomposer.model.tokenizer import document_separator_id

    return document_separator_id(tokenizer)


def model_context(model: Any) -> int:
    return int(getattr(model.config, "max_position_embeddings", 0) or 2048)


def _device(model: Any) -> Any:
    return next(model.parameters()).device


# ----------------------------------------------------------------------------------------------
# 1. Codebase NLL


def heldout_project_roots() -> list[Path]:
    """The held-out source projects (``tasks.heldout_projects``): repositories that the default
    pretraining corpus (stdlib and site-packages) does not hold, and task generation keeps out of
    the training stream."""
    from opencomposer.config import TasksConfig
    from opencomposer.tasks.format import PROJECTS_DIR

    return [PROJECTS_DIR / name for name in TasksConfig().heldout_projects]


def repository_text(root: Path | str, max_bytes: int = 0) -> tuple[str, list[str]]:
    """The UTF-8 text files of a repository, in alphabetical path order, concatenated (each ending
    with a newline); cut at a line end within ``max_bytes`` when given. Also the paths used."""
    from opencomposer.tasks.generators.source import SourceError, read_tree

    try:
        tree = read_tree(Path(root))
    except SourceError as e:
        raise BasecheckError(f"--nll-repo {root}: not a folder") from e
    parts, paths = [], []
    for rel in sorted(tree):
        data = tree[rel]
        if b"\0" in data:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip():
            parts.append(text if text.endswith("\n") else text + "\n")
            paths.append(rel)
    text = "".join(parts)
    if not text:
        raise BasecheckError(f"--nll-repo {root}: no UTF-8 text files to score")
    if max_bytes and len(text.encode()) > max_bytes:
        cut = text.encode()[:max_bytes].decode("utf-8", errors="ignore")
        text = cut[: cut.rfind("\n") + 1] or cut
    return text, paths


@dataclass
class NllResult:
    nll: float  # summed negative log-likelihood, nats
    tokens: int  # tokens scored (the text's tokens; the start token is context only)
    bytes: int  # UTF-8 bytes of the text
    windows: int

    @property
    def per_byte(self) -> float:
        return self.nll / self.bytes


def rolling_windows(num_ids: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """``(begin, end, first_scored)`` per window over ids ``[0, num_ids)``: the window feeds
    ``ids[begin:end]`` and scores the targets ``first_scored .. end - 1`` (target j is predicted
    from ``ids[begin:j]``). Target 0 (the start token) is never scored; each other target once."""
    if window < 2 or not 0 < stride < window:
        raise BasecheckError(f"window {window} and stride {stride}: need window >= 2 and 0 < stride < window")
    spans, scored_up_to, begin = [], 1, 0
    while scored_up_to < num_ids:
        end = min(begin + window, num_ids)
        if end > scored_up_to:
            spans.append((begin, end, scored_up_to))
            scored_up_to = end
        begin += stride
    return spans


def rolling_nll(model: Any, tokenizer: Any, text: str, window: int, stride: int = 0,
                progress: bool = False, label: str = "codebase NLL") -> NllResult:
    """Summed NLL of ``text`` under a rolling window (module doc); ``stride`` 0 = ``window // 2``."""
    import torch

    from opencomposer.training.progress import ProgressBar

    stride = stride or max(window // 2, 1)
    ids = [start_id(tokenizer), *tokenizer(text, add_special_tokens=False)["input_ids"]]
    spans = rolling_windows(len(ids), window, stride)
    device, total = _device(model), 0.0
    with torch.no_grad(), ProgressBar(label, len(spans), status="{nats:.3f} nats/byte so far",
                                      enabled=progress) as bar:
        done_bytes = 0
        for n, (begin, end, first) in enumerate(spans, 1):
            x = torch.tensor([ids[begin:end]], device=device)
            # the logits at positions first-1 .. end-2 predict the targets first .. end-1
            logits = model(input_ids=x, use_cache=False, logits_to_keep=end - first + 1).logits[0, :-1].float()
            targets = x[0, first - begin : end - begin]
            total -= logits.log_softmax(-1).gather(1, targets[:, None]).sum().item()
            done_bytes += len(tokenizer.decode(ids[first:end]).encode())
            bar.update(n, nats=total / max(done_bytes, 1))
    return NllResult(nll=total, tokens=len(ids) - 1, bytes=len(text.encode()), windows=len(spans))


def codebase_nll(model: Any, tokenizer: Any, repos: list[tuple[str, str]], window: int, stride: int = 0,
                 progress: bool = False) -> dict[str, Any]:
    """Total nats / total bytes over ``repos`` (name, text), with the per-repository numbers."""
    per_repo, nll, num_bytes = {}, 0.0, 0
    for name, text in repos:
        result = rolling_nll(model, tokenizer, text, window, stride, progress, label=f"NLL {name}")
        per_repo[name] = {"nll_per_byte": result.per_byte, "bits_per_byte": result.per_byte / math.log(2),
                          "nats": result.nll, "bytes": result.bytes, "tokens": result.tokens,
                          "windows": result.windows, "bytes_per_token": result.bytes / max(result.tokens, 1)}
        nll += result.nll
        num_bytes += result.bytes
    return {"nll_per_byte": nll / num_bytes, "bits_per_byte": nll / num_bytes / math.log(2),
            "window": window, "stride": stride or max(window // 2, 1), "repos": per_repo}


# ----------------------------------------------------------------------------------------------
# 2. State tracking


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
            for node in ast.parse(text).body:
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
    device, new = _device(model), []
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


# ----------------------------------------------------------------------------------------------
# 3. FreshBench-like QA


@dataclass
class Question:
    """One multiple-choice question about a module's source; ``candidates[answer_index]`` is right."""

    kind: str  # one of KINDS
    package: str  # distribution name
    version: str
    module: str  # path relative to its site-packages folder (POSIX)
    file: str  # absolute path of the source read
    subject: str  # "F" / "Class.method" / class name / called function G
    parameter: str  # the parameter of a "default" question, else ""
    prompt: str
    candidates: list[str]
    answer_index: int
    suffix: str  # the delimiter scored after every candidate

    @property
    def answer(self) -> str:
        return self.candidates[self.answer_index]

    @property
    def distractors(self) -> list[str]:
        return [c for i, c in enumerate(self.candidates) if i != self.answer_index]


@dataclass(frozen=True)
class ModuleSource:
    package: str
    version: str
    module: str
    file: Path


def dependency_names() -> list[str]:
    """The installed ``opencomposer``'s own requirements (extras left out), sorted."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    try:
        requirements = requires("opencomposer") or []
    except PackageNotFoundError as e:
        raise BasecheckError("--package: opencomposer is not installed, so its dependencies are unknown; "
                             "name the packages to ask about") from e
    names = set()
    for line in requirements:
        requirement = Requirement(line)
        if requirement.marker is None or "extra" not in str(requirement.marker):
            names.add(requirement.name)
    return sorted(names)


def package_modules(packages: list[str]) -> list[ModuleSource]:
    """Python modules of the named distributions (tests left out), sorted by package and path."""
    from importlib.metadata import PackageNotFoundError, distribution

    modules = []
    for name in sorted(set(packages)):
        try:
            dist = distribution(name)
        except PackageNotFoundError as e:
            raise BasecheckError(f"--package {name}: not installed in this environment") from e
        package, version = dist.metadata["Name"], dist.version
        for entry in sorted(dist.files or [], key=str):
            rel = PurePosixPath(str(entry))
            if rel.suffix != ".py" or rel.parts[0].endswith((".dist-info", ".data")) or ".." in rel.parts:
                continue
            if any(part in ("tests", "test", "testing") for part in rel.parts) or rel.name.startswith("test_"):
                continue
            modules.append(ModuleSource(package, version, str(rel), Path(dist.locate_file(entry))))
    return modules


def _segment(lines: list[bytes], start: tuple[int, int], end: tuple[int, int]) -> str:
    """Source text between two (line, byte column) positions, as ``ast`` reports them."""
    (l1, c1), (l2, c2) = start, end
    if l1 == l2:
        return lines[l1 - 1][c1:c2].decode("utf-8")
    return (lines[l1 - 1][c1:] + b"".join(lines[l1 : l2 - 1]) + lines[l2 - 1][:c2]).decode("utf-8")


def _next_char(lines: list[bytes], line: int, col: int) -> str:
    """The first non-blank character at or after (line, byte column)."""
    rest = lines[line - 1][col:] + b"".join(lines[line:])
    stripped = rest.decode("utf-8", errors="replace").lstrip()
    return stripped[:1]


def _functions(module: ast.Module, unique: bool = False) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef,
                                                                      str | None]]:
    """(qualified name, node, class name) of module-level functions and methods of top-level classes;
    ``unique`` leaves out names defined more than once (``@overload`` stubs, property setters),
    which a question could not name unambiguously."""
    found = []
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append((node.name, node, None))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.append((f"{node.name}.{item.name}", item, node.name))
    if unique:
        counts = Counter(qualname for qualname, _, _ in found)
        found = [entry for entry in found if counts[entry[0]] == 1]
    return found


def _defaults(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, ast.expr]]:
    args = fn.args
    positional = args.posonlyargs + args.args
    pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    return [(a.arg, d) for a, d in pairs]


def _value_key(text: str) -> str:
    """What makes two default texts the same answer: ``'a'`` and ``"a"``, ``0`` and ``0``."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return text
    try:
        value = ast.literal_eval(node)
        return f"{type(value).__name__}:{value!r}"
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ast.dump(node)


def _own_nodes(fn: ast.AST) -> list[ast.AST]:
    """Nodes of a function's body, not descending into nested functions, classes or lambdas."""
    out, stack = [], list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def _raised(nodes: list[ast.AST], parsed: _Parsed) -> dict[str, bool]:
    """Exception expressions raised in ``nodes`` (text → raised as a call), class-like names only."""
    found: dict[str, bool] = {}
    for node in nodes:
        if isinstance(node, ast.Raise) and node.exc is not None:
            call = isinstance(node.exc, ast.Call)
            expr = node.exc.func if call else node.exc
            if isinstance(expr, (ast.Name, ast.Attribute)):
                text = parsed.text(expr)
                if text and text.split(".")[-1][:1].isupper() and "\n" not in text:
                    found.setdefault(text, call)
    return found


def _called(fn: ast.AST) -> set[str]:
    """Simple names of everything called anywhere inside ``fn`` (``g()``, ``x.g()``)."""
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                names.add(node.func.id)
            elif isinstance(node.func, ast.Attribute):
                names.add(node.func.attr)
    return names


@dataclass
class _Parsed:
    source: str
    lines: list[bytes]
    tree: ast.Module


    def text(self, node: ast.AST) -> str:
        """The node's source text (``ast.get_source_segment`` splits the whole file per call)."""
        return _segment(self.lines, (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset))


@functools.lru_cache(maxsize=256)
def _parse(path: str) -> _Parsed | None:
    """A module's source, lines and tree; None when unreadable, not Python 3, or too large."""
    try:
        if Path(path).stat().st_size > MAX_MODULE_BYTES:
            return None
        source = Path(path).read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
        return None
    return _Parsed(source, source.encode("utf-8").splitlines(keepends=True), tree)


def _header(ms: ModuleSource) -> str:
    return f"# {ms.package} {ms.version}, {ms.module}\n"


def _choose(rng: random.Random, answer: str, pool: list[str], k: int) -> tuple[list[str], int] | None:
    """The candidates, shuffled, and the answer's index: ``k - 1`` distractors drawn uniformly from
    the distinct texts of the pool. (Drawing them matched to the answer's length was tried and
    dropped: untrained tiny models then scored further above chance, 0.30-0.46 on 96 questions
    over four seeds, not closer to it.)"""
    distinct = sorted(set(pool) - {answer})
    if len(distinct) < k - 1:
        return None
    choices = rng.sample(distinct, k - 1) + [answer]
    rng.shuffle(choices)
    return choices, choices.index(answer)


def _question(ms: ModuleSource, kind: str, subject: str, parameter: str, prompt: str, answer: str,
              pool: list[str], suffix: str, k: int, rng: random.Random, max_chars: int) -> Question | None:
    if len(prompt) > max_chars or not answer or len(answer) > MAX_ANSWER_CHARS:
        return None
    chosen = _choose(rng, answer, [p for p in pool if p and "\n" not in p and len(p) <= MAX_ANSWER_CHARS], k)
    if chosen is None:
        return None
    candidates, index = chosen
    return Question(kind, ms.package, ms.version, ms.module, str(ms.file), subject, parameter, prompt,
                    candidates, index, suffix)


def module_questions(ms: ModuleSource, kind: str, k: int, rng: random.Random,
                     max_chars: int = 1200) -> list[Question]:
    """Every question of ``kind`` the module supports (at most a few per module, seeded choices)."""
    parsed = _parse(str(ms.file))
    if parsed is None:
        return []
    lines, tree = parsed.lines, parsed.tree
    header, out = _header(ms), []
    functions = _functions(tree)
    if kind == "default":
        every = {}  # value key → one text, over the whole module
        for _, fn, _ in functions:
            for _, default in _defaults(fn):
                text = parsed.text(default)
                every.setdefault(_value_key(text), text)
        for qualname, fn, cls in _functions(tree, unique=True):
            for name, default in _defaults(fn):
                answer = parsed.text(default)
                suffix = _next_char(lines, default.end_lineno, default.end_col_offset)
                if suffix not in (",", ")"):
                    continue
                prefix = _segment(lines, (fn.lineno, 0), (default.lineno, default.col_offset))
                prompt = header + (f"class {cls}:\n" if cls else "") + prefix
                key = _value_key(answer)
                pool = [text for value, text in every.items() if value != key]
                question = _question(ms, kind, qualname, name, prompt, answer, pool, suffix, k, rng, max_chars)
                if question:
                    out.append(question)
    elif kind == "base":
        classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        names = [c.name for c in classes]
        bases = [parsed.text(b) for c in classes for b in c.bases]
        for cls in classes:
            if not cls.bases:
                continue
            first = cls.bases[0]
            answer = parsed.text(first)
            own = {parsed.text(b) for b in cls.bases} | {cls.name}
            suffix = _next_char(lines, first.end_lineno, first.end_col_offset)
            if suffix not in (",", ")"):
                continue
            pool = [b for b in bases + names if b not in own]
            question = _question(ms, kind, cls.name, "", f"{header}class {cls.name}(", answer, pool, suffix,
                                 k, rng, max_chars)
            if question:
                out.append(question)
    elif kind == "raises":
        every: dict[str, bool] = {}
        for _, fn, _ in functions:
            every.update(_raised(list(ast.walk(fn)), parsed))
        for qualname, fn, cls in _functions(tree, unique=True):
            raises = [node for node in _own_nodes(fn) if isinstance(node, ast.Raise) and _raised([node], parsed)]
            if not raises:
                continue
            node = rng.choice(sorted(raises, key=lambda n: (n.lineno, n.col_offset)))
            ((answer, call),) = _raised([node], parsed).items()
            # the function's code up to this raise: what a reader of the source sees before the answer
            before = _segment(lines, (fn.lineno, 0), (node.lineno, node.col_offset))
            prompt = header + (f"class {cls}:\n" if cls else "") + before + "raise "
            everything_in_fn = _raised(list(ast.walk(fn)), parsed)
            pool = [e for e in every if e not in everything_in_fn]
            question = _question(ms, kind, qualname, "", prompt, answer, pool, "(" if call else "\n",
                                 k, rng, max_chars)
            if question:
                out.append(question)
    elif kind == "caller":
        calls = {qualname: _called(fn) for qualname, fn, _ in functions}
        simple = {qualname: qualname.split(".")[-1] for qualname in calls}
        targets = sorted({name for name in simple.values() if not name.startswith("__")})
        for target in targets:
            callers = sorted(q for q, called in calls.items() if target in called and simple[q] != target)
            if not callers:
                continue
            caller_names = {simple[q] for q in callers}
            pool = sorted({simple[q] for q in calls if simple[q] not in caller_names and simple[q] != target
                           and not simple[q].startswith("__")})
            answer = simple[rng.choice(callers)]
            prompt = f"{header}# The function that calls `{target}()`:\ndef "
            question = _question(ms, kind, target, "", prompt, answer, pool, "(", k, rng, max_chars)
            if question:
                out.append(question)
    return out


def generate_questions(count: int, seed: int = 0, candidates: int = 4, packages: list[str] | None = None,
                       max_chars: int = 1200, progress: bool = False) -> list[Question]:
    """``count`` questions, a quarter of each kind, a function of ``seed`` and of the installed
    versions: modules are visited in a seeded order (round robin over packages), and each gives at
    most one question of each kind still short of its quota."""
    from opencomposer.training.progress import ProgressBar

    modules = package_modules(packages or dependency_names())
    if not modules:
        raise BasecheckError(f"--package: no Python modules in {', '.join(packages or []) or 'the dependencies'}")
    rng = random.Random(f"basecheck-questions-{seed}")
    by_package: dict[str, list[ModuleSource]] = {}
    for ms in modules:
        by_package.setdefault(ms.package, []).append(ms)
    queues = []
    for package in sorted(by_package):
        queue = by_package[package]
        rng.shuffle(queue)
        queues.append(queue)
    # round robin over packages, so torch's and transformers' thousands of files do not crowd out
    # the small packages
    order = [queue[i] for i in range(max(map(len, queues))) for queue in queues if i < len(queue)]
    quota = {kind: count // len(KINDS) + (i < count % len(KINDS)) for i, kind in enumerate(KINDS)}
    chosen: dict[str, list[Question]] = {kind: [] for kind in KINDS}
    with ProgressBar("FreshBench questions", count, enabled=progress, every=max(count // 4, 1)) as bar:
        for ms in order:
            if all(len(chosen[kind]) >= quota[kind] for kind in KINDS):
                break
            module_rng = random.Random(f"{seed}-{ms.package}-{ms.module}")
            for kind in KINDS:
                if len(chosen[kind]) < quota[kind]:
                    found = module_questions(ms, kind, candidates, module_rng, max_chars)
                    if found:
                        chosen[kind].append(module_rng.choice(found))
                        bar.update(sum(len(v) for v in chosen.values()))
    # kinds short of their quota (few classes with bases, say) leave room to the others
    questions = [q for kind in KINDS for q in chosen[kind]]
    if len(questions) < count:
        raise BasecheckError(f"--questions: only {len(questions)} questions could be made from "
                             f"{len(modules)} modules (asked for {count})")
    return questions


def verify_question(question: Question) -> bool:
    """Re-derive the question from its source file: the answer is right and every distractor wrong."""
    parsed = _parse(question.file)
    if parsed is None:
        return False
    tree = parsed.tree
    functions = {qualname: fn for qualname, fn, _ in _functions(tree, unique=True)}
    distractors = question.distractors
    if question.kind == "default":
        fn = functions.get(question.subject)
        defaults = dict(_defaults(fn)) if fn else {}
        if question.parameter not in defaults:
            return False
        truth = _value_key(parsed.text(defaults[question.parameter]))
        return _value_key(question.answer) == truth and all(_value_key(d) != truth for d in distractors)
    if question.kind == "base":
        classes = [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == question.subject]
        if not classes:
            return False
        bases = [parsed.text(b) for b in classes[0].bases]
        return bool(bases) and bases[0] == question.answer and not set(distractors) & set(bases)
    if question.kind == "raises":
        fn = functions.get(question.subject)
        if fn is None:
            return False
        return question.answer in _raised(_own_nodes(fn), parsed) and \
            not set(distractors) & set(_raised(list(ast.walk(fn)), parsed))
    if question.kind == "caller":
        def callers(name: str) -> list[bool]:
            return [question.subject in _called(fn) for q, fn, _ in _functions(tree) if q.split(".")[-1] == name]
        return any(callers(question.answer)) and all(callers(d) and not any(callers(d)) for d in distractors)
    return False


def continuation_logprobs(model: Any, tokenizer: Any, prompt: str, continuations: list[str]) -> list[float]:
    """Log-likelihood of each continuation after ``prompt`` (after the start token): the prompt
    runs once, each continuation from its cache, which is cropped back after it."""
    import torch

    ids = [start_id(tokenizer), *tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    device = _device(model)
    scores = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=device), use_cache=True, logits_to_keep=1)
        cache, first = out.cache, out.logits[0, -1].float().log_softmax(-1)
        for text in continuations:
            cont = tokenizer(text, add_special_tokens=False)["input_ids"]
            total = first[cont[0]].item()
            if len(cont) > 1:
                more = model(input_ids=torch.tensor([cont[:-1]], device=device), cache=cache, use_cache=True)
                logprobs = more.logits[0].float().log_softmax(-1)
                total += logprobs.gather(1, torch.tensor(cont[1:], device=device)[:, None]).sum().item()
                cache.crop(-(len(cont) - 1))  # back to the prompt (a negative count removes tokens)
            scores.append(total)
    return scores


def freshbench(model: Any, tokenizer: Any, questions: list[Question], progress: bool = False) -> dict:
    """Accuracy by total log-likelihood of candidate + delimiter (the headline, module doc), and by
    log-likelihood per UTF-8 byte; chance and per-kind accuracy alongside."""
    from opencomposer.training.progress import ProgressBar

    rows = []
    with ProgressBar("FreshBench", len(questions), status="accuracy {acc:.2f}", enabled=progress) as bar:
        for n, q in enumerate(questions, 1):
            texts = [c + q.suffix for c in q.candidates]
            totals = continuation_logprobs(model, tokenizer, q.prompt, texts)
            per_byte = [t / len(text.encode()) for t, text in zip(totals, texts)]
            chosen = totals.index(max(totals))
            rows.append({"kind": q.kind, "package": q.package, "module": q.module, "subject": q.subject,
                         "answer": q.answer, "chosen": q.candidates[chosen], "correct": chosen == q.answer_index,
                         "correct_per_byte": per_byte.index(max(per_byte)) == q.answer_index,
                         "logprobs": dict(zip(q.candidates, totals))})
            bar.update(n, acc=sum(r["correct"] for r in rows) / n)
    by_kind = {}
    for kind in KINDS:
        of_kind = [r["correct"] for r in rows if r["kind"] == kind]
        if of_kind:
            by_kind[kind] = sum(of_kind) / len(of_kind)
    return {"accuracy": sum(r["correct"] for r in rows) / len(rows),
            "accuracy_per_byte": sum(r["correct_per_byte"] for r in rows) / len(rows),
            "chance": sum(1 / len(q.candidates) for q in questions) / len(questions),
            "by_kind": by_kind, "questions": rows}


# ----------------------------------------------------------------------------------------------
# Running


@dataclass
class BasecheckData:
    """What every model is measured on, built once: repository texts, histories, questions."""

    repos: list[tuple[str, str]]
    histories: list[FileHistory]
    questions: list[Question]


def prepare(settings: BasecheckSettings, progress: bool = False) -> BasecheckData:
    """Check the inputs and build the shared data; raises BasecheckError on bad input."""
    settings.validate()
    roots = [Path(r).expanduser() for r in settings.nll_repos] or heldout_project_roots()
    repos = []
    for root in roots:
        if not root.is_dir():
            raise BasecheckError(f"--nll-repo {root}: not a folder")
        name = root.name if root.name not in {n for n, _ in repos} else str(root)
        repos.append((name, repository_text(root, settings.nll_bytes)[0]))
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
    if not histories:
        raise BasecheckError("histories: no state-tracking histories; use --histories N or --history-repo DIR")
    questions = generate_questions(settings.questions, settings.seed, settings.candidates, settings.packages,
                                   progress=progress) if settings.questions else []
    if not questions:
        raise BasecheckError("--questions: at least one question is needed")
    return BasecheckData(repos, histories, questions)


def check_model(spec: str, data: BasecheckData, settings: BasecheckSettings, progress: bool = False) -> dict:
    """The three checks on one model; the three headline keys first, then ``detail``."""
    import torch

    from opencomposer.model.device import resolve_device
    from opencomposer.model.loading import load_model

    started = time.perf_counter()
    model, tokenizer = load_model(check_model_spec(spec), seed=settings.seed, device=resolve_device(settings.device))
    context = model_context(model)
    window = min(settings.window or context, context)
    stride = settings.stride if settings.stride and settings.stride < window else max(window // 2, 1)
    timings = {}
    t = time.perf_counter()
    nll = codebase_nll(model, tokenizer, data.repos, window, stride, progress)
    timings["codebase_nll"] = time.perf_counter() - t
    t = time.perf_counter()
    state = state_tracking(model, tokenizer, data.histories, progress)
    timings["state_tracking"] = time.perf_counter() - t
    t = time.perf_counter()
    fresh = freshbench(model, tokenizer, data.questions, progress)
    timings["freshbench"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - started
    parameters = sum(p.numel() for p in model.parameters())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {
        "codebase_nll_per_byte": nll["nll_per_byte"],
        "state_tracking_distance": state["distance"],
        "freshbench_accuracy": fresh["accuracy"],
        "detail": {"parameters": parameters, "context": context, "seconds": timings,
                   "codebase_nll": nll, "state_tracking": state, "freshbench": fresh,
                   "settings": asdict(settings)},
    }


def run_basecheck(specs: list[str], settings: BasecheckSettings, progress: bool = False) -> dict[str, dict]:
    """Every model's results, keyed by its spec as given; inputs are checked before any model loads."""
    if not specs:
        raise BasecheckError("--model: name at least one model")
    duplicates = sorted(s for s, n in Counter(specs).items() if n > 1)
    if duplicates:
        raise BasecheckError(f"--model: given more than once: {', '.join(duplicates)}")
    for spec in specs:
        check_model_spec(spec)
    data = prepare(settings, progress)
    import torch

    threads = torch.get_num_threads()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    try:
        return {spec: check_model(spec, data, settings, progress) for spec in specs}
    finally:
        torch.set_num_threads(threads)


HEADLINE = (("codebase_nll_per_byte", "NLL/byte ↓"), ("state_tracking_distance", "state dist ↓"),
            ("freshbench_accuracy", "Fresh acc ↑"))


def results_table(results: dict[str, dict]) -> Any:
    """A rich table: one row per model, the three headline numbers and the run time."""
    from rich.table import Table

    table = Table(title="base-model checks", caption="NLL/byte: codebase NLL, nats per UTF-8 byte; state dist: "
                  "normalised edit distance of the final file; Fresh acc: FreshBench-like accuracy")
    table.add_column("model", overflow="fold")  # a checkpoint path is shown whole, over lines
    for _, title in HEADLINE:
        table.add_column(title, justify="right")
    table.add_column("seconds", justify="right")
    for spec, row in results.items():
        seconds = row.get("detail", {}).get("seconds", {}).get("total")
        table.add_row(spec, *(f"{row[key]:.4f}" for key, _ in HEADLINE), f"{seconds:.0f}" if seconds else "")
    return table

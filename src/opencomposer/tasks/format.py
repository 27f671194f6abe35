"""The task folder format (docs/task-format.md): loading, validating and writing task folders.

``load_task(folder)`` reads one folder into a ``Task``; every problem raises ``TaskFormatError``
naming the file and the field. ``load_suite(folder)`` loads every task folder below a suite folder
and reports all broken ones at once. ``write_task`` creates a folder (importers and generators use
it) and never overwrites an existing one unless asked.

A task's starting repository is either a ``repo/`` folder or a ``[repo]`` table naming a ``base``
folder and an optional ``setup_patch``. ``materialize_repo`` turns the second form into a folder
in a content-addressed cache, so ``Task.repo`` is always a folder and the sandbox, the grader and
the oracle never see the difference.

Not here: importers from other formats (``tasks.importers``), exporters (``tasks.exporters``),
grading (``grading.grade``).
"""

from __future__ import annotations

import datetime
import difflib
import fcntl
import hashlib
import json
import lzma
import re
import shutil
import stat
import tempfile
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

import opencomposer
from opencomposer.io import atomic_directory, atomic_write_text, cache_dir
from opencomposer.sandbox.patch import PatchError, apply_patch, copy_tree, diff_trees, list_files, parse_patch
from opencomposer.sandbox.venv import EnvironmentSpec, EnvironmentSpecError, parse_environment
from opencomposer.types import Budgets, Task

TASK_ID = re.compile(r"^[A-Za-z0-9._-]+$")
TOP_LEVEL_KEYS = ("id", "test_command", "protected_paths", "workdir", "repo", "metadata", "budgets", "environment")
VERIFIER_DIR, VERIFIER_SCRIPT = "verifier", "test.sh"
"""A Harbor verifier: ``verifier/test.sh`` (with its helpers) grades the task (``grading.grade``)."""
REPO_KEYS = ("base", "setup_patch")
SETUP_PATCH = "setup.patch"
SETUP_PATCH_XZ = "setup.patch.xz"
COMPRESS_SETUP_PATCH_BYTES = 64 << 10
"""A setup patch larger than this is written xz-compressed (``setup.patch.xz``): a real repository's
older commits differ from its one stored base by megabytes of diff, which compresses about 5x."""
PROJECTS_DIR = Path(opencomposer.__file__).parent / "suites" / "projects"
"""The built-in source projects: a ``[repo] base`` without a ``/`` names one of these folders."""
METADATA_CHOICES = {
    "source": ("handwritten", "bug_injection", "feature_deletion", "refactor", "mined", "humaneval", "swebench",
               "harbor"),
    "difficulty": ("easy", "medium", "hard"),
    "kind": ("fix", "feature", "refactor", "intent", "instructions", "no_edit"),
}
RUBRIC_KEYS = {"expect_no_edit": bool, "final_message_must_match": list, "forbidden_paths": list,
               "max_files_changed": int}
TESTS_JSON_KEYS = ("FAIL_TO_PASS", "PASS_TO_PASS")


class TaskFormatError(ValueError):
    """A task folder that breaks the format; the message names the file and the field."""

    def __init__(self, file: Path | str, field: str, problem: str):
        self.file, self.field, self.problem = Path(file), field, problem
        where = f"{file}: {field}" if field else f"{file}"
        super().__init__(f"{where}: {problem}")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskFormatError(path, "", f"not valid TOML: {e}") from None
    except UnicodeDecodeError:
        raise TaskFormatError(path, "", "not UTF-8 text") from None


def _relative_path(value: Any, file: Path, field: str) -> str:
    if not isinstance(value, str) or not value or value.startswith("/") or ".." in value.split("/"):
        raise TaskFormatError(file, field, f"{value!r} must be a relative path inside the repository (no '..')")
    return value.strip("/")


def load_task(folder: Path | str) -> Task:
    """Read and validate a task folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskFormatError(folder, "", "not a folder")
    toml_path = folder / "task.toml"
    if not toml_path.is_file():
        raise TaskFormatError(toml_path, "", "missing; every task folder needs a task.toml")
    data = _read_toml(toml_path)
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            close = difflib.get_close_matches(key, TOP_LEVEL_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TaskFormatError(toml_path, key, f"unknown key{hint}; valid keys: {', '.join(TOP_LEVEL_KEYS)}")

    task_id = data.get("id")
    if not isinstance(task_id, str) or not TASK_ID.match(task_id):
        raise TaskFormatError(toml_path, "id", f"{task_id!r} must be a string of letters, digits, '.', '_' or '-'")
    test_command = data.get("test_command", "python -m pytest -q")
    if not isinstance(test_command, str) or not test_command.strip():
        raise TaskFormatError(toml_path, "test_command", f"{test_command!r} must be a non-empty string")
    protected = data.get("protected_paths", [])
    if not isinstance(protected, list):
        raise TaskFormatError(toml_path, "protected_paths", f"expected a list of paths, got {protected!r}")
    protected = [_relative_path(p, toml_path, f"protected_paths[{i}]") for i, p in enumerate(protected)]
    workdir = data.get("workdir", "/workspace")
    if not isinstance(workdir, str) or not workdir.startswith("/") or workdir == "/" or ".." in workdir.split("/"):
        raise TaskFormatError(toml_path, "workdir", f"{workdir!r} must be an absolute path below / (e.g. /workspace)")
    metadata = _check_metadata(data.get("metadata", {}), toml_path)
    budgets = _check_budgets(data.get("budgets", {}), toml_path)
    if "environment" in data:
        try:
            parse_environment(data["environment"])  # read again where it is used (sandbox.venv)
        except EnvironmentSpecError as e:
            raise TaskFormatError(toml_path, f"environment.{e.field}" if e.field else "environment",
                                  e.problem) from None
    verifier = folder / VERIFIER_DIR
    if verifier.exists() and not (verifier / VERIFIER_SCRIPT).is_file():
        raise TaskFormatError(verifier, "", f"a verifier folder needs {VERIFIER_SCRIPT} (Harbor's tests/test.sh)")

    instruction_path = folder / "instruction.md"
    if not instruction_path.is_file():
        raise TaskFormatError(instruction_path, "", "missing; it holds what the agent is asked")
    instruction = instruction_path.read_text(encoding="utf-8")
    if not instruction.strip():
        raise TaskFormatError(instruction_path, "", "is empty")
    repo = _starting_repo(folder, data, toml_path, task_id)

    fail_to_pass, pass_to_pass = _read_tests_json(folder / "tests" / "tests.json")
    files = folder / "tests" / "files"
    if files.exists() and not files.is_dir():
        raise TaskFormatError(files, "", "must be a folder of hidden test files")

    gold_patch = None
    gold_path = folder / "solution" / "gold.patch"
    if gold_path.is_file():
        gold_patch = gold_path.read_bytes().decode("utf-8")  # not read_text: it would turn a hunk's CRLF into LF
        try:
            parse_patch(gold_patch)
        except PatchError as e:
            raise TaskFormatError(gold_path, "", f"not a valid unified diff: {e}") from None

    rubric = None
    rubric_path = folder / "rubric.toml"
    if rubric_path.is_file():
        rubric = _check_rubric(_read_toml(rubric_path), rubric_path)

    return Task(
        id=task_id,
        instruction=instruction,
        repo=repo,
        test_command=test_command,
        tests_dir=files if files.is_dir() else None,
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        protected_paths=protected,
        budgets=budgets,
        metadata=metadata,
        gold_patch=gold_patch,
        rubric=rubric,
        path=folder,
        workdir=workdir,
    )


def _starting_repo(folder: Path, data: dict[str, Any], toml_path: Path, task_id: str) -> Path:
    """The folder the workspace starts from: ``repo/``, or ``[repo]`` base + setup patch materialised."""
    full = folder / "repo"
    if "repo" not in data:
        if not full.is_dir():
            raise TaskFormatError(full, "", "missing; repo/ (or a [repo] table in task.toml naming a base) is the "
                                            "starting snapshot copied into the workspace")
        return full
    if full.exists():
        raise TaskFormatError(toml_path, "repo", "the task has both a repo/ folder and a [repo] table; keep one")
    table = data["repo"]
    if not isinstance(table, dict):
        raise TaskFormatError(toml_path, "repo", f"expected a table with {' and '.join(REPO_KEYS)}, got {table!r}")
    for key in table:
        if key not in REPO_KEYS:
            raise TaskFormatError(toml_path, f"repo.{key}", f"unknown key; valid keys: {', '.join(REPO_KEYS)}")
    base = resolve_base(table.get("base"), folder, toml_path)
    name = table.get("setup_patch")
    if name is None:
        return materialize_repo(base, "")
    if not isinstance(name, str) or not name or name.startswith("/") or ".." in name.split("/"):
        raise TaskFormatError(toml_path, "repo.setup_patch",
                              f"{name!r} must be a path inside the task folder (no '..'), e.g. {SETUP_PATCH!r}")
    patch_path = folder / name
    if not patch_path.is_file():
        raise TaskFormatError(patch_path, "", "missing; task.toml's [repo] setup_patch names it")
    raw = patch_path.read_bytes()  # not read_text: it would turn a hunk's CRLF into LF
    if name.endswith(".xz"):
        try:
            raw = lzma.decompress(raw)
        except lzma.LZMAError as e:
            raise TaskFormatError(patch_path, "", f"task {task_id!r}: not an xz-compressed patch: {e}") from None
    setup_patch = raw.decode("utf-8")
    try:
        parse_patch(setup_patch)
    except PatchError as e:
        raise TaskFormatError(patch_path, "", f"task {task_id!r}: not a valid unified diff: {e}") from None
    try:
        return materialize_repo(base, setup_patch)
    except PatchError as e:
        raise TaskFormatError(patch_path, "", f"task {task_id!r}: does not apply to base {table['base']!r}: {e}") from None


def resolve_base(value: Any, folder: Path, toml_path: Path | None = None) -> Path:
    """The folder a ``[repo] base`` names. The rule: a value without ``/`` is the name of a built-in
    source project (``suites/projects/<name>``); a value with ``/`` is a folder relative to the task
    folder (``../../projects/ledger``). Absolute paths are refused: a task folder must stay movable."""
    where = toml_path or folder / "task.toml"
    if not isinstance(value, str) or not value.strip("/.") or value.startswith("/"):
        raise TaskFormatError(where, "repo.base", f"{value!r} must be a built-in project name or a folder "
                                                  "relative to the task folder")
    if "/" not in value:
        base = PROJECTS_DIR / value
        if not base.is_dir():
            known = ", ".join(sorted(p.name for p in PROJECTS_DIR.iterdir() if p.is_dir()))
            raise TaskFormatError(where, "repo.base", f"{value!r} is not a built-in project; known: {known}")
        return base
    base = folder / value
    if value.endswith(BASE_ARCHIVE) and base.is_file():
        return unpack_base(base)
    if not base.is_dir():
        raise TaskFormatError(where, "repo.base", f"{value!r} is not a folder or a {BASE_ARCHIVE} archive "
                                                  f"(looked at {base.resolve()})")
    return base


BASE_ARCHIVE = ".tar.xz"


def unpack_base(archive: Path) -> Path:
    """A ``[repo] base`` stored as an xz tarball of a repository snapshot (many tasks mined from one
    repository share it; docs/realbench.md), unpacked once into ``cache_dir()/task-bases/<hash of
    the archive>``; the same rename-into-place and lock as ``materialize_repo``. Only regular files
    and folders are taken from the archive, never links or paths outside it."""
    import tarfile

    data = Path(archive).read_bytes()
    root = cache_dir() / "task-bases"
    final = root / hashlib.sha256(data).hexdigest()[:32]
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not final.is_dir():
            def unpack(tmp: Path) -> None:
                with tarfile.open(archive, "r:xz") as tar:
                    tar.extractall(tmp, members=[m for m in tar.getmembers() if m.isfile() or m.isdir()],
                                   filter="data")

            atomic_directory(final, unpack)
    return final


def materialize_repo(base: Path, setup_patch: str) -> Path:
    """The starting repository ``base`` + ``setup_patch`` as a folder in the cache (built once).

    The folder is ``cache_dir()/task-repos/<key>``, the key a hash of the base's files (path, bytes,
    executable bit: those ``sandbox.patch.list_files`` sees, so caches, ``.git`` and symbolic links of
    the base are left out of both the key and the copy) and of the patch text. Beside it,
    ``<key>.sha256`` holds the digest of the finished tree.

    Invariant: a load returns the folder only when it is whole and unchanged. It is built under a
    temporary name and renamed into place (``io.atomic_directory``), then its digest is written; a
    crash leaves a hidden temporary folder (removed by the next build) or a folder without a digest,
    and neither counts as a hit. Every load checks the digest, so a folder someone wrote into (the
    sandbox only copies it) is rebuilt instead of handed out. A lock file serialises builds, so two
    loaders never build the same key at once. A patch that does not apply raises ``PatchError`` and
    caches nothing."""
    files = list_files(Path(base))
    key = hashlib.sha256(f"opencomposer task repo v1\0{files_digest(files)}\0".encode() + setup_patch.encode())
    root = cache_dir() / "task-repos"
    final = root / key.hexdigest()[:32]
    stamp = root / f"{final.name}.sha256"
    if _intact(final, stamp):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _intact(final, stamp):
            return final
        for leftover in root.glob(f".{final.name}.tmp*"):
            shutil.rmtree(leftover, ignore_errors=True)
        try:
            atomic_directory(final, lambda tmp: _build_repo(tmp, files, setup_patch))  # replaces a damaged one
        except BaseException:
            for leftover in root.glob(f".{final.name}.tmp*"):
                shutil.rmtree(leftover, ignore_errors=True)
            raise
        atomic_write_text(stamp, files_digest(list_files(final)))
    return final


def _intact(folder: Path, stamp: Path) -> bool:
    return folder.is_dir() and stamp.is_file() and stamp.read_text() == files_digest(list_files(folder))


def files_digest(files: dict[str, Path]) -> str:
    """A hash of files by relative path (``list_files``): paths, executable bits and bytes."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        path = files[rel]
        digest.update(f"{rel}\0{int(_executable(path))}\0".encode() + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _executable(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IXUSR)


def _build_repo(target: Path, files: dict[str, Path], setup_patch: str) -> None:
    for rel, source in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, path)
        path.chmod(0o755 if _executable(source) else 0o644)
    # Only files are copied, so no folder is empty; one the patch empties goes too.
    for rel in apply_patch(target, setup_patch) if setup_patch else []:
        folder = (target / rel).parent
        while folder != target and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent


def _check_metadata(metadata: Any, file: Path) -> dict[str, Any]:
    if not isinstance(metadata, dict):
        raise TaskFormatError(file, "metadata", f"expected a table, got {metadata!r}")
    for key, choices in METADATA_CHOICES.items():
        if key in metadata and metadata[key] not in choices:
            raise TaskFormatError(file, f"metadata.{key}", f"{metadata[key]!r} is not one of {', '.join(choices)}")
    metadata = dict(metadata)
    if "date" in metadata:
        metadata["date"] = _check_date(metadata["date"], file)
    return metadata


def _check_date(value: Any, file: Path) -> str:
    """``metadata.date``, when the task's change was made (``eval --after`` leaves out older tasks),
    as an ISO ``YYYY-MM-DD`` string; TOML's own date literal is accepted too."""
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        try:
            return datetime.date.fromisoformat(value).isoformat()
        except ValueError:
            pass
    raise TaskFormatError(file, "metadata.date", f"{value!r} is not a date; expected YYYY-MM-DD, e.g. 2025-06-01")


def _check_budgets(table: Any, file: Path) -> Budgets:
    if not isinstance(table, dict):
        raise TaskFormatError(file, "budgets", f"expected a table, got {table!r}")
    names = [f.name for f in fields(Budgets)]
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in names:
            raise TaskFormatError(file, f"budgets.{key}", f"unknown budget; valid: {', '.join(names)}")
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise TaskFormatError(file, f"budgets.{key}", f"{value!r} must be a positive number")
        if key in ("max_turns", "max_tokens") and not isinstance(value, int):
            raise TaskFormatError(file, f"budgets.{key}", f"{value!r} must be an integer")
        values[key] = value
    return Budgets(**values)


def _read_tests_json(path: Path) -> tuple[list[str], list[str]]:
    if not path.is_file():
        raise TaskFormatError(path, "", 'missing; it lists the tests: {"FAIL_TO_PASS": [...], "PASS_TO_PASS": [...]}')
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TaskFormatError(path, "", f"not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise TaskFormatError(path, "", f"expected a JSON object, got {type(data).__name__}")
    for key in data:
        if key not in TESTS_JSON_KEYS:
            raise TaskFormatError(path, key, f"unknown key; expected {' and '.join(TESTS_JSON_KEYS)}")
    lists = []
    for key in TESTS_JSON_KEYS:
        value = data.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise TaskFormatError(path, key, f"expected a list of pytest node ids, got {value!r}")
        if len(set(value)) != len(value):
            raise TaskFormatError(path, key, "lists a test twice")
        lists.append(list(value))
    return lists[0], lists[1]


def _check_rubric(data: dict[str, Any], file: Path) -> dict[str, Any]:
    for key, value in data.items():
        if key not in RUBRIC_KEYS:
            raise TaskFormatError(file, key, f"unknown rubric rule; valid: {', '.join(RUBRIC_KEYS)}")
        expected = RUBRIC_KEYS[key]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise TaskFormatError(file, key, f"expected {expected.__name__}, got {value!r}")
    for i, pattern in enumerate(data.get("final_message_must_match", [])):
        try:
            re.compile(pattern)
        except (re.error, TypeError) as e:
            raise TaskFormatError(file, f"final_message_must_match[{i}]", f"{pattern!r} is not a regex: {e}") from None
    for i, path in enumerate(data.get("forbidden_paths", [])):
        _relative_path(path, file, f"forbidden_paths[{i}]")
    if data.get("max_files_changed", 0) < 0:
        raise TaskFormatError(file, "max_files_changed", "must be >= 0")
    return data


def load_suite(folder: Path | str) -> list[Task]:
    """Every task below ``folder`` (a folder of task folders, or one task folder), sorted by id.

    Broken folders are all reported in one ``TaskFormatError``; duplicate ids are an error."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskFormatError(folder, "", "suite folder not found")
    if (folder / "task.toml").is_file():
        return [load_task(folder)]
    tasks, problems = [], []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not (child / "task.toml").exists() and not (child / "instruction.md").exists():
            continue
        try:
            tasks.append(load_task(child))
        except TaskFormatError as e:
            problems.append(str(e))
    seen: dict[str, Path] = {}
    for task in tasks:
        if task.id in seen:
            problems.append(f"{task.path / 'task.toml'}: id: {task.id!r} is also the id of {seen[task.id]}")
        seen[task.id] = task.path
    if problems:
        raise TaskFormatError(folder, "", f"{len(problems)} broken task folder(s):\n  " + "\n  ".join(problems))
    if not tasks:
        raise TaskFormatError(folder, "", "no task folders (folders with a task.toml) found")
    return sorted(tasks, key=lambda t: t.id)


# ----------------------------------------------------------------------------------------------
# Writing


def write_task(
    folder: Path,
    *,
    task_id: str,
    instruction: str,
    repo: Path | dict[str, str],
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    hidden_tests: Path | dict[str, str] | None = None,
    test_command: str = "python -m pytest -q",
    protected_paths: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
    budgets: dict[str, Any] | None = None,
    gold_patch: str | None = None,
    rubric: dict[str, Any] | None = None,
    workdir: str = "/workspace",
    base: str | None = None,
    overwrite: bool = False,
    environment: EnvironmentSpec | None = None,
    verifier: Path | dict[str, str] | None = None,
) -> Task:
    """Create a task folder (``repo`` and ``hidden_tests`` are folders or {path: text} maps) and
    load it back, so what is written is always a valid task.

    ``repo`` is always the whole starting repository. With ``base`` (a ``[repo] base`` value, see
    ``resolve_base``) it is stored as that base plus ``setup.patch``, the difference written by
    ``diff_trees``; a ``repo`` the patch cannot reproduce exactly (binary or non-UTF-8 files that
    differ from the base) raises ``ValueError``. ``environment`` becomes the ``[environment]``
    table (``sandbox.venv``); ``verifier`` (a folder or {path: text} map holding ``test.sh``)
    the Harbor verifier folder ``verifier/`` that grades the task instead of the test lists."""
    folder = Path(folder)
    if folder.exists():
        if not overwrite:
            raise FileExistsError(f"{folder} already exists; remove it or pass overwrite=True")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    try:
        setup_patch = None if base is None else _setup_patch(folder, base, repo)
    except BaseException:
        shutil.rmtree(folder)
        raise
    data: dict[str, Any] = {"id": task_id, "test_command": test_command,
                            "protected_paths": list(protected_paths or [])}
    if workdir != "/workspace":
        data["workdir"] = workdir
    if base is None:
        _write_files(folder / "repo", repo)
    else:
        data["repo"] = {"base": base}
        if setup_patch:
            encoded = setup_patch.encode("utf-8")
            if len(encoded) > COMPRESS_SETUP_PATCH_BYTES:  # the same bytes for the same patch: xz is deterministic
                data["repo"]["setup_patch"] = SETUP_PATCH_XZ
                (folder / SETUP_PATCH_XZ).write_bytes(lzma.compress(encoded, preset=9 | lzma.PRESET_EXTREME))
            else:
                data["repo"]["setup_patch"] = SETUP_PATCH
                (folder / SETUP_PATCH).write_bytes(encoded)
    data["metadata"] = dict(metadata or {})
    if budgets:
        data["budgets"] = dict(budgets)
    if environment is not None:
        data["environment"] = environment.to_table()
    if verifier is not None:
        _write_files(folder / VERIFIER_DIR, verifier)
    (folder / "task.toml").write_text(dumps_toml(data), encoding="utf-8")
    (folder / "instruction.md").write_text(instruction if instruction.endswith("\n") else instruction + "\n",
                                           encoding="utf-8")
    (folder / "tests").mkdir()
    (folder / "tests" / "tests.json").write_text(
        json.dumps({"FAIL_TO_PASS": fail_to_pass, "PASS_TO_PASS": pass_to_pass}, indent=2) + "\n", encoding="utf-8"
    )
    if hidden_tests is not None:
        _write_files(folder / "tests" / "files", hidden_tests)
    if gold_patch:
        (folder / "solution").mkdir()
        (folder / "solution" / "gold.patch").write_text(gold_patch, encoding="utf-8")
    if rubric:
        (folder / "rubric.toml").write_text(dumps_toml(rubric), encoding="utf-8")
    return load_task(folder)


def _setup_patch(folder: Path, base: str, repo: Path | dict[str, str]) -> str:
    """The diff from ``base`` to ``repo``, checked to rebuild ``repo`` exactly."""
    base_dir = resolve_base(base, folder)
    with tempfile.TemporaryDirectory(prefix="opencomposer-repo-") as tmp:
        start = Path(tmp) / "repo"
        _write_files(start, repo)
        setup_patch = diff_trees(base_dir, start)
        rebuilt = materialize_repo(base_dir, setup_patch)
        if files_digest(list_files(rebuilt)) != files_digest(list_files(start)):
            raise ValueError(f"{folder}: base {base!r} plus a setup patch cannot reproduce the repository (a "
                             "binary, non-UTF-8 or CRLF file differs from the base); write it as a full repo/")
    return setup_patch


def _write_files(target: Path, source: Path | dict[str, str]) -> None:
    if isinstance(source, dict):
        target.mkdir(parents=True, exist_ok=True)
        for rel, text in source.items():
            _relative_path(rel, target, "file")
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    else:
        copy_tree(Path(source), target)


def dumps_toml(data: dict[str, Any]) -> str:
    """TOML for plain data: scalars and lists at each level, then sub-tables."""
    lines: list[str] = []

    def emit(table: dict[str, Any], name: str) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
        if name and (scalars or not any(isinstance(v, dict) for v in table.values())):
            lines.append(f"[{name}]")
        lines.extend(f"{_key(k)} = {_value(v)}" for k, v in scalars.items())
        if scalars or name:
            lines.append("")
        for k, v in table.items():
            if isinstance(v, dict):
                emit(v, f"{name}.{_key(k)}" if name else _key(k))

    emit(data, "")
    return "\n".join(lines).rstrip("\n") + "\n"


def _key(key: str) -> str:
    return key if re.match(r"^[A-Za-z0-9_-]+$", key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as TOML")

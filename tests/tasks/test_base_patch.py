"""Task repositories stored as a base folder plus a setup patch (``[repo]`` in task.toml).

The built-in suites keep no copy of their source projects: each task names its project and, when
its start differs, a ``setup.patch``. ``data/suite_repo_hashes.json`` holds the hash of every
suite task's ``repo/`` folder taken before the conversion, by the independent ``tree_hash`` below;
every task must still materialise to exactly that tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import opencomposer
from opencomposer.tasks import format as task_format
from opencomposer.tasks.format import PROJECTS_DIR, TaskFormatError, load_suite, load_task, write_task

SUITES = Path(opencomposer.__file__).parent / "suites"
HASHES = json.loads((Path(__file__).parent / "data" / "suite_repo_hashes.json").read_text())
CACHES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis"}


def tree_hash(root: Path) -> str:
    """Relative paths, executable bits and bytes of every file under ``root``, caches left out."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in CACHES)
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            executable = bool(path.lstat().st_mode & stat.S_IXUSR)
            digest.update(f"{rel}\0{int(executable)}\0".encode() + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("OPENCOMPOSER_HOME", str(home))
    return home


def suite_task_folders() -> list[Path]:
    """The hand-written suite's tasks, whose trees were hashed before they lost their copies (the
    mined realbench tasks start from packed repository snapshots, tests/suites/test_realbench.py)."""
    return sorted(p.parent for p in SUITES.glob("cursorbench/*/task.toml"))


def make_task(folder: Path, repo_table: dict[str, str] | None, setup_patch: str | None = None) -> Path:
    """A minimal task folder whose start is ``[repo]`` ``repo_table`` (written by hand, not by write_task)."""
    folder.mkdir(parents=True)
    table = "".join(f'{key} = "{value}"\n' for key, value in (repo_table or {}).items())
    (folder / "task.toml").write_text(f'id = "{folder.name}"\n\n[repo]\n{table}')
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "tests").mkdir()
    (folder / "tests" / "tests.json").write_text('{"FAIL_TO_PASS": [], "PASS_TO_PASS": []}')
    if setup_patch is not None:
        (folder / "setup.patch").write_text(setup_patch)
    return folder


def make_base(folder: Path) -> Path:
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "m.py").write_text("def f():\n    return 1\n")
    (folder / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (folder / "run.sh").chmod(0o755)
    (folder / "pkg" / "__pycache__").mkdir()
    (folder / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0stale")
    return folder


CHANGE = "--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"


# --------------------------------------------------------------------------- the built-in suites


def test_hashes_cover_every_suite_task():
    assert sorted(HASHES) == [f"{p.parent.name}/{p.name}" for p in suite_task_folders()]


@pytest.mark.parametrize("folder", suite_task_folders(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_suite_task_materialises_to_its_tree_before_conversion(folder: Path):
    task = load_task(folder)
    assert tree_hash(task.repo) == HASHES[f"{folder.parent.name}/{folder.name}"]


def test_suite_tasks_keep_no_copy_of_their_project():
    for folder in suite_task_folders():
        table = tomllib.loads((folder / "task.toml").read_text())["repo"]
        assert not (folder / "repo").exists(), folder
        assert (PROJECTS_DIR / table["base"]).is_dir(), folder
        assert ("setup_patch" in table) == (folder / "setup.patch").is_file(), folder


def test_the_suite_loads_and_shares_the_cache_between_identical_starts():
    tasks = load_suite(SUITES / "cursorbench")
    assert len(tasks) == 29 and len({t.repo for t in tasks}) == 5 + 6  # five projects, six patched starts


# --------------------------------------------------------------------------- the cache


def test_a_second_load_reuses_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_home: Path):
    make_base(tmp_path / "base")
    folder = make_task(tmp_path / "suite" / "t", {"base": "../../base", "setup_patch": "setup.patch"}, CHANGE)
    builds = []
    build = task_format._build_repo
    monkeypatch.setattr(task_format, "_build_repo", lambda *args: (builds.append(args), build(*args)))

    first = load_task(folder).repo
    inode = first.stat().st_ino
    second = load_task(folder).repo
    assert len(builds) == 1 and first == second and second.stat().st_ino == inode
    assert first.parent == cache_home / "task-repos"
    assert (first / "pkg" / "m.py").read_text() == "def f():\n    return 2\n"
    assert os.access(first / "run.sh", os.X_OK) and not os.access(first / "pkg" / "m.py", os.X_OK)
    assert not (first / "pkg" / "__pycache__").exists()  # caches of the base are not copied


def test_the_cache_key_follows_the_patch_and_the_base_not_caches(tmp_path: Path):
    base = make_base(tmp_path / "base")
    folder = make_task(tmp_path / "suite" / "t", {"base": "../../base", "setup_patch": "setup.patch"}, CHANGE)
    patched = load_task(folder).repo

    (folder / "setup.patch").write_text(CHANGE.replace("return 2", "return 3"))
    repatched = load_task(folder).repo
    assert repatched != patched and "return 3" in (repatched / "pkg" / "m.py").read_text()
    assert "return 2" in (patched / "pkg" / "m.py").read_text()  # a cached tree is never rewritten

    (base / "pkg" / "__pycache__" / "other.pyc").write_bytes(b"\0")
    assert load_task(folder).repo == repatched  # caches are not part of the base
    (base / "pkg" / "extra.py").write_text("x = 1\n")
    assert load_task(folder).repo != repatched  # the base's contents are


def test_a_killed_build_leaves_no_cache_hit(tmp_path: Path, cache_home: Path):
    """A loader killed in the middle of a build leaves a temporary folder, never a half tree under
    the key; the next load builds the whole tree and removes the leftover."""
    make_base(tmp_path / "base")
    folder = make_task(tmp_path / "suite" / "t", {"base": "../../base", "setup_patch": "setup.patch"}, CHANGE)
    crash = (
        "import os, sys\n"
        "from opencomposer.tasks import format\n"
        "build = format._build_repo\n"
        "def half(target, files, patch):\n"
        "    build(target, dict(list(files.items())[:1]), '')\n"
        "    os._exit(3)\n"
        "format._build_repo = half\n"
        "format.load_task(sys.argv[1])\n"
    )
    proc = subprocess.run([sys.executable, "-c", crash, str(folder)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    cache = cache_home / "task-repos"
    leftovers = [p for p in cache.iterdir() if p.name.startswith(".") and p.name != ".lock"]
    assert len(leftovers) == 1 and ".tmp" in leftovers[0].name
    assert [p for p in cache.iterdir() if not p.name.startswith(".")] == []

    repo = load_task(folder).repo
    assert leftovers[0].name.startswith(f".{repo.name}.tmp") and not leftovers[0].exists()
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()) == ["pkg/m.py", "run.sh"]
    assert (repo / "pkg" / "m.py").read_text() == "def f():\n    return 2\n"


def test_a_cached_tree_someone_wrote_into_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    make_base(tmp_path / "base")
    folder = make_task(tmp_path / "suite" / "t", {"base": "../../base", "setup_patch": "setup.patch"}, CHANGE)
    builds = []
    build = task_format._build_repo
    monkeypatch.setattr(task_format, "_build_repo", lambda *args: (builds.append(args), build(*args)))
    repo = load_task(folder).repo
    (repo / "pkg" / "__pycache__").mkdir()  # pytest run in place leaves caches: not a change
    assert load_task(folder).repo == repo and len(builds) == 1
    (repo / "pkg" / "m.py").write_text("def f():\n    return 'edited in place'\n")
    assert load_task(folder).repo == repo and len(builds) == 2
    assert (repo / "pkg" / "m.py").read_text() == "def f():\n    return 2\n"

    (repo.parent / f"{repo.name}.sha256").unlink()  # as if killed between the rename and the digest
    assert load_task(folder).repo == repo and len(builds) == 3
    assert load_task(folder).repo == repo and len(builds) == 3


def test_a_failed_build_caches_nothing(tmp_path: Path, cache_home: Path):
    make_base(tmp_path / "base")
    folder = make_task(tmp_path / "suite" / "t", {"base": "../../base", "setup_patch": "setup.patch"},
                       CHANGE.replace("return 1", "return 9"))
    with pytest.raises(TaskFormatError):
        load_task(folder)
    assert [p.name for p in (cache_home / "task-repos").iterdir()] == [".lock"]


# --------------------------------------------------------------------------- broken folders


def test_a_patch_that_does_not_apply_names_the_task_and_the_file(tmp_path: Path):
    make_base(tmp_path / "base")
    folder = make_task(tmp_path / "suite" / "stale", {"base": "../../base", "setup_patch": "setup.patch"},
                       CHANGE.replace("return 1", "return 9"))
    with pytest.raises(TaskFormatError) as info:
        load_task(folder)
    message = str(info.value)
    assert message.startswith(f"{folder / 'setup.patch'}: task 'stale': does not apply to base '../../base'")
    assert "pkg/m.py: hunk 1" in message


def test_an_unknown_base_is_named_with_the_known_ones(tmp_path: Path):
    folder = make_task(tmp_path / "t", {"base": "ledgr"})
    with pytest.raises(TaskFormatError, match=r"task.toml: repo.base: 'ledgr' is not a built-in project; "
                                              r"known: confkit, inventory, ledger, scheduler, textkit"):
        load_task(folder)
    folder = make_task(tmp_path / "u", {"base": "../nowhere"})
    with pytest.raises(TaskFormatError, match=r"repo.base: '../nowhere' is not a folder"):
        load_task(folder)


@pytest.mark.parametrize(("table", "field", "problem"), [
    ({"base": "/abs/path"}, "repo.base", "relative to the task folder"),
    ({}, "repo.base", "must be a built-in project name"),
    ({"base": "ledger", "patch": "x"}, "repo.patch", "unknown key"),
    ({"base": "ledger", "setup_patch": "../x.patch"}, "repo.setup_patch", "inside the task folder"),
])
def test_bad_repo_tables_name_the_field(tmp_path: Path, table: dict, field: str, problem: str):
    with pytest.raises(TaskFormatError) as info:
        load_task(make_task(tmp_path / "t", table))
    assert f"task.toml: {field}: " in str(info.value) and problem in str(info.value)


def test_a_missing_setup_patch_is_named(tmp_path: Path):
    folder = make_task(tmp_path / "t", {"base": "ledger", "setup_patch": "setup.patch"})
    with pytest.raises(TaskFormatError, match="setup.patch: missing; task.toml's \\[repo\\] setup_patch names it"):
        load_task(folder)


def test_repo_folder_and_repo_table_together_are_refused(tmp_path: Path):
    folder = make_task(tmp_path / "t", {"base": "ledger"})
    (folder / "repo").mkdir()
    with pytest.raises(TaskFormatError, match="task.toml: repo: the task has both a repo/ folder and a \\[repo\\] table"):
        load_task(folder)


# --------------------------------------------------------------------------- writing


def test_write_task_stores_a_start_as_base_and_patch(tmp_path: Path):
    start = {"README.md": "# scratch\n"}
    base = tmp_path / "base"
    (base / "tests").mkdir(parents=True)
    (base / "README.md").write_text("# base\n")
    (base / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")

    task = write_task(tmp_path / "suite" / "t", task_id="t", instruction="Do it.", repo=start, fail_to_pass=[],
                      pass_to_pass=[], base="../../base")
    table = tomllib.loads((task.path / "task.toml").read_text())["repo"]
    assert table == {"base": "../../base", "setup_patch": "setup.patch"} and not (task.path / "repo").exists()
    assert sorted(p.relative_to(task.repo).as_posix() for p in task.repo.rglob("*")) == ["README.md"]
    assert (task.repo / "README.md").read_text() == "# scratch\n"

    same = write_task(tmp_path / "suite" / "same", task_id="same", instruction="Do it.", repo=base,
                      fail_to_pass=[], pass_to_pass=[], base="../../base")
    assert tomllib.loads((same.path / "task.toml").read_text())["repo"] == {"base": "../../base"}
    assert not (same.path / "setup.patch").exists() and tree_hash(same.repo) == tree_hash(base)


def test_write_task_stores_binary_and_crlf_files_in_the_setup_patch(tmp_path: Path):
    """The setup patch is a git diff that round-trips byte for byte (``sandbox.patch``), and the loader
    reads it as bytes, so a start with binary and CRLF files is rebuilt exactly."""
    start = tmp_path / "start"
    task_format.copy_tree(PROJECTS_DIR / "ledger", start)
    (start / "logo.bin").write_bytes(b"\0\x01binary")
    (start / "win.txt").write_bytes(b"a\r\nb\r\n")
    task = write_task(tmp_path / "t", task_id="t", instruction="Do it.", repo=start, fail_to_pass=[], pass_to_pass=[],
                      base="ledger")
    assert "GIT binary patch" in (task.path / "setup.patch").read_text()
    assert (task.repo / "logo.bin").read_bytes() == b"\0\x01binary"
    assert (task.repo / "win.txt").read_bytes() == b"a\r\nb\r\n"
    assert tree_hash(task.repo) == tree_hash(start)


def test_a_large_setup_patch_is_stored_xz_compressed(tmp_path: Path):
    """Past ``COMPRESS_SETUP_PATCH_BYTES`` the patch is ``setup.patch.xz`` (a real repository's old
    commits differ from its one base by megabytes): the same start, a fraction of the bytes, and the
    same bytes for the same patch; a file that is not xz is named."""
    start = {"README.md": "# scratch\n", "big.txt": "".join(f"line {i} of a file the base lacks\n" for i in range(6000))}
    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("# base\n")
    task = write_task(tmp_path / "suite" / "t", task_id="t", instruction="Do it.", repo=start, fail_to_pass=[],
                      pass_to_pass=[], base="../../base")
    table = tomllib.loads((task.path / "task.toml").read_text())["repo"]
    assert table == {"base": "../../base", "setup_patch": "setup.patch.xz"} and not (task.path / "setup.patch").exists()
    packed = (task.path / "setup.patch.xz").read_bytes()
    assert len(packed) * 10 < len(start["big.txt"]) and (task.repo / "big.txt").read_text() == start["big.txt"]
    again = write_task(tmp_path / "suite" / "t2", task_id="t2", instruction="Do it.", repo=start, fail_to_pass=[],
                       pass_to_pass=[], base="../../base")
    assert (again.path / "setup.patch.xz").read_bytes() == packed
    (again.path / "setup.patch.xz").write_bytes(b"not xz")
    with pytest.raises(TaskFormatError, match="not an xz-compressed patch"):
        load_task(again.path)

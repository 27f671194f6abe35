"""``grading.integrity.secure_workspace``: the task's test infrastructure is put back before the hidden
tests run, startup hooks and shadowing modules are taken out, and the right paths are protected."""

from __future__ import annotations

from pathlib import Path

from opencomposer.grading.integrity import secure_workspace

PYPROJECT = '[project]\nname = "demo"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\npythonpath = ["src"]\n'
REPO = {
    "pyproject.toml": PYPROJECT,
    "setup.cfg": "[flake8]\nmax-line-length = 100\n",
    "src/demo/__init__.py": "",
    "src/demo/core.py": "def f():\n    return 1\n",
    "tests/conftest.py": "import pytest\n",
    "tests/test_core.py": "from demo.core import f\n\n\ndef test_f():\n    assert f() == 1\n",
    "conftest.py": "",
}
HIDDEN = {"tests/test_hidden.py": "def test_hidden():\n    assert True\n"}


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def workspace_with(tmp_path: Path, changes: dict[str, str | None]) -> tuple[Path, Path, Path]:
    """(workspace, repo, tests_dir): the repo and hidden tests, then the agent's ``changes`` (None deletes)."""
    repo, hidden = write(tmp_path / "repo", REPO), write(tmp_path / "hidden", HIDDEN)
    workspace = write(tmp_path / "workspace", {**REPO, **HIDDEN})
    for rel, text in changes.items():
        if text is None:
            (workspace / rel).unlink()
        else:
            write(workspace, {rel: text})
    return workspace, repo, hidden


def test_an_untouched_workspace_is_left_alone_and_its_tests_protected(tmp_path: Path):
    workspace, repo, hidden = workspace_with(tmp_path, {})
    secured = secure_workspace(workspace, repo, hidden, ["tests"])
    assert (secured.restored, secured.removed, secured.tampering) == ([], [], [])
    assert secured.protected == ["conftest.py", "pyproject.toml", "setup.cfg", "tests"]
    assert secured.hidden == ["tests/test_hidden.py"]


def test_pytest_configuration_is_put_back_and_other_edits_stay(tmp_path: Path):
    dependency = PYPROJECT.replace('name = "demo"', 'name = "demo"\ndependencies = ["attrs"]')
    changes = {
        "pyproject.toml": dependency,  # not pytest's section: kept
        "setup.cfg": "[flake8]\nmax-line-length = 100\n\n[tool:pytest]\naddopts = --co\n",
        "tox.ini": "[tox]\nenvlist = py311\n",  # no [pytest] section: pytest ignores it
        "pytest.ini": "[pytest]\naddopts = -k nothing\n",
        "tests/pytest.toml": "[pytest]\naddopts = ['-p', 'evil']\n",
        "conftest.py": "def pytest_runtest_makereport(item, call):\n    pass\n",
        "src/conftest.py": "",
        "tests/conftest.py": None,
    }
    workspace, repo, hidden = workspace_with(tmp_path, changes)
    secured = secure_workspace(workspace, repo, hidden, [])
    assert secured.restored == ["conftest.py", "setup.cfg", "tests/conftest.py"]
    assert secured.removed == ["pytest.ini", "src/conftest.py", "tests/pytest.toml"]
    assert secured.tampering == []  # configuration edits have honest uses; they are undone, not punished
    assert (workspace / "pyproject.toml").read_text() == dependency and (workspace / "tox.ini").exists()
    assert (workspace / "setup.cfg").read_text() == REPO["setup.cfg"]
    assert (workspace / "tests/conftest.py").read_text() == REPO["tests/conftest.py"]
    changed = PYPROJECT.replace('testpaths = ["tests"]', 'testpaths = ["tests"]\naddopts = "-p evil"')
    workspace, repo, hidden = workspace_with(tmp_path / "again", {"pyproject.toml": changed})
    assert secure_workspace(workspace, repo, hidden, []).restored == ["pyproject.toml"]
    assert (workspace / "pyproject.toml").read_text() == PYPROJECT


def test_startup_hooks_and_modules_that_shadow_the_test_stack_are_removed_as_tampering(tmp_path: Path):
    changes = {
        "sitecustomize.py": "import _pytest\n",
        "src/usercustomize.py": "",
        "boot.pth": "import os\n",
        "paths.pth": "src\n",  # a path list executes nothing: removed, not tampering
        "pytest.py": "raise SystemExit(0)\n",
        "src/_pytest/__init__.py": "",
        "argparse.py": "",  # shadows the standard library: removed, not counted
        "src/demo/json.py": "",  # inside a package: demo.json shadows nothing
        "src/demo/pluggy.py": "",
    }
    workspace, repo, hidden = workspace_with(tmp_path, changes)
    secured = secure_workspace(workspace, repo, hidden, ["tests"])
    assert secured.removed == ["argparse.py", "boot.pth", "paths.pth", "pytest.py", "sitecustomize.py",
                               "src/_pytest/__init__.py", "src/usercustomize.py"]
    assert [line.split(":")[0] for line in secured.tampering] == [
        "boot.pth", "pytest.py", "sitecustomize.py", "src/_pytest/__init__.py", "src/usercustomize.py"]
    assert (workspace / "src/demo/json.py").exists() and (workspace / "src/demo/pluggy.py").exists()


def test_a_changed_test_file_outside_the_protected_paths_is_not_trusted(tmp_path: Path):
    workspace, repo, hidden = workspace_with(tmp_path, {"tests/test_core.py": "def test_f():\n    pass\n"})
    secured = secure_workspace(workspace, repo, hidden, [])
    assert "tests/test_core.py" not in secured.protected
    assert {"tests/conftest.py", "tests/test_hidden.py"} <= set(secured.protected)

"""Task environments (``[environment]``, ``sandbox.venv``) on real repositories with a dependency.

Nothing is fetched: the dependency is a wheel written here (``tinydep``) and every build runs with
``sandbox.env_build_network = false`` and ``find_links`` at that wheel, so pip installs from it
with ``--no-index``. The repositories are src-layout packages (``calcpkg``) that import the
dependency, in a git history (SWE-bench import, mining) or a Harbor folder (Dockerfile ``pip``
lines, a ``tests/test.sh`` that writes ``reward.txt``).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from opencomposer.cli import main
from opencomposer.config import GradingConfig, SandboxConfig
from opencomposer.grading.grade import GradingInfraError, grade, read_reward
from opencomposer.sandbox.workspace import Sandbox
from opencomposer.sandbox.venv import (
    EnvironmentBuildError,
    EnvironmentSpec,
    EnvironmentSpecError,
    detect_repo_environment,
    parse_environment,
    prepare_environment,
    repo_dependencies,
    repo_name_version,
    resolve_environment,
)
from opencomposer.tasks.format import TaskFormatError, load_suite, load_task, write_task
from opencomposer.tasks.importers import import_harbor, import_swebench, translate_dockerfile
from opencomposer.tasks.mining import mine
from opencomposer.tasks.validation import check_task

CALC = "from tinydep import double\n\n\ndef quad(x):\n    return double(double(x))\n"
CALC_BUGGY = CALC.replace("double(double(x))", "double(x)")
TEST_CALC = "from calcpkg import quad\n\n\ndef test_quad():\n    assert quad(3) == 12\n"
TEST_ZERO = "from calcpkg import quad\n\n\ndef test_zero():\n    assert quad(0) == 0\n"
PYPROJECT = ('[project]\nname = "calcpkg"\nversion = "0.1"\ndependencies = ["tinydep>=1"]\n\n'
             "[tool.pytest.ini_options]\ntestpaths = ['tests']\n")


def make_wheel(folder: Path, name: str = "tinydep", version: str = "1.0") -> Path:
    """A pure-Python wheel written by hand (no build backend, no index)."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{name}/__init__.py", "def double(x):\n    return 2 * x\n")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                          "Tag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return folder


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


@pytest.fixture
def offline(tmp_path: Path, monkeypatch) -> tuple[SandboxConfig, Path]:
    """A sandbox config whose environment builds are offline and cached under tmp_path, and the
    folder of the one wheel they may install."""
    monkeypatch.setenv("OPENCOMPOSER_HOME", str(tmp_path / "home"))
    return SandboxConfig(env_cache_dir=str(tmp_path / "envs"), env_build_network=False), make_wheel(tmp_path / "wheels")


# ----------------------------------------------------------------------------------------------
# The table and the key (no sandbox)


def test_environment_table_is_validated(tmp_path: Path):
    assert parse_environment({"packages": ["a>=1"], "install_repo": True}).packages == ("a>=1",)
    for table, message in [({"pakages": []}, "unknown key"), ({"python": "three"}, "version"),
                           ({"packages": ["--pre"]}, "pip option"), ({"requirements": ["../x.txt"]}, "inside"),
                           ({"extras": ["test"]}, "install_repo"), ({"install_repo": "yes"}, "true or false")]:
        with pytest.raises(EnvironmentSpecError, match=message):
            parse_environment(table)
    task = write_task(tmp_path / "t", task_id="t", instruction="x", repo={"a.py": "x = 1\n"}, fail_to_pass=[],
                      pass_to_pass=[], environment=EnvironmentSpec(packages=("a",)))
    assert "[environment]" in (task.path / "task.toml").read_text()
    toml = task.path / "task.toml"
    toml.write_text(toml.read_text() + 'python = "3"\n')
    with pytest.raises(TaskFormatError, match="environment.python"):
        load_task(task.path)


def test_dependencies_are_read_without_running_anything(tmp_path: Path):
    write(tmp_path / "a", {"pyproject.toml": PYPROJECT.replace('"tinydep>=1"]', '"tinydep>=1"]\n'
                                                                "optional-dependencies = {test = ['calcpkg[x]', 'hyp']}")})
    assert repo_dependencies(tmp_path / "a", ("test",)) == (["tinydep>=1", "hyp"], "pyproject.toml")
    write(tmp_path / "b", {"setup.py": "from setuptools import setup\nsetup(name='b', install_requires=['x<2'])\n"})
    assert repo_dependencies(tmp_path / "b") == (["x<2"], "setup.py")
    write(tmp_path / "c", {"setup.py": "from setuptools import setup\nsetup(install_requires=read())\n"})
    assert repo_dependencies(tmp_path / "c")[0] is None  # computed: the build installs and removes the repo
    write(tmp_path / "d", {"setup.cfg": "[options]\ninstall_requires =\n    y\n    z>=3\n", "setup.py": "import setuptools\nsetuptools.setup()\n"})
    assert repo_dependencies(tmp_path / "d") == (["y", "z>=3"], "setup.cfg")
    write(tmp_path / "e", {"pyproject.toml": PYPROJECT, "src/calcpkg/__init__.py": CALC,
                           "requirements-dev.txt": "pytest-foo\n", "requirements.txt": "-e .\n"})
    spec = detect_repo_environment(tmp_path / "e")
    assert spec.install_repo and spec.pythonpath == ("src",) and spec.requirements == ("requirements-dev.txt",)
    assert spec.repo_metadata and repo_name_version(tmp_path / "e") == ("calcpkg", "0.1")


def test_test_dependencies_in_dependency_groups_and_self_referencing_extras(tmp_path: Path):
    # PEP 735 groups with include-group (attrs since 2025) and an extra that names the project's
    # own extras (marshmallow's dev = ["marshmallow[tests]"], attrs' tests = ["attrs[tests-no-zope]"])
    write(tmp_path / "g", {"pyproject.toml": '[project]\nname = "Calc.Pkg"\ndynamic = ["version"]\n'
                                             'dependencies = ["tinydep"]\n[dependency-groups]\n'
                                             'tests = ["hypothesis", "pympler"]\n'
                                             'cov = [{include-group = "tests"}, "coverage"]\nlint = ["ruff"]\n'})
    assert repo_dependencies(tmp_path / "g", ("cov",))[0] == ["tinydep", "hypothesis", "pympler", "coverage"]
    spec = detect_repo_environment(tmp_path / "g")
    assert spec.extras == ("tests",) and spec.repo_metadata
    assert repo_name_version(tmp_path / "g") == ("Calc.Pkg", "0+workspace")  # a dynamic version
    (tmp_path / "g" / "pyproject.toml").write_text((tmp_path / "g" / "pyproject.toml").read_text().replace(
        "tests = [", "dev = ["))
    assert detect_repo_environment(tmp_path / "g").extras == ("dev",)  # no test group: isort's dev
    write(tmp_path / "s", {"pyproject.toml": '[project]\nname = "calc_pkg"\nversion = "2.0"\n'
                                             '[project.optional-dependencies]\n'
                                             'tests = ["calc-pkg[tests-no-zope]", "zope.interface"]\n'
                                             '"tests-no-zope" = ["hypothesis", "calc.pkg[more]"]\n'
                                             'more = ["pytest-xdist", "calc_pkg[tests]"]\n'})
    assert repo_dependencies(tmp_path / "s", ("tests",))[0] == ["hypothesis", "pytest-xdist", "zope.interface"]
    assert detect_repo_environment(tmp_path / "s").extras == ("tests",)
    # setup.py's extras in a module-level dict (marshmallow before 2024)
    write(tmp_path / "m", {"setup.py": "from setuptools import setup\nEXTRAS = {'tests': ['pytz'], 'docs': ['sphinx']}\n"
                                       "EXTRAS['dev'] = EXTRAS['tests'] + ['tox']\n"
                                       "setup(name='m', install_requires=['packaging'], extras_require=EXTRAS)\n"})
    assert repo_dependencies(tmp_path / "m", ("tests",))[0] == ["packaging", "pytz"]
    assert detect_repo_environment(tmp_path / "m").extras == ("tests",)
    write(tmp_path / "p", {"setup.py": "from setuptools import setup\nsetup(name='legacy', version='1.2')\n"})
    assert repo_name_version(tmp_path / "p") == ("legacy", "1.2")
    write(tmp_path / "n", {"setup.py": "from setuptools import setup\nsetup(name=NAME)\n"})
    assert repo_name_version(tmp_path / "n") == (None, "0+workspace")
    with pytest.raises(EnvironmentSpecError, match="install_repo"):
        parse_environment({"repo_metadata": True})
    assert parse_environment({"repo_metadata": True, "install_repo": True}).repo_metadata


def test_key_follows_dependencies_not_source(tmp_path: Path, offline):
    _, wheels = offline
    spec = EnvironmentSpec(install_repo=True, find_links=(str(wheels),))
    keys = []
    for i, deps in enumerate(['"tinydep>=1"', '"tinydep>=1"', '"tinydep>=1", "other"']):
        write(tmp_path / f"r{i}", {"pyproject.toml": PYPROJECT.replace('"tinydep>=1"', deps),
                                   "src/calcpkg/__init__.py": CALC + f"# commit {i}\n"})
        keys.append(resolve_environment(spec, tmp_path / f"r{i}").key)
    assert keys[0] == keys[1] != keys[2]
    # the metadata adds (name, version) to the key only when asked for: tasks without it keep their keys
    plain = resolve_environment(spec, tmp_path / "r0")
    assert "repo_metadata" not in plain.definition()
    with_metadata = resolve_environment(dataclasses.replace(spec, repo_metadata=True), tmp_path / "r0")
    assert with_metadata.definition()["repo_metadata"] == ["calcpkg", "0.1"] and with_metadata.key != plain.key


# ----------------------------------------------------------------------------------------------
# Building, binding, grading


@pytest.mark.bwrap
def test_environment_builds_once_binds_read_only_and_imports_the_workspace(tmp_path: Path, offline):
    config, wheels = offline
    repo = tmp_path / "repo"
    write(repo, {"pyproject.toml": PYPROJECT, "src/calcpkg/__init__.py": CALC, "tests/test_calc.py": TEST_CALC})
    spec = EnvironmentSpec(install_repo=True, repo_metadata=True, find_links=(str(wheels),))
    bound, built = prepare_environment(spec, repo, config)
    assert built.built and built.log.is_file() and "tinydep" in built.log.read_text()
    assert built.manifest["repo_metadata"] == "calcpkg-0.1.dist-info"
    again = prepare_environment(spec, repo, config)[1]
    assert not again.built and again.root == built.root
    with Sandbox(repo, config, environment=bound) as sandbox:
        (sandbox.workspace / "src" / "calcpkg" / "__init__.py").write_text(CALC + "EDITED = True\n")
        result = sandbox.run("python -c 'import calcpkg, sys; print(calcpkg.quad(3), calcpkg.EDITED, "
                             "calcpkg.__file__, sys.prefix)' && python -m pytest -q")
        assert result.exit_code == 0, result.output
        assert f"12 True /workspace/src/calcpkg/__init__.py {built.root}" in result.output  # the workspace copy
        # its own version, as an editable install would give it (isort and marshmallow read theirs)
        result = sandbox.run("python -c 'import importlib.metadata as m; d = m.distribution(\"calcpkg\"); "
                             "print(d.version, d.files)'")
        assert result.exit_code == 0 and "0.1 None" in result.output, result.output  # no files of its own
        for attempt in (f"touch {built.root}/planted", f"pip install --no-index --find-links {wheels} --force-reinstall tinydep",
                        f"echo 'import os' > {built.root}/lib/x.pth"):
            assert sandbox.run(attempt).exit_code != 0, attempt
        assert sandbox.run("python -c 'import urllib.request as u; u.urlopen(\"http://1.1.1.1\", timeout=3)'"
                           ).exit_code != 0  # no network outside a build
    assert not (built.root / "planted").exists()
    # the control: without repo_metadata the repository has no distribution to ask
    plain_bound, plain = prepare_environment(dataclasses.replace(spec, repo_metadata=False), repo, config)
    assert plain.manifest["repo_metadata"] is None
    with Sandbox(repo, config, environment=plain_bound) as sandbox:
        result = sandbox.run("python -c 'import importlib.metadata as m; m.version(\"calcpkg\")'")
        assert result.exit_code != 0 and "PackageNotFoundError" in result.output, result.output


@pytest.mark.bwrap
def test_failed_build_is_an_infrastructure_error_with_its_log(tmp_path: Path, offline):
    config, wheels = offline
    task = write_task(tmp_path / "t", task_id="t", instruction="x", repo={"a.py": "x = 1\n", "tests/test_a.py":
                      "def test_a():\n    assert True\n"}, fail_to_pass=["tests/test_a.py::test_a"], pass_to_pass=[],
                      environment=EnvironmentSpec(packages=("not-in-the-wheelhouse",), find_links=(str(wheels),)))
    with pytest.raises(GradingInfraError, match=r"(?s)could not be built.*build log: .*\.log"):
        grade(task, "", None, config, GradingConfig(lint=False))
    logs = list((tmp_path / "envs" / "logs").glob("*.log"))
    assert logs and "not-in-the-wheelhouse" in logs[0].read_text()
    assert not [p for p in (tmp_path / "envs").iterdir() if p.is_dir() and p.name not in ("logs", "pip-cache")]
    with pytest.raises(EnvironmentBuildError):
        prepare_environment(EnvironmentSpec(commands=("exit 3",)), task.repo, config)


# ----------------------------------------------------------------------------------------------
# SWE-bench: a src-layout repository with a dependency, from a real fix commit


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=Dev", "-c", "user.email=dev@example.com", *args],
                          check=True, capture_output=True, text=True).stdout


def calc_history(root: Path) -> dict[str, str]:
    """A src-layout repository whose package imports ``tinydep``: a buggy start, then a fix with a test."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    write(root, {"pyproject.toml": PYPROJECT, "src/calcpkg/__init__.py": CALC_BUGGY, "tests/test_calc.py": TEST_ZERO})
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "Start calcpkg")
    base = git(root, "rev-parse", "HEAD").strip()
    write(root, {"src/calcpkg/__init__.py": CALC, "tests/test_calc.py": TEST_ZERO + TEST_CALC.split("\n", 1)[1]})
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "Fix quad: it doubled once")
    return {"base": base, "fix": git(root, "rev-parse", "HEAD").strip()}


def swebench_instance(root: Path, shas: dict[str, str]) -> dict:
    patch = git(root, "diff", shas["base"], shas["fix"], "--", "src")
    test_patch = git(root, "diff", shas["base"], shas["fix"], "--", "tests")
    return {"instance_id": "dev__calcpkg-1", "repo": "dev/calcpkg", "base_commit": shas["base"], "patch": patch,
            "test_patch": test_patch, "problem_statement": "quad(3) returns 6, it should be 12.",
            "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_quad"]),
            "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_zero"]), "version": "0.1"}


@pytest.mark.bwrap
def test_swebench_instance_with_dependencies_resolves_with_gold_only(tmp_path: Path, offline):
    config, wheels = offline
    checkouts = tmp_path / "checkouts"
    shas = calc_history(checkouts / "calcpkg")  # a folder of checkouts, one per repository
    source = tmp_path / "instances.jsonl"
    source.write_text(json.dumps(swebench_instance(checkouts / "calcpkg", shas)) + "\n")
    [task] = import_swebench(source, checkouts, tmp_path / "suite",
                             environment=EnvironmentSpec(find_links=(str(wheels),)))
    toml = (task.path / "task.toml").read_text()
    assert "[environment]" in toml and "install_repo = true" in toml and 'pythonpath = ["src"]' in toml
    check = check_task(task, config)
    assert check.problems == [], check.problems  # gold resolves, the untouched repo does not
    assert check.gold.resolved and not check.broken.resolved and check.broken.pass_to_pass == 1.0
    # without the environment nothing can import the package: what a new user saw before
    (task.path / "task.toml").write_text(toml.split("[environment]")[0])
    bare = check_task(load_task(task.path), config)
    assert any("gold does not resolve" in p for p in bare.problems)


@pytest.mark.bwrap
def test_build_env_command_builds_each_environment_once(tmp_path: Path, offline, capsys):
    config, wheels = offline
    checkouts = tmp_path / "calcpkg"
    shas = calc_history(checkouts)
    instance = swebench_instance(checkouts, shas)
    source = tmp_path / "instances.json"
    source.write_text(json.dumps([instance, {**instance, "instance_id": "dev__calcpkg-2"}]))
    args = ["tasks", "import", "swebench", str(source), "--repo", str(checkouts), "--out", str(tmp_path / "suite"),
            "--find-links", str(wheels)]
    assert main(args) == 0
    sets = ["--set", f'sandbox.env_cache_dir="{tmp_path / "envs"}"', "--set", "sandbox.env_build_network=false"]
    assert main(["tasks", "build-env", str(tmp_path / "suite"), *sets]) == 0
    out = capsys.readouterr().out
    assert "built in" in out and "2 task(s)" in out and "1 environment(s) for 2 task(s); 0 failed" in out
    assert main(["tasks", "build-env", str(tmp_path / "suite" / "dev__calcpkg-1"), *sets]) == 0
    assert "cached in" in capsys.readouterr().out
    assert main(["tasks", "build-env", str(tmp_path / "nowhere")]) == 2


# ----------------------------------------------------------------------------------------------
# Mining a src-layout repository with the default test command


@pytest.mark.bwrap
def test_mining_a_src_layout_repository_needs_no_test_command(tmp_path: Path, offline):
    config, wheels = offline
    shas = calc_history(tmp_path / "calcpkg")
    records = mine(tmp_path / "calcpkg", tmp_path / "mined", sandbox=config,
                   environment=EnvironmentSpec(find_links=(str(wheels),)))
    made = [r for r in records if r.task_id]
    assert [r.sha for r in made] == [shas["fix"]], [r.reason for r in records]
    assert made[0].fail_to_pass == ["tests/test_calc.py::test_quad"]
    [task] = load_suite(tmp_path / "mined")
    assert task.test_command.startswith("python -m pytest -q") and "install_repo = true" in (
        task.path / "task.toml").read_text()


# ----------------------------------------------------------------------------------------------
# Harbor: Dockerfile pip lines and tests/test.sh writing reward.txt


def harbor_folder(root: Path, wheels: Path) -> Path:
    task = root / "quad-fix"
    write(task, {
        "task.toml": 'version = "1.0"\n\n[metadata]\ndifficulty = "easy"\ncategory = "python"\n',
        "instruction.md": "calcpkg.quad(3) must return 12; fix /app/calcpkg.py.\n",
        "environment/Dockerfile": ("FROM python:3.11-slim\nRUN apt-get update && apt-get install -y curl\n"
                                   "WORKDIR /app\nCOPY app/ /app/\n"
                                   "RUN pip install --no-cache-dir -r /tmp/reqs.txt && \\\n    python -c 'print(1)'\n"
                                   "ENV FOO=bar\n"),
        "environment/reqs.txt": "tinydep>=1\n",
        "environment/app/calcpkg.py": CALC_BUGGY,
        "tests/test.sh": ("#!/bin/bash\ncd /app\npython -m pytest -q /tests/test_outputs.py -p no:cacheprovider\n"
                          "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; "
                          "else echo 0 > /logs/verifier/reward.txt; fi\n"),
        "tests/test_outputs.py": "import sys\nsys.path.insert(0, '/app')\nfrom calcpkg import quad\n\n\n"
                                 "def test_quad():\n    assert quad(3) == 12\n",
        "solution/solve.sh": "#!/bin/bash\nsed -i 's/return double(x)/return double(double(x))/' /app/calcpkg.py\n",
    })
    return task


def test_dockerfile_plain_python_steps_are_translated(tmp_path: Path):
    task = harbor_folder(tmp_path, tmp_path / "wheels")
    repo = task / "environment" / "app"
    spec, skipped = translate_dockerfile(task / "environment" / "Dockerfile", repo)
    assert spec.python == "3.11" and spec.packages == ("tinydep>=1",) and spec.commands == ("python -c 'print(1)'",)
    assert skipped == ["RUN apt-get update", "RUN apt-get install -y curl", "ENV FOO=bar"]


@pytest.mark.bwrap
def test_harbor_task_imports_builds_and_grades_with_its_test_sh(tmp_path: Path, offline):
    config, wheels = offline
    [task] = import_harbor(harbor_folder(tmp_path / "harbor", wheels), tmp_path / "suite", config,
                           environment=EnvironmentSpec(find_links=(str(wheels),)))
    assert (task.path / "verifier" / "test.sh").is_file() and task.workdir == "/app"
    assert task.gold_patch and "double(double(x))" in task.gold_patch  # solve.sh ran in the environment
    assert task.metadata["harbor_skipped"][0] == "RUN apt-get update"
    gold = grade(task, task.gold_patch, None, config, GradingConfig(lint=False))
    broken = grade(task, "", None, config, GradingConfig(lint=False))
    assert gold.resolved and gold.fail_to_pass == 1.0
    assert not broken.resolved and broken.fail_to_pass == 0.0
    assert check_task(task, config).problems == []


def test_reward_files_are_read_like_harbor(tmp_path: Path):
    assert read_reward(tmp_path) == (0.0, "the verifier wrote no reward.txt or reward.json")
    (tmp_path / "reward.json").write_text('{"reward": 0.75, "other": 2}')
    assert read_reward(tmp_path) == (0.75, "")
    (tmp_path / "reward.txt").write_text("1\n")
    assert read_reward(tmp_path) == (1.0, "")
    (tmp_path / "reward.txt").write_text("lots")
    assert read_reward(tmp_path)[0] == 0.0


# ----------------------------------------------------------------------------------------------
# The agent's episode runs in the task's environment too


@pytest.mark.bwrap
def test_an_episode_works_in_the_task_environment_and_a_failed_build_is_infra(tmp_path: Path, offline):
    from opencomposer.agent.policies.scripted import ScriptedPolicy, call
    from opencomposer.config import load_recipe
    from opencomposer.episode import run_episode
    from opencomposer.types import EpisodeStatus

    sandbox_config, wheels = offline
    config = load_recipe(None, ["grading.lint=false", f"sandbox.env_cache_dir={sandbox_config.env_cache_dir}",
                                "sandbox.env_build_network=false"])
    repo = {"pyproject.toml": PYPROJECT, "src/calcpkg/__init__.py": CALC_BUGGY, "tests/test_zero.py": TEST_ZERO}
    task = write_task(tmp_path / "t", task_id="t", instruction="fix quad", repo=repo,
                      hidden_tests={"tests/test_calc.py": TEST_CALC}, fail_to_pass=["tests/test_calc.py::test_quad"],
                      pass_to_pass=["tests/test_zero.py::test_zero"],
                      environment=EnvironmentSpec(install_repo=True, find_links=(str(wheels),)))
    script = [[call("run", command="python -c 'import tinydep, calcpkg; print(\"dep\", tinydep.double(4))'")],
              [call("edit", path="src/calcpkg/__init__.py", old="double(x)\n", new="double(double(x))\n")],
              [call("finish", message="fixed")]]
    episode = run_episode(task, ScriptedPolicy(script), config)
    assert episode.status == EpisodeStatus.OK, episode.error
    assert "dep 8" in episode.segments[0].messages[3].content  # the agent's shell imports the dependency
    assert episode.grade.resolved
    broken = write_task(tmp_path / "b", task_id="b", instruction="x", repo=repo, hidden_tests={"tests/test_calc.py": TEST_CALC},
                        fail_to_pass=["tests/test_calc.py::test_quad"], pass_to_pass=[],
                        environment=EnvironmentSpec(packages=("not-in-the-wheelhouse",), find_links=(str(wheels),)))
    episode = run_episode(broken, ScriptedPolicy(script), config)
    assert episode.status == EpisodeStatus.INFRA_ERROR and "could not be built" in episode.error


def test_swebench_instances_load_from_parquet_like_jsonl(tmp_path: Path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    from opencomposer.tasks.importers import read_instances

    shas = calc_history(tmp_path / "calcpkg")
    instance = swebench_instance(tmp_path / "calcpkg", shas)
    parquet.write_table(pyarrow.Table.from_pylist([instance, {**instance, "instance_id": "dev__calcpkg-2"}]),
                        tmp_path / "instances.parquet")
    (tmp_path / "instances.jsonl").write_text(json.dumps(instance) + "\n")
    from_parquet = read_instances(tmp_path / "instances.parquet")
    assert [i["instance_id"] for i in from_parquet] == ["dev__calcpkg-1", "dev__calcpkg-2"]
    assert from_parquet[0] == read_instances(tmp_path / "instances.jsonl")[0]

"""Task environments (``sandbox.venv``): build time cold and cached, and how many distinct
environments a mined history needs.

1. **cold**: a fresh cache, then ``prepare_environment`` of a src-layout repository whose one
   dependency comes from a wheel made here (offline: ``--no-index --find-links``): venv, pip
   install, the test stack copied. Also an environment with no dependency at all (venv and test
   stack only), the floor of any build.
2. **cached**: the same call again (the key is computed, the manifest found): what every grading,
   rollout and validation of a task pays once its environment exists.
3. **history**: a synthetic git history of N commits of a src-layout package whose dependencies
   change now and then (a new dependency, a bumped pin, a new test extra: every ``--change-every``
   commits), resolved commit by commit as the miner does (``mining.detect_environment`` then the
   key). The number of distinct keys is the number of builds mining the whole history costs. With
   ``--repo PATH``, the same count on the newest N commits of a real repository.

    .venv/bin/python benchmarks/task_envs.py [--repeats 3 --commits 200 --change-every 40 --repo .]
    .venv/bin/python benchmarks/task_envs.py --quick    # one build each way, a 6-commit history

Results are printed and written to benchmarks/results/task_envs.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from _quick import parse_args

from opencomposer.config import SandboxConfig
from opencomposer.sandbox.venv import (
    REQUIREMENT_FILES,
    SETUP_FILES,
    EnvironmentSpec,
    prepare_environment,
    resolve_environment,
)
from opencomposer.tasks.mining import detect_environment

QUICK = {"repeats": 1, "commits": 6, "change_every": 3}
PYPROJECT = '[project]\nname = "calcpkg"\nversion = "0.1"\ndependencies = [{deps}]\n'


def wheelhouse(folder: Path, names: list[str]) -> Path:
    """Pure-Python wheels written by hand, one per name."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        info = f"{name}-1.0.dist-info"
        with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as archive:
            archive.writestr(f"{name}/__init__.py", "VALUE = 1\n")
            archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
            archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\n"
                                              "Tag: py3-none-any\n")
            archive.writestr(f"{info}/RECORD", "")
    return folder


def repo(folder: Path, deps: list[str]) -> Path:
    (folder / "src" / "calcpkg").mkdir(parents=True, exist_ok=True)
    (folder / "src" / "calcpkg" / "__init__.py").write_text("def quad(x):\n    return 4 * x\n")
    (folder / "pyproject.toml").write_text(PYPROJECT.format(deps=", ".join(f'"{d}"' for d in deps)))
    return folder


def build_times(root: Path, deps: list[str], wheels: Path, repeats: int) -> dict[str, float]:
    cold, cached = [], []
    spec = EnvironmentSpec(install_repo=True, find_links=(str(wheels),))
    source = repo(root / f"repo-{len(deps)}", deps)
    for i in range(repeats):
        config = SandboxConfig(env_cache_dir=str(root / f"cache-{len(deps)}-{i}"), env_build_network=False)
        started = time.monotonic()
        built = prepare_environment(spec, source, config)[1]
        cold.append(time.monotonic() - started)
        assert built.built
        for _ in range(5):
            started = time.monotonic()
            again = prepare_environment(spec, source, config)[1]
            cached.append(time.monotonic() - started)
            assert not again.built
    return {"cold_s": round(statistics.median(cold), 3), "cold_min_s": round(min(cold), 3),
            "cached_s": round(statistics.median(cached), 4)}


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.name=b", "-c", "user.email=b@b", *args],
                          check=True, capture_output=True, text=True).stdout


def synthetic_history(folder: Path, commits: int, change_every: int) -> Path:
    """A history whose code changes every commit and whose dependencies change every
    ``change_every`` commits (a new dependency or a bumped pin, alternately)."""
    folder.mkdir(parents=True)
    git(folder, "init", "-q", "-b", "main")
    deps = ["tinydep>=1"]
    for i in range(commits):
        if i and i % change_every == 0:
            deps = deps + [f"dep{i}"] if (i // change_every) % 2 else deps[:-1] + [f"{deps[-1].split('>')[0]}>={i}"]
        repo(folder, deps)
        (folder / "src" / "calcpkg" / "__init__.py").write_text(f"def quad(x):\n    return 4 * x  # {i}\n")
        git(folder, "add", "-A")
        git(folder, "commit", "-q", "-m", f"commit {i}")
    return folder


def distinct_environments(folder: Path, limit: int) -> dict[str, int | float]:
    """Resolve the environment of each of the newest ``limit`` commits the way the miner does; only
    the packaging and requirement files are read (``git show``), plus the src layout."""
    shas = git(folder, "rev-list", "--max-count", str(limit), "HEAD").split()
    keys, with_env = set(), 0
    started = time.monotonic()
    for sha in shas:
        names = git(folder, "ls-tree", "-r", "--name-only", sha).splitlines()
        tree = {}
        for name in names:
            if name in SETUP_FILES or name in REQUIREMENT_FILES:
                tree[name] = subprocess.run(["git", "-C", str(folder), "show", f"{sha}:{name}"], check=True,
                                            capture_output=True).stdout
            elif name.startswith("src/") and name.endswith(".py") and name.count("/") <= 2:
                tree[name] = b""
        spec = detect_environment(tree)
        if spec is None:
            continue
        with_env += 1
        with tempfile.TemporaryDirectory() as tmp:
            for name, data in tree.items():
                (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / name).write_bytes(data)
            keys.add(resolve_environment(spec, Path(tmp)).key)
    return {"commits": len(shas), "commits_with_environment": with_env, "distinct_environments": len(keys),
            "resolve_ms_per_commit": round(1000 * (time.monotonic() - started) / max(1, len(shas)), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="builds of each environment (median reported)")
    parser.add_argument("--commits", type=int, default=200, help="commits of the synthetic history")
    parser.add_argument("--change-every", type=int, default=40, help="commits between dependency changes")
    parser.add_argument("--repo", help="also count the environments of this repository's newest --commits commits")
    args = parse_args(parser, QUICK)
    results: dict[str, object] = {"python": sys.version.split()[0]}
    with tempfile.TemporaryDirectory(prefix="bench-task-envs-") as tmp:
        root = Path(tmp)
        wheels = wheelhouse(root / "wheels", ["tinydep"])
        results["build_no_dependency"] = build_times(root, [], wheels, args.repeats)
        results["build_one_dependency"] = build_times(root, ["tinydep>=1"], wheels, args.repeats)
        history = synthetic_history(root / "history", args.commits, args.change_every)
        results["synthetic_history"] = {"change_every": args.change_every,
                                        **distinct_environments(history, args.commits)}
    if args.repo:
        results["repository"] = {"path": str(Path(args.repo).resolve()),
                                 **distinct_environments(Path(args.repo), args.commits)}
    print_tables(results)
    out = args.results_dir / "task_envs.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def print_tables(results: dict) -> None:
    print(f"{'environment':<16}  {'cold s (median)':>15}  {'cold s (min)':>12}  {'cached ms':>9}")
    for name in ("build_no_dependency", "build_one_dependency"):
        row = results[name]
        print(f"{name.removeprefix('build_').replace('_', ' '):<16}  {row['cold_s']:>15.3f}  {row['cold_min_s']:>12.3f}  "
              f"{1000 * row['cached_s']:>9.1f}")
    print(f"\n{'history':<16}  {'commits':>7}  {'with environment':>16}  {'distinct':>8}  {'resolve ms/commit':>17}")
    for name in ("synthetic_history", "repository"):
        if name in results:
            row = results[name]
            print(f"{name.replace('_', ' '):<16}  {row['commits']:>7}  {row['commits_with_environment']:>16}  "
                  f"{row['distinct_environments']:>8}  {row['resolve_ms_per_commit']:>17.1f}")


if __name__ == "__main__":
    raise SystemExit(main())

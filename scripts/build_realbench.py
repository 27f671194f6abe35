"""Build the realbench suite (src/opencomposer/suites/realbench) from public repositories' history.

Two steps, each rerunnable (docs/realbench.md):

    python scripts/build_realbench.py mine REPO [REPO ...] --clones DIR --work DIR [--candidates N]
    python scripts/build_realbench.py pack --work DIR [--suite DIR]
    python scripts/build_realbench.py readme        # the suite's line and medians in suites/README.md

``mine`` clones each repository (``--clones`` holds ``<name>/`` clones, made from the GitHub
mirror ``--mirror`` when missing), picks the newest ``--candidates`` changes on the first-parent
chain that fit ``CRITERIA`` by their size alone (cheap ``git diff --numstat``), and hands them to
``tasks.mining.mine`` with ``CRITERIA``: tests run in the sandbox, the developer prompt and its
solvability check, the mutation score with its floor, three validations. Task folders land in
``WORK/mined/<name>/`` (a full ``repo/`` each) with ``mining.json`` saying why each other change
was refused.

``pack`` turns them into the shipped suite: per repository one ``_repos/<name>/base.tar.xz``
(the snapshot at the median task's starting commit, files sorted and dated 0, so the archive is
a function of the tree) with the repository's licence beside it, and per task ``[repo] base``
naming that archive plus ``setup.patch`` (the base to the task's starting commit), its gold
patch, hidden tests and lists. The archive's hash names its cache folder (``tasks.format.
unpack_base``): content-addressed, built on first use.
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from opencomposer.tasks.format import load_task, write_task
from opencomposer.tasks.generators.source import is_test_path
from opencomposer.tasks.mining import Criteria, commit_tree, mine

SUITE = Path(__file__).resolve().parent.parent / "src" / "opencomposer" / "suites" / "realbench"
CRITERIA = Criteria.benchmark()  # what `opencomposer tasks mine --benchmark` mines with


@dataclass(frozen=True)
class Repository:
    name: str  # the clone's folder, the task ids' prefix
    github: str
    licence: str  # SPDX identifier
    licence_file: str
    shape: str


REPOSITORIES = {r.name: r for r in [
    Repository("marshmallow", "marshmallow-code/marshmallow", "MIT", "LICENSE", "library, src layout"),
    Repository("click", "pallets/click", "BSD-3-Clause", "LICENSE.txt", "CLI framework, src layout"),
    Repository("isort", "PyCQA/isort", "MIT", "LICENSE", "application (import sorter), flat layout"),
    Repository("tomlkit", "python-poetry/tomlkit", "MIT", "LICENSE", "library (style-preserving TOML), flat"),
    Repository("more-itertools", "more-itertools/more-itertools", "MIT", "LICENSE", "library with stubs, flat"),
    Repository("boltons", "mahmoud/boltons", "BSD-3-Clause", "LICENSE", "utility modules, flat"),
    Repository("cachetools", "tkem/cachetools", "MIT", "LICENSE", "library, src layout"),
    Repository("humanize", "python-humanize/humanize", "MIT", "LICENCE", "library with locales, src layout"),
    Repository("glom", "mahmoud/glom", "BSD-3-Clause", "LICENSE", "library + CLI, flat, dependencies"),
    Repository("toolz", "pytoolz/toolz", "BSD-3-Clause", "LICENSE.txt", "functional library, flat"),
    Repository("jmespath.py", "jmespath/jmespath.py", "MIT", "LICENSE", "query language, flat"),
    Repository("python-dotenv", "theskumar/python-dotenv", "BSD-3-Clause", "LICENSE", "library + CLI, src layout"),
    Repository("pyparsing", "pyparsing/pyparsing", "MIT", "LICENSE", "parser library, flat"),
    Repository("attrs", "python-attrs/attrs", "MIT", "LICENSE", "library, src layout, hypothesis tests"),
    Repository("python-tabulate", "astanin/python-tabulate", "MIT", "LICENSE", "library + CLI, one module"),
    Repository("parse", "r1chardj0n3s/parse", "MIT", "LICENSE", "one-module library"),
    Repository("schema", "keleshev/schema", "MIT", "LICENSE-MIT", "one-module library with stubs"),
    Repository("python-sortedcontainers", "grantjenks/python-sortedcontainers", "Apache-2.0", "LICENSE",
               "data structures, src layout"),
    Repository("sqlparse", "andialbrecht/sqlparse", "BSD-3-Clause", "LICENSE", "SQL parser + CLI, flat"),
    Repository("tinydb", "msiemens/tinydb", "MIT", "LICENSE", "document database, flat"),
    Repository("inflect", "jaraco/inflect", "MIT", "LICENSE", "one-module library (English inflection)"),
]}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          errors="replace").stdout


def preselect(clone: Path, count: int) -> list[str]:
    """The newest ``count`` first-parent changes that fit ``CRITERIA`` by their numbers alone."""
    chosen = []
    for sha in git(clone, "rev-list", "--first-parent", "HEAD").split():
        parents = git(clone, "rev-list", "--parents", "-n", "1", sha).split()[1:]
        if not parents:
            continue
        files = lines = tests = python = 0
        for row in git(clone, "diff", "--numstat", "--no-renames", parents[0], sha).splitlines():
            added, removed, path = row.split("\t", 2)
            if is_test_path(path):
                tests += 1
            elif added != "-":
                files, lines, python = files + 1, lines + int(added) + int(removed), python + path.endswith(".py")
        if tests and python and files >= CRITERIA.min_files and CRITERIA.min_lines <= lines <= CRITERIA.max_lines:
            chosen.append(sha)
            if len(chosen) == count:
                break
    return chosen[::-1]


def mine_main(args: argparse.Namespace) -> int:
    for name in args.repos:
        repo = REPOSITORIES[name]
        clone = Path(args.clones) / name
        if not clone.is_dir():
            subprocess.run(["git", "clone", "-q", f"{args.mirror}/{repo.github.replace('/', '+')}/repo",
                            str(clone)], check=True)
        out = Path(args.work) / "mined" / name
        seen = {folder.parent.name.rsplit("-", 1)[1] for folder in out.glob("*/task.toml")}  # sha[:10] of tasks made
        for report in out.glob("mining*.json"):
            seen.update(r["sha"][:10] for r in json.loads(report.read_text()))
        if (out / "mining.json").is_file():  # mine() writes it anew; keep the earlier batch's
            (out / "mining.json").rename(out / f"mining-{time.time_ns()}.json")
        # newest first: older changes more often fail for the era's code (Python 2 syntax, nose,
        # collections.MutableMapping) than for their tests, so a run cut short has tried the likelier
        shas = [s for s in preselect(clone, args.candidates) if s[:10] not in seen][::-1]
        print(f"{name}: {len(shas)} candidate change(s)", flush=True)

        done: list[dict] = []

        def report(record, done: list[dict] = done, out: Path = out) -> None:  # this repository's
            print(f"  {record.sha[:10]} {'TASK ' + record.task_id if record.task_id else record.reason[:160]}",
                  flush=True)
            # written as each change finishes, so a run stopped early still leaves its finished tasks
            # for ``pack`` (mine() rewrites the file with every record at the end)
            done.append(asdict(record))
            out.mkdir(parents=True, exist_ok=True)
            (out / "mining.json").write_text(json.dumps(done, indent=1) + "\n")

        records = mine(clone, out, criteria=CRITERIA, shas=shas, workers=args.workers, on_done=report)
        print(f"{name}: {sum(r.task_id is not None for r in records)} task(s) from {len(records)}", flush=True)
    return 0


def snapshot_archive(tree: dict[str, bytes]) -> bytes:
    """An xz tarball of ``tree``, byte-for-byte a function of it (sorted, dated 0, owner 0)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(tree):
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(tree[rel]), 0o644, 0
            tar.addfile(info, io.BytesIO(tree[rel]))
    return lzma.compress(buffer.getvalue(), preset=9 | lzma.PRESET_EXTREME)


def pack_main(args: argparse.Namespace) -> int:
    suite = Path(args.suite)
    for mined in sorted((Path(args.work) / "mined").iterdir()):
        # only tasks a finished run reported: a folder is in place before its last validations end
        made = {r["task_id"] for report in mined.glob("mining*.json") for r in json.loads(report.read_text())}
        folders = sorted(p.parent for p in mined.glob("*/task.toml") if p.parent.name in made)
        if not folders:
            continue
        repo = REPOSITORIES[mined.name]
        clone = Path(args.clones) / mined.name
        tasks = [load_task(folder) for folder in folders]
        dates = sorted((t.metadata["date"], t.metadata["base_commit"]) for t in tasks)
        base_commit = dates[len(dates) // 2][1]
        store = suite / "_repos" / mined.name
        store.mkdir(parents=True, exist_ok=True)
        (store / "base.tar.xz").write_bytes(snapshot_archive(commit_tree(clone, base_commit)))
        shutil.copyfile(clone / repo.licence_file, store / repo.licence_file)
        (store / "SOURCE.md").write_text(
            f"# {mined.name}\n\nhttps://github.com/{repo.github} ({repo.shape}), licence {repo.licence} "
            f"({repo.licence_file} here). `base.tar.xz` is the tree at commit {base_commit}; each task's "
            "`setup.patch` turns it into the task's starting commit.\n")
        for task in tasks:
            target = suite / task.id
            hidden = task.tests_dir
            write_task(target, task_id=task.id, instruction=task.instruction, repo=task.repo,
                       fail_to_pass=task.fail_to_pass, pass_to_pass=task.pass_to_pass, hidden_tests=hidden,
                       test_command=task.test_command, protected_paths=task.protected_paths,
                       metadata=task.metadata, gold_patch=task.gold_patch,
                       base=f"../_repos/{mined.name}/base.tar.xz", overwrite=True,
                       environment=_environment(task))
        print(f"{mined.name}: {len(tasks)} task(s), base {base_commit[:10]}", flush=True)
    write_index(suite)
    return 0


def write_index(suite: Path) -> None:
    """``README.md`` of the suite: one row per task and the repositories with their licences."""
    from opencomposer.tasks.stats import task_stats

    rows, repos = [], {}
    for toml in sorted(suite.glob("*/task.toml")):
        task = load_task(toml.parent)
        stats, meta = task_stats(task), task.metadata
        repo = REPOSITORIES[toml.parent.name.rsplit("-", 1)[0]]
        repos[repo.name] = repos.get(repo.name, 0) + 1
        rows.append(f"| `{task.id}` | {meta['kind']}{' (API)' if meta.get('api_change') else ''} | {meta['date']} | "
                    f"{stats.lines_changed} | {stats.files_touched} | {stats.prompt_chars} | "
                    f"{meta['mutation_score']:.2f} | {len(task.fail_to_pass)}/{len(task.pass_to_pass)} |")
    lines = ["# realbench", "", "Generated by `python scripts/build_realbench.py pack` (docs/realbench.md).", "",
             "| repository | licence | shape | tasks |", "|---|---|---|---|"]
    lines += [f"| [{name}](https://github.com/{REPOSITORIES[name].github}) | {REPOSITORIES[name].licence} | "
              f"{REPOSITORIES[name].shape} | {count} |" for name, count in sorted(repos.items())]
    lines += ["", "| task | kind | date | gold lines | gold files | prompt chars | mutation score | F2P/P2P |",
              "|---|---|---|---|---|---|---|---|", *rows, ""]
    (suite / "README.md").write_text("\n".join(lines))


def _environment(task):
    from opencomposer.sandbox.venv import task_environment_spec

    return task_environment_spec(task)


def readme_main(args: argparse.Namespace) -> int:
    """The suite's line and medians in suites/README.md, from the packed suite."""
    import re

    from opencomposer.tasks.format import load_suite
    from opencomposer.tasks.stats import summarize, task_stats

    suite = Path(args.suite)
    tasks = load_suite(suite)
    rows = [task_stats(t) for t in tasks]
    summary = summarize(rows)
    lines, chars = summary["lines_changed"], summary["prompt_chars"]
    repos = sorted({t.id.rsplit("-", 1)[0] for t in tasks})
    kinds: dict[str, int] = {}
    for task in tasks:
        kinds[task.metadata["kind"]] = kinds.get(task.metadata["kind"], 0) + 1
    scores = sorted(r.mutation_score for r in rows)
    text = (f"Medians over all {len(rows)} tasks: **{lines.median:g} lines changed, "
            f"{summary['files_touched'].median:g} files, {chars.median:g} prompt characters** (interquartile "
            f"{lines.p25:g}-{lines.p75:g} lines, {chars.p25:g}-{chars.p75:g} characters); mutation score median "
            f"{summary['mutation_score'].median:g} (lowest {scores[0]:g}, {scores.count(1.0)} at 1.0). Kinds: "
            + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            + f"; {sum(bool(t.metadata.get('api_change')) for t in tasks)} change public names. Repositories: "
            + ", ".join(f"{r} ({sum(t.id.startswith(r + '-') for t in tasks)})" for r in repos) + ".")
    readme_path = suite.parent / "README.md"
    readme = readme_path.read_text()
    readme = re.sub(r"realbench/     \S+ tasks mined from \S+ public repositories",
                    f"realbench/     {len(rows)} tasks mined from {len(repos)} public repositories", readme)
    readme = re.sub(r"(?m)^(STATS|Medians over all \d+ tasks: \*\*.*)$", lambda _: text, readme)
    readme_path.write_text(readme)
    print(text)
    return 0


def summary_main(args: argparse.Namespace) -> int:
    rows = []
    for mined in sorted((Path(args.work) / "mined").iterdir()):
        records = [r for report in mined.glob("mining*.json") for r in json.loads(report.read_text())]
        if records:
            rows.append((mined.name, sum(bool(r["task_id"]) for r in records), len(records)))
    for name, kept, tried in rows:
        print(f"{name:16} {kept:3d} / {tried}")
    print("total", sum(r[1] for r in rows), "median kept", statistics.median([r[1] for r in rows]) if rows else 0)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    m = sub.add_parser("mine")
    m.add_argument("repos", nargs="+", choices=sorted(REPOSITORIES))
    m.add_argument("--candidates", type=int, default=12)
    m.add_argument("--workers", type=int, default=1)
    for p in (m, sub.add_parser("pack"), sub.add_parser("summary"), sub.add_parser("readme")):
        p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "realbench"))
        p.add_argument("--clones", default=str(Path(tempfile.gettempdir()) / "realbench" / "clones"))
        p.add_argument("--mirror", default="/work/.mirror")
        p.add_argument("--suite", default=str(SUITE))
    args = parser.parse_args(argv)
    return {"mine": mine_main, "pack": pack_main, "summary": summary_main, "readme": readme_main}[args.step](args)


if __name__ == "__main__":
    sys.exit(main())

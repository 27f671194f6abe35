"""Handlers of ``opencomposer tasks ...``: check, import, export, generate, mine, measure and validate
suites. ``--workers`` is a shorthand for ``--set tasks.workers=N`` (declared in ``cli.py``).

The long ones (generate, mine, validate) show the shared ``ProgressBar``: a bar on a terminal, one
line per finished item in a log. The library functions report each item through ``on_done``; the
display is the command's. A suite, repository or output folder that is not there, and the
library's bad-input errors, are reported by ``cli.main`` as one line and exit 2."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from opencomposer.config import load_recipe
from opencomposer.tasks.format import load_suite
from opencomposer.training.progress import ProgressBar


def check_main(args: argparse.Namespace) -> int:
    tasks = load_suite(args.suite)
    for task in tasks:
        print(f"{task.id}: {len(task.fail_to_pass)} fail->pass, {len(task.pass_to_pass)} pass->pass, "
              f"gold patch: {'yes' if task.gold_patch else 'no'}")
    print(f"{len(tasks)} task(s) OK")
    return 0


def import_main(args: argparse.Namespace) -> int:
    from opencomposer.sandbox.venv import EnvironmentSpec, parse_environment
    from opencomposer.tasks import importers

    out = Path(args.out)
    try:
        base: EnvironmentSpec | None = None
        find_links, python = getattr(args, "find_links", []), getattr(args, "python", None)
        if find_links or python:
            links = [str(Path(f).resolve()) for f in find_links]
            base = parse_environment({"find_links": links, **({"python": python} if python else {})})
        if args.format == "humaneval":
            tasks = importers.import_humaneval(out, limit=args.limit, overwrite=args.overwrite)
        elif args.format == "swebench":
            if not args.repo or not args.source:
                print("opencomposer tasks import swebench: SOURCE and --repo CHECKOUT are required", file=sys.stderr)
                return 2
            tasks = importers.import_swebench(args.source, Path(args.repo), out, overwrite=args.overwrite,
                                              environment=base)
        else:
            config = load_recipe(args.recipe, args.overrides)
            tasks = importers.import_harbor(Path(args.source), out, config.sandbox,
                                            run_solutions=not args.no_solutions, overwrite=args.overwrite,
                                            environment=base)
    except FileNotFoundError as e:  # a Harbor source: a path, or not, by the format
        print(f"opencomposer tasks import: {e.filename}: no such file or folder", file=sys.stderr)
        return 2
    except FileExistsError as e:  # a task folder made before, without --overwrite
        print(f"opencomposer tasks import: {e}", file=sys.stderr)
        return 2
    print(f"imported {len(tasks)} task(s) into {out}")
    return 0


def export_main(args: argparse.Namespace) -> int:
    from opencomposer.tasks import exporters

    try:
        if args.format == "harbor":
            tasks = load_suite(args.source)
            for task in tasks:
                exporters.export_harbor(task, Path(args.out) / task.id)
            print(f"exported {len(tasks)} task(s) to {args.out}")
        else:
            count = exporters.export_swebench_predictions(Path(args.source), Path(args.out), args.model_name,
                                                         args.policy)
            print(f"wrote {count} prediction(s) to {args.out}")
    except (FileExistsError, ValueError) as e:  # a folder that is there already; predictions that are not
        print(f"opencomposer tasks export: {e}", file=sys.stderr)
        return 2
    return 0


def generate_main(args: argparse.Namespace) -> int:
    from opencomposer.tasks.generators.registry import TaskFactory, generate
    from opencomposer.tasks.generators.source import load_source

    config = load_recipe(args.recipe, args.overrides)
    out = Path(args.out)
    if args.count < 1:
        print(f"opencomposer tasks generate: --count must be >= 1, got {args.count}", file=sys.stderr)
        return 2
    if args.kind == "tiny":
        from opencomposer.tasks.generators.tiny import write_tiny_suite

        tasks = write_tiny_suite(out, args.count, seed=args.seed, split=args.split, sandbox=config.sandbox)
        print(f"{len(tasks)} tiny task(s) in {out}")
        return 0
    sources = [load_source(Path(s)) for s in args.source] if args.source else None
    factory = TaskFactory(args.kind, seed=args.seed, split=args.split, config=config.tasks,
                          sandbox=config.sandbox, sources=sources)
    started = time.monotonic()
    made = rejected = 0
    with ProgressBar(f"{factory.kind}/{factory.split}", args.count, status="{item}  rejected {rejected}") as bar:
        def on_done(result) -> None:
            nonlocal made, rejected
            made += result.task is not None
            rejected += sum(bool(a.reason) for a in result.attempts)
            bar.update(made, item=result.task.id if result.task else f"index {result.index}: no task",
                       rejected=rejected)

        results = generate(factory, args.count, out, start=args.start, workers=config.tasks.workers,
                           on_done=on_done)
    made = [r for r in results if r.task is not None]
    failed = [r for r in results if r.task is None]
    minutes = (time.monotonic() - started) / 60
    print(f"{len(made)} verified task(s) in {out} ({len(made) / max(minutes, 1e-9):.1f} per minute); "
          f"{sum(len(r.attempts) - 1 for r in made) + sum(len(r.attempts) for r in failed)} candidate(s) "
          f"rejected; report: {out / 'generation.json'}")
    for result in failed:
        print(f"  index {result.index}: no task after {len(result.attempts)} attempt(s); last: "
              f"{result.attempts[-1].reason if result.attempts else '-'}", file=sys.stderr)
    return 0 if len(made) == args.count else 1


def mine_main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from opencomposer.tasks.mining import Criteria, commits_to_mine, mine

    config = load_recipe(args.recipe, args.overrides)
    criteria = Criteria.benchmark() if args.benchmark else Criteria()
    for name in ("min_files", "min_lines"):
        value = getattr(args, name)
        if value is not None:
            if value < 0:
                print(f"opencomposer tasks mine: --{name.replace('_', '-')} {value}: must be >= 0", file=sys.stderr)
                return 2
            criteria = dataclasses.replace(criteria, **{name: value})
    total = len(commits_to_mine(Path(args.repo), args.rev, args.limit, criteria.merges))
    done = kept = 0
    with ProgressBar("mine", total, status="{sha} {outcome}  tasks {kept}") as bar:
        def on_done(record) -> None:
            nonlocal done, kept
            done += 1
            kept += record.task_id is not None
            bar.update(done, sha=record.sha[:10], outcome=record.task_id or f"(no task: {record.reason})",
                       kept=kept)

        records = mine(args.repo, args.out, rev=args.rev, limit=args.limit, test_command=args.test_command,
                       config=config.tasks, sandbox=config.sandbox, workers=config.tasks.workers, on_done=on_done,
                       criteria=criteria)
    table = Table()
    for column in ("commit", "subject", "task / why not"):
        table.add_column(column)
    for record in records:
        outcome = f"[green]{record.task_id}[/] ({len(record.fail_to_pass)} fail->pass)" if record.task_id \
            else f"[yellow]{record.reason}[/]"
        table.add_row(record.sha[:10], record.subject[:60], outcome)
    Console().print(table)
    # the count on a line of its own: a table title wraps with the table's width
    print(f"{args.repo}: {sum(r.task_id is not None for r in records)} task(s) from {len(records)} commit(s)")
    print(f"report: {Path(args.out) / 'mining.json'}")
    return 0


def stats_main(args: argparse.Namespace) -> int:
    """Print the table, write the PNG. ``args.suite`` is one folder or several (side by side)."""
    from rich.console import Console

    from opencomposer.tasks.stats import compare_table, plot, stats_table, summarize, task_stats

    folders = [Path(s) for s in (args.suite if isinstance(args.suite, list) else [args.suite])]
    suites = {folder.resolve().name: [task_stats(t) for t in load_suite(folder)] for folder in folders}
    name = "-vs-".join(suites)
    png = Path(args.png) if args.png else load_recipe(args.recipe, args.overrides).run.path / "stats" / f"{name}.png"
    console = Console(width=max(Console().width, 110))  # never wrap a row
    if len(suites) == 1:
        rows = next(iter(suites.values()))
        title = f"{name}: {len(rows)} tasks"
        console.print(stats_table(summarize(rows), title))
        print(f"histogram: {plot(rows, png, title)}")
    else:
        title = ", ".join(f"{n} ({len(r)} tasks)" for n, r in suites.items())
        console.print(compare_table({n: summarize(r) for n, r in suites.items()}))
        print(f"histograms: {plot(suites, png, title)}")
    for suite_name, rows in suites.items():
        scores = sorted(r.mutation_score for r in rows if r.mutation_score is not None)
        if scores:
            bands = [sum(low <= x < high for x in scores) for low, high in ((0, 0.5), (0.5, 0.75), (0.75, 1.0))]
            print(f"{suite_name}: mutation score of {len(scores)} task(s): median {summarize(rows)['mutation_score'].median:g}"
                  f", min {scores[0]:g}; <0.5: {bands[0]}, 0.5-0.75: {bands[1]}, 0.75-1: {bands[2]}, "
                  f"1.0: {scores.count(1.0)}")
    return 0


def validate_main(args: argparse.Namespace) -> int:
    """Exit 1 when a task drifted."""
    from opencomposer.config import GradingConfig
    from opencomposer.tasks.validation import validate_suite

    config = load_recipe(args.recipe, args.overrides)
    tasks = load_suite(Path(args.suite))
    grading = GradingConfig(lint=False, timeout_s=config.grading.timeout_s,
                            per_test_timeout_s=config.grading.per_test_timeout_s)
    done = drifted_so_far = 0
    with ProgressBar("validate", len(tasks), status="{task} {verdict}  drifted {drifted}") as bar:
        def on_done(check) -> None:
            nonlocal done, drifted_so_far
            done += 1
            drifted_so_far += check.drifted
            bar.update(done, task=check.task_id, verdict="drifted" if check.drifted else "holds",
                       drifted=drifted_so_far)

        checks = validate_suite(tasks, config.sandbox, grading, workers=config.tasks.workers, on_done=on_done)
    drifted = [c for c in checks if c.drifted]
    if drifted:
        print(f"{len(drifted)} of {len(checks)} task(s) drifted:")
        for check in drifted:
            for problem in check.problems:
                print(f"  {check.task_id}: {problem}")
        return 1
    print(f"all {len(checks)} task(s) hold: gold resolves, the untouched repository does not")
    return 0


def build_env_main(args: argparse.Namespace) -> int:
    """Build the ``[environment]`` of every task under ``args.suite`` (once per distinct
    environment). Exit 1 when a build failed (its log is named)."""
    from opencomposer.sandbox.venv import (
        EnvironmentBuildError,
        EnvironmentSpecError,
        build_environment,
        resolve_environment,
        task_environment_spec,
    )

    config = load_recipe(args.recipe, args.overrides)
    tasks = load_suite(Path(args.suite))
    groups: dict[str, list] = {}  # environment key -> (resolved, [task, ...])
    failed = 0
    for task in tasks:
        spec = task_environment_spec(task)
        if spec is None:
            continue
        try:
            resolved = resolve_environment(spec, task.repo, task.path)
        except EnvironmentSpecError as e:
            print(f"  {task.id}: {e}", file=sys.stderr)
            failed += 1
            continue
        groups.setdefault(resolved.key, [resolved, []])[1].append(task)
    if not groups and not failed:
        print(f"none of the {len(tasks)} task(s) has an [environment]; they run on opencomposer's Python")
        return 0
    with ProgressBar("build-env", len(groups), status="{key} {outcome}") as bar:
        for done, (key, (resolved, members)) in enumerate(groups.items(), 1):
            try:
                built = build_environment(resolved, members[0].repo, config.sandbox)
                outcome = f"{'built' if built.built else 'cached'} in {built.seconds:.1f} s"
                lines = [f"{key}: {outcome}, {len(members)} task(s) ({members[0].id}"
                         + (", ..." if len(members) > 1 else "") + f"); python {built.manifest.get('python')}"]
                if built.manifest.get("note"):
                    lines.append(f"  note: {built.manifest['note']}")
            except EnvironmentBuildError as e:
                failed += 1
                outcome = "FAILED"
                lines = [f"{key}: FAILED for {len(members)} task(s) ({members[0].id}, ...): {e}"]
            bar.update(done, key=key[:12], outcome=outcome)
            for line in lines:
                print(line, file=sys.stderr if outcome == "FAILED" else sys.stdout)
    print(f"{len(groups)} environment(s) for {sum(len(m) for _, m in groups.values())} task(s); "
          f"{failed} failed")
    return 1 if failed else 0

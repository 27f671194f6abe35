"""``opencomposer ablate``: a grid of RL runs of one recipe, over seeds, with intervals (docs/ablations.md).

The grid is the cartesian product of the varied keys' values (``[ablation] vary`` extended by
``--vary KEY=V1,V2``), each crossed with the cells ``[ablation] cells`` lists (a study that is not a
product), times ``ablation.seeds`` (each given to ``run.seed``). Every cell and seed
is an ordinary RL run folder, ``{out}/cells/{KEY=VALUE,...}/seed-{S}``, run as ``opencomposer rl``
runs it; ``{out}/ablation.json`` records each one (its overrides, seed, folder, status and final
metrics) and is rewritten after each, and ``{out}/report.html`` shows the table and the curves
(``bench.ablation``).

**Resumable.** A run whose ``summary.json`` says it reached ``rl.steps`` is finished and never
run again; any other resumes through the RL run's own resume (its newest checkpoint). So a study
killed half way continues where it stopped when the same command runs again.

**Prefix.** With ``ablation.prefix = "sft"`` the recipe's SFT stage runs first and RL starts from
its checkpoint; with ``"pretrain_sft"`` pretraining runs before it and SFT starts from the
pretrained checkpoint (the quickstart's chain). When every varied key is an ``rl.*`` key the
prefix does not depend on the cell, and it runs once per seed, under ``{out}/shared/``
(``seed-{S}-pretrain/``, ``seed-{S}-sft/``), for every cell of that seed; otherwise each cell has
its own, beside its runs (``{out}/cells/{cell}/seed-{S}-sft``). A finished stage (its final
checkpoint folder exists) is never recomputed.

**Backends.** ``local`` runs the jobs one after another in this process (a line per job in a log,
a bar on a terminal); ``ray`` hands them to a Ray cluster as tasks (``services.ray_backend.map_tasks``),
the shared prefixes first, then the cells.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from opencomposer.bench.ablation import CellRun, final_metrics, format_table, table, table_note, write_report
from opencomposer.config import AblationConfig, Config, ConfigError, load_recipe, to_toml
from opencomposer.config.ablation import cell_name, parse_cell, parse_vary
from opencomposer.config.paths import check_recipe_paths
from opencomposer.io import atomic_write_text

if TYPE_CHECKING:  # imports torch, which the command line loads only when a command runs
    from opencomposer.distributed.runtime import World


@dataclass
class Job:
    """What one task of the study runs, each stage skipped when it is done: pretraining
    (``pretrain``: its run folder has its final ``checkpoint/``), SFT (``sft``: its checkpoint
    folder exists), then RL (``rl``: ``finished``); any may be None. ``run``: the index of the
    ``CellRun`` it fills, None for a shared prefix."""

    pretrain: Config | None
    sft: Config | None
    rl: Config | None
    run: int | None = None


def study_config(config: Config, cli_vary: list[str], cli_cells: list[str] = ()) -> AblationConfig:
    """The recipe's ``[ablation]`` with ``--vary`` items added: one for a key the section already
    varies replaces its values, the others come after the section's; ``--cell`` items come after
    the section's cells."""
    section = config.ablation
    cli = {parse_vary(item)[0]: item for item in cli_vary}
    kept = [item for item in section.vary if parse_vary(item)[0] not in cli]
    study = replace(section, vary=[*kept, *cli.values()], cells=[*section.cells, *cli_cells])
    study.validate()
    return study


def check_values(recipe: str | None, overrides: list[str], study: AblationConfig) -> None:
    """Each varied value alone on the recipe, and each listed cell, so that a bad key or value is
    named as given."""
    for item in study.vary:
        key, values = parse_vary(item)
        for value in values:
            try:
                load_recipe(recipe, [*overrides, f"{key}={value}"])
            except ConfigError as e:
                raise ConfigError(f"--vary {key}={value}: {e}") from None
    for item in study.cells:
        try:
            load_recipe(recipe, [*overrides, *(f"{k}={v}" for k, v in parse_cell(item).items())])
        except ConfigError as e:
            raise ConfigError(f"ablation.cells {item}: {e}") from None
    from opencomposer.rl.tasks import check_family_length

    for cell in study.grid():  # each cell's RL fits its task pool (single epoch), before any prefix runs
        try:
            check_family_length(load_recipe(recipe, [*overrides, *(f"{k}={v}" for k, v in cell.items())]))
        except ConfigError as e:
            raise ConfigError(f"cell {cell_name(cell) or '(the recipe)'}: {e}") from None


def out_dir(config: Config, study: AblationConfig) -> Path:
    return Path(study.out) if study.out else Path(config.run.out_dir) / f"{config.run.name}-ablation"


def prefix_stages(config: Config, prefix: str, parent: Path, seed: int) -> tuple[Config | None, Config]:
    """The prefix stages of ``config`` (a recipe with its seed) in folder ``parent``: pretraining
    in ``{parent}/seed-{seed}-pretrain`` (for "pretrain_sft"), then SFT into ``{parent}/seed-{seed}-sft``,
    from the pretrained checkpoint when there is one (the quickstart's chain)."""
    sft = replace(config.sft, out=str(parent / f"seed-{seed}-sft"))
    pretrain = None
    if prefix == "pretrain_sft":
        pretrain = replace(config, run=replace(config.run, out_dir=str(parent), name=f"seed-{seed}-pretrain"))
        sft = replace(sft, init=str(pretrain.run.path / "checkpoint"))
    elif sft.init:
        check_recipe_paths(config, {"sft.init": "input"})
    return pretrain, replace(config, sft=sft)


def after_prefix(config: Config, prefix: str, sft_out: str) -> Config:
    """The RL recipe of a run whose prefix wrote its SFT checkpoint to ``sft_out``: RL starts there
    (and, after pretraining, takes the SFT task family when it names none, as the quickstart does)."""
    config = replace(config, model=replace(config.model, path=sft_out))
    if prefix == "pretrain_sft":
        config = replace(config, model=replace(config.model, kind="hf"),
                         rl=replace(config.rl, task_family=config.rl.task_family or config.sft.task_family))
    return config


def plan(recipe: str | None, overrides: list[str], study: AblationConfig, out: Path) -> tuple[list[CellRun], list[Job]]:
    """Every cell and seed as a ``CellRun`` and the jobs that produce them: the shared prefixes
    first (one per seed), then one job per run."""
    shared = study.prefix != "none" and all(key.startswith("rl.") for key in study.keys())
    runs, jobs, shared_jobs = [], [], {}
    names: dict[str, dict[str, str]] = {}
    for cell in study.grid():
        name = cell_name(cell)
        if names.setdefault(name, cell) != cell:
            raise ConfigError(f"ablation: cells {names[name]} and {cell} would share the folder {name}")
        for seed in study.seeds:
            where = [f"run.out_dir={out / 'cells' / name}", f"run.name=seed-{seed}", f"run.seed={seed}"]
            config = load_recipe(recipe, [*overrides, *(f"{k}={v}" for k, v in cell.items()), *where])
            config = replace(config, ablation=AblationConfig())  # each run's recipe is an ordinary one
            pretrain = sft = None
            if shared:
                if seed not in shared_jobs:  # one prefix per seed, from the recipe without the cell's values
                    base = load_recipe(recipe, [*overrides, f"run.seed={seed}"])
                    shared_jobs[seed] = Job(*prefix_stages(replace(base, ablation=AblationConfig()), study.prefix,
                                                           out / "shared", seed), None)
                config = after_prefix(config, study.prefix, shared_jobs[seed].sft.sft.out)
            elif study.prefix != "none":
                pretrain, sft = prefix_stages(config, study.prefix, out / "cells" / name, seed)
                config = after_prefix(config, study.prefix, sft.sft.out)
            elif config.model.path:
                check_recipe_paths(config, {"model.path": "input"})
            runs.append(CellRun(name, cell, seed, str(config.run.path)))
            jobs.append(Job(pretrain, sft, config, len(runs) - 1))
    return runs, [*shared_jobs.values(), *jobs]


def to_run(job: Job) -> bool:
    """Whether some stage of ``job`` is not done yet."""
    return ((job.pretrain is not None and not (job.pretrain.run.path / "checkpoint").is_dir())
            or (job.sft is not None and not Path(job.sft.sft.out).is_dir())
            or (job.rl is not None and not finished(job.rl)))


def finished(config: Config) -> bool:
    """Whether the RL run of ``config`` reached its last step (its ``summary.json`` says so)."""
    path = config.run.path / "summary.json"
    try:
        return json.loads(path.read_text())["steps"] >= config.rl.steps
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _rl_worker(world: World, config: Config) -> None:
    from opencomposer.commands.rl import rollout_source
    from opencomposer.rl.loop import follow_rl, run_rl

    if not world.main:
        follow_rl(config, world)
        return
    run_rl(config, progress=False, source=rollout_source(config), world=world)


def _pretrain_worker(world: World, config: Config) -> None:
    from opencomposer.pretrain.phases import run_phases

    run_phases(config, progress=False, world=world)


def _sft_worker(world: World, config: Config) -> None:
    from opencomposer.pretrain.sft import run_sft

    run_sft(config, progress=False, world=world)


def run_job(job: Job) -> None:
    """Run the stages of ``job`` that are not done yet, in this process (or a Ray worker's)."""
    from opencomposer.distributed.runtime import launch

    if job.pretrain is not None and not (job.pretrain.run.path / "checkpoint").is_dir():
        launch(_pretrain_worker, job.pretrain)
    if job.sft is not None and not Path(job.sft.sft.out).is_dir():
        launch(_sft_worker, job.sft)
    if job.rl is not None and not finished(job.rl):
        launch(_rl_worker, job.rl)


def _record(out: Path, study: AblationConfig, runs: list[CellRun]) -> None:
    header, rows = table(runs, study.metrics)
    atomic_write_text(out / "ablation.json", json.dumps({
        "vary": study.vary, "listed_cells": study.cells, "seeds": study.seeds, "metrics": study.metrics,
        "cells": [asdict(run) for run in runs],
        "table": {"header": header, "rows": rows, "note": table_note(runs)},
    }, indent=1) + "\n")


def _finish(job: Job, runs: list[CellRun], study: AblationConfig, error: BaseException | None) -> str:
    """Fill the job's ``CellRun`` from its folder (or its error); the progress line's text."""
    if job.run is None:
        return f"shared prefix of seed {job.sft.run.seed}" + (f": failed: {error}" if error else "")
    run = runs[job.run]
    if error is not None:
        run.status, run.error = "failed", f"{type(error).__name__}: {error}".splitlines()[0]
        return f"{run.cell} seed {run.seed}: failed: {run.error}"
    run.status, run.error = "finished", ""
    run.metrics = final_metrics(Path(run.run_dir), study.metrics)
    shown = ", ".join(f"{metric} {value:.3f}" for metric, value in run.metrics.items())
    return f"{run.cell} seed {run.seed}: {shown}"


def run_study(config: Config, study: AblationConfig, runs: list[CellRun], jobs: list[Job], out: Path) -> None:
    from opencomposer.training.progress import ProgressBar

    pending = [job for job in jobs if to_run(job)]
    for job in jobs:
        if job.run is not None and not to_run(job):
            _finish(job, runs, study, None)
    _record(out, study, runs)
    print(f"{len(runs)} runs ({len(study.grid())} cells x {len(study.seeds)} seeds) in {out}; "
          f"{len(runs) - sum(job.run is not None for job in pending)} finished already, "
          f"{len(pending)} jobs to run on the {study.backend} backend", flush=True)
    failures = []
    with ProgressBar("ablate", len(pending), status="{line}") as bar:
        def done(count: int, job: Job, error: BaseException | None) -> None:
            if error is not None and not isinstance(error, Exception):
                raise error  # KeyboardInterrupt and the like: the study resumes where it stopped
            if error is not None:
                failures.append(job)
            line = _finish(job, runs, study, error)
            _record(out, study, runs)
            bar.update(count, line=line)

        if study.backend == "ray":
            from opencomposer.services.ray_backend import map_tasks

            stages = [[job for job in pending if job.run is None], [job for job in pending if job.run is not None]]
            ended = map_tasks(config, run_job, stages, study.ray_cpus_per_cell)
            for count, (stage, index, error) in enumerate(ended, 1):
                done(count, stages[stage][index], error)
        else:
            for count, job in enumerate(pending, 1):
                try:
                    run_job(job)
                    error = None
                except Exception as e:  # recorded as the run's status; the other runs go on
                    error = e
                done(count, job, error)
    if failures:
        print(f"{len(failures)} of {len(pending)} jobs failed; the study resumes them when run again", flush=True)


def main(args: argparse.Namespace) -> int:
    config = load_recipe(args.recipe, args.overrides)
    study = study_config(config, args.vary, args.cell)
    check_values(args.recipe, args.overrides, study)
    out = out_dir(config, study)
    runs, jobs = plan(args.recipe, args.overrides, study, out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "study.toml", to_toml(replace(config, ablation=study)))
    started = time.perf_counter()
    run_study(config, study, runs, jobs, out)
    header, rows = table(runs, study.metrics)
    print(format_table(header, rows))
    print(table_note(runs))
    page = write_report(out, runs, study.metrics, f"opencomposer ablate: {out}", to_toml(replace(config, ablation=study)))
    print(f"ablation.json: {out / 'ablation.json'}\nreport: {page}\ndone in {time.perf_counter() - started:.0f} s")
    return 0 if all(run.status == "finished" for run in runs) else 1


"""``opencomposer rl``: the RL run (docs/recipe.md §4; docs/architecture.md, "Data flow").

One step: take the groups of the next step from the run's rollout source (B tasks of the stream,
G episodes each, rolled out in the real harness: sandboxes, agent loop, grading), score them
(reference forward, KL penalty, named-term reward, group advantages), take one Adam step,
checkpoint when due, and publish the new weights as policy version ``step``. Every
``rl.eval_every`` steps (and before the first, and after the last) the held-out suite is
evaluated on a fixed seed set.

**Rollout sources** (``protocols.RolloutSource``): ``rl.sync.SyncRollouts`` samples a step's
groups with the weights of the step before and waits for them (the synchronous loop);
``services.async_rl.AsyncRollouts`` runs the asynchronous services, sampling up to
``rl.max_staleness`` versions ahead. ``RLRun`` is the same for both: the task stream, scoring,
training, the exactly-once record, checkpoints, logs and the summary. The command layer picks the
source (``commands.rl``); ``run_rl`` takes the synchronous one unless given another.

**Parallelism** (``trainer.world_size > 1``, ``parallel.cp``/``ep``) is the ``world`` the run is
given (``distributed.runtime.World``): rank 0 runs ``RLRun`` with the policy sharded by its
``Trainer``; where a whole policy is needed (the sampler, the published weights, a checkpoint) it
comes from ``Trainer.full_model``, gathered from the shards, so a checkpoint has the same layout at
every world size. The other ranks run ``follow_rl``: load the policy rank 0 starts from (it
broadcasts the folder), shard it, and train their share of each step until rank 0's ``stop``.

Resuming: ``opencomposer rl`` on a run folder that has checkpoints continues from the newest one.
The steps after it are replayed from the same stream position with the same episode seeds; logs
(``metrics.jsonl``, TensorBoard) are cut back to the checkpoint first.

Outputs under ``{run.out_dir}/{run.name}``: ``recipe.toml``, ``initial/`` (the starting policy,
also the KL reference), ``checkpoints/``, ``metrics.jsonl``, ``tb/`` (TensorBoard),
``rollouts/step-NNNNNN.jsonl`` (one line per episode; a diff the hack monitor flagged is kept there
with its reasons, for ``report.html``), ``summary.json``, ``cost.json`` (``training.cost``: tokens,
FLOPs, time, memory; written at each checkpoint and at the end, a resume adding to it) and
``report.html`` with its cost table. ``opencomposer report RUN`` draws the curves.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from opencomposer.config import Config, ConfigError, ModelConfig, to_toml
from opencomposer.config.rl import uncorrected_staleness
from opencomposer.distributed.runtime import World, current_world
from opencomposer.io import atomic_directory, atomic_write_text
from opencomposer.model.device import apply_run_settings, resolve_device
from opencomposer.numerics.convert import convert_model
from opencomposer.protocols import RolloutSource
from opencomposer.rl.checkpoint import (
    RunState,
    TaskRecord,
    latest_checkpoint,
    load_training_checkpoint,
    remove_partial,
    save_training_checkpoint,
)
from opencomposer.rl.report import hack_record, write_run_page
from opencomposer.rl.rollouts import infrastructure_down
from opencomposer.rl.tasks import Draw
from opencomposer.training.cost import CostMeter
from opencomposer.training.metrics import MetricsLog, read_metrics
from opencomposer.training.progress import ProgressBar
from opencomposer.types import Group, InfrastructureDown


def lock_run_folder(run_dir: Path):
    """An exclusive lock on ``{run}/.lock`` for as long as the returned file stays open, so that two
    processes never train (and checkpoint) into one run folder. The kernel drops it when the holder
    dies, so a killed run never blocks its own resume."""
    import fcntl

    handle = (run_dir / ".lock").open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RuntimeError(f"{run_dir} is in use by another `opencomposer rl` process (it holds {run_dir / '.lock'})") from None
    return handle


@dataclass
class RLSummary:
    steps: int
    seconds: float
    evaluations: list[dict[str, float]]  # each with its "step"
    run_dir: Path

    @property
    def first_eval(self) -> dict[str, float] | None:
        return self.evaluations[0] if self.evaluations else None

    @property
    def last_eval(self) -> dict[str, float] | None:
        return self.evaluations[-1] if self.evaluations else None


def _load_folder(path: Path, config: Config) -> tuple[torch.nn.Module, Any]:
    from opencomposer.model.loading import load_model

    spec = ModelConfig(kind="hf", path=str(path), dtype=config.model.dtype)
    return load_model(spec, device=resolve_device(config.run.device))


class RLRun:
    """One ``opencomposer rl`` run: set up (fresh or resumed), open ``source``, then ``run()`` the
    steps. ``world``: this process's place in the trainer's group (the launched group's when None)."""

    def __init__(self, config: Config, source: RolloutSource, *, world: World | None = None, progress: bool = True):
        self.config = config
        self.rl = config.rl
        self.source = source
        self.world = world if world is not None else current_world()
        self.progress = progress
        self.run_dir = config.run.path
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock = lock_run_folder(self.run_dir)  # held until run() returns (or setup fails)
        try:
            self._setup(config)
            source.open(self)
        except BaseException:
            source.close()
            self._lock.close()
            raise

    def _setup(self, config: Config) -> None:
        from opencomposer.rl.tasks import TaskStream, heldout_tasks

        apply_run_settings(config.run)
        remove_partial(self.run_dir)
        self.stream = TaskStream(config, self.run_dir)
        self.stream.check_length(self.rl.steps * self.rl.batch_tasks)
        self.heldout = heldout_tasks(config, self.run_dir) if self.rl.eval_every else []
        checkpoint = latest_checkpoint(self.run_dir)
        self.resumed_from = checkpoint
        initial = self._initial_policy()
        start = self.world.broadcast(str(checkpoint / "model" if checkpoint else initial))  # to follow_rl
        self.model, self.tokenizer = _load_folder(Path(start), config)
        # [numerics]: the policy trains, and the reference scores, in the recipe's format; the
        # sampler copies the converted policy (rl.rollouts.make_sampler)
        convert_model(self.model, config.numerics)
        reference = None
        if self.rl.kl.reference == "initial":
            from opencomposer.rl.trainer import frozen_copy

            reference = _load_folder(initial, config)[0]
            convert_model(reference, config.numerics)
            reference = frozen_copy(reference)
        from opencomposer.rl.trainer import Trainer

        caveat = uncorrected_staleness(self.rl)
        if caveat:  # RLRun is rank 0's
            warnings.warn(caveat, UserWarning, stacklevel=2)
        self.cost = CostMeter("rl", config.run, self.model, devices=self.world.size)  # before the trainer shards it
        if checkpoint is not None:
            self.cost.resume(self.run_dir)
        if self.rl.task_pass_rate_band:  # before the trainer shards the policy
            self._screen(initial, checkpoint is not None)
        self.trainer = Trainer(self.model, self.tokenizer, config, reference=reference, world=self.world)
        self.state = RunState()
        if checkpoint is not None:
            self.state, trainer_state = load_training_checkpoint(checkpoint)
            self.trainer.load_state_dict(trainer_state, checkpoint / "optimizer")
            self.stream.load_state_dict(self.state.sampling, self.state.cursor)
            self._check_stream_matches_record(checkpoint)
        atomic_write_text(self.run_dir / "recipe.toml", to_toml(config))
        from opencomposer.grading.grade import GradeCache, grade

        self.grades = GradeCache() if config.grading.cache else None
        self.grader = self.grades.grade if self.grades else grade
        self.log = MetricsLog(self.run_dir, self.state.step if checkpoint else None, trackers=config.run.trackers,
                              recipe=to_toml(config), name=config.run.name)
        self.evaluations = read_metrics(self.log.path, kind="eval") if checkpoint else []

    def _screen(self, initial: Path, resumed: bool) -> None:
        """``rl.task_pass_rate_band``: screen the pool with the policy RL starts from (on a resume,
        ``initial`` loaded again, only if a task is left to screen), keep the tasks inside the band (``rl.screening``), and check
        again that the kept ones feed every step."""
        from opencomposer.rl.screening import screen_pool

        def policy() -> torch.nn.Module:
            if not resumed:
                return self.model
            model = _load_folder(initial, self.config)[0]
            convert_model(model, self.config.numerics)
            return model

        screen_pool(self.stream, self.config, self.run_dir, policy, self.tokenizer, resumed=resumed,
                    progress=self.progress, observe=lambda groups: [self.cost.episode(e) for g in groups
                                                                    for e in g.episodes])
        self.stream.check_length(self.rl.steps * self.rl.batch_tasks)

    def _check_stream_matches_record(self, checkpoint: Path) -> None:
        """Refuse to resume when the recipe now yields another task stream than the one the
        checkpoint's record was trained on (a changed seed, batch size or task folder would
        otherwise break exactly-once silently): every recorded position must hold the same task,
        and every step but the last must have trained (or dropped) exactly ``rl.batch_tasks`` of
        them (groups dropped as stale before training come on top; the last step of a stream may
        be short)."""
        state, batch = self.state, self.rl.batch_tasks
        problem = None
        for record in state.trained:
            task_id = self.stream.task(record.index).id if record.index < self.stream.size else None
            if task_id != record.task_id:
                problem = f"stream position {record.index} held task {record.task_id!r} then and holds {task_id!r} now"
                break
        per_step = Counter(r.step for r in state.trained if not r.reason.startswith("stale"))
        for step in range(1, state.step + 1):
            if problem is None and (per_step[step] > batch or (per_step[step] < batch and step < state.step)):
                problem = f"its step {step} trained {per_step[step]} tasks, not rl.batch_tasks = {batch}"
        if problem:
            raise ConfigError(
                f"cannot resume {checkpoint}: {problem}. The recipe's task stream changed (run.seed, "
                "rl.batch_tasks, rl.train_tasks or rl.task_family); restore it, or start a new run folder"
            )

    def _initial_policy(self) -> Path:
        """``{run}/initial``: the policy RL starts from (and the KL reference), saved once."""
        from opencomposer.model.loading import load_model, save_checkpoint

        initial = self.run_dir / "initial"
        if not (initial / "config.json").is_file():
            model, tokenizer = load_model(self.config.model, seed=self.config.run.seed)
            atomic_directory(initial, lambda folder: save_checkpoint(model, tokenizer, folder))
        return initial

    # ------------------------------------------------------------------------------------------
    def run(self) -> RLSummary:
        started = time.perf_counter()
        try:
            with ProgressBar("rl", self.rl.steps, status="reward {reward:.3f}  resolved {passed:.2f}",
                             completed=self.state.step, enabled=self.progress) as bar:
                self._evaluate_owed()
                while self.state.step < self.rl.steps:
                    metrics = self.step()
                    bar.update(self.state.step, reward=metrics.get("reward_mean", float("nan")),
                               passed=metrics.get("resolved_rate", float("nan")))
                    if self.state.step % self.rl.checkpoint_every == 0 or self.state.step == self.rl.steps:
                        self.checkpoint()
                    self.source.publish(self.state.step)  # after its checkpoint (services.async_rl)
                    if self._eval_due(self.state.step):
                        self.source.evaluate(self.state.step)
                    self._log_evaluations(wait=False)
                self._log_evaluations(wait=True)
        finally:
            self.source.close()
            self.log.close()
            self._lock.close()
        self.trainer.stop()  # only on success: after a failure rank 0 exits and the launcher ends the rest
        self.cost.write(self.run_dir)
        write_run_page(self.run_dir)
        return self._summary(time.perf_counter() - started)

    def _summary(self, seconds: float) -> RLSummary:
        self.evaluations.sort(key=lambda row: row["step"])
        summary = RLSummary(self.state.step, seconds, self.evaluations, self.run_dir)
        final = latest_checkpoint(self.run_dir)
        atomic_write_text(self.run_dir / "summary.json", json.dumps({
            "steps": summary.steps, "evaluations": summary.evaluations, "mode": self.rl.mode,
            "final_model": str(final / "model") if final else None,
        }, indent=1) + "\n")
        return summary

    def _eval_due(self, step: int) -> bool:
        every = self.rl.eval_every
        return bool(every) and bool(self.heldout) and (step % every == 0 or step == self.rl.steps)

    def _evaluate_owed(self) -> None:
        """Evaluations due at versions the source can still evaluate that no logged row holds (the
        first one on a fresh run; any a crash cut short on a resume)."""
        logged = {row["step"] for row in self.evaluations}
        for version in self.source.versions():
            if version <= self.state.step and self._eval_due(version) and version not in logged:
                self.source.evaluate(version)
        self._log_evaluations(wait=False)

    def _log_evaluations(self, wait: bool) -> None:
        for version, metrics in self.source.evaluations(wait=wait):
            self.log.log(version, "eval", metrics)
            self.evaluations.append({"step": version, **metrics})

    def step(self) -> dict[str, float]:
        """The source's next groups → score → one optimizer step → the exactly-once record; the
        caller checkpoints and publishes."""
        state = self.state
        started = time.perf_counter()
        drawn = self.stream.draw(state.step + 1)  # harder_later: by the estimates so far (rl.tasks)
        batch = self.source.next_batch(state.step)
        trained_from = time.perf_counter()
        check_not_all_failed(batch.groups, state.step + 1)  # before anything of the step is kept
        scored = self.trainer.score(batch.groups)
        loss, train_metrics = self.trainer.train(scored, version=state.step)
        step = state.step + 1
        records = step_records(batch.indices, batch.groups, step, skipped=bool(train_metrics["skipped"]))
        records += [TaskRecord(index, self.stream.task(index).id, step, "dropped", reason)
                    for index, reason in batch.dropped]
        for record in records:  # why the stream chose it (rl.tasks)
            draw = self.stream.drawn(record.index)
            record.drawn_by, record.difficulty = draw.drawn_by, draw.difficulty
        for index, group in zip(batch.indices, batch.groups, strict=True):
            self.stream.observe(index, group)
        self.source.trained(step, records)
        state.step = step
        state.cursor = max(state.cursor, batch.cursor)
        state.trained += records
        state.sampling = self.stream.state_dict()
        self._write_rollouts(batch.groups)
        self._count_cost(batch.groups, skipped=bool(train_metrics["skipped"]))
        metrics = {
            **scored.metrics,
            "loss": loss,
            **train_metrics,
            **batch.metrics,
            **drawn_metrics(drawn),
            "train_s": time.perf_counter() - trained_from,
            "step_s": time.perf_counter() - started,
            "policy_version": float(step),
        }
        self.log.log(step, "train", metrics)
        return metrics

    def _count_cost(self, groups: list[Group], skipped: bool) -> None:
        """The step's sampling, reference forward and training, in the ``training.cost`` accounting:
        every segment of a scored episode is a row the reference scores and, unless the step
        skipped its update, the policy trains."""
        rows = [len(s.prompt_ids) + sum(len(t.token_ids) + len(t.observation_ids) for t in s.turns)
                for group in groups for episode in group.episodes if episode.scored for s in episode.segments]
        for episode in (e for group in groups for e in group.episodes):
            self.cost.episode(episode)
        if self.rl.kl.reference == "initial":
            self.cost.forward_rows("reference", rows)
        if not skipped:
            self.cost.train_rows("trained", rows)

    def checkpoint(self) -> Path:
        self.log.sync()
        trainer_state = self.trainer.state_dict()
        sharded = trainer_state.get("optimizer_format") == "sharded"
        path = save_training_checkpoint(self.run_dir, self.state, self.trainer.full_model(), self.tokenizer,
                                        trainer_state, self.rl.keep_checkpoints,
                                        self.trainer.save_optimizer if sharded else None)
        self.source.checkpointed()
        self.cost.write(self.run_dir)  # a resume adds to it
        return path

    def _write_rollouts(self, groups: list[Group]) -> None:
        lines = []
        for group, advantages in ((g, g.advantages) for g in groups):
            for episode, advantage in zip(group.episodes, advantages, strict=True):
                lines.append(json.dumps({
                    "step": self.state.step, "task_id": episode.task_id, "sample": episode.sample_index,
                    "status": episode.status.value, "reward": episode.reward, "advantage": advantage,
                    "resolved": None if episode.grade is None else float(episode.grade.resolved),
                    "terms": episode.reward_terms,
                    "tokens": sum(len(t.token_ids) for t in episode.turns), "turns": len(episode.turns),
                    "segments": len(episode.segments), "summaries": len(episode.summaries),
                    "summary_texts": episode.summaries,
                    "policy_versions": episode.policy_versions, "error": episode.error,
                    "final_turn": episode.turns[-1].text if episode.turns else "",
                    # the hack monitor's verdict (grading.hack_monitor), and the diff it flagged
                    **hack_record(episode.grade, episode.diff),
                }))
        folder = self.run_dir / "rollouts"
        folder.mkdir(exist_ok=True)
        atomic_write_text(folder / f"step-{self.state.step:06d}.jsonl", "".join(line + "\n" for line in lines))


def check_not_all_failed(groups: list[Group], step: int) -> None:
    """Stop the run when every episode of ``step``, over two tasks or more, is an infrastructure
    error: the engine or the sandbox is down, not the policy wrong, and going on would record step
    after step of dropped prompts. Raised before anything of the step is trained or recorded, so
    the same command resumes from the last checkpoint and samples these prompts again. A step of
    one task is left to the usual drop: that task's own environment may be what is broken, and
    stopping would meet it again on every resume."""
    first = infrastructure_down(groups)
    if first is None:
        return
    raise InfrastructureDown(
        f"every episode of step {step} ({sum(len(g.episodes) for g in groups)}) failed on infrastructure, not the "
        f"policy; the first: {first.error}. Nothing of this step was trained or recorded: fix the cause and run the "
        "same command again, which resumes from the last checkpoint")


def drawn_metrics(drawn: list[Draw]) -> dict[str, float]:
    """``harder_later``: how hard the step's draws were estimated, and the share drawn by difficulty."""
    if not drawn:
        return {}
    known = [d.difficulty for d in drawn if d.difficulty is not None]
    return {"drawn_difficulty": sum(known) / len(known) if known else float("nan"),
            "drawn_harder_share": sum(d.drawn_by == "harder_later" for d in drawn) / len(drawn)}


def step_records(indices: list[int], groups: list[Group], step: int, skipped: bool) -> list[TaskRecord]:
    """The exactly-once record of one step's tasks (``rl.checkpoint``): ``trained`` when the task's
    rows entered the step's update, else ``dropped`` with the reason."""
    records = []
    for index, group in zip(indices, groups, strict=True):
        scored = sum(episode.scored for episode in group.episodes)
        if all(math.isnan(a) for a in group.advantages):
            reason = (f"group dropped: {scored} of {len(group.episodes)} episodes scored (infrastructure "
                      "errors), too few for a group baseline")
        elif skipped:
            reason = "step skipped: no gradient (every advantage zero), so no update was applied"
        else:
            reason = ""
        records.append(TaskRecord(index, group.task.id, step, "dropped" if reason else "trained", reason))
    return records


def follow_rl(config: Config, world: World) -> None:
    """Ranks > 0: load the policy rank 0 starts from, shard it, and train as rank 0 commands."""
    from opencomposer.model.loading import load_model
    from opencomposer.rl.trainer import Trainer

    apply_run_settings(config.run)
    start = world.broadcast(None)
    model, tokenizer = load_model(ModelConfig(kind="hf", path=start, dtype=config.model.dtype), device=world.device)
    convert_model(model, config.numerics)
    Trainer(model, tokenizer, config, world=world).follow()


def run_rl(config: Config, progress: bool = True, source: RolloutSource | None = None,
           world: World | None = None) -> RLSummary:
    """Run (or resume) the RL run of ``config`` from ``source`` (the synchronous one when None) on
    rank 0 of ``world``; see the module doc."""
    from opencomposer.rl.sync import SyncRollouts

    return RLRun(config, source or SyncRollouts(), world=world, progress=progress).run()

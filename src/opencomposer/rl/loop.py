"""``opencomposer rl``: the synchronous RL loop (docs/recipe.md §4; docs/architecture.md, "Data flow").

One step: take the next B tasks of the stream, roll out G episodes of each in the real harness
(sandboxes, agent loop, grading), score them (reference forward, KL penalty, named-term reward,
group advantages), take one Adam step, and push the new weights into the sampler as policy
version ``step``. Every ``rl.eval_every`` steps (and before the first, and after the last) the
held-out suite is evaluated on a fixed seed set. Every ``rl.checkpoint_every`` steps the run is
checkpointed atomically with the record of trained tasks (``rl.checkpoint``).

Synchronous on purpose: sampling waits for training and training waits for sampling, so the
policy that samples is always the one being trained (versions equal; no importance correction
needed). The report's asynchronous pipeline is the job of ``services/``.

Resuming: ``opencomposer rl`` on a run folder that has checkpoints continues from the newest one.
The steps after it are replayed from the same stream position with the same episode seeds; logs
(``metrics.jsonl``, TensorBoard) are cut back to the checkpoint first.

Outputs under ``{run.out_dir}/{run.name}``: ``recipe.toml``, ``initial/`` (the starting policy,
also the KL reference), ``checkpoints/``, ``metrics.jsonl``, ``tb/`` (TensorBoard),
``rollouts/step-NNNNNN.jsonl`` (one line per episode), ``summary.json``. ``opencomposer report RUN``
draws the curves.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from opencomposer.config import Config, ConfigError, ModelConfig, to_toml
from opencomposer.io import atomic_directory, atomic_write_text
from opencomposer.model.device import apply_run_settings, resolve_device
from opencomposer.numerics.convert import convert_model
from opencomposer.rl.checkpoint import (
    RunState,
    TaskRecord,
    latest_checkpoint,
    load_training_checkpoint,
    remove_partial,
    save_training_checkpoint,
)
from opencomposer.training.metrics import MetricsLog, read_metrics
from opencomposer.training.progress import ProgressBar
from opencomposer.types import EpisodeStatus, Group, InfrastructureDown


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
    """One ``opencomposer rl`` run: set up (fresh or resumed), then ``run()`` the steps."""

    def __init__(self, config: Config, progress: bool = True):
        self.config = config
        self.rl = config.rl
        self.progress = progress
        self.run_dir = config.run.path
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock = lock_run_folder(self.run_dir)  # held until run() returns (or setup fails)
        try:
            self._setup(config)
        except BaseException:
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
        self.model, self.tokenizer = _load_folder(checkpoint / "model" if checkpoint else initial, config)
        # [numerics]: the policy trains, and the reference scores, in the recipe's format; the
        # sampler copies the converted policy (_sampler)
        convert_model(self.model, config.numerics)
        reference = None
        if self.rl.kl.reference == "initial":
            from opencomposer.rl.trainer import frozen_copy

            reference = _load_folder(initial, config)[0]
            convert_model(reference, config.numerics)
            reference = frozen_copy(reference)
        from opencomposer.rl.trainer import Trainer

        self.trainer = Trainer(self.model, self.tokenizer, config, reference=reference)
        self.state = RunState()
        if checkpoint is not None:
            self.state, trainer_state = load_training_checkpoint(checkpoint)
            self.trainer.load_state_dict(trainer_state, checkpoint / "optimizer")
            self._check_stream_matches_record(checkpoint)
        atomic_write_text(self.run_dir / "recipe.toml", to_toml(config))
        self.batcher = self._sampler()
        from opencomposer.grading.grade import GradeCache, grade

        self.grades = GradeCache() if config.grading.cache else None
        self.grader = self.grades.grade if self.grades else grade
        self.log = MetricsLog(self.run_dir, self.state.step if checkpoint else None)
        self.evaluations = self._logged_evaluations() if checkpoint else []

    def _sampler(self) -> Any:
        """The batching sampler every episode of a step shares, at the run's policy version.

        The engine is ``[inference] backend``'s (``inference.factory.make_engine``). With ``local``
        it samples a copy of the policy, so with ``[numerics]`` it samples in the trainer's format (a
        converted policy is not decoded batch-invariantly: ``inference.local.LocalEngine``)."""
        from opencomposer.inference.batching import BatchingEngine
        from opencomposer.inference.factory import make_engine

        return BatchingEngine(make_engine(self.config, self.model, self.tokenizer, policy_version=self.state.step,
                                          for_training=True, copy_model=True))

    def _check_stream_matches_record(self, checkpoint: Path) -> None:
        """Refuse to resume when the recipe now yields another task stream than the one the
        checkpoint's record was trained on (a changed seed, batch size or task folder would
        otherwise break exactly-once silently)."""
        state, batch = self.state, self.rl.batch_tasks
        problem = None
        if state.cursor != state.step * batch:
            problem = f"its stream position {state.cursor} is not step {state.step} × rl.batch_tasks {batch}"
        else:
            for record in state.trained:
                task_id = self.stream.task(record.index).id if record.index < self.stream.size else None
                if task_id != record.task_id:
                    problem = (f"stream position {record.index} held task {record.task_id!r} then and "
                               f"holds {task_id!r} now")
                    break
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

    def _logged_evaluations(self) -> list[dict[str, float]]:
        return read_metrics(self.log.path, kind="eval")

    # ------------------------------------------------------------------------------------------
    def run(self) -> RLSummary:
        started = time.perf_counter()
        try:
            with ProgressBar("rl", self.rl.steps, status="reward {reward:.3f}  resolved {passed:.2f}",
                             completed=self.state.step, enabled=self.progress) as bar:
                if self.state.step == 0 and self._eval_due(0):
                    self.evaluate()
                while self.state.step < self.rl.steps:
                    metrics = self.step()
                    bar.update(self.state.step, reward=metrics.get("reward_mean", float("nan")),
                               passed=metrics.get("resolved_rate", float("nan")))
                    if self._eval_due(self.state.step):
                        self.evaluate()
                    if self.state.step % self.rl.checkpoint_every == 0 or self.state.step == self.rl.steps:
                        self.checkpoint()
        finally:
            self.log.close()
            self._lock.close()
        summary = RLSummary(self.state.step, time.perf_counter() - started, self.evaluations, self.run_dir)
        atomic_write_text(self.run_dir / "summary.json", json.dumps({
            "steps": summary.steps, "evaluations": summary.evaluations,
            "final_model": str(latest_checkpoint(self.run_dir) / "model") if latest_checkpoint(self.run_dir) else None,
        }, indent=1) + "\n")
        return summary

    def _eval_due(self, step: int) -> bool:
        every = self.rl.eval_every
        return bool(every) and bool(self.heldout) and (step % every == 0 or step == self.rl.steps)

    def step(self) -> dict[str, float]:
        """Rollouts → score → one optimizer step → publish; the stream position advances by B."""
        from opencomposer.rl.rollouts import episode_seed, run_groups

        rl, state = self.rl, self.state
        started = time.perf_counter()
        indices = list(range(state.cursor, state.cursor + rl.batch_tasks))
        tasks = [self.stream.task(i) for i in indices]
        seeds = [[episode_seed(self.config.run.seed, "train", i, j) for j in range(rl.group_size)] for i in indices]
        calls_before, rows_before = self.batcher.stats.calls, self.batcher.stats.rows
        hits_before = self.grades.hits if self.grades else 0
        groups = run_groups(tasks, self.batcher, self.tokenizer, self.config, group_size=rl.group_size,
                            seeds=seeds, workers=rl.rollout_workers, grader=self.grader)
        rollout_s = time.perf_counter() - started
        check_not_all_failed(groups, state.step + 1)
        scored = self.trainer.score(groups)
        loss, train_metrics = self.trainer.train(scored, version=state.step)  # staleness 0, as a check
        state.step += 1
        state.cursor += rl.batch_tasks
        state.trained += step_records(indices, groups, state.step, skipped=bool(train_metrics["skipped"]))
        self.trainer.publish(self.batcher, state.step)
        self._write_rollouts(groups)
        metrics = {
            **scored.metrics,
            "loss": loss,
            **train_metrics,
            "rollout_s": rollout_s,
            "step_s": time.perf_counter() - started,
            "engine_calls": float(self.batcher.stats.calls - calls_before),
            "engine_rows": float(self.batcher.stats.rows - rows_before),
            "grades_reused": float((self.grades.hits if self.grades else 0) - hits_before),
            "policy_version": float(state.step),
        }
        self.log.log(state.step, "train", metrics)
        return metrics

    def evaluate(self) -> dict[str, float]:
        from opencomposer.rl.evaluate import evaluate

        metrics = evaluate(self.heldout, self.batcher, self.tokenizer, self.config, grader=self.grader,
                           record=self.run_dir / "eval" / f"step-{self.state.step:06d}.jsonl")
        self.log.log(self.state.step, "eval", metrics)
        self.evaluations.append({"step": self.state.step, **metrics})
        return metrics

    def checkpoint(self) -> Path:
        self.log.sync()
        trainer_state = self.trainer.state_dict()
        sharded = trainer_state.get("optimizer_format") == "sharded"
        return save_training_checkpoint(self.run_dir, self.state, self.model, self.tokenizer, trainer_state,
                                        self.rl.keep_checkpoints, self.trainer.save_optimizer if sharded else None)

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
    episodes = [e for g in groups for e in g.episodes]
    if len(groups) < 2 or not episodes or any(e.status != EpisodeStatus.INFRA_ERROR for e in episodes):
        return
    raise InfrastructureDown(
        f"every episode of step {step} ({len(episodes)}) failed on infrastructure, not the policy; the first: "
        f"{episodes[0].error}. Nothing of this step was trained or recorded: fix the cause and run the same "
        "command again, which resumes from the last checkpoint")


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


def run_rl(config: Config, progress: bool = True) -> RLSummary:
    """Run (or resume) the RL loop of ``config``; see the module doc."""
    return RLRun(config, progress=progress).run()

"""Supervised fine-tuning on scripted episodes: the docs/recipe.md §3 SFT phase, and RL's starting point.

Demonstrations are recorded in the real harness: the oracle policy (the task's gold patch replayed
through the tools, ``agent.policies.scripted``) plays each task in a sandbox, all its calls in one
turn followed by ``finish`` (or, for a task with a walkthrough, its turns one by one under the
recipe's context policy), and the agent loop records the episode token in, token out, exactly
as it records an RL rollout. SFT then trains on those records with the same packing and forward
as the RL trainer (``training.packing``, ``training.forward``): cross-entropy on the model-written tokens only
(prompts and tool outputs are context, not targets), averaged over the batch's model tokens.
Adam (AdamW with decay groups when ``sft.weight_decay > 0``), linear warm-up, cosine decay to a
tenth of the peak learning rate: the shared optimizer, schedule, device, progress display and
metrics log of ``training``. The loss of every step goes to ``metrics.jsonl`` (and ``tb/``) in
the output folder, beside the checkpoint. With ``[numerics]`` set, the matmuls of the experts (and
linears, with ``quantize_linears``) run in that format (``numerics.convert``), as in RL.

RL needs a starting point that solves its tasks only some of the time (groups whose rollouts
disagree). Two ways to get one: stop SFT early, or give it an imperfect teacher
(``sft.wrong_share``: that share of the demonstrations writes a decoy word instead of the one
asked for, so the model learns to be right with about the complementary probability, whatever the
phrasing). The RL learning test uses the second (docs/rl.md explains why).

**Data and context parallel** (``trainer.world_size > 1``, ``parallel.cp``; ``opencomposer sft``
launches the group like ``rl`` and ``pretrain``): rank 0 records the demonstrations and sends them
to the other ranks; every rank draws the same batches, takes its cost-balanced share of each
(``distributed.balance``; the ``cp`` ranks of one data-parallel position take the same rows and
each scores its chunks of them, ``distributed.context``), and divides its cross-entropy sum by the
whole batch's model tokens (× N, since FSDP averages gradients), so the step is the single
process's. Rank 0 logs and writes the checkpoint, gathered whole, in the same layout.

``sft.pack_tokens`` packs a step's demonstrations several to a row (``training.packing.pack_rows``,
each attending only to itself), after the split over the ranks. ``sft.micro_batch_tokens`` then
runs a rank's rows in micro-batches (gradient accumulation: each divided by the whole step's
tokens, so the step's gradient is the same), which bounds a step's activation memory; a rank with
fewer micro-batches than another runs empty forwards (``training.forward.padding_forward``) so
that FSDP's collectives match.

Not here: chat-transcript SFT data sets (no data set is downloaded).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from opencomposer.config import Config, ConfigError, SFTConfig, to_toml
from opencomposer.distributed.balance import split_rows
from opencomposer.distributed.fsdp import clip_gradients, full_model_state, reduce_gradients, shard_model
from opencomposer.distributed.runtime import World
from opencomposer.model.device import apply_run_settings, resolve_device
from opencomposer.numerics.convert import convert_model
from opencomposer.training.metrics import MetricsLog
from opencomposer.training.optim import build_optimizer
from opencomposer.training.progress import ProgressBar
from opencomposer.training.schedule import warmup_cosine_lr
from opencomposer.types import Episode, EpisodeStatus, Task

SFT_MIN_LR_RATIO = 0.1  # the cosine ends at a tenth of sft.lr


@dataclass
class SFTResult:
    steps: int
    seconds: float
    demonstrations: int
    history: list[dict] = field(default_factory=list)  # one row per step: step, lr, loss, tokens

    @property
    def first_loss(self) -> float:
        return self.history[0]["loss"]

    @property
    def last_loss(self) -> float:
        return self.history[-1]["loss"]


def one_turn_oracle(task: Task) -> list[list[Any]]:
    """The oracle's tool calls for ``task`` and a short ``finish``, all in a single turn."""
    from opencomposer.agent.policies.scripted import call, oracle_script

    calls = [c for turn in oracle_script(task) for c in turn if c.name != "finish"]
    return [[*calls, call("finish", message="Done.")]]


def demonstration_script(task: Task, demonstrations: str = "oracle") -> list[Any]:
    """What the teacher plays: a task's walkthrough when it has one (``solution/script.json``, e.g.
    the ``tiny-long`` family: read each note in its own turn, then write), else ``one_turn_oracle``
    or, with ``demonstrations = "explore"``, ``explore_script`` (find, read, edit, test, finish).
    A walkthrough runs under the recipe's ``agent.context_policy``, so with ``self_summary`` the
    demonstrations hold the oracle's summaries and the chains that follow them."""
    from opencomposer.agent.policies.scripted import explore_script, oracle_script

    if task.path is not None and (task.path / "solution" / "script.json").is_file():
        return list(oracle_script(task))
    if demonstrations == "explore":
        return explore_script(task)
    return one_turn_oracle(task)


def record_demonstrations(tasks: list[Task], tokenizer: Any, config: Config) -> list[Episode]:
    """Play ``demonstration_script`` on every task in the real loop and sandbox (no grading
    needed: the oracle's change is the gold patch); returns the token-level episodes."""
    from opencomposer.agent.loop import AgentLoop
    from opencomposer.agent.policies.scripted import ScriptedPolicy
    from opencomposer.sandbox.workspace import Sandbox

    def script(task: Task) -> list[Any]:
        return demonstration_script(task, config.sft.demonstrations)

    policy = ScriptedPolicy(script, name="oracle", tokenizer=tokenizer)
    episodes = []
    for task in tasks:
        with Sandbox(task.repo, config.sandbox, workdir=task.workdir) as sandbox:
            episode = AgentLoop(policy, task, sandbox, config.agent).run()
        if episode.status != EpisodeStatus.OK:
            raise RuntimeError(f"the oracle did not finish task {task.id}: {episode.status.value} ({episode.error})")
        episodes.append(episode)
    return episodes


def demonstration_tasks(config: Config, folder: Path) -> list[Task]:
    """The tasks SFT demonstrates: a folder of tasks, or a tiny family's training split from a seed
    stream of its own (RL's stream is another; the held-out split is never demonstrated). A wrong
    demonstration (``sft.wrong_share``) writes ``sft.decoy_word`` instead of the word asked for; in
    ``tiny-long`` instead of one of the K words (``LongSpec.mistake_position``)."""
    sft = config.sft
    if sft.task_family:
        from opencomposer.tasks.generators.tiny import tiny_spec, write_tiny_task

        seed = config.run.seed + 1  # not RL's stream (run.seed)
        specs = [tiny_spec(seed, "train", i, sft.task_family) for i in range(sft.num_tasks)]
        order = np.random.default_rng([seed, 0x5F7]).permutation(sft.num_tasks)
        wrong = set(order[: round(sft.wrong_share * sft.num_tasks)].tolist())  # the teacher's mistakes
        if wrong and any(sft.decoy_word in spec.words for spec in specs):
            raise ConfigError(f"sft.decoy_word = {sft.decoy_word!r} is a word the family asks for; pick another")
        return [write_tiny_task(folder / f"demo-{i:05d}", spec, answer=sft.decoy_word if i in wrong else None)
                for i, spec in enumerate(specs)]
    if not sft.tasks:
        raise ConfigError('sft: set sft.task_family (e.g. "tiny") or sft.tasks = FOLDER (task folders with gold patches)')
    from opencomposer.tasks.format import load_suite

    tasks = [t for t in load_suite(sft.tasks) if t.gold_patch][: sft.num_tasks]
    if not tasks:
        raise ConfigError(f"sft.tasks: no task under {sft.tasks} has a gold patch to demonstrate")
    return tasks


def sft(
    model: torch.nn.Module,
    tokenizer: Any,
    episodes: list[Episode],
    config: SFTConfig,
    *,
    seed: int = 0,
    progress: bool = True,
    log: MetricsLog | None = None,
    world: World | None = None,
) -> SFTResult:
    """Train ``model`` in place on the model tokens of ``episodes``; returns the loss history, and
    writes it to ``log`` when given. ``world``: this rank's place in a data- (and context-)
    parallel group (module doc); ``model`` is then sharded in place."""
    from opencomposer.training.forward import batch_to, padding_forward
    from opencomposer.training.packing import collate, episode_rows, micro_batches, pack_rows

    rows = episode_rows(episodes)
    if not rows:
        raise ValueError("sft: the demonstrations hold no model tokens")
    world = world or World()
    if config.batch_size < world.dp_size:
        raise ConfigError(f"sft.batch_size = {config.batch_size} gives some of the {world.dp_size} data-parallel "
                          "ranks no rows; use at least one row per rank")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    shard_model(model, world)
    device = next(model.parameters()).device
    optimizer = build_optimizer(model, lr=config.lr, weight_decay=config.weight_decay)
    rng = np.random.default_rng(seed)
    order: list[int] = []
    result = SFTResult(steps=0, seconds=0.0, demonstrations=len(episodes))
    start = time.perf_counter()
    model.train()
    with ProgressBar("sft", config.steps, status="loss {loss:.3f}", enabled=progress) as bar:
        for step in range(config.steps):
            while len(order) < config.batch_size:  # epochs in a seeded order
                order += rng.permutation(len(rows)).tolist()
            chosen, order = [rows[i] for i in order[: config.batch_size]], order[config.batch_size :]
            tokens = sum(row.model_tokens for row in chosen)  # the whole batch's, on every rank
            if world.distributed:
                chosen = split_rows(chosen, world.dp_size)[world.dp_rank]
            if config.pack_tokens:  # after the split: it balances whole sequences
                chosen = pack_rows(chosen, config.pack_tokens)
            chunks = micro_batches(chosen, config.micro_batch_tokens) if config.micro_batch_tokens else [chosen]
            lr = warmup_cosine_lr(step, peak_lr=config.lr, warmup_steps=config.warmup_steps,
                                  total_steps=config.steps, min_lr_ratio=SFT_MIN_LR_RATIO)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for chunk in chunks:  # each normalised by the whole step's tokens: the gradients add up to its
                nll = model_token_nll(model, batch_to(collate(chunk, int(pad)), device), world, int(pad), config.bf16)
                loss = nll / tokens
                (loss * world.size if world.distributed else loss).backward()  # FSDP averages over the ranks
                step_loss += float(loss.detach())
            for _ in range(world.max(len(chunks)) - len(chunks)):  # FSDP gathers layers collectively
                padding_forward(model, device)
            reduce_gradients(model, world)
            if config.grad_clip > 0:
                clip_gradients([p for p in model.parameters() if p.grad is not None], config.grad_clip, world)
            optimizer.step()
            result.steps = step + 1
            value = sum(world.gather(step_loss))
            row = {"lr": lr, "loss": value, "tokens": tokens}
            result.history.append({"step": step + 1, **row})
            if log:
                log.log(step + 1, "train", row)
            bar.update(step + 1, loss=value)
    model.eval()
    result.seconds = time.perf_counter() - start
    return result


def model_token_nll(model: torch.nn.Module, batch: Any, world: World, pad_id: int, bf16: bool) -> torch.Tensor:
    """-Σ log π(token) over the model tokens of ``batch`` (this rank's positions of them under
    context parallelism)."""
    from opencomposer.training.forward import cp_token_logprobs, token_logprobs

    if world.cp > 1:
        from opencomposer.distributed.context import pad_batch_for_cp, split_batch

        batch = pad_batch_for_cp(batch, world.cp, pad_id)
        logprobs, _ = cp_token_logprobs(model, batch, world.cp_group, with_entropy=False, bf16=bf16)
        batch = split_batch(batch, world.cp, world.cp_rank)
    else:
        logprobs, _ = token_logprobs(model, batch, with_entropy=False, bf16=bf16,
                                     share_prefix=not world.distributed)
    return -torch.where(batch.loss_mask, logprobs, 0.0).sum()


def sft_output(config: Config) -> Path:
    return Path(config.sft.out) if config.sft.out else Path(config.run.out_dir) / f"{config.run.name}-sft"


def run_sft(config: Config, progress: bool = True, world: World | None = None
            ) -> tuple[torch.nn.Module, Any, SFTResult, Path | None]:
    """Demonstrations → SFT → checkpoint at ``sft_output(config)`` (loadable as ``model.path``).
    ``world``: a rank of a data-parallel group (module doc); ranks other than 0 return no folder."""
    import dataclasses

    from opencomposer.model.loading import load_model, save_checkpoint

    world = world or World()
    device = world.device if world.distributed else resolve_device(config.run.device)
    apply_run_settings(config.run)
    init = config.sft.init
    spec = dataclasses.replace(config.model, kind="hf", path=init) if init else dataclasses.replace(config.model, path="")
    model, tokenizer = load_model(spec, seed=config.run.seed, device=device)
    convert_model(model, config.numerics)
    with tempfile.TemporaryDirectory(prefix="opencomposer-sft-") as scratch:
        episodes = None
        if world.main:  # the sandboxed demonstrations run once, on rank 0
            tasks = demonstration_tasks(config, Path(scratch) / "tasks")
            episodes = record_demonstrations(tasks, tokenizer, config)
        episodes = world.broadcast(episodes)
        if not world.main:
            result = sft(model, tokenizer, episodes, config.sft, seed=config.run.seed, progress=False, world=world)
            full_model_state(model, world)  # rank 0 gathers the checkpoint
            return model, tokenizer, result, None
        # logged in scratch, then moved in with the weights: the output folder is whole or absent
        metrics = Path(scratch) / "metrics"
        with MetricsLog(metrics) as log:
            result = sft(model, tokenizer, episodes, config.sft, seed=config.run.seed, progress=progress, log=log,
                         world=world)
        if world.distributed:  # the whole weights, into the single-process model's layout
            whole, _ = load_model(spec, seed=config.run.seed, device=torch.device("cpu"))
            convert_model(whole, config.numerics)
            whole.load_state_dict(full_model_state(model, world))
            model = whole
        from opencomposer.io import atomic_directory

        def write(folder: Path) -> None:
            save_checkpoint(model, tokenizer, folder)
            (folder / "recipe.toml").write_text(to_toml(config))
            for item in metrics.iterdir():  # metrics.jsonl and tb/
                shutil.move(item, folder / item.name)

        # built aside and renamed into place: RL never starts from half a checkpoint after a crash
        out = atomic_directory(sft_output(config), write)
    return model, tokenizer, result, out


def sft_worker(world: World, config: Config) -> tuple[SFTResult, Path] | None:
    """``distributed.launch``'s function for ``opencomposer sft``: rank 0's result and checkpoint
    folder, None on the other ranks."""
    _, _, result, out = run_sft(config, progress=world.main, world=world)
    return (result, out) if world.main else None

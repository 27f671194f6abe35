"""``opencomposer rl`` with data parallelism: rank 0 runs the RL loop (synchronous, or the async
services with ``rl.mode = "async"``), the other ranks train.

Rank 0 runs ``rl.loop.RLRun`` unchanged in what it does (task stream, rollouts, scoring with the
unsharded reference, evaluation, metrics, rollouts files, the exactly-once record, checkpoints)
through ``DataParallelRLRun``, which only swaps in the whole policy where the loop needs one: the
sampler's copy and the checkpoint's weights come from ``Trainer.full_model`` (gathered from the
shards), so a checkpoint has the same layout at every world size. Its ``Trainer`` joins the
launched group by itself (``distributed.current_world``) and shards the policy. The other ranks
run ``follow_rl``: load the policy rank 0 starts from (it broadcasts the folder), shard it, and
train their share of each step in ``Trainer.follow`` until rank 0's ``stop``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from opencomposer.config import Config, ModelConfig
from opencomposer.distributed.runtime import World
from opencomposer.rl.checkpoint import latest_checkpoint
from opencomposer.rl.loop import RLRun, RLSummary


class DataParallelRLRun(RLRun):
    """Rank 0's loop (module doc)."""

    def __init__(self, config: Config, world: World):
        self.world = world
        super().__init__(config, progress=True)

    def _initial_policy(self) -> Path:
        initial = super()._initial_policy()
        checkpoint = latest_checkpoint(self.run_dir)
        self.world.broadcast(str(checkpoint / "model" if checkpoint else initial))  # to follow_rl
        return initial

    def _whole(self, method, *args):
        """Run an ``RLRun`` method with ``self.model`` the whole policy instead of the shards."""
        sharded, self.model = self.model, self.trainer.full_model()
        try:
            return method(*args)
        finally:
            self.model = sharded

    def _sampler(self):
        return self._whole(super()._sampler)

    def checkpoint(self) -> Path:
        return self._whole(super().checkpoint)

    def run(self) -> RLSummary:
        summary = super().run()
        self.trainer.stop()  # only on success: after a failure rank 0 exits and the launcher ends the rest
        return summary


def _async_run_class():
    """``DataParallelRLRun``'s swaps on top of the async loop (``services.async_rl``), defined on
    first use: the services import more than the synchronous path needs."""
    from opencomposer.services.async_rl import AsyncRLRun

    class DataParallelAsyncRLRun(DataParallelRLRun, AsyncRLRun):
        """Rank 0's async loop: its services are built from, and publish, the whole policy."""

        def _state_dict(self) -> dict[str, torch.Tensor]:
            return {k: v.detach().clone() for k, v in self.trainer.full_model().state_dict().items()}

        def _start_services(self) -> None:
            self._whole(super()._start_services)

    return DataParallelAsyncRLRun


def follow_rl(config: Config, world: World) -> None:
    """Ranks > 0: load the policy rank 0 starts from, shard it, and train as rank 0 commands."""
    import torch

    from opencomposer.model.loading import load_model
    from opencomposer.numerics.convert import convert_model
    from opencomposer.rl.trainer import Trainer

    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    start = world.broadcast(None)
    model, tokenizer = load_model(ModelConfig(kind="hf", path=start, dtype=config.model.dtype), device=world.device)
    convert_model(model, config.numerics)
    Trainer(model, tokenizer, config, world=world).follow()


def rl_worker(world: World, config: Config) -> RLSummary | None:
    """``distributed.launch``'s function for ``opencomposer rl``: rank 0's summary, None elsewhere."""
    asynchronous = config.rl.mode == "async"
    if not world.distributed:
        if asynchronous:
            from opencomposer.services.async_rl import run_async

            return run_async(config)
        from opencomposer.rl.loop import run_rl

        return run_rl(config)
    if world.main:
        return (_async_run_class() if asynchronous else DataParallelRLRun)(config, world).run()
    follow_rl(config, world)
    return None


def cp_token_logprobs(model: torch.nn.Module, batch: Any, group: Any = None, *, replay: Any = None,
                      temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, with_entropy: bool = True,
                      bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``training.forward.token_logprobs`` under context parallelism (``distributed.context``):
    log π(target) (and the entropy) at this rank's
    positions of the FULL ``batch`` (``[rows, seq / cp]``, ``cp_indices`` order; pair them with
    ``split_batch(batch, cp, rank)``). Every position is scored (no shared prefix, no
    ``logits_to_keep`` window); positions without loss are the caller's to mask."""
    from opencomposer.distributed.context import cp_forward, group_size_rank, split_sequence
    from opencomposer.training.forward import autocast, token_logprobs_and_entropy

    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score tokens, got {temperature}")
    cp, rank = group_size_rank(group)
    device = next(model.parameters()).device
    with autocast(device, bf16):
        out = cp_forward(model, batch.input_ids.to(device), batch.position_ids.to(device), group,
                         routes=None if batch.routes is None else batch.routes.to(device), replay=replay)
    logits = out.logits if temperature == 1.0 else out.logits / temperature
    targets = split_sequence(batch.target_ids.to(device), cp, rank)
    logprobs, entropy = token_logprobs_and_entropy(logits, targets, top_p, top_k)
    return logprobs, entropy if with_entropy else None

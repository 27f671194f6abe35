"""``opencomposer rl`` with data parallelism: rank 0 runs the RL loop, the other ranks train (the
async services' rank 0 builds on this: ``services.async_rl.DataParallelAsyncRLRun``).

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


def follow_rl(config: Config, world: World) -> None:
    """Ranks > 0: load the policy rank 0 starts from, shard it, and train as rank 0 commands."""

    from opencomposer.model.device import apply_run_settings
    from opencomposer.model.loading import load_model
    from opencomposer.numerics.convert import convert_model
    from opencomposer.rl.trainer import Trainer

    apply_run_settings(config.run)
    start = world.broadcast(None)
    model, tokenizer = load_model(ModelConfig(kind="hf", path=start, dtype=config.model.dtype), device=world.device)
    convert_model(model, config.numerics)
    Trainer(model, tokenizer, config, world=world).follow()


def rl_worker(world: World, config: Config) -> RLSummary | None:
    """``distributed.launch``'s function for ``opencomposer rl``: rank 0's summary, None elsewhere."""
    if not world.distributed:
        from opencomposer.rl.loop import run_rl

        return run_rl(config)
    if world.main:
        return DataParallelRLRun(config, world).run()
    follow_rl(config, world)
    return None

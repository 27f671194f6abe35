"""Context- and expert-parallel settings: a world size the degree does not divide, a group missing,
a timeout that is not positive (the equality of each layout with one process is in
``test_dp_rl_step.py``, ``test_dp_pretrain.py``, ``test_dp_sft.py`` and ``test_dp_phases.py``)."""

from __future__ import annotations

import pytest

from opencomposer.config import Config, ConfigError
from opencomposer.distributed.runtime import World, launch


@pytest.mark.parametrize(("axis", "what"), [("cp", "splits each sequence"), ("ep", "splits each MoE layer's experts")])
def test_context_and_expert_parallel_settings_are_checked(axis, what):
    cfg = Config()
    setattr(cfg.parallel, axis, 2)
    with pytest.raises(ConfigError, match=f"parallel.{axis} = 2 {what} over that many ranks"):
        launch(lambda world, config: None, cfg)
    cfg.trainer.world_size = 3
    with pytest.raises(ConfigError, match=f"parallel.{axis} = 2: trainer.world_size = 3 is not a multiple of it"):
        cfg.validate()
    with pytest.raises(ConfigError, match=f"parallel.{axis}: must be"):
        type(cfg.parallel)(**{axis: 0})
    with pytest.raises(ValueError, match=f"cannot form {axis} groups of 2"):
        World(0, 3, **{axis: 2, f"{axis}_group": object()})
    with pytest.raises(ValueError, match=f"needs this rank's {axis} group"):
        World(0, 2, **{axis: 2})


def test_the_collective_timeout_is_checked():
    from opencomposer.config import TrainerConfig

    assert TrainerConfig().timeout_s == 3600.0
    with pytest.raises(ConfigError, match="trainer.timeout_s"):
        TrainerConfig(timeout_s=0)


def test_ep_fsdp_needs_expert_parallelism():
    from opencomposer.config import ParallelConfig

    with pytest.raises(ConfigError, match="parallel.ep_fsdp = true .* set parallel.ep > 1"):
        ParallelConfig(ep_fsdp=True)
    assert ParallelConfig(ep=2, ep_fsdp=True).ep_fsdp


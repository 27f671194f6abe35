"""Context- and expert-parallel settings: a world size the degree does not divide, a group missing,
a timeout that is not positive (the equality of each layout with one process is in
``test_dp_rl_step.py``, ``test_dp_pretrain.py``, ``test_dp_sft.py`` and ``test_dp_phases.py``)."""

from __future__ import annotations

import pytest

from opencomposer.config import Config, ConfigError
from opencomposer.distributed.runtime import World, launch


def test_context_parallel_settings_are_checked():
    cfg = Config()
    cfg.parallel.cp = 2
    with pytest.raises(ConfigError, match="set trainer.world_size to a multiple of it"):
        launch(lambda world, config: None, cfg)
    cfg.trainer.world_size = 3
    with pytest.raises(ConfigError, match="trainer.world_size = 3 is not a multiple of it"):
        cfg.validate()
    with pytest.raises(ConfigError, match="parallel.cp: must be >= 1"):
        type(cfg.parallel)(cp=0)
    with pytest.raises(ValueError, match="cannot form cp groups of 2"):
        World(0, 3, cp=2, cp_group=object())
    with pytest.raises(ValueError, match="needs this rank's cp group"):
        World(0, 2, cp=2)


def test_the_collective_timeout_is_checked():
    from opencomposer.config import TrainerConfig

    assert TrainerConfig().timeout_s == 3600.0
    with pytest.raises(ConfigError, match="trainer.timeout_s"):
        TrainerConfig(timeout_s=0)


def test_expert_parallel_settings_are_checked():
    cfg = Config()
    cfg.parallel.ep = 2
    with pytest.raises(ConfigError, match="parallel.ep = 2 splits each MoE layer's experts"):
        launch(lambda world, config: None, cfg)
    cfg.trainer.world_size = 3
    with pytest.raises(ConfigError, match="parallel.ep = 2: trainer.world_size = 3 is not a multiple of it"):
        cfg.validate()
    with pytest.raises(ValueError, match="cannot form ep groups of 2"):
        World(0, 3, ep=2, ep_group=object())

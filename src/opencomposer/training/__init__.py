"""What every trainer shares (pretraining, SFT, RL): packing episodes into rows, the token-level
forward with its shared-prefix path, and the schedule, optimizer, progress and metrics
helpers.

Not here: any objective (RL losses in ``rl.losses``, the LM loss in ``pretrain``).
"""

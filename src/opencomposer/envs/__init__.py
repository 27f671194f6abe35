"""Environments: the sandbox, the task folder format with its importers and exporters, grading,
and ``rollout.run_episode`` (sandbox + agent loop + grading for one episode). Task generators
live in ``envs.generators``."""

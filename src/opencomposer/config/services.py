"""``[services]``: how ``opencomposer rl`` with ``rl.mode = "async"`` runs its four services
(inference, episode workers, trainer, evaluation; ``opencomposer.services``, docs/services.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from opencomposer.config.section import ConfigError, Section


@dataclass
class ServicesConfig(Section):
    section = "services"

    backend: Literal["embedded", "ray"] = "embedded"
    """``embedded``: the services are threads of one process (the default; a laptop). ``ray``:
    inference, episode workers and evaluation are Ray actors and ready groups travel through
    the object store; the trainer is the driver (``services.ray_backend``; the ``ray`` extra)."""
    inference_process: bool = False
    """Embedded backend: run the inference service in a child process of its own
    (``services.inference_process``) instead of a thread beside the trainer; the episode
    workers stay threads. It isolates the sampler (its memory, a crash); throughput on two cores
    is the same (docs/LOG.md). The child samples on CPU, as the Ray actor does. False keeps
    everything in one process. The Ray backend always runs inference in an actor."""
    trainer_cpus: list[int] = field(default_factory=list)
    """CPUs kept for the trainer (``os.sched_setaffinity``, Linux): the trainer's thread runs on
    these, and the episode workers with their sandboxes, the inference service (thread or
    process) and the evaluation service on the others. On a machine with few cores where training
    is the slower side, it keeps them from taking the trainer's cores (docs/LOG.md). Meant for one
    torch thread per trainer CPU (``run.threads``). Empty (default): no pinning. Embedded backend."""
    env_workers: int = 0
    """Episode workers (``services.episodes``): groups rolled out at once, each worker running
    the G episodes of one task (sandbox, agent loop, grading). 0: ``rl.batch_tasks``, one step's
    worth. Where the trainer shares a few cores with them, fewer leave it more (two cores: 2 beat
    4, docs/LOG.md)."""
    weight_store: str = ""
    """Where the trainer publishes every policy version (``services.weights.WeightStore``): a
    folder or any fsspec URL. Empty: ``{run}/weights``. A fresh run (no checkpoint yet) refuses a
    store named here that already holds versions (another run's), unless
    ``weight_store_overwrite``; the default store belongs to its run folder and is cleared."""
    weight_store_overwrite: bool = False
    """Let a fresh run clear a non-empty ``weight_store`` and publish its own versions there. A
    resumed run never needs it: it keeps the versions before its checkpoint's and republishes that
    one from the checkpoint."""
    full_every: int = 10
    """A full snapshot every N versions, lossless deltas in between (shorter chains to rebuild,
    more bytes)."""
    keep_versions: int = 0
    """Versions kept in the weight store after each publish (older chains are pruned, never the
    chain of a kept version); 0 keeps every version."""
    heartbeat_s: float = 0.5
    """How often each worker reports that it is alive."""
    worker_timeout_s: float = 5.0
    """A worker silent this long is declared dead: its episodes are infrastructure failures and
    are retried on another worker."""
    episode_timeout_s: float = 0.0
    """An episode running longer than this (wall clock, a hung sandbox) is abandoned as an
    infrastructure failure and retried (both modes, as ``max_retries``); 0: no limit beyond the
    task's own budgets."""
    max_retries: int = 2
    """Times an episode that ended in an infrastructure failure (worker died, sandbox hung, grader
    crashed) is run again, same seed, before it stays unscored. Both modes: the synchronous one
    rolls its groups out the same way (``rl.rollouts.rollout_group``)."""
    ray_address: str = ""
    """Ray cluster to join (``ray.init(address=...)``); empty starts a local one for the run."""
    ray_num_cpus: int = 0
    """CPUs of the local Ray cluster; 0 lets Ray count them."""
    ray_num_gpus: int = 0
    """GPUs of the local Ray cluster; 0 lets Ray count those this process sees (ignored when joining
    a cluster: ``ray start --num-gpus`` set it there). Ray hands them out from the first, which the
    trainer uses too: to keep sampler and trainer apart on one node, start Ray on the sampler's
    GPUs yourself and join it (``ray_address``; docs/gpu.md)."""
    ray_inference_gpus: float = 0.0
    """GPUs the inference actor asks Ray for (``num_gpus``): 1 for a vLLM engine or a local sampler
    on ``run.device = "cuda"``, a fraction to share one; 0 (default) samples on the CPU of its node."""
    ray_evaluation_gpus: float = 0.0
    """GPUs the evaluation actor asks Ray for, as ``ray_inference_gpus``."""

    def validate(self) -> None:
        if self.env_workers < 0:
            raise ConfigError(f"services.env_workers: must be >= 0 (0 = rl.batch_tasks), got {self.env_workers}")
        if self.full_every < 1:
            raise ConfigError(f"services.full_every: must be >= 1, got {self.full_every}")
        if self.keep_versions < 0 or self.max_retries < 0 or self.ray_num_cpus < 0:
            raise ConfigError("services.keep_versions, services.max_retries and services.ray_num_cpus: must be >= 0")
        for name in ("ray_num_gpus", "ray_inference_gpus", "ray_evaluation_gpus"):
            gpus = getattr(self, name)
            if gpus < 0 or (gpus > 1 and gpus != int(gpus)):
                raise ConfigError(f"services.{name}: expected >= 0, a fraction of one GPU or a whole number, "
                                  f"got {gpus}")
        if self.heartbeat_s <= 0 or self.worker_timeout_s <= self.heartbeat_s:
            raise ConfigError(
                f"services.heartbeat_s ({self.heartbeat_s}) must be > 0 and below services.worker_timeout_s "
                f"({self.worker_timeout_s})"
            )
        if self.inference_process and self.backend != "embedded":
            raise ConfigError(
                "services.inference_process: applies to the embedded backend; services.backend = "
                f"\"{self.backend}\" runs inference in an actor of its own already"
            )
        if self.trainer_cpus and (min(self.trainer_cpus) < 0 or len(set(self.trainer_cpus)) != len(self.trainer_cpus)):
            raise ConfigError(f"services.trainer_cpus: distinct CPU numbers >= 0, got {self.trainer_cpus}")
        if self.trainer_cpus and self.backend != "embedded":
            raise ConfigError("services.trainer_cpus: applies to the embedded backend; give Ray actors CPUs "
                              "through the cluster instead")
        if self.episode_timeout_s < 0:
            raise ConfigError(f"services.episode_timeout_s: must be >= 0 (0 = none), got {self.episode_timeout_s}")

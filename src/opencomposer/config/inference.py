"""``[inference]``: which engine samples the policy (``opencomposer.inference.factory.make_engine``).

Every place that builds a sampler (the RL loop, the inference and evaluation services, the
``local`` agent policy, ``opencomposer serve``) asks the factory, so this one table switches all of
them. ``local`` is the in-process ``LocalEngine`` (CPU or one GPU, batch-invariant, what the tests
and the laptop recipes run); ``vllm`` is ``inference.vllm.VLLMEngine``, vLLM's offline engine in
this process (the ``gpu`` extra; docs/gpu.md); ``http`` samples from an OpenAI-compatible server
that someone else runs (vLLM's ``vllm serve``), for evaluation and agent policies only: a remote
server cannot take the trainer's weights, so RL refuses it (``make_engine(for_training=True)``).

The vLLM knobs are passed to ``vllm.LLM`` as they are; the other backends ignore them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from opencomposer.config.section import ConfigError, Section


@dataclass
class InferenceConfig(Section):
    section = "inference"

    backend: Literal["local", "vllm", "http"] = "local"
    """``local``: ``inference.local.LocalEngine`` in this process (the default). ``vllm``:
    ``inference.vllm.VLLMEngine``, vLLM's offline ``LLM`` in this process on the GPUs it sees
    (``pip install -e '.[gpu]'`` in a separate venv, docs/gpu.md). ``http``: an OpenAI-compatible
    server at ``http_base_url`` (token ids in and out through vLLM's extensions); not for RL."""
    gpu_memory_utilization: float = 0.5
    """vLLM: share of each GPU's memory vLLM may take (weights + KV cache). Below vLLM's own 0.9
    because in the single-node loop the trainer shares the GPU; raise it on a GPU that only samples."""
    tensor_parallel_size: int = 1
    """vLLM: GPUs one engine shards the model over (tensor parallel)."""
    enable_prefix_caching: bool = True
    """vLLM: reuse the KV cache of shared prompt prefixes (the G samples of a group, an agent's
    growing context). The ``n`` samples of one prompt share their prefill through it."""
    max_model_len: int = 0
    """vLLM: longest prompt + completion, in tokens; 0 takes the model's
    ``max_position_embeddings``. Lower it to leave more memory for the KV cache."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """vLLM: dtype of the weights and activations; ``auto`` takes the checkpoint's
    (``model.dtype``). The trainer's weights are cast to it on every update."""
    enforce_eager: bool = False
    """vLLM: run the model eagerly, without torch.compile and CUDA graphs: starts in seconds rather
    than minutes, decodes slower. For tests and short checks; leave it off for runs."""
    prefix_cache_tokens: int = 0
    """local: context positions the ``LocalEngine`` keeps across calls, so an agent's next call
    (its context plus the new tool output, or the self-summary request) prefills only the new
    tokens; 0 turns it off. Reuse agrees with a fresh prefill to float rounding, not bit for bit, so
    runs that must reproduce exactly leave it off (``inference.local``; docs/LOG.md measures it).
    Memory: SmolLM2 in float32 keeps ~45 KiB per position."""
    batch_wait_s: float = 1.0
    """How long the batching sampler of RL rollouts and evaluation (``inference.batching``) waits
    for episodes still in a tool call before it starts a batch without them, counted from when a
    request arrives or the previous batch ends, whichever is later. A decode step costs about the
    same for one row as for sixteen on CPU, so a batch that leaves half the episodes behind nearly
    doubles the sampling time; the wait is what it costs to gather them (docs/LOG.md, 2026-12-07).
    0 starts a batch with whoever is waiting."""
    http_base_url: str = ""
    """http: the server's OpenAI API root, such as ``http://127.0.0.1:8000/v1``."""
    http_model: str = ""
    """http: the model id the server serves (``vllm serve NAME``); empty asks ``/models`` for the first."""

    def validate(self) -> None:
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"inference.gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"inference.tensor_parallel_size: must be >= 1, got {self.tensor_parallel_size}")
        if self.prefix_cache_tokens < 0:
            raise ConfigError(f"inference.prefix_cache_tokens: must be >= 0 (0 = off), got {self.prefix_cache_tokens}")
        if self.batch_wait_s < 0:
            raise ConfigError(f"inference.batch_wait_s: must be >= 0 seconds, got {self.batch_wait_s}")
        if self.max_model_len < 0:
            raise ConfigError(f"inference.max_model_len: must be >= 0 (0 = the model's limit), got {self.max_model_len}")
        if self.backend == "http" and not self.http_base_url:
            raise ConfigError(
                'inference.http_base_url: required when inference.backend = "http" '
                "(the server's OpenAI API root, such as http://127.0.0.1:8000/v1)"
            )

"""``make_engine``: the one place that turns ``[inference] backend`` into an ``Engine``.

The RL loop's sampler, the inference and evaluation services, the ``local`` agent policy and
``opencomposer serve`` all build their engine here, so switching a recipe from the in-process
``LocalEngine`` to vLLM (or to a remote server) is one key (``tests/test_inference_backend.py``
checks every caller goes through it). The callers keep what they wrap around the engine (a
``BatchingEngine``, a fault injector).
"""

from __future__ import annotations

import copy
from typing import Any

from opencomposer.config.inference import InferenceConfig
from opencomposer.config.section import ConfigError
from opencomposer.model.attention import restore_attention
from opencomposer.protocols import Engine


def make_engine(config: Any, model: Any, tokenizer: Any, *, policy_version: int = 0, for_training: bool = False,
                copy_model: bool = False, **local_options: Any) -> Engine:
    """The engine ``config`` asks for, serving ``model``'s current weights.

    ``config``: a whole recipe (``Config``; its ``[numerics]`` is checked too) or its
    ``InferenceConfig``. ``for_training``: the engine's samples are trained on and it must take
    the trainer's weights (RL, evaluation of published versions), which the ``http`` backend
    cannot. ``copy_model``: ``local`` samples from a deep copy, so the caller may go on training
    ``model`` (``vllm`` always holds its own copy, on the GPU). ``local_options`` go to
    ``LocalEngine`` only (``max_batch_size``, ``prefix_cache_tokens``, ...)."""
    inference = config if isinstance(config, InferenceConfig) else getattr(config, "inference", None)
    if not isinstance(inference, InferenceConfig):
        raise TypeError(f"make_engine: expected a Config or an InferenceConfig, got {type(config).__name__}")
    backend = inference.backend
    if backend == "local":
        from opencomposer.inference.local import LocalEngine

        engine_model = restore_attention(copy.deepcopy(model)).eval() if copy_model else model
        local_options.setdefault("prefix_cache_tokens", inference.prefix_cache_tokens)
        return LocalEngine(engine_model, tokenizer, policy_version=policy_version, **local_options)
    numerics = getattr(getattr(config, "numerics", None), "recipe", "bf16")
    if numerics != "bf16":
        raise ConfigError(
            f'inference.backend = "{backend}" samples with vLLM\'s kernels, which do not emulate '
            f'numerics.recipe = "{numerics}" (the trainer\'s converted experts); use inference.backend = "local" '
            'or numerics.recipe = "bf16"'
        )
    if backend == "vllm":
        from opencomposer.inference.vllm import VLLMEngine

        return VLLMEngine.from_model(model, tokenizer, inference, policy_version=policy_version)
    if backend == "http":
        if for_training:
            raise ConfigError(
                'inference.backend = "http" cannot sample for RL or evaluate published versions: an '
                "OpenAI-compatible server takes no weights from the trainer, and its token logprobs are those of "
                "its own --logprobs-mode (by default the raw softmax, not the temperature/top-p distribution the "
                'trainer scores). Use inference.backend = "vllm" (GPU) or "local"'
            )
        from opencomposer.inference.vllm import HttpEngine

        max_positions = int(getattr(getattr(model, "config", None), "max_position_embeddings", 0) or 0)
        return HttpEngine(inference.http_base_url, inference.http_model, tokenizer, max_positions=max_positions)
    raise ConfigError(f"inference.backend: unknown backend {backend!r}")

"""Switching a transformers model to another attention implementation for the length of a forward,
in a way that a copy of the model taken meanwhile can undo.

The trainers register their own attention functions with transformers (``AttentionInterface``):
per-document attention for packed rows (``training.attention``) and context-parallel attention
(``distributed.context``). Each runs only inside its context manager, which sets the model's
``config._attn_implementation`` and puts it back on exit. A copy of the model made while one is
switched (the asynchronous inference service copies the trainer's model when it restarts an
engine) would keep the switched name and fail in its first forward; ``restore_attention`` gives
such a copy its own implementation back, and every copy made for inference calls it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

SAVED = "_opencomposer_attention_before_switch"
"""Config attribute holding the model's own implementation while a switch is on."""


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, name: str) -> Iterator[None]:
    """Run ``model``'s forwards inside with the registered attention implementation ``name``."""
    config = model.config
    previous = config._attn_implementation
    outermost = not hasattr(config, SAVED)
    if outermost:
        setattr(config, SAVED, previous)
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = previous
        if outermost:
            delattr(config, SAVED)


def restore_attention(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` (a copy) with its own attention implementation, if it was copied mid-switch."""
    config = getattr(model, "config", None)
    saved = getattr(config, SAVED, None)
    if saved is not None:
        config._attn_implementation = saved
        delattr(config, SAVED)
    return model

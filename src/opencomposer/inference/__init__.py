"""Inference engines: the ``Engine`` protocol and its in-process implementation.

``Engine`` is defined in ``opencomposer.protocols`` and its records in ``opencomposer.types``;
``LocalEngine`` is imported lazily so that importing this package never pulls in torch.
"""

from opencomposer.protocols import Engine
from opencomposer.types import Completion, SamplingParams

__all__ = ["Completion", "Engine", "LocalEngine", "SamplingParams"]


def __getattr__(name: str):
    if name == "LocalEngine":
        from opencomposer.inference.local import LocalEngine

        return LocalEngine
    raise AttributeError(f"module 'opencomposer.inference' has no attribute {name!r}")

"""Inference engines: the ``Engine`` protocol and its in-process implementation.

``LocalEngine`` is imported lazily so that ``opencomposer.inference.engine`` (the light protocol
module) never pulls in torch.
"""

from opencomposer.inference.engine import Completion, Engine, SamplingParams

__all__ = ["Completion", "Engine", "LocalEngine", "SamplingParams"]


def __getattr__(name: str):
    if name == "LocalEngine":
        from opencomposer.inference.local import LocalEngine

        return LocalEngine
    raise AttributeError(f"module 'opencomposer.inference' has no attribute {name!r}")

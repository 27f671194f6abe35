"""Write checkpoints plain transformers loads, and keep transformers quiet while it works.

The lowest module of ``model`` that touches transformers: ``loading`` (every model kind) and
``smollm2`` (the GGUF conversion) both save and both need the quiet, so it lives here, below them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# What transformers' first import of its torchao quantizer logs (torchao is a dev dependency here,
# for the numerics tests), by logger: "Failed to load" for each GPU-only extension library of
# torchao's wheel, and torch's pytree deprecation notice for the enums torchao registers. Neither
# concerns a CPU run; any other record of these loggers still gets through.
_IMPORT_NOISE = {
    "torchao": ("Failed to load ",),
    "torch.utils._pytree": ("Calling register_constant() on Enum subclasses is deprecated",),
}


class _DropKnownNoise(logging.Filter):
    """Drops the records whose message contains one of ``fragments``."""

    def __init__(self, fragments: tuple[str, ...]):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """For the calls inside: no transformers progress bars (per-checkpoint "Loading weights" and
    "Writing model shards") and none of the known torchao import-time records above; the previous
    settings come back on exit. Scoped, so a user's own transformers calls keep their bars."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    filters = [(logging.getLogger(name), _DropKnownNoise(fragments)) for name, fragments in _IMPORT_NOISE.items()]
    hf_logging.disable_progress_bar()
    for logger, noise in filters:
        logger.addFilter(noise)
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        for logger, noise in filters:
            logger.removeFilter(noise)


def save_checkpoint(model: Any, tokenizer: Any, path: str | Path) -> Path:
    """Write a folder loadable by ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer``.

    A GGUF origin leaves a ``quantization_config`` behind although the weights are already
    dequantised; it is dropped so the folder loads as a plain checkpoint.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    with quiet_transformers():
        model.save_pretrained(str(path), safe_serialization=True)
        tokenizer.save_pretrained(str(path))
    return path

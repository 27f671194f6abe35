"""Byte-level BPE tokenizer for code, and the chat template shared by every model.

The tokenizer is trained with Hugging Face ``tokenizers`` on the code corpus (byte-level, so any
text round-trips exactly) and wrapped as a ``transformers`` fast tokenizer, saved with every
checkpoint so that plain ``AutoTokenizer.from_pretrained`` loads it.

The chat template is ChatML with the Hermes/Qwen tool-call convention: tools are listed in the
system turn inside ``<tools></tools>``, the assistant calls them with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, and results come back in a
user turn as ``<tool_response>...</tool_response>`` blocks. SmolLM2 and Qwen models already speak
ChatML, so they feel at home; for our own tokenizer the markers are single special tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SPECIAL_TOKENS = [
    END_OF_TEXT,
    IM_START,
    IM_END,
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_RESPONSE_CLOSE,
    THINK_OPEN,
    THINK_CLOSE,
]

# The words around the tool listing in the system turn; ``tools_system_text`` writes the same turn
# in Python, for servers that are sent the tools inside the system prompt instead of as ``tools``.
TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_OUTRO = (
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

# ChatML + Hermes tool calls. Consecutive tool messages share one user turn, as in Qwen's template.
CHAT_TEMPLATE = (
    # transformers renders with trim_blocks: a newline right after a {% %} tag is dropped, so
    # newlines that follow a tag are written as {{ '\\n' }}.
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{{ '\\n\\n' }}{% endif %}"
    + TOOLS_INTRO
    + "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}"
    + TOOLS_OUTRO
    + "<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' and loop.first %}"
    "{% elif message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{% if message.tool_calls %}"
    "{% for call in message.tool_calls %}"
    "{% if call.function is defined %}{% set call = call.function %}{% endif %}"
    "{{ '\\n' }}<tool_call>\n{{ {'name': call.name, 'arguments': call.arguments} | tojson }}\n</tool_call>"
    "{% endfor %}"
    "{% endif %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tools_system_text(system: str | None, tools: list[dict[str, Any]]) -> str:
    """The system turn's content as ``CHAT_TEMPLATE`` writes it when given ``tools``: a system
    message with this content and no ``tools`` renders to the same text (tests check it)."""
    listing = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    head = f"{system}\n\n" if system is not None else ""
    return f"{head}{TOOLS_INTRO}{listing}\n{TOOLS_OUTRO}"


def tool_responses_text(contents: list[str]) -> str:
    """One user turn's content as ``CHAT_TEMPLATE`` writes consecutive tool messages."""
    return "\n".join(f"{TOOL_RESPONSE_OPEN}\n{content}\n{TOOL_RESPONSE_CLOSE}" for content in contents)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, show_progress: bool = False) -> Any:
    """Train a byte-level BPE on ``texts`` and wrap it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[3:],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 30,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def ensure_chat_template(tokenizer: Any) -> Any:
    """Install the project's tool-calling ChatML template (used for SmolLM2, whose own has no tools)."""
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def document_separator_id(tokenizer: Any) -> int:
    """The id placed between pretraining documents: ``<|endoftext|>`` if known, else EOS."""
    token_id = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    if token_id is None or token_id == tokenizer.unk_token_id:
        token_id = tokenizer.eos_token_id
    return int(token_id)


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Ids that end an assistant turn: ``<|im_end|>`` and the tokenizer's EOS."""
    ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)}
    return sorted(i for i in ids if i is not None and i != tokenizer.unk_token_id)


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))

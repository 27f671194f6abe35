"""The code tokenizer round-trips exactly and the chat template renders the promised text."""

from __future__ import annotations

from opencomposer.model.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, ensure_chat_template, stop_token_ids


def test_round_trips_1000_corpus_files_exactly(tiny_tokenizer, code_corpus):
    files = code_corpus.train[:1000]
    assert len(files) == 1000
    encoded = tiny_tokenizer([f.text for f in files], add_special_tokens=False)["input_ids"]
    mismatches = [
        f.name for f, ids in zip(files, encoded)
        if tiny_tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) != f.text
    ]
    assert mismatches == []


def test_round_trips_unusual_text(tiny_tokenizer):
    for text in ["\t\r\n  x\u00a0= 'é€😀'\n", "a" * 5000, "\x00\x01 bytes", "  leading spaces", "<tool_call>{}"]:
        ids = tiny_tokenizer.encode(text, add_special_tokens=False)
        assert tiny_tokenizer.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_are_single_ids(tiny_tokenizer):
    for token in SPECIAL_TOKENS:
        ids = tiny_tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1, token
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    assert stop_token_ids(tiny_tokenizer) == [tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_vocab_size_and_compression(tiny_tokenizer, code_corpus):
    assert len(tiny_tokenizer) == 4096
    sample = code_corpus.train[:100]
    tokens = sum(len(ids) for ids in tiny_tokenizer([f.text for f in sample])["input_ids"])
    bytes_per_token = sum(len(f.text.encode()) for f in sample) / tokens
    assert bytes_per_token > 2.5  # a 4k BPE on code compresses well beyond bytes


def test_saved_tokenizer_loads_with_autotokenizer(tiny_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tiny_tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "def f(x):\n    return x  # <|im_end|>\n"
    assert loaded.encode(text) == tiny_tokenizer.encode(text)
    assert loaded.chat_template == CHAT_TEMPLATE


CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "List files."},
    {"role": "assistant", "content": "Looking.", "tool_calls": [{"name": "run", "arguments": {"command": "ls"}}]},
    {"role": "tool", "content": "a.py"},
    {"role": "tool", "content": "b.py"},
    {"role": "assistant", "content": "Two files."},
]

EXPECTED = (
    "<|im_start|>system\nYou are a coding agent.<|im_end|>\n"
    "<|im_start|>user\nList files.<|im_end|>\n"
    "<|im_start|>assistant\nLooking.\n<tool_call>\n"
    '{"name": "run", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n<tool_response>\nb.py\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nTwo files.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_chat_template_golden(tiny_tokenizer):
    text = tiny_tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text == EXPECTED


def test_chat_template_lists_tools_in_system_turn(tiny_tokenizer):
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
    text = tiny_tokenizer.apply_chat_template(CONVERSATION[:2], tools=tools, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a coding agent.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}\n</tools>' in text
    assert text.endswith("<|im_start|>user\nList files.<|im_end|>\n")


def test_smollm2_speaks_the_same_template(smollm2):
    _, tokenizer = smollm2
    ensure_chat_template(tokenizer)
    assert tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True) == EXPECTED

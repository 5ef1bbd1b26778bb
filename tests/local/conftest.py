"""Fixtures for the embedded Loops: a tiny chat model and one server per test module."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import build_tiny_chat_model


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat-model"))


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random `LlamaForCausalLM` (vocab 128, hidden 32), no tokenizer: trainer tests speak ids."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(1234)
    LlamaForCausalLM(config).save_pretrained(path)
    return path

"""Fixtures for the embedded Loops: a tiny chat model and one server per test module."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import build_tiny_chat_model, save_tiny_llama


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat-model"))


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random `LlamaForCausalLM` (vocab 128, hidden 32), no tokenizer: trainer tests speak ids."""
    return save_tiny_llama(
        tmp_path_factory.mktemp("tiny-llama"), vocab_size=128, max_position_embeddings=256, seed=1234
    )

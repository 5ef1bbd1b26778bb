"""Fixtures for the SFT tests: offline tokenizers for each chat-template family (see sft_fixtures)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sft_fixtures import build_tokenizer


@pytest.fixture(scope="session")
def make_tokenizer() -> Callable[..., Any]:
    """``make_tokenizer(family, template=None, regex=False)``: a fresh tokenizer; see `build_tokenizer`."""
    return build_tokenizer


@pytest.fixture(scope="session")
def smollm2() -> Any:
    return build_tokenizer("smollm2")


@pytest.fixture(scope="session")
def smollm2_tools() -> Any:
    return build_tokenizer("smollm2_tools")


@pytest.fixture(scope="session")
def qwen3() -> Any:
    return build_tokenizer("qwen3")


@pytest.fixture(scope="session")
def llama3() -> Any:
    return build_tokenizer("llama3")

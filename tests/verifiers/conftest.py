"""Fixtures: the verifiers runtime on the fake driver (run by this interpreter), a gateway and a scripted LLM."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from scripted_policy import ScriptedPolicy

from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import LoopsLLM, SamplingDefaults
from loops_nb.llm.renderer import ChatRenderer
from loops_nb.model_access import ModelGateway
from loops_nb.verifiers import VerifiersRuntime, create_runtime

FAKE_DRIVER = Path(__file__).with_name("fake_driver.py")


@pytest.fixture(scope="module")
def renderer(tiny_chat_model_path: Path) -> ChatRenderer:
    from transformers import AutoTokenizer

    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_chat_model_path))


@pytest.fixture(scope="module")
def gateway() -> Any:
    with ModelGateway(model_name="tiny") as gw:
        yield gw


@pytest.fixture
def scripted(renderer: ChatRenderer) -> Callable[..., LoopsLLM]:
    def make(*texts: str) -> LoopsLLM:
        end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
        policy = ScriptedPolicy(renderer, list(texts), logprob=-0.5, end_token=end)
        return LoopsLLM(renderer, policy, TokenCapture(), SamplingDefaults(max_tokens=64))

    return make


@pytest.fixture
def fake_runtime() -> Callable[..., VerifiersRuntime]:
    """The verifiers runtime with the fake driver, run by this interpreter (nothing is built)."""

    def make(env_args: dict[str, Any] | None = None, **options: Any) -> VerifiersRuntime:
        return create_runtime(
            env_id="fake-env",
            env_args=env_args or {},
            python=sys.executable,
            driver=str(FAKE_DRIVER),
            **options,
        )

    return make

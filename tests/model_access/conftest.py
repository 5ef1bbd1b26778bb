"""Fixtures: a gateway in front of a real embedded Loops serving the tiny chat model, and a scripted policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from scripted_policy import ScriptedPolicy

from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import LoopsLLM, SamplingDefaults
from loops_nb.llm.renderer import ChatRenderer
from loops_nb.model_access import ModelGateway


@pytest.fixture(scope="module")
def loops_server(tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path) -> Any:
    from loops_nb.local.embedded import EmbeddedLoops

    with EmbeddedLoops(
        state_dir=tmp_path_factory.mktemp("loops-state"), cache_dir=model_cache_dir, device="cpu"
    ) as server:
        yield server


@pytest.fixture(scope="module")
def renderer(tiny_chat_model_path: Path) -> ChatRenderer:
    from transformers import AutoTokenizer

    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_chat_model_path))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def policy(loops_server: Any, tiny_chat_model_path: Path) -> Any:
    from loops_nb.rl.policy import Policy

    svc = loops_server.service_client()
    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model_path), rank=4, seed=0)
    p = Policy(tc, str(tiny_chat_model_path))
    await p.publish()
    return p


@pytest.fixture(scope="module")
def gateway() -> Any:
    with ModelGateway(model_name="tiny") as gw:
        yield gw


@pytest.fixture
def make_llm(renderer: ChatRenderer, policy: Any) -> Any:
    def make(seed: int = 1, max_tokens: int = 8) -> LoopsLLM:
        return LoopsLLM(renderer, policy, TokenCapture(), SamplingDefaults(max_tokens=max_tokens), seed=seed)

    return make


@pytest.fixture
def scripted(renderer: ChatRenderer) -> Any:
    def make(*texts: str) -> tuple[LoopsLLM, ScriptedPolicy]:
        end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
        policy = ScriptedPolicy(renderer, list(texts), logprob=-0.5, end_token=end)
        return LoopsLLM(renderer, policy, TokenCapture(), SamplingDefaults(max_tokens=64)), policy

    return make

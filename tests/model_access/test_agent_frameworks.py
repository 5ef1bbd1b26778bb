"""The OpenAI Agents SDK and a LangChain tool agent, written as their users write them, on a Qwen3 model
through the gateway: the model's Qwen3-syntax tool calls reach each agent as tool calls, the agent runs its
tool and gets the answer, and the attempt is one exact training sequence that trains a Qwen3-architecture
model on the local scope.

The replies come from a scripted sampler in Qwen3's own syntax (a random tiny model writes no call), rendered
and parsed by the qwen3 renderer on Qwen3's real vocabulary; the training step runs a tiny random Qwen3
(tests/family_models.py) in the embedded Loops.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from baseten.loops import AdamParams
from family_models import build_family_model
from family_replies import FAMILY_REPLIES
from scripted_policy import ScriptedPolicy

from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import LoopsLLM, SamplingDefaults
from loops_nb.llm.prime_renderer import PrimeRenderer
from loops_nb.model_access import ModelGateway
from loops_nb.rl.datums import sequence_datums

pytestmark = pytest.mark.asyncio(loop_scope="session")

QUESTION = "What is the weather in Rome?"
ANSWER = "It is sunny in Rome."


def qwen3_attempt(family_tokenizer: Callable[[str], Any]) -> LoopsLLM:
    """A new attempt on Qwen3: first the call to get_weather(city="Rome"), then the answer."""
    renderer = PrimeRenderer(family_tokenizer("qwen3"), "qwen3", hub_id="Qwen/Qwen3-8B")
    replies = FAMILY_REPLIES["qwen3"]
    policy = ScriptedPolicy(renderer, [replies.call_reply, replies.answer_reply], logprob=-0.5)
    return LoopsLLM(renderer, policy, TokenCapture(), SamplingDefaults(max_tokens=64))


def one_sequence(llm: LoopsLLM) -> None:
    assert len(llm.capture.calls) == 2
    assert not llm.capture.breaks, llm.capture.breaks
    assert len(llm.capture.sequences()) == 1


async def run_openai_agent(gateway: ModelGateway, llm: LoopsLLM, key: str) -> list[str]:
    """The Agents SDK's quickstart shape: an Agent with a function tool on its default Responses model."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # the SDK would upload traces to OpenAI
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return "sunny"

    lease = gateway.issue(key, llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    agent = Agent(
        name="weather",
        instructions="You are a weather assistant.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model="policy", openai_client=client),
    )
    result = await Runner.run(agent, QUESTION)
    gateway.revoke(lease.key)
    assert result.final_output == ANSWER
    return asked


async def run_langchain_agent(gateway: ModelGateway, llm: LoopsLLM, key: str) -> list[str]:
    """LangChain's tool agent (`create_agent`) on `ChatOpenAI` pointed at the gateway."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    asked: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return "sunny"

    lease = gateway.issue(key, llm)
    model = ChatOpenAI(model="policy", base_url=gateway.url, api_key=lease.key, max_retries=0)
    agent = create_agent(model, tools=[get_weather], system_prompt="You are a weather assistant.")
    state = await agent.ainvoke({"messages": [{"role": "user", "content": QUESTION}]})
    gateway.revoke(lease.key)
    assert state["messages"][-1].content == ANSWER
    return asked


async def test_the_agents_sdk_gets_qwen3_tool_calls_as_tool_calls(
    gateway: ModelGateway, family_tokenizer: Callable[[str], Any]
) -> None:
    llm = qwen3_attempt(family_tokenizer)
    assert await run_openai_agent(gateway, llm, "t/frameworks/agents") == ["Rome"]
    one_sequence(llm)
    first = llm.capture.calls[0]
    prompt = llm.renderer.decode(first.prompt_tokens)
    assert "You are a weather assistant." in prompt and '"name": "get_weather"' in prompt


async def test_a_langchain_tool_agent_gets_qwen3_tool_calls_as_tool_calls(
    gateway: ModelGateway, family_tokenizer: Callable[[str], Any]
) -> None:
    llm = qwen3_attempt(family_tokenizer)
    assert await run_langchain_agent(gateway, llm, "t/frameworks/langchain") == ["Rome"]
    one_sequence(llm)


@pytest.mark.slow
async def test_both_frameworks_attempts_train_a_qwen3_model(
    gateway: ModelGateway,
    family_tokenizer: Callable[[str], Any],
    embedded_loops: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    attempts = [qwen3_attempt(family_tokenizer) for _ in range(2)]
    await run_openai_agent(gateway, attempts[0], "t/frameworks/train-agents")
    await run_langchain_agent(gateway, attempts[1], "t/frameworks/train-langchain")
    path: Path = build_family_model("qwen3", tmp_path_factory.mktemp("qwen3"))
    trainer = await embedded_loops.service_client().create_lora_training_client_async(
        base_model=str(path), rank=8, seed=0
    )
    datums = [
        d
        for k, llm in enumerate(attempts)
        for d in sequence_datums(llm.capture.sequences(), 1.0 - 2 * k, f"attempt {k}")
    ]
    assert len(datums) == 2 and all(d.trained_tokens > 20 for d in datums)
    future = await trainer.forward_backward_async([d.to_datum() for d in datums], "importance_sampling")
    out = await future.result_async()
    assert out.loss == out.loss and len(out.loss_fn_outputs) == 2
    step = await trainer.optim_step_async(AdamParams(learning_rate=1e-3))
    assert await step.result_async() is not None

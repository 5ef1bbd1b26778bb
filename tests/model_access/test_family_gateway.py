"""The gateway on five families besides SmolLM2: Qwen3, Qwen3.6 (the kit's Baseten default, XML calls and an
opened `<think>`), Llama 3 (bare JSON calls, no reasoning), DeepSeek V4 (DSML calls, thinking mode) and gpt-oss
(Harmony channels). Replies come from a scripted sampler in the family's own syntax; the
family's renderer parses them, so tool calls and reasoning reach the agent as such on Chat Completions
(streamed and not) and the Responses API, and a tool round trip stays one exact training sequence."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai
import pytest
from family_replies import FAMILY_REPLIES, REASONING, TOOLS
from scripted_policy import ScriptedPolicy

from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import LoopsLLM, SamplingDefaults
from loops_nb.llm.prime_renderer import PrimeRenderer
from loops_nb.llm.renderer_choice import renderer_config
from loops_nb.model_access import ModelGateway

pytestmark = pytest.mark.asyncio(loop_scope="session")

RESPONSES_TOOL = {"type": "function", **TOOLS[0]["function"]}
QUESTION = [{"role": "user", "content": "What is the weather in Rome?"}]


class Family:
    """New attempts on one family's renderer, each answering first with a call, then with the answer."""

    def __init__(self, name: str, tokenizer: Any) -> None:
        self.replies = FAMILY_REPLIES[name]
        config = renderer_config(name, self.replies.options)
        self.renderer = PrimeRenderer(tokenizer, name, config=config)

    def __call__(self) -> LoopsLLM:
        replies = self.replies
        policy = ScriptedPolicy(self.renderer, [replies.call_reply, replies.answer_reply], logprob=-0.5)
        return LoopsLLM(self.renderer, policy, TokenCapture(), SamplingDefaults(max_tokens=64))

    def reasoning(self, text: str) -> str | None:
        """What the reply's reasoning reads as: `text`, or nothing on a family without reasoning (Llama 3)."""
        return text if self.replies.reasons else None


@pytest.fixture(params=list(FAMILY_REPLIES))
def family(request: pytest.FixtureRequest, family_tokenizer: Callable[[str], Any]) -> Family:
    return Family(request.param, family_tokenizer(request.param))


def one_sequence(llm: LoopsLLM) -> None:
    """The tool round trip trains as one sequence: the second prompt continued the first call's tokens."""
    assert len(llm.capture.calls) == 2
    assert not llm.capture.breaks, llm.capture.breaks
    assert len(llm.capture.sequences()) == 1


async def test_chat_completions_return_the_call_and_the_reasoning(
    gateway: ModelGateway, family: Family
) -> None:
    llm = family()
    lease = gateway.issue("t/family/c0", llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    messages: list[Any] = list(QUESTION)
    resp = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert (choice.message.model_extra or {}).get("reasoning_content") == family.reasoning(REASONING)
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Rome"}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    resp = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    gateway.revoke(lease.key)
    assert resp.choices[0].message.content == "It is sunny in Rome."
    said = (resp.choices[0].message.model_extra or {}).get("reasoning_content")
    assert said == family.reasoning("The tool answered.")
    one_sequence(llm)


async def test_streamed_chat_completions_carry_the_call_and_the_reasoning(
    gateway: ModelGateway, family: Family
) -> None:
    llm = family()
    lease = gateway.issue("t/family/c1", llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    stream = await client.chat.completions.create(model="policy", messages=QUESTION, tools=TOOLS, stream=True)
    reasoning, content, calls, finish = "", "", [], None
    async for chunk in stream:
        for choice in chunk.choices:
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            content += choice.delta.content or ""
            calls += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    gateway.revoke(lease.key)
    assert (reasoning, content, finish) == (family.reasoning(REASONING) or "", "", "tool_calls")
    [call] = calls
    assert call.function is not None and call.function.name == "get_weather"
    assert json.loads(call.function.arguments or "") == {"city": "Rome"}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_the_responses_api_returns_reasoning_and_function_call_items(
    gateway: ModelGateway, family: Family, stream: bool
) -> None:
    llm = family()
    lease = gateway.issue("t/family/r0", llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    conversation: list[Any] = list(QUESTION)
    if stream:
        async with client.responses.stream(
            model="policy", input=conversation, tools=[RESPONSES_TOOL]
        ) as helper:
            events = [e async for e in helper]
            first = await helper.get_final_response()
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.done" in kinds
        streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        assert streamed == (family.reasoning(REASONING) or "")
    else:
        first = await client.responses.create(model="policy", input=conversation, tools=[RESPONSES_TOOL])
    kinds = ["reasoning", "function_call"] if family.replies.reasons else ["function_call"]
    assert [item.type for item in first.output] == kinds
    call = first.output[-1]
    if family.replies.reasons:
        reasoning = first.output[0]
        assert reasoning.type == "reasoning" and [c.text for c in reasoning.content or []] == [REASONING]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Rome"}
    # What agent frameworks do: send the output items back (the reasoning item too), then the tool's result.
    conversation += [item.model_dump(exclude_none=True) for item in first.output]
    conversation.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny"})
    second = await client.responses.create(model="policy", input=conversation, tools=[RESPONSES_TOOL])
    gateway.revoke(lease.key)
    assert second.output_text == "It is sunny in Rome."
    one_sequence(llm)

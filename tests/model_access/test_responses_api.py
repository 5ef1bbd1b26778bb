"""The Responses API (`POST /v1/responses`) through the official `openai` client: plain, streamed and a
tool round trip, each checked to capture (and so train) exactly the tokens the same conversation
captures through `/v1/chat/completions`.

Plain and streamed replies come from the real tiny model with the same seed on both paths; the tool
round trip from a scripted sampler (a random tiny model never writes a tool call).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from loops_nb.llm.capture import TokenCapture
from loops_nb.model_access import ModelGateway, delivery

pytestmark = pytest.mark.asyncio(loop_scope="session")

ADD_TOOL = {
    "type": "function",
    "name": "add",
    "description": "Add two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
}
CHAT_ADD_TOOL = {
    "type": "function",
    "function": {k: v for k, v in ADD_TOOL.items() if k != "type"},
}


def same_tokens(a: TokenCapture, b: TokenCapture) -> None:
    """Two captures train the same: the same calls, token for token, joined into the same sequences.
    Logprobs match to float rounding: the second call's prompt may come from the sampler's prefix cache, and a
    cached prefix is summed in another order on CPUs whose kernels pick blockings by shape (AMX)."""
    assert [(c.prompt_tokens, c.completion_tokens) for c in a.calls] == [
        (c.prompt_tokens, c.completion_tokens) for c in b.calls
    ]
    for x, y in zip(a.calls, b.calls, strict=True):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    assert [(s.tokens, s.sampled) for s in a.sequences()] == [(s.tokens, s.sampled) for s in b.sequences()]
    assert a.breaks == b.breaks


async def test_a_plain_response_captures_what_chat_completions_captures(
    gateway: ModelGateway, make_llm: Any
) -> None:
    via_responses, via_chat = make_llm(seed=21), make_llm(seed=21)
    lease = gateway.issue("t/g0/r0", via_responses)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    resp = await client.responses.create(
        model="tiny", instructions="Be brief.", input="Name a board game.", max_output_tokens=8
    )
    gateway.revoke(lease.key)
    call = via_responses.capture.calls[0]
    assert resp.object == "response" and resp.status in ("completed", "incomplete")
    [item] = resp.output
    assert item.type == "message" and item.role == "assistant"
    assert resp.output_text == via_responses.renderer.parse(call.completion_tokens).content
    assert resp.usage is not None
    assert resp.usage.input_tokens == len(call.prompt_tokens)
    assert resp.usage.output_tokens == len(call.completion_tokens)
    assert (resp.model_extra or {})["loops"]["completion_token_ids"] == call.completion_tokens

    lease = gateway.issue("t/g0/r0-chat", via_chat)
    chat = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    await chat.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a board game."},
        ],
        max_tokens=8,
    )
    gateway.revoke(lease.key)
    same_tokens(via_responses.capture, via_chat.capture)


async def test_a_streamed_response_parses_in_the_openai_client(gateway: ModelGateway, make_llm: Any) -> None:
    llm = make_llm(seed=23)
    lease = gateway.issue("t/g0/r1", llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    events = []
    stream = await client.responses.create(model="tiny", input="Hello", max_output_tokens=8, stream=True)
    async for event in stream:
        events.append(event)
    # The stream helper checks every event against the ones before it (indexes, item ids, order).
    # (A reply cut at max_output_tokens ends in response.incomplete, as OpenAI's does, for which its
    # get_final_response has no answer; the last event carries the Response.)
    async with client.responses.stream(model="tiny", input="Hello again", max_output_tokens=8) as helper:
        helped = [e async for e in helper]
    text = "".join(e.delta for e in helped if e.type == "response.output_text.delta")
    final = helped[-1].response
    gateway.revoke(lease.key)
    first, second = llm.capture.calls
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_item.added" in kinds and "response.output_item.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == llm.renderer.parse(first.completion_tokens).content
    assert events[-1].response.output_text == streamed
    assert text == final.output_text == llm.renderer.parse(second.completion_tokens).content


async def tool_round_trip_by_responses(gateway: ModelGateway, llm: Any, *, stream: bool) -> list[Any]:
    lease = gateway.issue("t/g0/r2", llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    conversation: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
    if stream:
        async with client.responses.stream(model="tiny", input=conversation, tools=[ADD_TOOL]) as helper:
            kinds = [e.type async for e in helper]
            first = await helper.get_final_response()
        assert "response.function_call_arguments.delta" in kinds
    else:
        first = await client.responses.create(model="tiny", input=conversation, tools=[ADD_TOOL])
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "add" and json.loads(call.arguments) == {"a": 2, "b": 3}
    # What agent frameworks do: send the output items back, then the tool's result.
    conversation += [item.model_dump(exclude_none=True) for item in first.output]
    conversation.append({"type": "function_call_output", "call_id": call.call_id, "output": "5"})
    second = await client.responses.create(model="tiny", input=conversation, tools=[ADD_TOOL])
    gateway.revoke(lease.key)
    assert second.output_text == "The sum is 5."
    return [first, second]


async def tool_round_trip_by_chat(gateway: ModelGateway, llm: Any) -> None:
    lease = gateway.issue("t/g0/r2-chat", llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    messages: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
    resp = await client.chat.completions.create(model="tiny", messages=messages, tools=[CHAT_ADD_TOOL])
    [tool_call] = resp.choices[0].message.tool_calls or []
    messages += [
        resp.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tool_call.id, "content": "5"},
    ]
    await client.chat.completions.create(model="tiny", messages=messages, tools=[CHAT_ADD_TOOL])
    gateway.revoke(lease.key)


CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2,   "b": 3}}\n</tool_call>'


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_tool_round_trip_trains_the_tokens_of_the_chat_completions_one(
    gateway: ModelGateway, scripted: Any, stream: bool
) -> None:
    via_responses, policy = scripted(CALL_TEXT, " The sum is 5. ")
    await tool_round_trip_by_responses(gateway, via_responses, stream=stream)
    via_chat, _ = scripted(CALL_TEXT, " The sum is 5. ")
    await tool_round_trip_by_chat(gateway, via_chat)
    same_tokens(via_responses.capture, via_chat.capture)
    # The returned function_call item is rendered from its exact sampled text: one sequence, no break.
    assert not via_responses.capture.breaks
    assert len(via_responses.capture.sequences()) == 1
    assert "<tool_response>\n5\n</tool_response>" in via_responses.renderer.decode(policy.prompts[1])


async def tool_round_trip_by_previous_response_id(gateway: ModelGateway, llm: Any, attempt_id: str) -> str:
    """A tool call answered by continuing its Response (`previous_response_id`); the reply's text."""
    lease = gateway.issue(attempt_id, llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    first = await client.responses.create(model="tiny", input="What is 2 + 3?", tools=[ADD_TOOL])
    [call] = [item for item in first.output if item.type == "function_call"]
    second = await client.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "5"}],
        tools=[ADD_TOOL],
    )
    gateway.revoke(lease.key)
    return second.output_text


async def test_previous_response_id_continues_the_conversation_exactly(
    gateway: ModelGateway, scripted: Any
) -> None:
    llm, _ = scripted(CALL_TEXT, " The sum is 5. ")
    assert await tool_round_trip_by_previous_response_id(gateway, llm, "t/g0/r3") == "The sum is 5."
    via_chat, _ = scripted(CALL_TEXT, " The sum is 5. ")
    await tool_round_trip_by_chat(gateway, via_chat)
    same_tokens(llm.capture, via_chat.capture)


async def test_a_response_can_be_continued_before_the_server_hears_its_send_completed(
    gateway: ModelGateway, scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client has the body (and its id) the moment it is written; the server learns the send
    completed only later, on another loop. A continuation arriving in between must still find it."""
    settle = delivery.Exchange.settle

    def late_settle(self: Any, delivered: bool) -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, settle, self, delivered)

    monkeypatch.setattr(delivery.Exchange, "settle", late_settle)
    llm, _ = scripted(CALL_TEXT, " The sum is 5. ")
    assert await tool_round_trip_by_previous_response_id(gateway, llm, "t/g0/r4") == "The sum is 5."


async def test_an_undelivered_response_cannot_be_continued(
    gateway: ModelGateway, scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[str] = []
    send_whole = delivery.DeliveringResponse.__call__

    async def lost(self: Any, scope: Any, receive: Any, send: Any) -> None:
        sent.append(json.loads(self.body)["id"])
        self.on_sent(False)  # what the server hears when the client left before the body reached it
        await send_whole(self, scope, receive, send)

    monkeypatch.setattr(delivery.DeliveringResponse, "__call__", lost)
    llm, _ = scripted(CALL_TEXT)
    lease = gateway.issue("t/g0/r5", llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    await client.responses.create(model="tiny", input="What is 2 + 3?", tools=[ADD_TOOL])
    for _ in range(100):  # the withdrawal runs on the attempt's loop
        if sent[0] not in lease.responses:
            break
        await asyncio.sleep(0.01)
    assert sent[0] not in lease.responses
    monkeypatch.undo()
    with pytest.raises(openai.BadRequestError, match="not found"):
        await client.responses.create(model="tiny", previous_response_id=sent[0], input="and?")
    gateway.revoke(lease.key)


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"input": 3}, "input", "string or a non-empty list"),
        ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role", "unknown role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]},
            "input[0].content[0]",
            "only text and image content parts",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "messages",
            "renders text only",
        ),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "not supported"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]", "only function tools"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice", "not supported"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "between"),
        ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id", "not found"),
        ({"input": [{"type": "function_call", "call_id": "c"}]}, "input[0].name", "must be a string"),
    ],
)
async def test_malformed_responses_requests_get_400_naming_the_field(
    gateway: ModelGateway, make_llm: Any, body: dict[str, Any], param: str, needle: str
) -> None:
    llm = make_llm()
    lease = gateway.issue("t/g0/r-bad", llm)
    async with httpx.AsyncClient(
        timeout=60, base_url=gateway.url, headers={"Authorization": f"Bearer {lease.key}"}
    ) as http:
        r = await http.post("/responses", json={"model": "tiny", **body})
    gateway.revoke(lease.key)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and needle in error["message"], error
    assert not llm.capture.calls

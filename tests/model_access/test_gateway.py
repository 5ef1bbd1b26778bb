"""The OpenAI-compatible gateway, driven by the official `openai` client and plain httpx.

The policy is a real embedded Loops on the tiny chat model (or, for tool calls a random model never
writes, a scripted sampler); every request goes through the attempt's `LoopsLLM`, so the capture is
checked against what the gateway returned.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from loops_nb.model_access import ModelGateway

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_openai_client_gets_an_openai_shaped_reply(gateway: ModelGateway, make_llm: Any) -> None:
    llm = make_llm(seed=3)
    lease = gateway.issue("t/g0/a0", llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    resp = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Name a board game."}], max_tokens=8
    )
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    call = llm.capture.calls[0]
    assert resp.usage is not None
    assert resp.usage.completion_tokens == len(call.completion_tokens)
    assert resp.usage.prompt_tokens == len(call.prompt_tokens)
    extra = resp.model_extra or {}
    assert extra["loops"]["completion_token_ids"] == call.completion_tokens
    assert extra["loops"]["attempt"] == "t/g0/a0"
    assert choice.message.content == llm.renderer.parse(call.completion_tokens).content
    models = await client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    gateway.revoke(lease.key)


async def test_three_turns_through_the_gateway_are_one_exact_sequence(
    gateway: ModelGateway, make_llm: Any
) -> None:
    llm = make_llm(seed=11)
    lease = gateway.issue("t/g0/a1", llm)
    client = openai.OpenAI(base_url=gateway.url, api_key=lease.key)  # the sync client, off the loop
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Say something."}]
    returned = []
    for follow_up in ("And once more.", "Last one.", None):
        resp = await asyncio.to_thread(
            client.chat.completions.create, model="tiny", messages=messages, max_tokens=6
        )
        returned.append((resp.model_extra or {})["loops"]["completion_token_ids"])
        if follow_up:
            messages += [
                {"role": "assistant", "content": resp.choices[0].message.content},
                {"role": "user", "content": follow_up},
            ]
    gateway.revoke(lease.key)
    capture = llm.capture
    assert len(capture.calls) == 3
    assert not capture.breaks, capture.breaks
    [sequence] = capture.sequences()
    assert [c.completion_tokens for c in capture.calls] == returned
    # Each completion sits in the sequence right after the exact prompt it was sampled from.
    for call in capture.calls:
        start = len(call.prompt_tokens)
        assert sequence.tokens[:start] == call.prompt_tokens
        assert sequence.tokens[start : start + len(call.completion_tokens)] == call.completion_tokens
        assert all(sequence.sampled[start : start + len(call.completion_tokens)])
    assert sum(sequence.sampled) == sum(len(r) for r in returned)


async def test_streaming_with_the_openai_client(gateway: ModelGateway, make_llm: Any) -> None:
    llm = make_llm(seed=5)
    lease = gateway.issue("t/g0/a2", llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    stream = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    gateway.revoke(lease.key)
    call = llm.capture.calls[0]
    assert text == llm.renderer.parse(call.completion_tokens).content
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens == len(call.completion_tokens)


async def test_n_choices_record_only_the_first(gateway: ModelGateway, make_llm: Any) -> None:
    llm = make_llm(seed=7)
    lease = gateway.issue("t/g0/a3", llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    resp = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, n=3, temperature=1.0
    )
    gateway.revoke(lease.key)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert len(llm.capture.calls) == 1


async def test_tool_calls_come_back_parsed_and_the_next_turn_extends(
    gateway: ModelGateway, scripted: Any
) -> None:
    call_text = '<tool_call>\n{"name": "add", "arguments": {"a": 2,   "b": 3}}\n</tool_call>'
    llm, policy = scripted(call_text, " The sum is 5. ")
    lease = gateway.issue("t/g0/a4", llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                },
            },
        }
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 3?"}]
    resp = await client.chat.completions.create(
        model="tiny", messages=messages, tools=tools, tool_choice="auto"
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [tool_call] = choice.message.tool_calls or []
    assert tool_call.function.name == "add"
    assert json.loads(tool_call.function.arguments) == {"a": 2, "b": 3}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tool_call.id, "content": "5"},
    ]
    resp = await client.chat.completions.create(model="tiny", messages=messages, tools=tools)
    assert resp.choices[0].message.content == "The sum is 5."
    assert resp.choices[0].finish_reason == "stop"
    gateway.revoke(lease.key)
    # The template re-serialises the call differently from what was sampled; the gateway renders the
    # returned message from its exact text, so turn 2's prompt extends turn 1's tokens.
    assert not llm.capture.breaks
    assert len(llm.capture.sequences()) == 1
    assert "<tool_response>\n5\n</tool_response>" in llm.renderer.decode(policy.prompts[1])


async def test_tool_choice_none_returns_text_and_named_choice_is_refused(
    gateway: ModelGateway, scripted: Any
) -> None:
    llm, _ = scripted('<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>')
    lease = gateway.issue("t/g0/a5", llm)
    async with httpx.AsyncClient(
        timeout=60, base_url=gateway.url, headers={"Authorization": f"Bearer {lease.key}"}
    ) as http:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tool_choice": "none"}
        r = await http.post("/chat/completions", json=body)
        assert r.status_code == 200
        message = r.json()["choices"][0]["message"]
        assert "tool_calls" not in message and message["content"].startswith("<tool_call>")
        body["tool_choice"] = {"type": "function", "function": {"name": "add"}}
        r = await http.post("/chat/completions", json=body)
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "tool_choice"
        assert "not supported" in r.json()["error"]["message"]
    gateway.revoke(lease.key)


async def test_missing_unknown_and_revoked_leases_get_401(gateway: ModelGateway, make_llm: Any) -> None:
    lease = gateway.issue("t/g0/a6", make_llm())
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    async with httpx.AsyncClient(timeout=60, base_url=gateway.url) as http:
        r = await http.post("/chat/completions", json=body)
        assert r.status_code == 401 and "missing API key" in r.json()["error"]["message"]
        r = await http.post("/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
        r = await http.get("/models", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key, max_retries=0)
    await client.chat.completions.create(**body)
    assert gateway.revoke(lease.key) is lease
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        await client.chat.completions.create(**body)
    assert len(lease.llm.capture.calls) == 1


@pytest.mark.parametrize(
    ("content", "param", "needle"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "JSON object"),
        (json.dumps({"model": "m", "messages": "hi"}).encode(), "messages", "non-empty list"),
        (
            json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(),
            "messages[0].role",
            "unknown role",
        ),
        (json.dumps({"messages": [{"role": "user"}]}).encode(), "messages[0].content", "required"),
        (
            json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(),
            "messages[0].content[0]",
            "must hold the image's URL",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}).encode(),
            "messages[0].content[0]",
            "only text and image content parts",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).encode(),
            "temperature",
            "number",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).encode(),
            "max_tokens",
            "between",
        ),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 99}).encode(), "n", "between"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "stop": [1]}).encode(), "stop", "stop"),
        (
            json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "x"}]}).encode(),
            "tools[0]",
            "function",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}).encode(),
            "stream",
            "boolean",
        ),
        (b"\xff\xfe", None, "not valid JSON"),
    ],
)
async def test_malformed_requests_get_400_naming_the_problem(
    gateway: ModelGateway, make_llm: Any, content: bytes, param: str | None, needle: str
) -> None:
    llm = make_llm()
    lease = gateway.issue("t/g0/bad", llm)
    async with httpx.AsyncClient(
        timeout=60, base_url=gateway.url, headers={"Authorization": f"Bearer {lease.key}"}
    ) as http:
        r = await http.post(
            "/chat/completions", content=content, headers={"content-type": "application/json"}
        )
    gateway.revoke(lease.key)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert needle in error["message"]
    assert not llm.capture.calls


async def test_a_body_over_the_limit_is_refused_and_the_gateway_keeps_serving(make_llm: Any) -> None:
    with ModelGateway(max_body_bytes=2000) as small:
        llm = make_llm()
        lease = small.issue("t/g0/big", llm)
        headers = {"Authorization": f"Bearer {lease.key}"}
        async with httpx.AsyncClient(timeout=60, base_url=small.url, headers=headers) as http:
            big = {"messages": [{"role": "user", "content": "x" * 5000}]}
            r = await http.post("/chat/completions", json=big)
            assert r.status_code == 400 and r.json()["error"]["code"] == "request_too_large"

            async def chunks() -> Any:  # no content-length: the limit applies while reading
                for _ in range(5):
                    yield b" " * 1000

            r = await http.post("/chat/completions", content=chunks())
            assert r.status_code == 400 and "over 2000 bytes" in r.json()["error"]["message"]
            ok = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            r = await http.post("/chat/completions", json=ok)
            assert r.status_code == 200
        small.revoke(lease.key)

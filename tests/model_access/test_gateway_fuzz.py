"""The gateway under hostile requests: random JSON in every field of a chat completion is refused with
a 4xx that names the problem (or served, when it happens to be valid), never a 500; the gateway keeps
serving, and no refused request reaches the model."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loops_nb.model_access import ModelGateway

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
)
JSON = st.recursive(
    SCALARS | st.text(max_size=16),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=16,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "robot", ""]) | JSON},
    optional={"content": st.text(max_size=40) | JSON, "tool_calls": JSON, "tool_call_id": JSON, "name": JSON},
)
TOOL = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "web"]) | JSON}, optional={"function": JSON}
)
BODY = st.fixed_dictionaries(
    {},
    optional={
        "messages": st.lists(MESSAGE, max_size=3) | JSON,
        "tools": st.lists(TOOL, max_size=2) | JSON,
        "tool_choice": st.sampled_from(["auto", "none", "required"]) | JSON,
        "max_tokens": st.integers(-5, 4) | JSON,
        "temperature": st.floats(-1, 3, allow_nan=False) | JSON,
        "top_p": JSON,
        "n": st.integers(-1, 2) | JSON,
        "stop": JSON,
        "stream": st.booleans() | JSON,
        "model": JSON,
        "seed": JSON,
        "logprobs": JSON,
    },
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.mark.slow
async def test_random_requests_get_a_4xx_naming_the_problem_never_a_500(
    gateway: ModelGateway, make_llm: Any
) -> None:
    llm = make_llm(max_tokens=4)
    lease = gateway.issue("fuzz/g0/a0", llm)
    client = httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {lease.key}"}, timeout=60)
    served = 0

    @settings(max_examples=120, suppress_health_check=list(HealthCheck))
    @given(body=BODY)
    @example(body={"messages": [{"role": []}]})  # once a 500: an unhashable role
    @example(
        body={
            "messages": [{"role": "user", "content": [{"type": []}]}],
            "tools": [{"type": "function", "function": {"name": []}}],
        }
    )
    def one(body: dict) -> None:
        nonlocal served
        before = len(llm.capture.calls)
        r = client.post("/chat/completions", json=body)
        assert r.status_code < 500, f"{body!r}: {r.status_code} {r.text[:300]}"
        if r.status_code >= 400:
            assert r.json()["error"]["message"], "a refusal says why"
            # A refused request never sampled; a 400 for a too-long context may have been tried.
            assert (
                len(llm.capture.calls) == before or r.json()["error"].get("code") == "context_length_exceeded"
            )
        else:
            served += 1

    # Hypothesis drives a blocking client from a thread, so this loop stays free to serve the policy.
    await asyncio.to_thread(one)
    ok = await asyncio.to_thread(
        client.post,
        "/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert ok.status_code == 200, ok.text
    gateway.revoke(lease.key)


ITEM = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "x"])
        | JSON,
        "role": st.sampled_from(["user", "assistant", "developer", "tool"]) | JSON,
        "content": st.text(max_size=20)
        | st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["input_text", "output_text", "input_image"]) | JSON},
                optional={"text": st.text(max_size=10) | JSON},
            ),
            max_size=2,
        )
        | JSON,
        "call_id": st.text(max_size=8) | JSON,
        "name": st.text(max_size=8) | JSON,
        "arguments": st.text(max_size=16) | JSON,
        "output": st.text(max_size=16) | JSON,
    },
)
RESPONSES_BODY = st.fixed_dictionaries(
    {},
    optional={
        "input": st.text(max_size=20) | st.lists(ITEM, max_size=3) | JSON,
        "instructions": st.text(max_size=20) | JSON,
        "tools": st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["function", "web_search"]) | JSON}, optional={"name": JSON}
            ),
            max_size=2,
        )
        | JSON,
        "tool_choice": st.sampled_from(["auto", "none", "required"]) | JSON,
        "max_output_tokens": st.integers(-5, 4) | JSON,
        "temperature": JSON,
        "previous_response_id": JSON,
        "stream": st.booleans() | JSON,
        "store": JSON,
        "model": JSON,
    },
)


@pytest.mark.slow
async def test_random_responses_requests_get_a_4xx_naming_the_problem_never_a_500(
    gateway: ModelGateway, make_llm: Any
) -> None:
    llm = make_llm(max_tokens=4)
    lease = gateway.issue("fuzz/g0/a1", llm)
    client = httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {lease.key}"}, timeout=60)

    @settings(max_examples=120, suppress_health_check=list(HealthCheck))
    @given(body=RESPONSES_BODY)
    @example(body={"input": [{"type": "function_call", "name": "f", "call_id": "c"}]})
    def one(body: dict) -> None:
        before = len(llm.capture.calls)
        r = client.post("/responses", json=body)
        assert r.status_code < 500, f"{body!r}: {r.status_code} {r.text[:300]}"
        if r.status_code >= 400:
            assert r.json()["error"]["message"], "a refusal says why"
            assert (
                len(llm.capture.calls) == before or r.json()["error"].get("code") == "context_length_exceeded"
            )

    await asyncio.to_thread(one)
    ok = await asyncio.to_thread(client.post, "/responses", json={"input": "hi", "max_output_tokens": 2})
    assert ok.status_code == 200, ok.text
    gateway.revoke(lease.key)

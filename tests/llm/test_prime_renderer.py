"""`PrimeRenderer` on five families' real tokenizers: each renders a tool conversation in its own syntax, reads
a reply written in that syntax back (reasoning, content, tool call), keeps a malformed call as an error, and
continues a turn's exact tokens into the next prompt."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from family_replies import CALL, FAMILY_REPLIES, REASONING, THREE_TURNS, TOOLS

from loops_nb.llm.capture import ModelCall, TokenCapture
from loops_nb.llm.prime_renderer import PrimeRenderer
from loops_nb.llm.renderer_choice import renderer_config

FAMILIES = sorted(FAMILY_REPLIES)


def family_renderer(name: str, family_tokenizer: Callable[[str], Any]) -> PrimeRenderer:
    replies = FAMILY_REPLIES[name]
    config = renderer_config(replies.renderer).model_copy(update=replies.options)
    return PrimeRenderer(family_tokenizer(name), replies.renderer, config=config)


def call_of(renderer: PrimeRenderer, prompt: list[int], text: str) -> ModelCall:
    completion = renderer.encode(text)
    return ModelCall(prompt, completion, [-0.5] * len(completion), 0, "stop")


@pytest.mark.parametrize("name", FAMILIES)
def test_a_three_turn_tool_conversation_renders_in_the_family_syntax(
    name: str, family_tokenizer: Callable[[str], Any]
) -> None:
    renderer = family_renderer(name, family_tokenizer)
    prompt = renderer.prompt_tokens(THREE_TURNS, TOOLS)
    text = renderer.decode(prompt)
    for marker in FAMILY_REPLIES[name].markers:
        assert marker in text, (marker, text[-1500:])
    assert "And in Rome?" in text and "sunny, 21 C" in text
    assert renderer.stop_token_ids  # each family ends its turn on its own tokens


@pytest.mark.parametrize("name", FAMILIES)
def test_a_reply_in_the_family_syntax_parses_to_reasoning_content_and_a_call(
    name: str, family_tokenizer: Callable[[str], Any]
) -> None:
    renderer, replies = family_renderer(name, family_tokenizer), FAMILY_REPLIES[name]
    prompt = renderer.prompt_tokens(THREE_TURNS, TOOLS)
    call = call_of(renderer, prompt, replies.call_reply)
    parsed = renderer.parse(call.completion_tokens, prompt_tokens=prompt, tools=TOOLS)
    assert parsed.tool_call_errors == []
    [tool_call] = parsed.tool_calls
    assert tool_call["type"] == "function" and tool_call["id"]
    assert tool_call["function"]["name"] == CALL["name"]
    assert json.loads(tool_call["function"]["arguments"]) == CALL["arguments"]
    assert parsed.reasoning == (REASONING if replies.reasons else "")
    assert parsed.content == ""

    answer = renderer.parse(renderer.encode(replies.answer_reply), prompt_tokens=prompt, tools=TOOLS)
    assert answer.content == "It is sunny in Rome."
    assert answer.tool_calls == [] and answer.tool_call_errors == []
    assert answer.reasoning == ("The tool answered." if replies.reasons else "")


@pytest.mark.parametrize("name", FAMILIES)
def test_a_malformed_call_is_kept_and_counted(name: str, family_tokenizer: Callable[[str], Any]) -> None:
    renderer, replies = family_renderer(name, family_tokenizer), FAMILY_REPLIES[name]
    prompt = renderer.prompt_tokens(THREE_TURNS, TOOLS)
    parsed = renderer.parse(renderer.encode(replies.malformed_reply), prompt_tokens=prompt, tools=TOOLS)
    assert parsed.tool_calls == []
    if name == "llama-3":
        # Llama 3 writes a call as bare JSON, with no markers: JSON that does not parse cannot be told from
        # prose, so it stays the content (as in Meta's own parser).
        assert parsed.tool_call_errors == [] and parsed.content.startswith('{"name": "get_weather"')
        return
    [error] = parsed.tool_call_errors
    assert error.startswith("tool call 0: ") and "Ro" in error  # what the model wrote, kept


@pytest.mark.parametrize("name", FAMILIES)
def test_the_next_turn_continues_the_exact_tokens(name: str, family_tokenizer: Callable[[str], Any]) -> None:
    """A call, then its tool result: the second prompt starts with the first prompt + completion token for
    token, and the capture joins both calls into one sequence."""
    renderer, replies = family_renderer(name, family_tokenizer), FAMILY_REPLIES[name]
    conversation = [{"role": "user", "content": "What is the weather in Rome?"}]
    first_prompt = renderer.prompt_tokens(conversation, TOOLS)
    first = call_of(renderer, first_prompt, replies.call_reply)
    first = ModelCall(**{**first.__dict__, "messages": list(conversation)})
    capture = TokenCapture()
    capture.record(first)
    reply = renderer.parse(first.completion_tokens, prompt_tokens=first_prompt, tools=TOOLS)
    sent_back = {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}
    follow = [*conversation, sent_back, {"role": "tool", "tool_call_id": "call_0", "content": "sunny"}]

    second_prompt = renderer.prompt_tokens(follow, TOOLS, capture.last_call())
    before = first.prompt_tokens + first.completion_tokens
    assert second_prompt[: len(before)] == before
    assert "sunny" in renderer.decode(second_prompt[len(before) :])
    capture.record(call_of(renderer, second_prompt, replies.answer_reply))
    assert not capture.breaks
    assert len(capture.sequences()) == 1


def test_an_edited_history_or_another_conversation_is_rendered_afresh(
    family_tokenizer: Callable[[str], Any],
) -> None:
    """The bridge continues a call only in the conversation it was sampled in, with its reply as sampled."""
    renderer, replies = family_renderer("qwen3", family_tokenizer), FAMILY_REPLIES["qwen3"]
    conversation = [{"role": "user", "content": "What is the weather in Rome?"}]
    prompt = renderer.prompt_tokens(conversation, TOOLS)
    first = call_of(renderer, prompt, replies.call_reply)
    first = ModelCall(**{**first.__dict__, "messages": list(conversation)})
    reply = renderer.parse(first.completion_tokens, prompt_tokens=prompt, tools=TOOLS)
    tool = {"role": "tool", "tool_call_id": "call_0", "content": "sunny"}
    sent_back = {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}
    edited_reply = {
        **sent_back,
        "tool_calls": [
            {**reply.tool_calls[0], "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    }
    other = [{"role": "user", "content": "What is the weather in Oslo?"}, sent_back, tool]
    for messages in ([*conversation, edited_reply, tool], other):
        fresh = renderer.prompt_tokens(messages, TOOLS)
        assert renderer.prompt_tokens(messages, TOOLS, first) == fresh
        assert fresh[: len(prompt) + len(first.completion_tokens)] != prompt + first.completion_tokens


def test_tool_results_are_named_after_their_call(family_tokenizer: Callable[[str], Any]) -> None:
    """gpt-oss writes the tool's name in a result's header; an OpenAI tool message only has the call id."""
    renderer = family_renderer("gpt-oss", family_tokenizer)
    text = renderer.decode(renderer.prompt_tokens(THREE_TURNS, TOOLS))
    assert "<|start|>functions.get_weather to=assistant" in text
    assert "functions.unknown" not in text


@pytest.mark.parametrize("name", ["qwen3.6", "deepseek-v4"])
def test_a_kept_parse_is_the_parse_and_a_caller_cannot_change_it(
    name: str, family_tokenizer: Callable[[str], Any]
) -> None:
    """The twin: the parse an attempt's next call finds kept equals a fresh renderer's parse of the same tokens."""
    renderer, fresh = family_renderer(name, family_tokenizer), family_renderer(name, family_tokenizer)
    prompt = renderer.prompt_tokens(THREE_TURNS[:2], TOOLS)
    completion = renderer.encode(FAMILY_REPLIES[name].call_reply)
    first = renderer.parse(completion, prompt_tokens=prompt, tools=TOOLS)
    first.tool_calls.clear()  # a caller's own copy
    again = renderer.parse(completion, prompt_tokens=prompt, tools=TOOLS)
    assert again == fresh.parse(completion, prompt_tokens=prompt, tools=TOOLS)
    assert [c["function"]["name"] for c in again.tool_calls] == ["get_weather"]
    assert renderer.parse(completion, prompt_tokens=prompt, tools=None) == fresh.parse(
        completion, prompt_tokens=prompt
    )

"""`parse_assistant_text` (the chat template's parse): Qwen3.5/3.6's XML calls and `<think>` reasoning, as a
model of that family writes them under its own template."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from family_replies import TOOLS

from loops_nb.llm.renderer import ChatRenderer
from loops_nb.llm.templates import TOOL_CAPABLE_CHATML_TEMPLATE, parse_assistant_text

QWEN36_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
)


def test_the_qwen36_xml_call_parses() -> None:
    reply = parse_assistant_text(QWEN36_CALL)
    assert reply.tool_call_errors == []
    assert reply.content == ""
    assert reply.tool_calls[0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }


def test_think_is_reasoning_not_content() -> None:
    reply = parse_assistant_text(f"<think>\nI need the weather.\n</think>\n\nLet me look.\n{QWEN36_CALL}")
    assert reply.reasoning == "I need the weather."
    assert reply.content == "Let me look."
    assert len(reply.tool_calls) == 1
    # The template opened the block in the prompt (Qwen3.5/3.6): the reply holds only its end.
    opened = parse_assistant_text("I need the weather.\n</think>\n\nIt is sunny.")
    assert (opened.reasoning, opened.content) == ("I need the weather.", "It is sunny.")
    # Cut off while reasoning: all of it is reasoning, no content.
    cut = parse_assistant_text("Still thinking about", reasoning_open=True)
    assert (cut.reasoning, cut.content) == ("Still thinking about", "")
    assert parse_assistant_text("<think>\nhalf a thought").reasoning == "half a thought"
    assert parse_assistant_text("No reasoning here.").reasoning == ""


def test_xml_values_are_typed_by_the_tool_schema() -> None:
    call = (
        "<tool_call>\n<function=f>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "<parameter=note>\ntwo\nlines\n</parameter>\n</function>\n</tool_call>"
    )
    tools = [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"properties": {"city": {"type": "string"}}}},
        }
    ]
    [parsed] = parse_assistant_text(call, tools=tools).tool_calls
    assert json.loads(parsed["function"]["arguments"]) == {"city": "42", "days": 3, "note": "two\nlines"}
    [untyped] = parse_assistant_text(call).tool_calls
    assert json.loads(untyped["function"]["arguments"])["city"] == 42


def test_malformed_xml_calls_are_reported() -> None:
    text = (
        "<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"
        "<tool_call>\n<function=b>\nstray text\n</function>\n</tool_call>"
        "<tool_call>\n<function=c>\n<parameter=x>\n1\n</parameter>\n</tool_call>"
        "<tool_call>\n<function=d>\n<parameter=x>\nhal"
    )
    reply = parse_assistant_text(text)
    assert [c["function"] for c in reply.tool_calls] == [{"name": "a", "arguments": '{"x": 1}'}]
    assert reply.tool_call_errors == [
        "tool call 1: text outside <parameter=...> blocks in <function=b>",
        "tool call 2: expected <function=name> ... </function>",
        "tool call 3: no closing </tool_call>",
    ]


def test_the_chat_renderer_reads_a_qwen36_reply(family_tokenizer: Callable[[str], Any]) -> None:
    """A Qwen3.6 model under a chat template (model.renderer = "chat_template"): the prompt opened `<think>`,
    the reply closes it and calls in XML."""
    renderer = ChatRenderer(family_tokenizer("qwen3.6"), TOOL_CAPABLE_CHATML_TEMPLATE)
    prompt = renderer.encode(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    completion = renderer.encode(f"It needs the tool.\n</think>\n\n{QWEN36_CALL}<|im_end|>")
    parsed = renderer.parse(completion, prompt_tokens=prompt, tools=TOOLS)
    assert parsed.reasoning == "It needs the tool."
    assert parsed.content == ""
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["get_weather"]
    cut = renderer.parse(renderer.encode("It needs"), prompt_tokens=prompt)
    assert (cut.reasoning, cut.content) == ("It needs", "")

"""The tool-capable ChatML template and parsing its tool calls back."""

from __future__ import annotations

from typing import Any

from sft_fixtures import SMOLLM2_CHAT_TEMPLATE

from loops_nb.llm.templates import TOOL_CAPABLE_CHATML_TEMPLATE, parse_assistant_text, parse_tool_calls

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def test_smollm2_template_matches_its_gguf_text() -> None:
    assert SMOLLM2_CHAT_TEMPLATE == (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )


def test_tool_capable_template_renders_like_smollm2_without_tools(smollm2: Any) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    for prompt in (False, True):
        ours = smollm2.apply_chat_template(
            messages, chat_template=TOOL_CAPABLE_CHATML_TEMPLATE, tokenize=False, add_generation_prompt=prompt
        )
        assert ours == smollm2.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)


def test_tool_capable_template_layout(smollm2: Any) -> None:
    messages = [
        {"role": "system", "content": "You check the weather."},
        {"role": "user", "content": "Paris?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },
                {
                    "id": "b",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Nice"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "rain"},
    ]
    text = smollm2.apply_chat_template(
        messages,
        tools=TOOLS,
        chat_template=TOOL_CAPABLE_CHATML_TEMPLATE,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text.startswith("<|im_start|>system\nYou check the weather.\n\n# Tools\n")
    assert (
        '<tools>\n{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}\n'
        "</tools>" in text
    )
    assert (
        "<|im_start|>assistant\nLet me look.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Nice"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert text.endswith(
        "<|im_start|>tool\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>tool\n<tool_response>\nrain\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    calls = parse_tool_calls(text[text.index("Let me look.") :])
    assert calls == [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_weather", "arguments": {"city": "Nice"}},
    ]


def test_parse_assistant_text_reports_malformed_calls() -> None:
    text = (
        'Checking.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        "<tool_call>{not json}</tool_call>\n"
        '<tool_call>{"arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>\n'
        '<tool_call>{"name": "c", "arguments": [1]}</tool_call>\n'
        '<tool_call>{"name": "d", "arguments": {}}'
    )
    reply = parse_assistant_text(text)
    assert reply.content == "Checking."
    assert parse_tool_calls(text) == [
        {"name": "a", "arguments": {"x": 1}},
        {"name": "b", "arguments": {"y": 2}},
    ]
    assert reply.tool_call_errors == [
        "tool call 1: not valid JSON (Expecting property name enclosed in double quotes)",
        'tool call 2: expected {"name": <string>, "arguments": <object>}',
        "tool call 4: arguments must be a JSON object",
        "tool call 5: no closing </tool_call>",
    ]
    assert reply.tool_calls[1] == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "b", "arguments": '{"y": 2}'},
    }


def test_parse_tool_calls_on_plain_text() -> None:
    assert parse_tool_calls("The answer is 4.") == []
    assert parse_assistant_text("The answer is 4.").content == "The answer is 4."

"""A tool conversation, and replies written in each model family's own syntax, for renderer and gateway tests.

Each family's reply is the text a model of that family writes after its renderer's generation prompt (Qwen3.6
and gpt-oss prompts open the reasoning block themselves, so their replies start inside it): reasoning, then a
call to `get_weather`. Token ids are made by encoding the text with the family's tokenizer
(family_tokenizers.py), as its model would have sampled them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

CALL = {"name": "get_weather", "arguments": {"city": "Rome"}}
REASONING = "The user wants the weather, so I call the tool."

THREE_TURNS: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a weather assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I need the tool.",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21 C"},
    {"role": "assistant", "content": "It is sunny in Paris, 21 C."},
    {"role": "user", "content": "And in Rome?"},
]
"""System, user, assistant (reasoning + tool call), tool result, answer, user: the conversation a family's
renderer must render with its own markers."""


@dataclass(frozen=True)
class FamilyReplies:
    renderer: str
    call_reply: str
    """Reasoning, then the call to get_weather(city="Rome"), then the end of the turn."""
    answer_reply: str
    """The answer after the tool result, without a call."""
    malformed_reply: str
    """A call the family's parser sees as a call but cannot read."""
    markers: tuple[str, ...]
    """Text the family's render of THREE_TURNS holds (its turn and tool-call syntax)."""
    reasons: bool = True
    """Whether the family writes reasoning (Llama 3 has no reasoning channel)."""
    options: dict[str, Any] = field(default_factory=dict)
    """`renderers` config fields the family's test renderer takes (DeepSeek V4 reasons only in thinking mode)."""


FAMILY_REPLIES = {
    "qwen3": FamilyReplies(
        "qwen3",
        f'<think>\n{REASONING}\n</think>\n\n<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "Rome"}}}}\n'
        "</tool_call><|im_end|>",
        "<think>\nThe tool answered.\n</think>\n\nIt is sunny in Rome.<|im_end|>",
        '<think>\nHm.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": Rome}}\n</tool_call>'
        "<|im_end|>",
        (
            "<|im_start|>assistant\n",
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
            "<tools>",
        ),
    ),
    "qwen3.6": FamilyReplies(
        "qwen3.6",
        f"{REASONING}\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>",
        "The tool answered.\n</think>\n\nIt is sunny in Rome.<|im_end|>",
        "Hm.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRo",
        ("<function=get_weather>\n<parameter=city>\nParis\n</parameter>", "<|im_start|>assistant\n<think>\n"),
    ),
    "llama-3": FamilyReplies(
        "llama-3",
        '{"name": "get_weather", "parameters": {"city": "Rome"}}<|eot_id|>',
        "It is sunny in Rome.<|eot_id|>",
        '{"name": "get_weather", "parameters": {"city": Rome}}<|eot_id|>',
        (
            "<|start_header_id|>ipython<|end_header_id|>",
            '{"name": "get_weather", "parameters": {"city": "Paris"}}',
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        reasons=False,
    ),
    "deepseek-v4": FamilyReplies(
        "deepseek-v4",
        f'{REASONING}</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        "</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
        "The tool answered.</think>It is sunny in Rome.<｜end▁of▁sentence｜>",
        'Hm.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
        'string="true">Ro',
        ('<｜DSML｜invoke name="get_weather">', "<｜User｜>", "<｜Assistant｜>"),
        options={"enable_thinking": True},
    ),
    "gpt-oss": FamilyReplies(
        "gpt-oss",
        f"{REASONING}<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Rome"}<|call|>',
        "The tool answered.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny in Rome.<|return|>",
        'Hm.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": Rome}'
        "<|call|>",
        (
            "<|start|>assistant to=functions.get_weather<|channel|>commentary",
            "<|start|>functions.get_weather to=assistant",
            "type get_weather",
        ),
    ),
}

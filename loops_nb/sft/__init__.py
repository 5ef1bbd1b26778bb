"""Supervised fine-tuning: data contracts, the target rule, check and training.

`read_rows` streams a JSONL dataset into validated rows (or refusals with a reason), a `Renderer` turns them
into training `Example`s with the model's own chat template, and `CheckReport` summarises what trains.
"""

from loops_nb.sft.data import ChatRow, Message, RefusedRow, TokenizedRow, iter_rows, parse_row, read_rows
from loops_nb.sft.rendering import Example, RenderedRow, Renderer
from loops_nb.sft.report import CheckReport
from loops_nb.sft.templates import (
    SMOLLM2_CHAT_TEMPLATE,
    TOOL_CAPABLE_CHATML_TEMPLATE,
    parse_assistant_text,
    parse_tool_calls,
)

__all__ = [
    "SMOLLM2_CHAT_TEMPLATE",
    "TOOL_CAPABLE_CHATML_TEMPLATE",
    "ChatRow",
    "CheckReport",
    "Example",
    "Message",
    "RefusedRow",
    "RenderedRow",
    "Renderer",
    "TokenizedRow",
    "iter_rows",
    "parse_assistant_text",
    "parse_row",
    "parse_tool_calls",
    "read_rows",
]

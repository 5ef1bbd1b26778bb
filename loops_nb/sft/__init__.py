"""Supervised fine-tuning: data contracts, the target rule, check and training.

`read_rows` streams a JSONL dataset into validated rows (or refusals with a reason), a `Renderer` turns them
into training `Example`s with the model's own chat template, and `CheckReport` summarises what trains.
`SFTData` plans which examples train at each step, `SFTRun` trains them (resuming exactly), and `compare`
samples the base model and the trained adapter on held-out conversations.
"""

from loops_nb.sft.batching import BatchPlan, ExampleIndex, SFTData, is_held_out
from loops_nb.sft.compare import Comparison, compare, score_reply
from loops_nb.sft.data import ChatRow, Message, RefusedRow, TokenizedRow, iter_rows, parse_row, read_rows
from loops_nb.sft.recipe import SFTCheckReport
from loops_nb.sft.rendering import Example, RenderedRow, Renderer
from loops_nb.sft.report import CheckReport
from loops_nb.sft.schedule import learning_rate
from loops_nb.sft.templates import (
    SMOLLM2_CHAT_TEMPLATE,
    TOOL_CAPABLE_CHATML_TEMPLATE,
    parse_assistant_text,
    parse_tool_calls,
)
from loops_nb.sft.train import SFTOutcome, SFTRun

__all__ = [
    "SMOLLM2_CHAT_TEMPLATE",
    "TOOL_CAPABLE_CHATML_TEMPLATE",
    "BatchPlan",
    "ChatRow",
    "CheckReport",
    "Comparison",
    "Example",
    "ExampleIndex",
    "Message",
    "RefusedRow",
    "RenderedRow",
    "Renderer",
    "SFTCheckReport",
    "SFTData",
    "SFTOutcome",
    "SFTRun",
    "TokenizedRow",
    "compare",
    "is_held_out",
    "iter_rows",
    "learning_rate",
    "parse_assistant_text",
    "parse_row",
    "parse_tool_calls",
    "read_rows",
    "score_reply",
]

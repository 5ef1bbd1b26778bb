"""The real SmolLM2 tokenizer (the offline default, dequantised once per machine by the `smollm2_path` fixture)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sft_fixtures import SMOLLM2_CHAT_TEMPLATE

from loops_nb.llm.templates import TOOL_CAPABLE_CHATML_TEMPLATE
from loops_nb.sft.data import parse_row
from loops_nb.sft.targets import RenderedRow, chat_targets

TOOL_ROW = {
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ],
}


@pytest.fixture(scope="module")
def tok(smollm2_path: Path) -> Any:
    # Built from the files directly: AutoTokenizer.from_pretrained takes seconds to resolve the class.
    from transformers import PreTrainedTokenizerFast

    cached = smollm2_path
    config = json.loads((cached / "tokenizer_config.json").read_text())
    return PreTrainedTokenizerFast(
        tokenizer_file=str(cached / "tokenizer.json"),
        bos_token=config["bos_token"],
        eos_token=config["eos_token"],
        pad_token=config.get("pad_token"),
        unk_token=config.get("unk_token"),
        chat_template=(cached / "chat_template.jinja").read_text(),
    )


def test_template_is_the_real_one(tok: Any) -> None:
    assert tok.chat_template == SMOLLM2_CHAT_TEMPLATE


def test_real_tokenizer_targets(tok: Any) -> None:
    row = parse_row(
        {
            "messages": [
                {"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": "Paris."},
            ]
        }
    )
    result = chat_targets(tok).render(row)
    assert isinstance(result, RenderedRow)
    [example] = result.examples
    trained = [s.text for s in example.segments(tok) if s.trained]
    assert trained == ["Paris.<|im_end|>"]
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Capital of France?"}], add_generation_prompt=True, return_dict=False
    )
    assert example.input_ids[: len(prompt)] == prompt and not any(example.weights[: len(prompt)])


def test_real_tokenizer_tool_rows(tok: Any) -> None:
    refused = chat_targets(tok).render(parse_row(TOOL_ROW, 3))
    assert not isinstance(refused, RenderedRow)
    assert refused.reason.startswith("messages[1].tool_calls[0]: the chat template dropped this tool call")
    result = chat_targets(tok, chat_template=TOOL_CAPABLE_CHATML_TEMPLATE).render(parse_row(TOOL_ROW, 3))
    assert isinstance(result, RenderedRow)
    trained = [s.text for s in result.examples[0].segments(tok) if s.trained]
    assert trained == [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        "Sunny.<|im_end|>",
    ]

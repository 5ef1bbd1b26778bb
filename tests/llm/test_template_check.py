"""`loops check`'s template preflight: a sample tool conversation played through the configured renderer says
how many sequence breaks an attempt will have and whether a tool call survives; SmolLM2's own template drops
tool calls, a template that rewrites history warns, a family renderer (Qwen3, chosen by its Hub id from a
config) extends every turn."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sft_fixtures import build_tokenizer

from loops_nb.config.sections import ModelConfig
from loops_nb.llm.prime_renderer import PrimeRenderer
from loops_nb.llm.renderer import ChatRenderer
from loops_nb.llm.template_check import template_report
from loops_nb.model_renderer import load_model_renderer


def test_smollm2s_own_template_drops_tool_calls_and_the_line_names_the_fix() -> None:
    line, warnings = template_report(ChatRenderer(build_tokenizer("smollm2")))
    assert line.startswith("template: chat_template on a sample tool conversation: 2 model calls, 0 sequence")
    assert "tool call round trip fails, the rendered call parses back as no call" in line
    assert "[model] chat_template_file" in line and 'chat_template = "chatml-tools"' in line
    assert warnings == []  # a task without tools needs none: the quickstarts' check stays ok
    line, warnings = template_report(ChatRenderer(build_tokenizer("smollm2_tools")))
    assert line.endswith("0 sequence break(s) per attempt; tool call round trip ok") and warnings == []


def test_a_template_that_rewrites_history_warns_with_the_breaks_and_the_fix() -> None:
    counting = (
        "<|im_start|>system\n{{ messages|length }} messages<|im_end|>\n"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    line, [warning] = template_report(ChatRenderer(build_tokenizer("smollm2"), counting))
    assert "2 sequence break(s) per attempt (2 template_rewrote_history)" in line
    assert warning.startswith("template: each attempt like the sample breaks into 3 training sequences")
    assert "first difference at token " in warning and "[model] renderer" in warning
    assert "[model] chat_template_file" in warning


def test_a_family_renderer_from_a_hub_id_extends_every_turn(
    tmp_path: Path, family_tokenizer: Callable[[str], Any]
) -> None:
    family_tokenizer("qwen3").save_pretrained(tmp_path)
    renderer = load_model_renderer(
        ModelConfig(base_model="Qwen/Qwen3-8B", tokenizer=str(tmp_path)), "serverless"
    )
    line, warnings = template_report(renderer)
    # The sample's last prompt follows a new user message, where Qwen3 drops earlier reasoning as its own
    # template does: said in the line, not warned.
    assert line == (
        "template: qwen3 on a sample tool conversation: 2 model calls, 1 sequence break(s) per attempt (1 "
        "reasoning_dropped; reasoning dropped at the new user message, as the family's own template drops it); "
        "tool call round trip ok"
    )
    assert warnings == []


@pytest.mark.parametrize("name", ["qwen3.6", "gpt-oss", "llama-3", "deepseek-v4"])
def test_every_family_plays_the_whole_sample_attempt(
    name: str, family_tokenizer: Callable[[str], Any]
) -> None:
    """Qwen3.6 and gpt-oss open reasoning in their prompts: their replies are played as the family writes them
    after the prompt (the turn's training target), so the check runs every turn and finds no break inside the
    tool round trip."""
    line, warnings = template_report(PrimeRenderer(family_tokenizer(name), name))
    assert "2 model calls" in line and line.endswith("tool call round trip ok"), line
    assert warnings == []
    breaks = 0 if name in ("llama-3", "deepseek-v4") else 1
    assert f"{breaks} sequence break(s) per attempt" in line

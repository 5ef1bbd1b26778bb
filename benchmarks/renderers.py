"""Renderers: prompts rendered per second by each seam, on `loops check`'s sample tool conversation (system,
user, tool call, tool result, answer, user; one tool). The reference is the chat template (`ChatRenderer`) on
SmolLM2 with `chatml-tools`; each row is one family's renderer (`PrimeRenderer`) on its real vocabulary.
Informational: a render is per model call, next to a sampler's milliseconds per token.

Deliberate simplifications: a fresh render each time (no previous call to extend or bridge), one
conversation shape, the family tokenizers the tests build offline (tests/family_tokenizers.py, dev
dependencies).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from benchmarks.common import MODEL, Result, median_time

FAMILIES = ("qwen3", "qwen3.6", "llama-3", "deepseek-v4", "gpt-oss")
RENDERS = 200


def _renders_per_second(renderer: object) -> float:
    from loops_nb.llm.template_check import SAMPLE_TOOLS, SAMPLE_TURNS

    def batch() -> None:
        for _ in range(RENDERS):
            renderer.prompt_tokens(SAMPLE_TURNS, SAMPLE_TOOLS)  # type: ignore[attr-defined]

    batch()  # warm: template compilation, caches
    return RENDERS / median_time(batch, 3)


def run() -> list[Result]:
    from loops_nb.llm.prime_renderer import PrimeRenderer
    from loops_nb.llm.renderer import ChatRenderer
    from loops_nb.llm.templates import TOOL_CAPABLE_CHATML_TEMPLATE
    from loops_nb.local.model_store import load_tokenizer, resolve_model

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from family_tokenizers import family_tokenizer, tiktoken_encodings_dir

    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", tiktoken_encodings_dir())
    tokenizer = load_tokenizer(resolve_model(MODEL), chat_template=None)
    template = _renders_per_second(ChatRenderer(tokenizer, TOOL_CAPABLE_CHATML_TEMPLATE))
    return [
        Result(
            f"renderers: {name} (PrimeRenderer) vs chat template (SmolLM2)",
            _renders_per_second(PrimeRenderer(family_tokenizer(name), name)),
            template,
            "renders/s",
            "informational",
        )
        for name in FAMILIES
    ]

"""Renderers: prompts rendered per second by each seam. The reference is the chat template (`ChatRenderer`) on
SmolLM2 with `chatml-tools`; each row is one family's renderer (`PrimeRenderer`) on its real vocabulary.
Informational: a render is per model call, next to a sampler's milliseconds per token.

Two rows per family:
- `fresh`: `loops check`'s sample tool conversation (system, user, tool call, tool result, answer, user; one
  tool) rendered from scratch, as a first call is;
- `per call in an attempt`: a 12-call tool attempt (each call's prompt = the last one's prompt and reply, then
  the tool's result), rendered as `llm().chat` renders each call, with the previous call: the chat template
  renders the whole conversation again every call, a family's renderer bridges from the previous tokens.

Deliberate simplifications: one conversation shape; the replies are the renderer's own writing of a call
(not sampled); the family tokenizers the tests build offline (tests/family_tokenizers.py, dev dependencies).
Run: `uv run python -m benchmarks renderers`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from benchmarks.common import MODEL, Result, median_time

FAMILIES = ("qwen3", "qwen3.6", "llama-3", "deepseek-v4", "gpt-oss")
RENDERS = 200
CALLS = 12


def _renders_per_second(renderer: object) -> float:
    from loops_nb.llm.template_check import SAMPLE_TOOLS, SAMPLE_TURNS

    def batch() -> None:
        for _ in range(RENDERS):
            renderer.prompt_tokens(SAMPLE_TURNS, SAMPLE_TOOLS)  # type: ignore[attr-defined]

    batch()  # warm: template compilation, caches
    return RENDERS / median_time(batch, 3)


def _attempt(renderer: object) -> list[tuple[list[dict], object]]:
    """Each call of a CALLS-call tool attempt: (its conversation, the previous call), the replies written as
    the renderer writes a call (through its stop token)."""
    from loops_nb.llm.capture import ModelCall
    from loops_nb.llm.prime_renderer import PrimeRenderer
    from loops_nb.llm.template_check import SAMPLE_TOOLS, SAMPLE_TURNS

    conversation, previous, calls = list(SAMPLE_TURNS[:2]), None, []
    for k in range(CALLS):
        calls.append((list(conversation), previous))
        prompt, _ = renderer.render_prompt(conversation, SAMPLE_TOOLS, previous)  # type: ignore[attr-defined]
        call = {
            "id": f"call_{k}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": f'{{"city": "City {k}"}}'},
        }
        reply = {"role": "assistant", "content": "", "tool_calls": [call]}
        result = {"role": "tool", "tool_call_id": f"call_{k}", "content": f"sunny, {k} C"}
        if isinstance(renderer, PrimeRenderer):  # with reasoning, as a reasoning model writes (gpt-oss must)
            reply["reasoning_content"] = f"I look up city {k}."
            written = renderer.reply_tokens([*conversation, reply], SAMPLE_TOOLS)
        else:
            base = renderer.prompt_tokens(conversation, SAMPLE_TOOLS)  # type: ignore[attr-defined]
            written = renderer.prompt_tokens([*conversation, reply, result], SAMPLE_TOOLS)[len(base) :]  # type: ignore[attr-defined]
        stops = renderer.stop_token_ids  # type: ignore[attr-defined]
        end = next(i for i, t in enumerate(written) if t in stops) + 1
        previous = ModelCall(prompt, written[:end], [0.0] * end, 0, "stop", messages=list(conversation))
        conversation += [reply, result]
    return calls


def _calls_per_second(renderer: object) -> float:
    from loops_nb.llm.template_check import SAMPLE_TOOLS

    calls = _attempt(renderer)

    def attempt() -> None:
        for conversation, previous in calls:
            renderer.render_prompt(conversation, SAMPLE_TOOLS, previous)  # type: ignore[attr-defined]

    attempt()
    return len(calls) * 10 / median_time(lambda: [attempt() for _ in range(10)], 3)


def run() -> list[Result]:
    from loops_nb.llm.prime_renderer import PrimeRenderer
    from loops_nb.llm.renderer import ChatRenderer
    from loops_nb.llm.templates import TOOL_CAPABLE_CHATML_TEMPLATE
    from loops_nb.local.model_store import load_tokenizer, resolve_model

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from family_tokenizers import family_tokenizer, tiktoken_encodings_dir

    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", tiktoken_encodings_dir())
    tokenizer = load_tokenizer(resolve_model(MODEL), chat_template=None)
    chat = ChatRenderer(tokenizer, TOOL_CAPABLE_CHATML_TEMPLATE)
    fresh, in_attempt = _renders_per_second(chat), _calls_per_second(chat)
    results = []
    for name in FAMILIES:
        family = PrimeRenderer(family_tokenizer(name), name)
        results += [
            Result(
                f"renderers: {name} (PrimeRenderer) vs chat template (SmolLM2), fresh",
                _renders_per_second(family),
                fresh,
                "renders/s",
                "informational",
            ),
            Result(
                f"renderers: {name} vs chat template, per call in a {CALLS}-call attempt",
                _calls_per_second(family),
                in_attempt,
                "calls/s",
                "aim: >= 1x (issue 34)",
            ),
        ]
    return results

"""Why a model call's prompt did not extend the previous call's prompt + completion: a *sequence break*, by
cause (docs/reference/renderers.md, "Sequence breaks by cause"). The causes and `SequenceBreak` live in
capture.py (this module's renderer imports would make GRPO's import heavy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from loops_nb.llm.capture import CAUSES as CAUSES  # steps.jsonl's causes, named where they are told apart
from loops_nb.llm.capture import (
    HISTORY_EDITED,
    REASONING_DROPPED,
    TEMPLATE_REWROTE_HISTORY,
    TOOL_CALL_RERENDERED,
    TRUNCATION,
    ModelCall,
    SequenceBreak,
    first_difference,
)
from loops_nb.llm.chat_messages import ChatMessage, ToolSpec
from loops_nb.llm.renderer import call_keys

if TYPE_CHECKING:
    from loops_nb.llm.renderer import Renderer


def continuation_start(
    renderer: Renderer,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec] | None,
    previous: ModelCall,
) -> int | None:
    """Where the new turns start in `messages` when they continue `previous`: its conversation unchanged, then
    its reply (the same content and calls), then no other assistant turn. None otherwise: another
    conversation, or an edited history."""
    k = len(previous.messages)
    if not k or len(messages) <= k + 1 or list(messages[:k]) != previous.messages:
        return None
    sent_back = messages[k]
    if sent_back.get("role") != "assistant":
        return None
    reply = renderer.parse(previous.completion_tokens, prompt_tokens=previous.prompt_tokens, tools=tools)
    same_calls = call_keys(sent_back.get("tool_calls")) == call_keys(reply.tool_calls)
    if (sent_back.get("content") or "").strip() != reply.content or not same_calls:
        return None
    return k + 1


def classify_break(
    renderer: Renderer,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec] | None,
    previous: ModelCall,
    prompt: Sequence[int],
) -> SequenceBreak:
    """Why `prompt` (rendered from `messages`) does not extend `previous`'s prompt + completion."""
    where = first_difference(previous.prompt_tokens + previous.completion_tokens, prompt, renderer.decode)
    if previous.finish_reason == "length":
        return SequenceBreak(TRUNCATION, where)
    # A call recorded without its messages (built by hand) cannot be checked for edits.
    if previous.messages and continuation_start(renderer, messages, tools, previous) is None:
        return SequenceBreak(HISTORY_EDITED, where)
    rendered = renderer.decode(prompt)
    reply = renderer.parse(previous.completion_tokens, prompt_tokens=previous.prompt_tokens, tools=tools)
    # The previous reply's reasoning, or an earlier turn's sent back with it: a template drops them all at once.
    sent = [m.get("reasoning_content") for m in messages if m.get("role") == "assistant"]
    if any(r and str(r).strip() not in rendered for r in [reply.reasoning, *sent]):
        return SequenceBreak(REASONING_DROPPED, where)
    if reply.tool_calls and _sampled_answer(renderer, previous) not in rendered:
        return SequenceBreak(TOOL_CALL_RERENDERED, where)
    return SequenceBreak(TEMPLATE_REWROTE_HISTORY, where)


def _sampled_answer(renderer: Renderer, previous: ModelCall) -> str:
    """The sampled completion after its reasoning, without its stop token: what a template that keeps the
    call as sampled writes back verbatim."""
    tokens = list(previous.completion_tokens)
    while tokens and tokens[-1] in renderer.stop_token_ids:
        tokens.pop()
    text = renderer.decode(tokens)
    for end in ("</think>", "<|end|>"):  # a think block; gpt-oss's analysis channel
        if end in text:
            text = text.rsplit(end, 1)[1]
    return text.strip()

"""Exact tokens across turns: an assistant message the gateway returned, rendered from its sampled text when the
agent sends it back.

The reply an agent gets has its content trimmed and its tool calls as JSON the chat template re-serialises;
rendered as sent back, the next prompt would not extend the previous prompt + completion. So a message that
matches one the lease returned (same content, same calls) is swapped for the exact text its tokens decode to.
That is the chat template's way (`ChatRenderer`); a family's renderer continues the sampled token ids itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loops_nb.llm.renderer import call_keys

if TYPE_CHECKING:
    from loops_nb.llm.capture import ModelCall
    from loops_nb.llm.chat_messages import ChatMessage
    from loops_nb.llm.client import LoopsLLM
    from loops_nb.model_access.leases import AttemptLease


def restore_exact(lease: AttemptLease, messages: list[ChatMessage]) -> list[ChatMessage]:
    """Assistant messages this lease returned, replaced by the exact text their tokens decode to.

    Only for a renderer that extends turns by matching text (the chat template): a family's renderer bridges
    on the sampled token ids and renders the structured message itself (content, reasoning, calls)."""
    if not lease.returned or not lease.llm.renderer.extends_by_text:
        return messages
    out = []
    for msg in messages:
        if msg["role"] == "assistant":
            key = (msg.get("content") or "", call_keys(msg.get("tool_calls")))
            for known in lease.returned:
                if (known.content, known.tool_calls) == key:
                    msg = {"role": "assistant", "content": known.exact_text}
                    break
        out.append(msg)
    return out


def exact_text(llm: LoopsLLM, call: ModelCall) -> str:
    tokens = list(call.completion_tokens)
    if tokens and tokens[-1] in llm.renderer.stop_token_ids:
        tokens = tokens[:-1]  # the template writes the end-of-turn token itself
    return llm.renderer.decode(tokens)

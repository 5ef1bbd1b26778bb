"""Content survival: did the chat template keep everything the row says?

Templates lose data silently. SmolLM2's template, for one, ignores ``tools`` and renders an assistant turn that
holds only ``tool_calls`` as an empty turn: training on it teaches the model to answer a tool request with
nothing. So after rendering, every message's text, every tool call's name and argument values, and every tool
definition's name must be found in the rendered text, or the row is refused with the reason.

The check is by substring, so it is lenient about formatting (argument values are matched as JSON values, not as
one exact serialisation) and strict about loss. A trained turn is checked inside its own rendered turn, where a
drop matters most; context messages anywhere in the example's text, because templates may move them (Mistral puts
the system prompt in the last user turn). Reasoning that a template drops from *earlier* turns (Qwen3) is not
a loss: that is how the model saw those turns, and such rows are split per turn instead.
"""

from __future__ import annotations

import json

from pydantic import JsonValue

from loops_nb.sft.data import ChatRow, Message
from loops_nb.sft.refusal_wording import show

_FIX_TOOLS = 'set [model] chat_template to a tool-capable template (e.g. "chatml-tools")'


def _forms(value: JsonValue) -> list[str]:
    """The ways a JSON scalar may be written by a template (raw, JSON-escaped, Python-style)."""
    if isinstance(value, str):
        forms = [value, json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]]
    elif isinstance(value, bool):
        forms = ["true", "True"] if value else ["false", "False"]
    elif value is None:
        forms = ["null", "None"]
    else:
        forms = [json.dumps(value), repr(value), str(value)]
    return [f for f in forms if f]


def _found(value: JsonValue, text: str) -> bool:
    if isinstance(value, str) and value in text:  # the common case, without building the other forms
        return True
    forms = _forms(value)
    return not forms or any(f in text for f in forms)


def _leaves(value: JsonValue) -> list[JsonValue]:
    """Keys and scalar values of a JSON value, depth first."""
    if isinstance(value, dict):
        out: list[JsonValue] = []
        for k, v in value.items():
            out.append(k)
            out.extend(_leaves(v))
        return out
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def split_reasoning(content: str) -> tuple[str, str]:
    """``(reasoning, answer)`` for content that inlines ``<think>…</think>``, as Qwen3's template reads it."""
    if "</think>" not in content:
        return "", content
    reasoning, _, answer = content.partition("</think>")
    return reasoning.split("<think>")[-1].strip(), answer.strip()


def _missing_text(at: str, text: str | None, rendered: str, where: str) -> str | None:
    needle = (text or "").strip()
    if needle and not _found(needle, rendered):
        return f"{at}: the chat template dropped this text (it is not in the rendered {where}); check [model] chat_template"
    return None


def _missing_calls(at: str, m: Message, rendered: str, where: str) -> str | None:
    for k, call in enumerate(m.tool_calls or ()):
        fn = call.function
        if not _found(fn.name, rendered):
            return (
                f"{at}.tool_calls[{k}]: the chat template dropped this tool call (its name {show(fn.name)} is not in "
                f"the rendered {where}); {_FIX_TOOLS}"
            )
        for leaf in _leaves(fn.arguments):
            if not _found(leaf, rendered):
                return (
                    f"{at}.tool_calls[{k}]: the chat template dropped this tool call's arguments ({show(leaf)} is not "
                    f"in the rendered {where}); {_FIX_TOOLS}"
                )
    return None


def check_trained_turn(i: int, m: Message, turn_text: str) -> str | None:
    """A reason if trained turn ``i`` lost content, reasoning or a tool call in its own rendered turn."""
    at = f"messages[{i}]"
    reasoning, answer = split_reasoning(m.content or "")
    return (
        _missing_text(f"{at}.content", answer, turn_text, "turn")
        or _missing_text(f"{at}.content", reasoning, turn_text, "turn")
        or _missing_text(f"{at}.reasoning_content", m.reasoning_content, turn_text, "turn")
        or _missing_calls(at, m, turn_text, "turn")
    )


def check_context(row: ChatRow, upto: int, skip: set[int], text: str) -> str | None:
    """A reason if any message before index ``upto`` (other than those in ``skip``) or any tool definition is
    missing from ``text``, the rendered example."""
    for i, m in enumerate(row.messages[:upto]):
        if i in skip:
            continue
        at = f"messages[{i}]"
        if m.role == "assistant":
            # Earlier reasoning may legitimately be dropped (Qwen3); the answer and the calls may not.
            reason = _missing_text(f"{at}.content", split_reasoning(m.content or "")[1], text, "conversation")
            reason = reason or _missing_calls(at, m, text, "conversation")
        else:
            reason = _missing_text(f"{at}.content", m.content, text, "conversation")
        if reason:
            return reason
    for t, tool in enumerate(row.tools or ()):
        if not _found(tool.function.name, text):
            return (
                f"tools[{t}]: the chat template dropped this tool definition ({show(tool.function.name)} is not in "
                f"the rendered text); {_FIX_TOOLS}"
            )
    return None

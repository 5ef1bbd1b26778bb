"""Content survival: did the chat template keep everything the row says?

Templates lose data silently (SmolLM2's drops `tools` and renders a tool-call-only turn empty), and training
on that teaches the model to answer with nothing. So every message's text, tool call and tool definition must
be found in the rendered text, by substring: lenient about formatting, strict about loss
(docs/reference/sft.md#content-survival). Reasoning a template drops from earlier turns (Qwen3) is not a loss:
such rows are split per turn instead.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

from pydantic import JsonValue

from loops_nb.sft.data import ChatRow, Message
from loops_nb.sft.refusal_wording import show


@dataclass(frozen=True)
class Wording:
    """Who renders the row, and what to change when it loses something, as the refusals say it."""

    who: str
    text_fix: str
    tools_fix: str
    reasoning_fix: str


CHAT_TEMPLATE_WORDING = Wording(
    "the chat template",
    "check [model] chat_template",
    'set [model] chat_template to a tool-capable template (e.g. "chatml-tools")',
    "check [model] chat_template",
)


def family_wording(name: str, options: Collection[str]) -> Wording:
    """How a family renderer's (`renderers`) losses are said; `options`: the names of its options, which decide
    whether it writes reasoning."""
    reasoning = (
        "set [model] renderer_options = {enable_thinking = true} to write it, or remove the reasoning"
        if "enable_thinking" in options
        else f"{name} writes no reasoning in this form: remove reasoning_content from the row"
    )
    return Wording(
        f"the {name} renderer",
        "check [model] renderer and renderer_options",
        'the family\'s renderer writes calls itself: check [model] renderer, or set it to "chat_template"',
        reasoning,
    )


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


def split_inline_reasoning(content: str) -> tuple[str, str]:
    """``(reasoning, answer)`` for content that inlines ``<think>…</think>``, as Qwen3's template reads it."""
    if "</think>" not in content:
        return "", content
    reasoning, _, answer = content.partition("</think>")
    return reasoning.split("<think>")[-1].strip(), answer.strip()


@dataclass(frozen=True)
class RowChecks:
    """Did the rendering keep what one row says? The target rule asks per trained turn and per example
    (`TargetChecks`); each answer is a reason the row is refused, or None."""

    row: ChatRow
    wording: Wording = CHAT_TEMPLATE_WORDING

    def turn(self, i: int, text: str) -> str | None:
        """A reason if trained turn ``i`` lost content, reasoning or a tool call in its own rendered turn."""
        m, at, fix = self.row.messages[i], f"messages[{i}]", self.wording.reasoning_fix
        reasoning, answer = split_inline_reasoning(m.text or "")
        return (
            self._text(f"{at}.content", answer, text, "turn")
            or self._text(f"{at}.content", reasoning, text, "turn", fix)
            or self._text(f"{at}.reasoning_content", m.reasoning_content, text, "turn", fix)
            or self._calls(at, m, text, "turn")
        )

    def context(self, upto: int, skip: set[int], text: str) -> str | None:
        """A reason if any message before index ``upto`` (other than those in ``skip``) or any tool definition is
        missing from ``text``, the rendered example."""
        for i, m in enumerate(self.row.messages[:upto]):
            # Earlier reasoning may legitimately be dropped (Qwen3); the answer and the calls may not.
            content = split_inline_reasoning(m.text or "")[1] if m.role == "assistant" else m.text
            at = f"messages[{i}]"
            reason = i not in skip and (
                self._text(f"{at}.content", content, text, "conversation")
                or self._calls(at, m, text, "conversation")
            )
            if reason:
                return reason
        for t, tool in enumerate(self.row.tools or ()):
            if not _found(tool.function.name, text):
                return (
                    f"tools[{t}]: {self.wording.who} dropped this tool definition ({show(tool.function.name)} is "
                    f"not in the rendered text); {self.wording.tools_fix}"
                )
        return None

    def _text(
        self, at: str, text: str | None, rendered: str, where: str, fix: str | None = None
    ) -> str | None:
        needle, w = (text or "").strip(), self.wording
        if needle and not _found(needle, rendered):
            return f"{at}: {w.who} dropped this text (it is not in the rendered {where}); {fix or w.text_fix}"
        return None

    def _calls(self, at: str, m: Message, rendered: str, where: str) -> str | None:
        w = self.wording
        for k, call in enumerate(m.tool_calls or ()):
            fn = call.function
            if not _found(fn.name, rendered):
                return (
                    f"{at}.tool_calls[{k}]: {w.who} dropped this tool call (its name {show(fn.name)} is not in "
                    f"the rendered {where}); {w.tools_fix}"
                )
            for leaf in _leaves(fn.arguments):
                if not _found(leaf, rendered):
                    return (
                        f"{at}.tool_calls[{k}]: {w.who} dropped this tool call's arguments ({show(leaf)} is not "
                        f"in the rendered {where}); {w.tools_fix}"
                    )
        return None

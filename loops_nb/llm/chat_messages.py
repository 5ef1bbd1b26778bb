"""The chat data a renderer takes and gives back, named: OpenAI-shaped JSON objects, as agents, the gateway and
SFT rows write them (a renderer reads the keys its format has and leaves the rest)."""

import json
from dataclasses import dataclass
from typing import Any, TypeGuard

ChatMessage = dict[str, Any]
"""One message: `role`, `content` (a string, or a list of parts with images), and where they apply
`tool_calls`, `tool_call_id`, `name`, `reasoning_content`."""
ToolSpec = dict[str, Any]
"""One tool a request offers: `{"type": "function", "function": {"name", "description", "parameters"}}`."""
ToolCall = dict[str, Any]
"""One call: `{"id", "type": "function", "function": {"name", "arguments"}}`, `arguments` a JSON string (an
object once `renderers` has decoded it)."""


@dataclass(frozen=True)
class ParsedReply:
    """A sampled reply as a renderer reads it back (`Renderer.parse`, `templates.parse_assistant_text`)."""

    text: str
    """The completion's text, special tokens removed."""
    content: str
    """The prose, with reasoning and tool-call blocks removed."""
    tool_calls: list[ToolCall]
    """The well-formed calls, OpenAI-shaped (`arguments` a JSON string)."""
    tool_call_errors: list[str]
    """One line per malformed call (bad JSON, no name, cut off before its end), with what the model wrote:
    kept and counted, never raised, so evaluation can score it."""
    reasoning: str = ""
    """The reasoning the model wrote before its answer (a `<think>` block, an analysis channel); empty when
    none."""


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> ToolCall:
    """A parsed call in OpenAI shape, its arguments a JSON string."""
    arguments_json = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments_json}}


def assistant_message(
    content: str | None, tool_calls: list[ToolCall] | None = None, reasoning: str = ""
) -> ChatMessage:
    """An assistant turn in OpenAI shape, its reasoning as `reasoning_content` (which the family's template keeps
    or drops as it does in training); reasoning and calls only where there are some."""
    message: ChatMessage = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def is_image_part(part: object) -> TypeGuard[dict[str, object]]:
    """Whether a content part is an image (vision.py reads its source)."""
    return isinstance(part, dict) and part.get("type") in ("image", "image_url", "input_image")


def has_images(messages: list[ChatMessage]) -> bool:
    return any(
        isinstance(m.get("content"), list) and any(is_image_part(p) for p in m["content"]) for m in messages
    )

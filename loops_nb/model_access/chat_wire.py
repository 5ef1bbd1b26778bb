"""OpenAI chat-completions wire format: validating requests and shaping replies and stream chunks.

Validation names the offending field the way OpenAI does (`messages[2].role`), because the caller is
an agent under development and a precise 400 is the fastest fix. Image parts pass through to the renderer. Unknown top-level fields are ignored,
as clients send many optional ones (`user`, `seed`, `logprobs`, ...).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass

from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from pydantic import BaseModel

from loops_nb.errors import ModelAccessError
from loops_nb.llm.chat_messages import ChatMessage, ToolCall, ToolSpec, assistant_message

ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_CHOICES = 16
IMAGE_PARTS = ("image_url", "input_image")
"""Image content parts: Chat Completions' `{"image_url": {"url": u}}`, the Responses API's `{"image_url": u}`."""
ContentPart = dict[str, object]


class InvalidAgentRequest(ModelAccessError):
    """A request the gateway refuses with 400; `param` names the field, as OpenAI's errors do."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass
class ChatRequest:
    model: str
    messages: list[ChatMessage]
    tools: list[ToolSpec] | None = None
    parse_tools: bool = True
    """False under tool_choice "none": tool-call text is returned as content, not as calls."""
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    n: int = 1
    stream: bool = False
    include_usage: bool = False


def bounded[N: (int, float)](body: dict[str, object], key: str, kind: type[N], low: N, high: N) -> N | None:
    """`body[key]`, an integer or a number (`kind`) between `low` and `high`; None when absent."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | kind):
        article = "an integer" if kind is int else "a number"
        raise InvalidAgentRequest(f"{key} must be {article}, got {type(value).__name__}", key)
    if not low <= value <= high:
        bounds = f"{low} and {high}" if kind is int else f"{low:g} and {high:g}"
        raise InvalidAgentRequest(f"{key} must be between {bounds}, got {value}", key)
    return kind(value)


def text_content(value: object, where: str, kinds: tuple[str, ...] = ("text",)) -> str | list[ContentPart]:
    """Content as one string: a string, or a list of text parts of these `kinds` (joined; a `refusal`
    part's text is its `refusal`). With images among the parts (Chat Completions' `image_url`, the Responses
    API's `input_image`) it stays a list: text parts and `image_url` parts, which the renderer renders
    (vision.py reads their URLs). Files and audio are refused."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidAgentRequest(f"{where} must be a string or a list of text parts", where)
    parts: list[ContentPart] = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in IMAGE_PARTS and isinstance(part, dict):
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str):
                raise InvalidAgentRequest(
                    f"{where}[{i}].image_url must hold the image's URL", f"{where}[{i}]"
                )
            parts.append({"type": "image_url", "image_url": {"url": url}})
            continue
        text = part.get("refusal" if kind == "refusal" else "text") if isinstance(part, dict) else None
        if kind not in kinds or not isinstance(text, str):
            raise InvalidAgentRequest(
                f"{where}[{i}]: only text and image content parts ({', '.join(kinds)}, "
                f"{', '.join(IMAGE_PARTS)}) are supported, not {kind!r}",
                f"{where}[{i}]",
            )
        parts.append({"type": "text", "text": text})
    if any(p["type"] == "image_url" for p in parts):
        return parts
    return "".join(str(p["text"]) for p in parts)


def chat_role(role: object, where: str, roles: set[str]) -> str:
    """A message's role, one of `roles`, as chat templates know it: OpenAI's newer `developer` is `system`."""
    if not isinstance(role, str) or role not in roles:
        raise InvalidAgentRequest(
            f"{where}.role: unknown role {role!r}; expected one of {sorted(roles)}", f"{where}.role"
        )
    return "system" if role == "developer" else role


def _tool_call(call: object, where: str) -> ToolCall:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidAgentRequest(
            f"{where} must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}", where
        )
    arguments = fn.get("arguments", "{}")
    if not isinstance(arguments, str | dict):
        raise InvalidAgentRequest(
            f"{where}.function.arguments must be a JSON string", f"{where}.function.arguments"
        )
    return {
        "id": str(call.get("id", "")),
        "type": "function",
        "function": {"name": fn["name"], "arguments": arguments},
    }


def _message(raw: object, i: int) -> ChatMessage:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise InvalidAgentRequest(f"{where} must be an object", where)
    role = raw.get("role")
    msg: ChatMessage = {"role": chat_role(role, where, ROLES)}
    content = raw.get("content")
    msg["content"] = None if content is None else text_content(content, f"{where}.content")
    if role == "assistant" and raw.get("tool_calls") is not None:
        calls = raw["tool_calls"]
        if not isinstance(calls, list):
            raise InvalidAgentRequest(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
        msg["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    elif msg["content"] is None and role != "assistant":
        raise InvalidAgentRequest(f"{where}.content is required for role {role!r}", f"{where}.content")
    if role == "tool":
        if raw.get("tool_call_id") is not None and not isinstance(raw["tool_call_id"], str):
            raise InvalidAgentRequest(f"{where}.tool_call_id must be a string", f"{where}.tool_call_id")
        msg["tool_call_id"] = raw.get("tool_call_id")
    if isinstance(raw.get("name"), str):
        msg["name"] = raw["name"]
    if role == "assistant" and isinstance(raw.get("reasoning_content"), str) and raw["reasoning_content"]:
        # Sent back as we returned it: the family's template decides whether history keeps it.
        msg["reasoning_content"] = raw["reasoning_content"]
    return msg


def _tools(value: object) -> list[ToolSpec] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidAgentRequest("tools must be a list", "tools")
    for i, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise InvalidAgentRequest(
                f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", f"tools[{i}]"
            )
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidAgentRequest(
                f"tools[{i}].function.name must be a non-empty string", f"tools[{i}].function.name"
            )
    return value or None


def request_object(body: object) -> dict[str, object]:
    if not isinstance(body, dict):
        raise InvalidAgentRequest("the request body must be a JSON object")
    return body


def flag(body: dict[str, object], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool | None):
        raise InvalidAgentRequest(f"{key} must be a boolean", key)
    return default if value is None else value


def sampling_request(
    body: dict[str, object], messages: list[ChatMessage], max_tokens: int | None
) -> ChatRequest:
    """The fields Chat Completions and the Responses API share: model, tool_choice, stream, temperature,
    top_p."""
    model = body.get("model", "")
    if not isinstance(model, str):
        raise InvalidAgentRequest("model must be a string", "model")
    choice = body.get("tool_choice", "auto")
    if choice not in ("auto", "none", None):
        raise InvalidAgentRequest(
            f"tool_choice {choice!r} is not supported: the gateway samples the policy unconstrained and "
            "cannot force a tool call; use 'auto' (or 'none')",
            "tool_choice",
        )
    return ChatRequest(
        model=model,
        messages=messages,
        parse_tools=choice != "none",
        temperature=bounded(body, "temperature", float, 0.0, 2.0),
        top_p=bounded(body, "top_p", float, 1e-9, 1.0),
        max_tokens=max_tokens,
        stream=flag(body, "stream", False),
    )


def parse_chat_request(raw: object) -> ChatRequest:
    """A validated request, or InvalidAgentRequest naming the first problem."""
    body = request_object(raw)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidAgentRequest("messages must be a non-empty list", "messages")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise InvalidAgentRequest("stop must be a string or a list of non-empty strings", "stop")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidAgentRequest("stream_options must be an object", "stream_options")
    max_tokens = bounded(body, "max_completion_tokens", int, 1, 1 << 20)
    if max_tokens is None:
        max_tokens = bounded(body, "max_tokens", int, 1, 1 << 20)
    req = sampling_request(body, [_message(m, i) for i, m in enumerate(messages)], max_tokens)
    req.tools = _tools(body.get("tools"))
    req.stop = stop or None
    req.n = bounded(body, "n", int, 1, MAX_CHOICES) or 1
    req.include_usage = bool(options.get("include_usage", False))
    return req


def new_id(prefix: str) -> str:
    """A fresh object id, as OpenAI's look (`chatcmpl-...`, `resp_...`)."""
    return prefix + secrets.token_hex(12)


def wire(model: BaseModel) -> dict[str, object]:
    """An OpenAI object as JSON: only the fields we set (and extras such as `loops`), as OpenAI sends them."""
    return model.model_dump(mode="json", exclude_unset=True)


def choice_message(content: str, tool_calls: list[ToolCall], reasoning: str = "") -> ChatMessage:
    """The assistant message of a choice (content null when it is only calls; its reasoning as
    `reasoning_content`, as vLLM and DeepSeek send it)."""
    return assistant_message(content if content or not tool_calls else None, tool_calls, reasoning)


def usage(prompt_tokens: int, completion_tokens: int) -> CompletionUsage:
    return CompletionUsage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def completion(cid: str, model: str, choices: list[Choice], usage: CompletionUsage) -> ChatCompletion:
    return ChatCompletion(
        id=cid, object="chat.completion", created=int(time.time()), model=model, choices=choices, usage=usage
    )


def stream_events(cid: str, model: str, choices: list[Choice], usage: CompletionUsage | None) -> list[str]:
    """The SSE `data:` lines of a finished completion, in OpenAI's chunk format, ending in [DONE]."""
    created = int(time.time())

    def chunk(choices: list[ChunkChoice], usage: CompletionUsage | None = None) -> str:
        body = ChatCompletionChunk(
            id=cid, object="chat.completion.chunk", created=created, model=model, choices=choices
        )
        if usage is not None:
            body.usage = usage
        return f"data: {json.dumps(wire(body), ensure_ascii=False)}\n\n"

    def delta(index: int, **fields: object) -> str:
        return chunk(
            [
                ChunkChoice(
                    index=index, delta=ChoiceDelta.model_validate(fields), finish_reason=None, logprobs=None
                )
            ]
        )

    out = []
    for choice in choices:
        i, message = choice.index, choice.message
        out.append(delta(i, role="assistant", content=""))
        reasoning = getattr(message, "reasoning_content", None)
        if reasoning:
            out.append(delta(i, reasoning_content=reasoning))
        if message.content:
            out.append(delta(i, content=message.content))
        for j, call in enumerate(message.tool_calls or []):
            out.append(delta(i, tool_calls=[{"index": j, **wire(call)}]))
        end = ChunkChoice(index=i, delta=ChoiceDelta(), finish_reason=choice.finish_reason, logprobs=None)
        out.append(chunk([end]))
    if usage is not None:
        out.append(chunk([], usage))
    out.append("data: [DONE]\n\n")
    return out

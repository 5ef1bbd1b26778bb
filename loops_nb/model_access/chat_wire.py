"""OpenAI chat-completions wire format: validating requests and shaping replies and stream chunks.

Validation names the offending field the way OpenAI does (`messages[2].role`), because the caller is
an agent under development and a precise 400 is the fastest fix. Unknown top-level fields are ignored,
as clients send many optional ones (`user`, `seed`, `logprobs`, ...).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from loops_nb.errors import ModelAccessError

ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_CHOICES = 16


class InvalidAgentRequest(ModelAccessError):
    """A request the gateway refuses with 400; `param` names the field, as OpenAI's errors do."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    parse_tools: bool = True
    """False under tool_choice "none": tool-call text is returned as content, not as calls."""
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidAgentRequest(f"{key} must be a number, got {type(value).__name__}", key)
    if not low <= value <= high:
        raise InvalidAgentRequest(f"{key} must be between {low:g} and {high:g}, got {value}", key)
    return float(value)


def integer(body: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidAgentRequest(f"{key} must be an integer, got {type(value).__name__}", key)
    if not low <= value <= high:
        raise InvalidAgentRequest(f"{key} must be between {low} and {high}, got {value}", key)
    return value


def _content(value: object, where: str) -> str | None:
    """Message content: a string, null, or a list of text parts (joined); other parts are refused."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise InvalidAgentRequest(
                    f"{where}[{i}]: only text content parts are supported", f"{where}[{i}]"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidAgentRequest(f"{where} must be a string, null or a list of text parts", where)


def _tool_call(call: object, where: str) -> dict[str, Any]:
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


def _message(raw: object, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise InvalidAgentRequest(f"{where} must be an object", where)
    role = raw.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidAgentRequest(
            f"{where}.role: unknown role {role!r}; expected one of {sorted(ROLES)}", f"{where}.role"
        )
    # Chat templates know `system`; OpenAI's newer `developer` role means the same thing.
    msg: dict[str, Any] = {"role": "system" if role == "developer" else role}
    msg["content"] = _content(raw.get("content"), f"{where}.content")
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


def _tools(value: object) -> list[dict[str, Any]] | None:
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


def parse_chat_request(body: object) -> ChatRequest:
    """A validated request, or InvalidAgentRequest naming the first problem."""
    if not isinstance(body, dict):
        raise InvalidAgentRequest("the request body must be a JSON object")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise InvalidAgentRequest("model must be a string", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidAgentRequest("messages must be a non-empty list", "messages")
    choice = body.get("tool_choice", "auto")
    if choice not in ("auto", "none", None):
        raise InvalidAgentRequest(
            f"tool_choice {choice!r} is not supported: the gateway samples the policy unconstrained and "
            "cannot force a tool call; use 'auto' (or 'none')",
            "tool_choice",
        )
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise InvalidAgentRequest("stop must be a string or a list of non-empty strings", "stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool | None):
        raise InvalidAgentRequest("stream must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidAgentRequest("stream_options must be an object", "stream_options")
    max_tokens = integer(body, "max_completion_tokens", 1, 1 << 20)
    if max_tokens is None:
        max_tokens = integer(body, "max_tokens", 1, 1 << 20)
    return ChatRequest(
        model=model,
        messages=[_message(m, i) for i, m in enumerate(messages)],
        tools=_tools(body.get("tools")),
        parse_tools=choice != "none",
        temperature=number(body, "temperature", 0.0, 2.0),
        top_p=number(body, "top_p", 1e-9, 1.0),
        max_tokens=max_tokens,
        stop=stop or None,
        n=integer(body, "n", 1, MAX_CHOICES) or 1,
        stream=bool(stream),
        include_usage=bool(options.get("include_usage", False)),
    )


def completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


def choice_message(content: str, tool_calls: list[dict[str, Any]], reasoning: str = "") -> dict[str, Any]:
    """The assistant message of a choice; its reasoning as `reasoning_content`, as vLLM and DeepSeek send it."""
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not tool_calls else None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def completion_body(
    cid: str, model: str, choices: list[dict[str, Any]], usage: dict[str, int], extra: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
        **extra,
    }


def stream_events(
    cid: str, model: str, choices: list[dict[str, Any]], usage: dict[str, int] | None
) -> list[str]:
    """The SSE `data:` lines of a finished completion, in OpenAI's chunk format, ending in [DONE]."""
    created = int(time.time())

    def chunk(index: int, delta: dict[str, Any], finish: str | None) -> str:
        body = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    out = []
    for choice in choices:
        i, message = choice["index"], choice["message"]
        out.append(chunk(i, {"role": "assistant", "content": ""}, None))
        if message.get("reasoning_content"):
            out.append(chunk(i, {"reasoning_content": message["reasoning_content"]}, None))
        if message.get("content"):
            out.append(chunk(i, {"content": message["content"]}, None))
        for j, call in enumerate(message.get("tool_calls") or []):
            out.append(chunk(i, {"tool_calls": [{"index": j, **call}]}, None))
        out.append(chunk(i, {}, choice["finish_reason"]))
    if usage is not None:
        body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
        out.append(f"data: {json.dumps({**body, 'choices': [], 'usage': usage})}\n\n")
    out.append("data: [DONE]\n\n")
    return out

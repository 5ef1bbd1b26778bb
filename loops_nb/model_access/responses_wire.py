"""OpenAI Responses API wire format (`POST /v1/responses`): requests become the gateway's chat requests,
replies become Response objects and their stream events.

A request's `input` (a string, or items: messages with `input_text` / `output_text` parts,
`function_call` and `function_call_output` items) and `instructions` are turned into the chat
messages the chat template renders, the way the same conversation would arrive at
`/v1/chat/completions`: a `function_call` item joins the assistant message before it as a tool call,
a `function_call_output` is a `tool` message, and a `reasoning` item's text is the next assistant turn's
`reasoning_content` (the family's template keeps or drops it). A reply's reasoning comes back as a
`reasoning` output item before its message and calls. So a conversation trains the same tokens whichever API
the agent speaks. Function tools (`{"type": "function", "name", "parameters"}`) become chat tools;
OpenAI's hosted tools (web search, file search, computer use, ...) do not exist here and are refused.
Unknown top-level fields are ignored, as in chat completions.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from loops_nb.model_access.chat_wire import ChatRequest, InvalidAgentRequest, integer, number

INPUT_ROLES = {"user", "system", "developer", "assistant"}
TEXT_PARTS = {"input_text", "output_text", "text"}
REASONING_PARTS = {"reasoning_text", "summary_text"}


@dataclass
class ResponsesRequest:
    chat: ChatRequest
    """The conversation and sampling settings, as the chat-completions path takes them."""
    input_messages: list[dict[str, Any]]
    """This request's own input (without `instructions` and the previous response's conversation)."""
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    echo: dict[str, Any] = field(default_factory=dict)
    """Request fields a Response object repeats (tools, tool_choice, metadata, ...)."""


def _text(value: object, where: str) -> str:
    """Item content: a string or a list of text parts (joined); images, files and audio are refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in TEXT_PARTS and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "refusal" and isinstance(part.get("refusal"), str):
                texts.append(part["refusal"])
            else:
                raise InvalidAgentRequest(
                    f"{where}[{i}]: only text content parts (input_text, output_text) are supported, "
                    f"not {kind!r}",
                    f"{where}[{i}]",
                )
        return "".join(texts)
    raise InvalidAgentRequest(f"{where} must be a string or a list of text parts", where)


def _string(item: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = item.get(key, default)
    if not isinstance(value, str):
        raise InvalidAgentRequest(f"{where}.{key} must be a string", f"{where}.{key}")
    return value


def input_messages(value: object) -> list[dict[str, Any]]:
    """The chat messages of a request's `input`."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidAgentRequest("input must be a string or a non-empty list of items", "input")
    out: list[dict[str, Any]] = []
    reasoning = ""  # a reasoning item's text, for the assistant turn that follows it
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidAgentRequest(f"{where} must be an object", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "reasoning":
            reasoning = _reasoning_text(item)
            continue
        if kind == "message":
            role = item.get("role")
            if role not in INPUT_ROLES:
                raise InvalidAgentRequest(
                    f"{where}.role: unknown role {role!r}; expected one of {sorted(INPUT_ROLES)}",
                    f"{where}.role",
                )
            # Chat templates know `system`; `developer` means the same thing.
            out.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _text(item.get("content"), f"{where}.content"),
                }
            )
            if role == "assistant" and reasoning:
                out[-1]["reasoning_content"] = reasoning
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", where, ""),
                "type": "function",
                "function": {
                    "name": _string(item, "name", where),
                    "arguments": _string(item, "arguments", where, "{}"),
                },
            }
            # The calls of one reply follow its message item (or each other): one assistant turn.
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                if reasoning:
                    out[-1]["reasoning_content"] = reasoning
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": _string(item, "call_id", where), "content": content})
        else:
            raise InvalidAgentRequest(
                f"{where}.type {kind!r} is not supported: send message, function_call and "
                "function_call_output items (stored items cannot be referenced)",
                f"{where}.type",
            )
        if kind != "function_call":
            reasoning = ""  # it belongs to the turn right after it, or to none
    return out


def _reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's text (its `reasoning_text` parts, else its summary); an encrypted one has none."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list):
            texts = [
                p["text"]
                for p in parts
                if isinstance(p, dict) and p.get("type") in REASONING_PARTS and isinstance(p.get("text"), str)
            ]
            if texts:
                return "\n".join(texts)
    return ""


def chat_tools(value: object) -> list[dict[str, Any]] | None:
    """Function tools in chat-completions shape; hosted tools are refused."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidAgentRequest("tools must be a list", "tools")
    out = []
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise InvalidAgentRequest(
                f"tools[{i}]: only function tools are supported, not {kind!r} (OpenAI's hosted tools do "
                "not exist here)",
                f"tools[{i}]",
            )
        assert isinstance(tool, dict)
        spec = tool["function"] if isinstance(tool.get("function"), dict) else tool
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            raise InvalidAgentRequest(f"tools[{i}].name must be a non-empty string", f"tools[{i}].name")
        fn = {"name": spec["name"]}
        for key in ("description", "parameters"):
            if spec.get(key) is not None:
                fn[key] = spec[key]
        out.append({"type": "function", "function": fn})
    return out or None


def parse_responses_request(body: object) -> ResponsesRequest:
    """A validated request (its `chat.messages` still without a previous response's conversation)."""
    if not isinstance(body, dict):
        raise InvalidAgentRequest("the request body must be a JSON object")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise InvalidAgentRequest("model must be a string", "model")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidAgentRequest("instructions must be a string", "instructions")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise InvalidAgentRequest("previous_response_id must be a string", "previous_response_id")
    choice = body.get("tool_choice", "auto")
    if choice not in ("auto", "none", None):
        raise InvalidAgentRequest(
            f"tool_choice {choice!r} is not supported: the gateway samples the policy unconstrained and "
            "cannot force a tool call; use 'auto' (or 'none')",
            "tool_choice",
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool | None):
        raise InvalidAgentRequest("stream must be a boolean", "stream")
    store = body.get("store", True)
    if not isinstance(store, bool | None):
        raise InvalidAgentRequest("store must be a boolean", "store")
    messages = input_messages(body.get("input"))
    tools = chat_tools(body.get("tools"))
    metadata = body.get("metadata")
    chat = ChatRequest(
        model=model,
        messages=messages,
        tools=tools,
        parse_tools=choice != "none",
        temperature=number(body, "temperature", 0.0, 2.0),
        top_p=number(body, "top_p", 1e-9, 1.0),
        max_tokens=integer(body, "max_output_tokens", 1, 1 << 20),
        stream=bool(stream),
    )
    echo = {
        "instructions": instructions,
        "tools": body.get("tools") or [],
        "tool_choice": choice or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "metadata": metadata if isinstance(metadata, dict) else {},
        "max_output_tokens": chat.max_tokens,
        "temperature": chat.temperature,
        "top_p": chat.top_p,
        "previous_response_id": previous,
        "store": store is not False,
    }
    return ResponsesRequest(chat, messages, instructions, previous, store is not False, echo)


# -- replies ----------------------------------------------------------------------------------------
def response_id() -> str:
    return "resp_" + secrets.token_hex(12)


def output_items(content: str, tool_calls: list[dict[str, Any]], reasoning: str = "") -> list[dict[str, Any]]:
    """A reply as output items: its reasoning (when there is some), its text as a message (unless it is only
    tool calls), then each call.

    Call ids are made unique per reply (the parser numbers calls `call_0`, `call_1`, ... in every
    reply), as frameworks match `function_call_output` items to calls by id across the conversation.
    """
    items: list[dict[str, Any]] = []
    if reasoning:
        items.append(
            {
                "id": "rs_" + secrets.token_hex(12),
                "type": "reasoning",
                "status": "completed",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            }
        )
    if content or not tool_calls:
        items.append(
            {
                "id": "msg_" + secrets.token_hex(12),
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": content, "annotations": [], "logprobs": []}],
            }
        )
    for call in tool_calls:
        items.append(
            {
                "id": "fc_" + secrets.token_hex(12),
                "type": "function_call",
                "call_id": "call_" + secrets.token_hex(12),
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    return items


def response_body(
    rid: str,
    model: str,
    echo: dict[str, Any],
    output: list[dict[str, Any]],
    usage: dict[str, int],
    truncated: bool,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """A Response object; `truncated` (the completion hit its token limit) makes it `incomplete`."""
    now = int(time.time())
    return {
        "id": rid,
        "object": "response",
        "created_at": now,
        "status": "incomplete" if truncated else "completed",
        "completed_at": None if truncated else now,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "model": model,
        "output": output,
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        **echo,
        **extra,
    }


def stream_events(body: dict[str, Any]) -> list[str]:
    """The SSE events of a finished Response, in the order OpenAI sends them."""
    events: list[str] = []

    def emit(kind: str, **fields: object) -> None:
        data = {"type": kind, "sequence_number": len(events), **fields}
        events.append(f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n")

    start = {**body, "status": "in_progress", "completed_at": None, "output": [], "usage": None}
    start["incomplete_details"] = None
    emit("response.created", response=start)
    emit("response.in_progress", response=start)
    for index, item in enumerate(body["output"]):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            for c, part in enumerate(item["content"]):
                emit("response.content_part.added", **where, content_index=c, part={**part, "text": ""})
                if part["text"]:
                    emit(
                        "response.output_text.delta",
                        **where,
                        content_index=c,
                        delta=part["text"],
                        logprobs=[],
                    )
                emit("response.output_text.done", **where, content_index=c, text=part["text"], logprobs=[])
                emit("response.content_part.done", **where, content_index=c, part=part)
        elif item["type"] == "reasoning":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            for c, part in enumerate(item["content"]):
                emit("response.reasoning_text.delta", **where, content_index=c, delta=part["text"])
                emit("response.reasoning_text.done", **where, content_index=c, text=part["text"])
        else:
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            emit("response.function_call_arguments.delta", **where, delta=item["arguments"])
            emit(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            )
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.incomplete" if body["status"] == "incomplete" else "response.completed", response=body)
    return events

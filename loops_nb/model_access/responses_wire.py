"""OpenAI Responses API wire format (`POST /v1/responses`): requests become the gateway's chat requests,
replies become Response objects and their stream events.

A request's items become the chat messages the same conversation would send to `/v1/chat/completions`, so a
conversation trains the same tokens whichever API the agent speaks; docs/reference/model_access.md
("*Responses*") lists what is taken and what is refused.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from openai.types.responses import (
    FunctionTool,
    Response,
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseUsage,
)
from openai.types.responses.response_reasoning_item import Content as ReasoningText
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from pydantic import BaseModel, ValidationError

from loops_nb.llm.chat_messages import ChatMessage, ToolCall, ToolSpec, assistant_message
from loops_nb.model_access.chat_wire import (
    ChatRequest,
    InvalidAgentRequest,
    bounded,
    chat_role,
    flag,
    new_id,
    request_object,
    sampling_request,
    text_content,
    wire,
)

INPUT_ROLES = {"user", "system", "developer", "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
REASONING_PARTS = {"reasoning_text", "summary_text"}


@dataclass
class ResponsesRequest:
    chat: ChatRequest
    """The conversation and sampling settings, as the chat-completions path takes them."""
    input_messages: list[ChatMessage]
    """This request's own input (without `instructions` and the previous response's conversation)."""
    tools: list[FunctionTool]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    parallel_tool_calls: bool = True
    metadata: dict[str, str] | None = None


def _string(item: dict[str, object], key: str, where: str, default: str | None = None) -> str:
    value = item.get(key, default)
    if not isinstance(value, str):
        raise InvalidAgentRequest(f"{where}.{key} must be a string", f"{where}.{key}")
    return value


def input_messages(value: object) -> list[ChatMessage]:
    """The chat messages of a request's `input`."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidAgentRequest("input must be a string or a non-empty list of items", "input")
    out: list[ChatMessage] = []
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
            role = chat_role(item.get("role"), where, INPUT_ROLES)
            out.append(
                {"role": role, "content": text_content(item.get("content"), f"{where}.content", TEXT_PARTS)}
            )
            if role == "assistant" and reasoning:
                out[-1]["reasoning_content"] = reasoning
        elif kind == "function_call":
            call: ToolCall = {
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
                out.append(assistant_message(None, [call], reasoning))
        elif kind == "function_call_output":
            output = item.get("output")
            content = (
                output if isinstance(output, str) else text_content(output, f"{where}.output", TEXT_PARTS)
            )
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


def _reasoning_text(item: dict[str, object]) -> str:
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


def function_tools(value: object) -> list[FunctionTool]:
    """Function tools (in the Responses shape, or chat-completions' nested one); hosted tools are refused."""
    if value is None:
        return []
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
        try:
            out.append(FunctionTool.model_validate({**spec, "type": "function"}))
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join([f"tools[{i}]", *map(str, problem["loc"])])
            raise InvalidAgentRequest(f"{where}: {problem['msg']}", where) from None
    return out


def chat_tools(tools: list[FunctionTool]) -> list[ToolSpec] | None:
    """Function tools in chat-completions shape, as the renderer takes them (in this key order, which the
    chat template's JSON keeps)."""
    specs = []
    for tool in tools:
        fields = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
        specs.append({"type": "function", "function": {k: v for k, v in fields.items() if v is not None}})
    return specs or None


def parse_responses_request(raw: object) -> ResponsesRequest:
    """A validated request (its `chat.messages` still without a previous response's conversation)."""
    body = request_object(raw)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidAgentRequest("instructions must be a string", "instructions")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise InvalidAgentRequest("previous_response_id must be a string", "previous_response_id")
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise InvalidAgentRequest("metadata must map strings to strings", "metadata")
    messages = input_messages(body.get("input"))
    tools = function_tools(body.get("tools"))
    chat = sampling_request(body, messages, bounded(body, "max_output_tokens", int, 1, 1 << 20))
    chat.tools = chat_tools(tools)
    return ResponsesRequest(
        chat,
        messages,
        tools,
        instructions,
        previous,
        store=flag(body, "store", True),
        parallel_tool_calls=body.get("parallel_tool_calls", True) is not False,
        metadata=metadata,
    )


# -- replies ----------------------------------------------------------------------------------------
def output_items(content: str, tool_calls: list[ToolCall], reasoning: str = "") -> list[ResponseOutputItem]:
    """A reply as output items: its reasoning (when there is some), its text as a message (unless it is only
    tool calls), then each call.

    Call ids are made unique per reply (the parser numbers calls `call_0`, `call_1`, ... in every
    reply), as frameworks match `function_call_output` items to calls by id across the conversation.
    """
    items: list[ResponseOutputItem] = []
    if reasoning:
        text = ReasoningText(type="reasoning_text", text=reasoning)
        items.append(
            ResponseReasoningItem(
                id=new_id("rs_"), type="reasoning", status="completed", summary=[], content=[text]
            )
        )
    if content or not tool_calls:
        part = ResponseOutputText(type="output_text", text=content, annotations=[], logprobs=[])
        items.append(
            ResponseOutputMessage(
                id=new_id("msg_"), type="message", role="assistant", status="completed", content=[part]
            )
        )
    for call in tool_calls:
        items.append(
            ResponseFunctionToolCall(
                id=new_id("fc_"),
                type="function_call",
                call_id=new_id("call_"),
                name=call["function"]["name"],
                arguments=call["function"]["arguments"],
                status="completed",
            )
        )
    return items


def response(
    req: ResponsesRequest, model: str, output: list[ResponseOutputItem], usage: ResponseUsage, truncated: bool
) -> Response:
    """A Response object; `truncated` (the completion hit its token limit) makes it `incomplete`."""
    now = int(time.time())
    return Response(
        id=new_id("resp_"),
        object="response",
        created_at=now,
        status="incomplete" if truncated else "completed",
        completed_at=None if truncated else now,
        error=None,
        incomplete_details={"reason": "max_output_tokens"} if truncated else None,
        model=model,
        output=output,
        usage=usage,
        text={"format": {"type": "text"}},
        truncation="disabled",
        instructions=req.instructions,
        tools=req.tools,
        tool_choice="auto" if req.chat.parse_tools else "none",
        parallel_tool_calls=req.parallel_tool_calls,
        metadata=req.metadata or {},
        max_output_tokens=req.chat.max_tokens,
        temperature=req.chat.temperature,
        top_p=req.chat.top_p,
        previous_response_id=req.previous_response_id,
        store=req.store,
    )


def usage(prompt_tokens: int, completion_tokens: int) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
        output_tokens=completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        total_tokens=prompt_tokens + completion_tokens,
    )


def stream_events(body: Response, extra: dict[str, object]) -> list[str]:
    """The SSE events of a finished Response, in the order OpenAI sends them; each Response in them carries
    `extra` (the gateway's `loops` field)."""
    events: list[str] = []

    def emit(kind: str, **fields: object) -> None:
        data: dict[str, object] = {"type": kind, "sequence_number": len(events)}
        for key, value in fields.items():
            extras = extra if isinstance(value, Response) else {}
            data[key] = {**wire(value), **extras} if isinstance(value, BaseModel) else value
        events.append(f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n")

    start = body.model_copy(
        update={
            "status": "in_progress",
            "completed_at": None,
            "output": [],
            "usage": None,
            "incomplete_details": None,
        }
    )
    emit("response.created", response=start)
    emit("response.in_progress", response=start)
    for index, item in enumerate(body.output):
        where = {"item_id": item.id, "output_index": index}
        started = {"status": "in_progress", "content": []}
        if isinstance(item, ResponseFunctionToolCall):
            started = {"status": "in_progress", "arguments": ""}
        emit("response.output_item.added", output_index=index, item=item.model_copy(update=started))
        if isinstance(item, ResponseOutputMessage):
            for c, part in enumerate(item.content):
                assert isinstance(part, ResponseOutputText)
                emit(
                    "response.content_part.added",
                    **where,
                    content_index=c,
                    part=part.model_copy(update={"text": ""}),
                )
                if part.text:
                    emit("response.output_text.delta", **where, content_index=c, delta=part.text, logprobs=[])
                emit("response.output_text.done", **where, content_index=c, text=part.text, logprobs=[])
                emit("response.content_part.done", **where, content_index=c, part=part)
        elif isinstance(item, ResponseReasoningItem):
            for c, text in enumerate(item.content or []):
                emit("response.reasoning_text.delta", **where, content_index=c, delta=text.text)
                emit("response.reasoning_text.done", **where, content_index=c, text=text.text)
        elif isinstance(item, ResponseFunctionToolCall):
            emit("response.function_call_arguments.delta", **where, delta=item.arguments)
            emit("response.function_call_arguments.done", **where, name=item.name, arguments=item.arguments)
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.incomplete" if body.status == "incomplete" else "response.completed", response=body)
    return events

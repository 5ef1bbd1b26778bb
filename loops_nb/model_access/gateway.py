"""The OpenAI-compatible model gateway on loopback: `POST /v1/chat/completions`, `POST /v1/responses` and
`GET /v1/models` (docs/reference/model_access.md).

The bearer key (an attempt's lease) selects the attempt; the request is handed to that attempt's `LoopsLLM` on
its own event loop, so rendering, sampling and exact token capture are the very code path of `llm().chat`. An
assistant message sent back as this lease returned it is rendered from its exact sampled text
(exact_replies.py), and a reply trains only once it was delivered (delivery.py). uvicorn runs on its own
thread and loop, so a notebook's loop never blocks it; every handler catches everything and answers an error,
so nothing a request carries can crash the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from openai.types.chat import ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import loops_nb.model_access.chat_wire as chat_wire
import loops_nb.model_access.responses_wire as responses_wire
from loops_nb.connection_guard import ConnectionLimits, Headers
from loops_nb.errors import UserError
from loops_nb.llm.chat_messages import ChatMessage, ToolCall
from loops_nb.llm.client import ContextTooLong
from loops_nb.llm.renderer import call_keys
from loops_nb.loopback_server import LoopbackServer
from loops_nb.model_access.delivery import ClientGone, DeliveringResponse, Exchange, LeaseEnded
from loops_nb.model_access.exact_replies import exact_text, restore_exact
from loops_nb.model_access.leases import AttemptLease, LeaseRegistry, ReturnedReply
from loops_nb.request_body import BodyRefused, parse_json, read_limited

if TYPE_CHECKING:
    from loops_nb.llm.capture import ModelCall
    from loops_nb.llm.client import LoopsLLM, Reply

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024
"""A chat request larger than this is refused; contexts that size do not fit max_seq_len anyway."""


def _error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> Response:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status
    )


def _unauthorized(message: str) -> Response:
    return _error(401, message, code="invalid_api_key")


def _bearer_key(header: str) -> str:
    """The key of an `Authorization: Bearer <key>` header; empty for any other."""
    scheme, _, key = header.partition(" ")
    return key.strip() if scheme.lower() == "bearer" else ""


@dataclass
class Sampled:
    """One request's replies, the call its first reply was recorded as, and that call's exact text."""

    replies: list[Reply]
    call: ModelCall
    exact_text: str
    parse_tools: bool

    def tokens(self) -> tuple[int, int]:
        """The prompt's tokens and all the replies' tokens."""
        return len(self.call.prompt_tokens), sum(r.tokens for r in self.replies)

    def extra(self, attempt_id: str) -> dict[str, object]:
        """The non-standard `loops` field of a reply."""
        return {
            "loops": {
                "attempt": attempt_id,
                "policy_version": self.call.policy_version,
                "completion_token_ids": list(self.call.completion_tokens),
            }
        }


async def _sample(lease: AttemptLease, req: chat_wire.ChatRequest) -> Sampled:
    """The request sampled on the attempt's loop through its LoopsLLM (the in-process code path).

    Runs under the lease's lock (delivery.Exchange), so this call's record is the capture's latest.
    """
    llm = lease.llm
    try:
        replies = await llm.sample(
            restore_exact(lease, req.messages),
            tools=req.tools,
            n=req.n,
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stop=req.stop,
        )
    except ContextTooLong as exc:
        lease.truncated = str(exc)
        raise
    call = llm.capture.calls[-1]
    return Sampled(replies, call, exact_text(llm, call), req.parse_tools)


def _delivered(lease: AttemptLease, sampled: Sampled) -> None:
    """A reply reached its agent: it is the attempt's turn, and may come back in a later conversation."""
    lease.calls += 1
    content, tool_calls, _ = answer(sampled.replies[0], sampled.parse_tools)
    lease.returned.append(ReturnedReply(content, call_keys(tool_calls), sampled.exact_text))


def _withdrawn(lease: AttemptLease, sampled: Sampled) -> None:
    """A reply its agent never got must not train."""
    lease.llm.capture.withdraw(sampled.call)


def answer(reply: Reply, parse_tools: bool) -> tuple[str, list[ToolCall], str]:
    """A reply's content, tool calls and reasoning as the agent gets them, parsed by the run's renderer.
    Under tool_choice "none" the reply's whole text is the content, tool-call and reasoning markup included."""
    if parse_tools:
        return reply.content, reply.tool_calls, reply.reasoning
    return reply.text.strip(), [], ""


def _chat_choices(sampled: Sampled) -> list[Choice]:
    choices = []
    for i, reply in enumerate(sampled.replies):
        content, tool_calls, reasoning = answer(reply, sampled.parse_tools)
        message = ChatCompletionMessage.model_validate(
            chat_wire.choice_message(content, tool_calls, reasoning)
        )
        choices.append(
            Choice(
                index=i,
                message=message,
                finish_reason="tool_calls"
                if tool_calls
                else ("length" if reply.finish_reason == "length" else "stop"),
                logprobs=None,
            )
        )
    return choices


class ModelGateway:
    """OpenAI-compatible access to the run's policy for out-of-process agents, one lease per attempt."""

    host = "127.0.0.1"
    """Loopback only; the port is chosen when it starts."""

    def __init__(
        self,
        *,
        model_name: str = "policy",
        max_body_bytes: int = MAX_BODY_BYTES,
        limits: ConnectionLimits | None = None,
        on_request: Callable[[chat_wire.ChatRequest], None] | None = None,
    ) -> None:
        self.registry = LeaseRegistry()
        self.on_request = on_request
        """Told of every sampling request it accepts, on the gateway's thread (`loops check` counts the
        tools each offered)."""
        self.model_name = model_name
        self.port = 0
        self.max_body_bytes = max_body_bytes
        self._http = LoopbackServer("model gateway", limits)

    # -- leases -----------------------------------------------------------------------------------
    def issue(self, attempt_id: str, llm: LoopsLLM) -> AttemptLease:
        """A lease for an attempt whose LoopsLLM is `llm`; call it on the attempt's loop."""
        return self.registry.issue(attempt_id, llm)

    def revoke(self, key: str) -> AttemptLease | None:
        return self.registry.revoke(key)

    @property
    def url(self) -> str:
        """The OpenAI base URL (ends in /v1), for `OPENAI_BASE_URL`."""
        if not self._http.running:
            raise RuntimeError("the model gateway is not started")
        return f"http://{self.host}:{self.port}/v1"

    # -- HTTP -------------------------------------------------------------------------------------
    def _lease(self, request: Request) -> AttemptLease | Response:
        key = _bearer_key(request.headers.get("authorization", ""))
        if not key:
            return _unauthorized("missing API key: send `Authorization: Bearer <lease key>`")
        lease = self.registry.get(key)
        if lease is None:
            return _unauthorized("unknown or revoked lease key: a lease is valid only while its attempt runs")
        return lease

    async def _body(self, request: Request) -> object:
        try:
            return parse_json(await read_limited(request, self.max_body_bytes))
        except BodyRefused as exc:
            raise chat_wire.InvalidAgentRequest(
                str(exc), code="request_too_large" if exc.too_large else None
            ) from None

    def _authorizes(self, headers: Headers) -> bool:
        """A connection is proven (ConnectionGuard) by a request with a live lease key."""
        for name, value in headers:
            if name == b"authorization":
                key = _bearer_key(value.decode("latin-1"))
                return bool(key) and self.registry.get(key) is not None
        return False

    async def _serve(
        self,
        request: Request,
        parse: Callable[[object, AttemptLease], chat_wire.ChatRequest],
        reply: Callable[[AttemptLease, chat_wire.ChatRequest, Sampled], dict[str, object] | list[str]],
        withdrawn: Callable[[AttemptLease, Sampled], None] = _withdrawn,
    ) -> Response:
        """One sampling request, whatever its API: `parse` the body into a chat request, sample it
        (delivery.Exchange), and send `reply`'s JSON body, or its SSE events."""
        try:
            lease = self._lease(request)
            if isinstance(lease, Response):
                return lease
            try:
                req = parse(await self._body(request), lease)
            except chat_wire.InvalidAgentRequest as exc:
                return _error(400, str(exc), param=exc.param, code=exc.code)
            if self.on_request is not None:
                self.on_request(req)

            exchange = Exchange(
                lease,
                lambda: _sample(lease, req),
                lambda s: withdrawn(lease, s),
                lambda s: _delivered(lease, s),
            )
            try:
                sampled = await exchange.run(request.receive)
            except ClientGone:
                # Nobody reads this; the sampling was cancelled and nothing of it is recorded.
                return _error(408, "the client disconnected")
            except ContextTooLong as exc:
                return _error(400, str(exc), param="messages", code="context_length_exceeded")
            except UserError as exc:  # messages the renderer cannot render (an image it cannot read)
                return _error(400, str(exc), param="messages")
            except LeaseEnded:
                return _unauthorized("the attempt of this lease has ended")
            try:
                body = reply(lease, req, sampled)
            except BaseException:
                exchange.settle(False)
                raise
            if isinstance(body, list):
                return DeliveringResponse(exchange.settle, events=body)
            return DeliveringResponse(exchange.settle, body=body)
        except RecursionError:
            # Parseable JSON can still be too deep for the code that walks it.
            return _error(400, "the request is nested too deeply")
        except asyncio.CancelledError:
            # The server is shutting down with this request in flight: answer rather than raise.
            return _error(503, "the model gateway is shutting down", "server_error")
        except Exception as exc:  # a request must never take the run down
            log.exception("model gateway: request failed")
            return _error(500, f"the gateway failed: {type(exc).__name__}: {exc}", "server_error")

    async def chat_completions(self, request: Request) -> Response:
        def reply(
            lease: AttemptLease, req: chat_wire.ChatRequest, sampled: Sampled
        ) -> dict[str, object] | list[str]:
            cid, model, choices = (
                chat_wire.new_id("chatcmpl-"),
                req.model or self.model_name,
                _chat_choices(sampled),
            )
            usage = chat_wire.usage(*sampled.tokens())
            if req.stream:
                return chat_wire.stream_events(cid, model, choices, usage if req.include_usage else None)
            body = chat_wire.completion(cid, model, choices, usage)
            return {**chat_wire.wire(body), **sampled.extra(lease.attempt_id)}

        return await self._serve(request, lambda body, _: chat_wire.parse_chat_request(body), reply)

    async def responses(self, request: Request) -> Response:
        """`POST /v1/responses`: the Responses API, on the same sampling and capture path."""
        parsed: list[responses_wire.ResponsesRequest] = []
        conversation: list[ChatMessage] = []  # without instructions, for previous_response_id
        answered: list[str] = []  # the stored Response's id

        def parse(body: object, lease: AttemptLease) -> chat_wire.ChatRequest:
            req = responses_wire.parse_responses_request(body)
            if req.previous_response_id is not None:
                history = lease.responses.get(req.previous_response_id)
                if history is None:
                    raise chat_wire.InvalidAgentRequest(
                        f"previous response {req.previous_response_id!r} not found: only this attempt's "
                        "own stored responses can be continued",
                        "previous_response_id",
                        "previous_response_not_found",
                    )
                conversation.extend(history)
            conversation.extend(req.input_messages)
            # As in OpenAI's API, instructions apply to this response only, never carried over.
            system = [{"role": "system", "content": req.instructions}] if req.instructions else []
            req.chat.messages = [*system, *conversation]
            parsed.append(req)
            return req.chat

        def reply(
            lease: AttemptLease, chat: chat_wire.ChatRequest, sampled: Sampled
        ) -> dict[str, object] | list[str]:
            req = parsed[0]
            content, tool_calls, reasoning = answer(sampled.replies[0], sampled.parse_tools)
            body = responses_wire.response(
                req,
                req.chat.model or self.model_name,
                responses_wire.output_items(content, tool_calls, reasoning),
                responses_wire.usage(*sampled.tokens()),
                sampled.replies[0].finish_reason == "length" and not tool_calls,
            )
            if req.store:
                # Stored before it is sent, not once delivered: a client may continue from it the
                # moment it has the body, before this server has heard that the send completed.
                answered.append(body.id)
                message = chat_wire.choice_message(content, tool_calls, reasoning)
                lease.responses[body.id] = [*conversation, message]
            extra = sampled.extra(lease.attempt_id)
            if req.chat.stream:
                return responses_wire.stream_events(body, extra)
            return {**chat_wire.wire(body), **extra}

        def withdrawn(lease: AttemptLease, sampled: Sampled) -> None:
            _withdrawn(lease, sampled)
            for response_id in answered:  # its id never reached anyone: nothing can continue it
                lease.responses.pop(response_id, None)

        return await self._serve(request, parse, reply, withdrawn=withdrawn)

    async def models(self, request: Request) -> Response:
        lease = self._lease(request)
        if isinstance(lease, Response):
            return lease
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "loops_nb"}
        return JSONResponse({"object": "list", "data": [model]})

    def app(self) -> Starlette:
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
            ]
        )
        app.state.authorizes = self._authorizes  # read by the LoopbackServer's ConnectionGuard
        return app

    # -- lifecycle (as loops_nb.local.embedded runs uvicorn) ------------------------------------
    def start(self, timeout: float = 30.0) -> ModelGateway:
        if not self._http.running:
            self.port = self._http.start(self.app(), self.host, self.port, timeout=timeout)
            log.info("model gateway serving at %s", self.url)
        return self

    async def astart(self) -> ModelGateway:
        return await asyncio.to_thread(self.start)

    def stop(self) -> None:
        self._http.stop(join_timeout=10)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> ModelGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

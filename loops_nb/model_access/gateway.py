"""The OpenAI-compatible model gateway: `POST /v1/chat/completions` and `GET /v1/models` on loopback.

An agent that is its own program gets `OPENAI_BASE_URL` (this server's `/v1`) and `OPENAI_API_KEY`
(its attempt's lease key). The bearer key selects the attempt; the request is handed to that attempt's
`LoopsLLM` on the attempt's own event loop, so rendering, sampling and exact token capture are the very
code path `llm().chat` takes in-process. Replies come back in OpenAI's shape (tool calls with JSON-string
arguments, `finish_reason`, `usage`), streamed as SSE chunks when asked; the non-standard `loops` field
carries the attempt id, the policy version and the sampled token ids.

Exact tokens across turns: when the agent sends a conversation back, an assistant message equal to one
this lease returned is rendered from the exact text its sampled tokens decode to (the reply's content is
trimmed and its tool calls re-serialised by the template, which would otherwise differ from what was
sampled), so the next prompt extends the previous prompt + completion and the turns stay one training
sequence.

Like the embedded Loops, uvicorn runs on its own thread and loop, so a notebook's loop never blocks it.
Nothing a request carries can crash the run: every handler catches everything and answers an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from loops_nb.connection_guard import ConnectionLimits, Headers
from loops_nb.llm.client import ContextTooLong
from loops_nb.loopback_server import LoopbackServer
from loops_nb.model_access import wire
from loops_nb.model_access.leases import AttemptLease, LeaseRegistry, ReturnedReply
from loops_nb.request_body import BodyRefused, parse_json, read_limited

if TYPE_CHECKING:
    from loops_nb.llm.capture import ModelCall
    from loops_nb.llm.client import LoopsLLM

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024
"""A chat request larger than this is refused; contexts that size do not fit max_seq_len anyway."""


class LeaseRevoked(RuntimeError):
    """The lease was revoked between accepting a request and sampling it."""


def _error(
    status: int, message: str, kind: str, param: str | None = None, code: str | None = None
) -> Response:
    return JSONResponse(wire.error_body(message, kind, param, code), status_code=status)


def _bad(exc: wire.BadRequest) -> Response:
    return _error(400, str(exc), "invalid_request_error", exc.param, exc.code)


def _tool_key(calls: list[dict[str, Any]] | None) -> list[tuple[str, Any]]:
    """Tool calls compared by name and decoded arguments, so re-serialised JSON still matches."""
    out = []
    for call in calls or []:
        fn = call.get("function", {})
        args = fn.get("arguments")
        if isinstance(args, str):
            # ValueError: also an integer too long to convert; arguments are the agent's text.
            with contextlib.suppress(ValueError, RecursionError):
                args = json.loads(args)
        out.append((fn.get("name"), args))
    return out


def _restore_exact(lease: AttemptLease, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant messages this lease returned, replaced by the exact text their tokens decode to."""
    if not lease.returned:
        return messages
    out = []
    for msg in messages:
        if msg["role"] == "assistant":
            key = (msg.get("content") or "", _tool_key(msg.get("tool_calls")))
            for known in lease.returned:
                if (known.content, known.tool_calls) == key:
                    msg = {"role": "assistant", "content": known.exact_text}
                    break
        out.append(msg)
    return out


async def _complete(lease: AttemptLease, req: wire.ChatRequest) -> dict[str, Any]:
    """One chat completion on the attempt's loop, through its LoopsLLM (the in-process code path)."""
    llm = lease.llm
    async with lease.lock():
        if lease.revoked:  # the attempt ended while this request waited: its tokens must not count
            raise LeaseRevoked(lease.attempt_id)
        try:
            replies = await llm.sample(
                _restore_exact(lease, req.messages),
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
        lease.calls += 1
        call = llm.capture.calls[-1]  # the lock makes this call's record the latest
    choices = []
    for i, reply in enumerate(replies):
        tool_calls = reply.tool_calls if req.parse_tools else []
        content = reply.content if req.parse_tools else reply.text.strip()
        finish = "tool_calls" if tool_calls else ("length" if reply.finish_reason == "length" else "stop")
        message = wire.choice_message(content, tool_calls)
        choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": None})
        if i == 0:
            lease.returned.append(
                ReturnedReply(message["content"] or "", _tool_key(tool_calls), _exact_text(llm, call))
            )
    completion_tokens = sum(r.tokens for r in replies)
    usage = {
        "prompt_tokens": len(call.prompt_tokens),
        "completion_tokens": completion_tokens,
        "total_tokens": len(call.prompt_tokens) + completion_tokens,
    }
    extra = {
        "loops": {
            "attempt": lease.attempt_id,
            "policy_version": call.policy_version,
            "completion_token_ids": list(call.completion_tokens),
        }
    }
    return {"choices": choices, "usage": usage, "extra": extra}


def _exact_text(llm: LoopsLLM, call: ModelCall) -> str:
    tokens = list(call.completion_tokens)
    if tokens and tokens[-1] in llm.renderer.stop_token_ids:
        tokens = tokens[:-1]  # the template writes the end-of-turn token itself
    return llm.renderer.decode(tokens)


class ModelGateway:
    """OpenAI-compatible access to the run's policy for out-of-process agents, one lease per attempt."""

    def __init__(
        self,
        registry: LeaseRegistry | None = None,
        *,
        model_name: str = "policy",
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = MAX_BODY_BYTES,
        limits: ConnectionLimits | None = None,
    ) -> None:
        if host not in {"127.0.0.1", "localhost", "::1"}:
            raise ValueError(f"the model gateway binds loopback only, not {host!r}")
        self.registry = registry or LeaseRegistry()
        self.model_name = model_name
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.requests = 0
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
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return _error(
                401,
                "missing API key: send `Authorization: Bearer <lease key>`",
                "invalid_request_error",
                code="invalid_api_key",
            )
        lease = self.registry.get(key.strip())
        if lease is None:
            return _error(
                401,
                "unknown or revoked lease key: a lease is valid only while its attempt runs",
                "invalid_request_error",
                code="invalid_api_key",
            )
        return lease

    async def _body(self, request: Request) -> Any:
        try:
            return parse_json(await read_limited(request, self.max_body_bytes))
        except BodyRefused as exc:
            raise wire.BadRequest(str(exc), code="request_too_large" if exc.too_large else None) from None

    def _authorizes(self, headers: Headers) -> bool:
        """A connection is proven (ConnectionGuard) by a request with a live lease key."""
        for name, value in headers:
            if name == b"authorization":
                scheme, _, key = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and self.registry.get(key.strip()) is not None
        return False

    async def chat_completions(self, request: Request) -> Response:
        self.requests += 1
        try:
            lease = self._lease(request)
            if isinstance(lease, Response):
                return lease
            try:
                req = wire.parse_chat_request(await self._body(request))
            except wire.BadRequest as exc:
                return _bad(exc)
            try:
                future = asyncio.run_coroutine_threadsafe(_complete(lease, req), lease.loop)
                result = await asyncio.wrap_future(future)
            except ContextTooLong as exc:
                return _error(400, str(exc), "invalid_request_error", "messages", "context_length_exceeded")
            except RuntimeError as exc:
                if isinstance(exc, LeaseRevoked) or lease.loop.is_closed():
                    return _error(
                        401,
                        "the attempt of this lease has ended",
                        "invalid_request_error",
                        code="invalid_api_key",
                    )
                raise exc
            cid, model = wire.completion_id(), req.model or self.model_name
            if not req.stream:
                body = wire.completion_body(cid, model, result["choices"], result["usage"], result["extra"])
                return JSONResponse(body)
            events = wire.stream_events(
                cid, model, result["choices"], result["usage"] if req.include_usage else None
            )

            async def stream() -> AsyncIterator[str]:
                for event in events:
                    yield event

            return StreamingResponse(stream(), media_type="text/event-stream")
        except RecursionError:
            # Parseable JSON can still be too deep for the code that walks it.
            return _error(400, "the request is nested too deeply", "invalid_request_error")
        except Exception as exc:  # a request must never take the run down
            log.exception("model gateway: request failed")
            return _error(500, f"the gateway failed: {type(exc).__name__}: {exc}", "server_error")

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

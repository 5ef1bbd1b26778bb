"""The embedded Loops' HTTP surface: control plane, trainers and samplers on one loopback port.

The routes are baseten-loops 0.32.0's, and what each answers, errors included, is in
docs/reference/local_loops.md ("What it implements", "Every SDK call").
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from baseten.loops import ServerCapabilities, SupportedModel
from baseten.loops.models import CheckpointSourceResponse, S3CheckpointSource
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from loops_nb.connection_guard import Headers, api_key_authorizes
from loops_nb.errors import UserError
from loops_nb.local import trainer_ops
from loops_nb.local.bad_request import BadRequest, RunDeactivated
from loops_nb.local.checkpoint_files import (
    DOWNLOAD_ROUTE,
    FILE_LINK_PREFIX,
    CheckpointFileLinks,
    LinkRefused,
    file_in_checkpoint,
    files_page,
)
from loops_nb.local.offline_models import OFFLINE_MODELS
from loops_nb.local.op_requests import OP_REQUESTS, CreateTrainer
from loops_nb.local.run_records import RunLost
from loops_nb.local.sampler_routing import PolicyNotPublished, SamplerRouting
from loops_nb.local.state import LocalLoopsState
from loops_nb.request_body import BodyRefused, parse_json, read_limited
from loops_nb.validation_message import validation_message

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
"""The SDK splits forward_backward bodies above 24 MiB, so anything much larger is a mistake."""
POLL_HOLD_SECONDS = 25.0
"""Long-poll hold for `/operations/{id}`; the SDK's read timeout per poll is 35 s."""
DISCONNECT_POLL_SECONDS = 0.5
"""How often a `/sample` waiting on the engine checks that its client is still connected."""


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


def _answer(body: BaseModel) -> JSONResponse:
    """One of the SDK's response models as the JSON the SDK reads back into it."""
    return JSONResponse(body.model_dump(mode="json"))


class ApiKeyMiddleware:
    """Refuse requests that do not carry the server's key (`Authorization: Api-Key <key>`)."""

    def __init__(self, app: ASGIApp, authorizes: Callable[[Headers], bool]) -> None:
        self.app = app
        self.authorizes = authorizes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Checkpoint file links carry their own signature instead of the key, as presigned URLs do.
        keyless = scope["type"] != "http" or scope["path"].startswith(FILE_LINK_PREFIX)
        if not keyless and not self.authorizes(scope["headers"]):
            await _error(401, "missing or wrong API key for this Loops server")(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _body(request: Request) -> dict[str, Any]:
    raw = await read_limited(request, MAX_BODY_BYTES)
    body = parse_json(raw) if raw else {}
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _origin(request: Request) -> str:
    return str(request.base_url).rstrip("/")


class LoopsRoutes:
    """Request handlers bound to one server's state."""

    def __init__(self, state: LocalLoopsState) -> None:
        self.state = state
        self.samplers = SamplerRouting(state)
        self.links = CheckpointFileLinks()

    # -- control plane ------------------------------------------------------------------------
    async def create_session(self, request: Request) -> Response:
        return JSONResponse({"session": {"id": "sess-local"}})

    async def create_trainer(self, request: Request) -> Response:
        asked = CreateTrainer.model_validate(await _body(request))
        base_model = asked.base_model
        if asked.base_checkpoint:
            raise BadRequest("base_checkpoint is not supported by the embedded Loops")
        await asyncio.to_thread(self.state.model_path, base_model)  # fail now if the model is unknown
        run = self.state.create_run(
            base_model, asked.lora_rank, seed=asked.seed, name=asked.name, max_seq_len=asked.max_seq_len
        )
        self.samplers.pair(run)
        log.info("created run %s for %s (rank %d)", run.id, base_model, asked.lora_rank)
        return JSONResponse(
            {
                "run": {
                    "id": run.id,
                    "base_model": base_model,
                    "base_url": f"{_origin(request)}/trainers/{run.id}",
                    "deployment_id": f"dep-{run.id}",
                }
            }
        )

    async def deployment_status(self, request: Request) -> Response:
        dep = request.path_params["deployment_id"]
        run_id = dep.removeprefix("dep-")
        run = self.state.runs.get(run_id)
        lost = run is None and self.state.records.earlier_run(run_id) is not None
        name = "INACTIVE" if lost or (run is not None and not run.active) else "ACTIVE"
        return JSONResponse({"deployment": {"id": dep, "status": {"name": name}}})

    async def create_sampler(self, request: Request) -> Response:
        body = await _body(request)
        run_id = body.get("run_id")
        base_model: object
        if run_id:
            run = self.state.run(str(run_id))
            sampler_id, base_model = self.samplers.pair(run), run.base_model
        elif body.get("model_path"):
            sampler_id, base_model = self.samplers.on_checkpoint(str(body["model_path"]))
        else:
            base_model = body.get("base_model")
            if not isinstance(base_model, str) or not base_model:
                raise BadRequest(
                    "give run_id (a paired sampler), base_model (a standalone one) or model_path "
                    "(a standalone one on saved sampler weights)"
                )
            await asyncio.to_thread(self.state.model_path, base_model)
            sampler_id = self.samplers.standalone(base_model)
        return JSONResponse(
            {
                "sampler": {
                    "id": sampler_id,
                    "base_url": f"{_origin(request)}/samplers/{sampler_id}",
                    "base_model": base_model,
                    "model_id": "mdl-local",
                    "deployment_id": f"dep-{sampler_id}",
                }
            }
        )

    async def model_deployment_status(self, request: Request) -> Response:
        return JSONResponse({"status": "ACTIVE"})

    async def list_checkpoints(self, request: Request) -> Response:
        q = request.query_params
        found = self.state.checkpoints(run_id=q.get("run_id"), checkpoint_path=q.get("checkpoint_path"))
        if q.get("base_model"):
            found = [c for c in found if c.base_model == q["base_model"]]
        return JSONResponse({"checkpoints": [c.model_dump(mode="json", by_alias=True) for c in found]})

    async def validate_checkpoint(self, request: Request) -> Response:
        body = await _body(request)
        self.state.resolve_checkpoint(str(body.get("checkpoint_path", "")))
        return JSONResponse({"valid": True})

    async def checkpoint_files(self, request: Request) -> Response:
        checkpoint_id = request.path_params["checkpoint_id"]
        q = request.query_params
        try:
            page_size, page_token = int(q.get("page_size", 1000)), int(q.get("page_token", 0))
        except ValueError:
            raise BadRequest("page_size and page_token must be whole numbers") from None
        directory = self.state.checkpoint_by_id(checkpoint_id)
        return _answer(
            files_page(self.links, _origin(request), checkpoint_id, directory, page_size, page_token)
        )

    async def checkpoint_source(self, request: Request) -> Response:
        self.state.checkpoint_by_id(request.path_params["checkpoint_id"])
        # "s3": the SDK then downloads through the /files links, which is what this server offers.
        return _answer(CheckpointSourceResponse(source=S3CheckpointSource()))

    async def checkpoint_file(self, request: Request) -> Response:
        checkpoint_id = request.path_params["checkpoint_id"]
        relative_path = request.path_params["relative_path"]
        q = request.query_params
        self.links.check(checkpoint_id, relative_path, q.get("expires", ""), q.get("signature", ""))
        directory = self.state.checkpoint_by_id(checkpoint_id)
        return FileResponse(file_in_checkpoint(directory, relative_path))

    async def deactivate(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        changed = self.state.deactivate(run_id)
        return JSONResponse({"run": {"id": run_id, "status": "INACTIVE", "changed": changed}})

    async def list_runs(self, request: Request) -> Response:
        runs = [
            {
                "id": r.id,
                "base_model": r.base_model,
                "lora_rank": r.lora_rank,
                "max_seq_len": r.max_seq_len,
                "active": r.active,
                "policy_version": r.published_version,
                "created_at": r.created_at.isoformat(),
            }
            for r in self.state.runs.values()
        ]
        return JSONResponse({"runs": runs})

    async def capabilities(self, request: Request) -> Response:
        # An offline model whose package is not installed (Gemma's is opt-in) cannot be served: not listed.
        offline = {name for name, spec in OFFLINE_MODELS.items() if spec.installed()}
        models = sorted(offline | {r.base_model for r in self.state.runs.values()})
        supported = [
            SupportedModel(
                model_name=m, max_context_length=await asyncio.to_thread(self.state.max_positions, m)
            )
            for m in models
        ]
        return _answer(ServerCapabilities(supported_models=supported))

    # -- trainer ------------------------------------------------------------------------------
    async def trainer_submit(self, request: Request) -> Response:
        op = request.path_params["op"]
        if op not in OP_REQUESTS:
            raise BadRequest(f"unknown trainer operation {op!r}; valid: {', '.join(OP_REQUESTS)}")
        run = self.state.run(request.path_params["run_id"])
        body = await _body(request)
        op_id = (
            request.headers.get("idempotency-key")
            or hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]
        )
        work = trainer_ops.prepare(self.state, run, op, body)
        run.ops.submit(op_id, op, work)
        return JSONResponse({"operation_id": op_id, "schema_version": 1}, status_code=202)

    async def trainer_poll(self, request: Request) -> Response:
        run = self.state.run(request.path_params["run_id"], active=False)
        op = run.ops.get(request.path_params["op_id"])
        if op is None:
            if not run.active:
                raise RunDeactivated(run.id)
            return _error(404, "unknown operation id (or its result expired)")
        body = await run.ops.wait(op, POLL_HOLD_SECONDS)
        if body is None:
            return _error(408, "operation still running")
        return JSONResponse(body)

    async def trainer_health(self, request: Request) -> Response:
        run = self.state.run(request.path_params["run_id"], active=False)
        return JSONResponse({"status": "ok" if run.active else "inactive", "run_id": run.id})

    async def trainer_policy_version(self, request: Request) -> Response:
        run = self.state.run(request.path_params["run_id"])
        step = run.trainer.step if run.trainer is not None else (run.parked_step or 0)
        return JSONResponse({"policy_version": step})

    # -- sampler ------------------------------------------------------------------------------
    async def sample(self, request: Request) -> Response:
        from loops_nb.local.sampler import SampleRequest

        base_model, paired_run = self.samplers.lookup(request.path_params["sampler_id"])
        sample_request = SampleRequest.model_validate(await _body(request))
        run_id = request.headers.get("x-run-id") or paired_run
        min_version = request.headers.get("x-min-policy-version")
        checkpoint = request.headers.get("x-checkpoint-path")
        engine = await asyncio.to_thread(self.state.sampler, base_model)
        adapter, served = await self.samplers.serving_adapter(engine, run_id, min_version, checkpoint)
        sampling = asyncio.ensure_future(engine.sample_async(sample_request, adapter))
        try:
            # A client that gives up (an attempt past its timeout) closes the connection; stop its decoding
            # then, or the sampler keeps a core busy for an answer nobody reads.
            while not sampling.done():
                await asyncio.wait({sampling}, timeout=DISCONNECT_POLL_SECONDS)
                if not sampling.done() and await request.is_disconnected():
                    return _error(499, "the client closed the connection before the sample was ready")
            result = sampling.result()
        finally:
            if not sampling.done():
                sampling.cancel()  # abandons the request in the engine (SamplerEngine.sample_async)
        return JSONResponse(result.to_wire(), headers={"x-trainers-policy-version": str(served)})

    async def sampler_models(self, request: Request) -> Response:
        base_model, run_id = self.samplers.lookup(request.path_params["sampler_id"])
        data = [{"id": base_model, "parent": None}]
        if run_id:
            data.append({"id": run_id, "parent": base_model})
        return JSONResponse({"object": "list", "data": data})

    async def sampler_policy_version(self, request: Request) -> Response:
        _, run_id = self.samplers.lookup(request.path_params["sampler_id"])
        version = self.state.runs[run_id].published_version if run_id in self.state.runs else 0
        return JSONResponse({"policy_version": version})


def _refused(status: int) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def answer(request: Request, exc: Exception) -> Response:
        return _error(status, str(exc))

    return answer


async def _invalid_body(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ValidationError)
    return _error(422, validation_message(exc))


async def _too_deep(request: Request, exc: Exception) -> Response:
    # Parseable JSON can still be too deep for the code that walks it (validation, hashing).
    return _error(422, "the request is nested too deeply")


# Routes the SDK knows but that make no sense locally, and why. A bare 404 is the worst answer a Loops client
# can get (the SDK retries it for up to an hour, and it says nothing), so every path or method not served is
# answered 422 in the SDK's error shape, naming the route and what to do instead.
_KNOWN_UNSERVED: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"^/v1/teams(/|$)"),
        "teams are a Baseten workspace concept; the local Loops has one implicit team. "
        "Create the ServiceClient without team=",
    ),
    (
        re.compile(r"^/v1/loops/debug/"),
        "the internal debug route (scope=, internal backend version) picks Baseten capacity; "
        "create the client without scope= (or unset BASETEN_LOOPS_SCOPE)",
    ),
    (
        re.compile(r"^/samplers/[^/]+/wake$"),
        "a local sampler never scales to zero, so there is nothing to wake",
    ),
]


async def _not_served(request: Request, exc: Exception) -> Response:
    path = request.url.path
    reason = next(
        (reason for pattern, reason in _KNOWN_UNSERVED if pattern.match(path)),
        "no such route in the Loops API this server implements (baseten-loops 0.32); see "
        "docs/reference/local_loops.md",
    )
    return _error(422, f"{request.method} {path} is not served by the local Loops: {reason}")


async def _internal_error(request: Request, exc: Exception) -> Response:
    # Starlette re-raises the exception after this answer, so uvicorn logs its traceback after this line.
    log.error("embedded Loops: %s %s failed: %r", request.method, request.url.path, exc)
    return _error(500, "internal error in the embedded Loops; see its log")


EXCEPTION_HANDLERS: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    # A caller's mistake is a 422, which the SDK raises at once (never 400/404: those it retries for an hour);
    # so is a `UserError`: an unknown or unreachable base model, a bad checkpoint path.
    BadRequest: _refused(422),
    BodyRefused: _refused(422),  # not JSON, or too large
    UserError: _refused(422),
    ValidationError: _invalid_body,
    RecursionError: _too_deep,
    RunLost: _refused(410),
    LinkRefused: _refused(403),  # as S3 answers a bad presigned URL
    PolicyNotPublished: _refused(408),  # the SDK retries a 408: the version may come yet
    # No route for the path (404), or not for the method (405): say so, in the SDK's error shape.
    404: _not_served,
    405: _not_served,
    Exception: _internal_error,
}
"""Starlette's answers to what a handler raises; none leaks a traceback to the client."""


def build_app(state: LocalLoopsState, api_key: str | None) -> Starlette:
    r = LoopsRoutes(state)
    authorizes = api_key_authorizes(api_key or None)
    table = [
        ("POST", "/v1/loops/sessions", r.create_session),
        ("POST", "/v1/loops/trainers", r.create_trainer),
        ("POST", "/v1/loops/samplers", r.create_sampler),
        ("GET", "/v1/loops/deployments/{deployment_id}", r.deployment_status),
        ("GET", "/v1/models/{model_id}/deployments/{deployment_id}", r.model_deployment_status),
        ("GET", "/v1/loops/checkpoints", r.list_checkpoints),
        ("POST", "/v1/loops/checkpoints/validate", r.validate_checkpoint),
        ("GET", "/v1/loops/checkpoints/{checkpoint_id}/files", r.checkpoint_files),
        ("GET", "/v1/loops/checkpoints/{checkpoint_id}/source", r.checkpoint_source),
        ("GET", DOWNLOAD_ROUTE, r.checkpoint_file),
        ("GET", "/v1/loops/runs", r.list_runs),
        ("POST", "/v1/loops/runs/{run_id}/deactivate", r.deactivate),
        ("GET", "/v1/loops/capabilities", r.capabilities),
        ("GET", "/trainers/{run_id}/operations/{op_id:path}", r.trainer_poll),
        ("GET", "/trainers/{run_id}/health", r.trainer_health),
        ("GET", "/trainers/{run_id}/policy_version", r.trainer_policy_version),
        ("POST", "/trainers/{run_id}/{op}", r.trainer_submit),
        ("POST", "/samplers/{sampler_id}/sample", r.sample),
        ("GET", "/samplers/{sampler_id}/v1/models", r.sampler_models),
        ("GET", "/samplers/{sampler_id}/trainers_policy_version", r.sampler_policy_version),
    ]
    app = Starlette(
        routes=[Route(path, handler, methods=[method]) for method, path, handler in table],
        middleware=[Middleware(ApiKeyMiddleware, authorizes=authorizes)],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.state.authorizes = authorizes  # proves a connection to the LoopbackServer's guard
    return app

"""A gateway completion trains only once it was delivered (docs/reference/model_access.md).

A request crosses two loops: the gateway's receives it and sends the reply; the attempt's samples it, under
the lease's lock. When the client disconnects first, the sampling is cancelled and the call counts as cut off.
The lock is held until the gateway's loop has sent the whole reply and learnt whether the client was still
there: a completion sampled but not delivered is withdrawn from the capture, before the lease's next call
(a retry) renders against it, so the retry makes no break. Nothing `DeliveringResponse` does raises out of the
ASGI handler.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from loops_nb.connection_guard import CLIENT_CONNECTED
from loops_nb.errors import ModelAccessError
from loops_nb.model_access.leases import AttemptLease

DELIVERY_TIMEOUT = 30.0
"""Seconds the attempt's loop waits to learn whether a sampled reply reached its client; past it, the
reply counts as undelivered. Sending a reply of a few kilobytes to a loopback client takes far less."""


class LeaseEnded(ModelAccessError):
    """The attempt of the lease ended (or its loop was shut down) before the request was answered."""


class ClientGone(ModelAccessError):
    """The client disconnected before its reply was ready; its sampling was cancelled."""


async def _disconnected(receive: Receive) -> None:
    """Returns when the client disconnects (the request body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Exchange[T]:
    """One request: `sample` runs on the lease's loop; `run` waits for it on the gateway's loop."""

    def __init__(
        self,
        lease: AttemptLease,
        sample: Callable[[], Awaitable[T]],
        withdraw: Callable[[T], None],
        delivered: Callable[[T], None] = lambda _: None,
    ) -> None:
        self.lease = lease
        self._sample = sample
        self._withdraw = withdraw
        self._on_delivered = delivered
        self._reply: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._delivered: concurrent.futures.Future[bool] = concurrent.futures.Future()

    # -- the gateway's loop ------------------------------------------------------------------------
    async def run(self, receive: Receive) -> T:
        """The sampled reply; ClientGone when the client left first, LeaseEnded when the attempt did."""
        coro = self._on_attempt_loop()
        try:
            job = asyncio.run_coroutine_threadsafe(coro, self.lease.loop)
        except RuntimeError:  # the attempt's loop is closed
            coro.close()
            raise LeaseEnded(self.lease.attempt_id) from None
        reply = asyncio.wrap_future(self._reply)
        gone = asyncio.ensure_future(_disconnected(receive))
        waiting: set[asyncio.Future[Any]] = {reply, gone}
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not reply.done():  # the client left, or this handler is being cancelled
                # The attempt may still fail the reply (LeaseEnded) once nobody waits for it: retrieve that
                # outcome here, or asyncio logs "Future exception was never retrieved" at the end of the run.
                reply.add_done_callback(_retrieved)
                job.cancel()
                self.settle(False)
        if reply.cancelled():
            raise LeaseEnded(self.lease.attempt_id)
        if not reply.done():
            raise ClientGone(self.lease.attempt_id)
        return reply.result()

    def settle(self, delivered: bool) -> None:
        """Report whether the reply reached the client (only the first report counts)."""
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self._delivered.set_result(delivered)

    # -- the attempt's loop ------------------------------------------------------------------------
    async def _on_attempt_loop(self) -> None:
        lease = self.lease
        task = asyncio.current_task()
        assert task is not None
        lease.inflight[task] = "sampling"
        try:
            async with lease.lock():
                if lease.revoked:  # the attempt ended while this request waited: its tokens must not count
                    self._fail(LeaseEnded(lease.attempt_id))
                    return
                try:
                    sampled = await self._sample()
                except asyncio.CancelledError:
                    self._fail(LeaseEnded(lease.attempt_id))
                    raise
                except Exception as exc:
                    self._fail(exc)
                    return
                lease.inflight[task] = "delivering"
                self._reply.set_result(sampled)
                delivered = False
                try:
                    delivered = await asyncio.wait_for(asyncio.wrap_future(self._delivered), DELIVERY_TIMEOUT)
                except TimeoutError:
                    pass
                finally:
                    # Also when cancelled here (the attempt's loop shutting down): undelivered.
                    if delivered:
                        self._on_delivered(sampled)
                    else:
                        self._withdraw(sampled)
        finally:
            lease.inflight.pop(task, None)

    def _fail(self, exc: BaseException) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self._reply.set_exception(exc)


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def settle_lease(lease: AttemptLease, timeout: float = DELIVERY_TIMEOUT) -> None:
    """At the end of an attempt (its lease revoked): cancel the requests still sampling, and wait for
    those whose reply is being sent to learn whether it was delivered. Call on the attempt's loop."""
    for task, phase in list(lease.inflight.items()):
        if phase == "sampling":
            task.cancel()
    tasks = set(lease.inflight)
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)


class DeliveringResponse(Response):
    """A JSON body, or SSE events, sent whole; `on_sent(delivered)` says whether the client got it."""

    def __init__(
        self,
        on_sent: Callable[[bool], None],
        *,
        body: object = None,
        events: Sequence[str] | None = None,
    ) -> None:
        self.on_sent = on_sent
        self.events = events
        if events is not None:
            super().__init__(media_type="text/event-stream")
            del self.headers["content-length"]  # sent chunked, event by event
            self.headers["cache-control"] = "no-cache"
        else:
            content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
            super().__init__(content, media_type="application/json")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        delivered = False
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            if self.events is None:
                await send({"type": "http.response.body", "body": self.body, "more_body": False})
            else:
                for event in self.events:
                    await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            connected = scope.get(CLIENT_CONNECTED)
            # uvicorn drops what is sent to a client that left without telling the app: ask the guard.
            delivered = connected() if connected is not None else True
        except OSError:  # a server that reports a lost client by raising
            delivered = False
        finally:
            self.on_sent(delivered)

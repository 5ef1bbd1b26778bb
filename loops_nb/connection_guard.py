"""`ConnectionGuard`: the limits a loopback HTTP server keeps against clients that connect and say nothing.

uvicorn alone holds a silent connection open indefinitely and accepts connections until the process runs
out of descriptors; the guard's limits are docs/reference/local_loops.md#slow-clients. `guard.protocol_class()`
is the uvicorn `http` class; it also puts `CLIENT_CONNECTED` in each request's scope, which tells the app
whether its client is still there (ASGI cannot say so once a response has been sent).
"""

from __future__ import annotations

import asyncio
import resource
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

if TYPE_CHECKING:
    from uvicorn.config import Config
    from uvicorn.server import ServerState

DISCARD_LIMIT_BYTES = 1024 * 1024
"""How much of a refused request's unread body is read and dropped before the connection is closed."""

CLIENT_CONNECTED = "loops_nb.client_connected"
"""The ASGI scope key of a `() -> bool`: whether the request's client is still connected."""

Headers = list[tuple[bytes, bytes]]
"""Request headers as uvicorn hands them to the app: lower-cased names, raw values."""


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = 10.0
    """Seconds a connection has to finish a request's headers; our clients send them at once."""
    body_idle_timeout: float = 30.0
    """Seconds a request body may pause before the connection is dropped."""
    max_unproven: int = 0
    """Most open connections that have not yet sent a request with the key (0: from the fd limit)."""


class ConnectionGuard:
    """One server's limits, and its unproven connections oldest first (lives on the server's loop)."""

    def __init__(self, limits: ConnectionLimits, authorizes: Callable[[Headers], bool] | None) -> None:
        self.limits = limits
        # By default well under the descriptor limit, which the run's own files, pipes and clients also need.
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        default = max(16, min(256, soft // 8)) if soft != resource.RLIM_INFINITY else 256
        self.max_unproven = limits.max_unproven if limits.max_unproven > 0 else default
        self.authorizes = authorizes
        self.unproven: OrderedDict[int, GuardedH11Protocol] = OrderedDict()

    def protocol_class(self) -> type[GuardedH11Protocol]:
        """A protocol class bound to this guard, for `uvicorn.Config(http=...)`."""
        return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": self})

    def admit(self, protocol: GuardedH11Protocol) -> None:
        self.unproven[id(protocol)] = protocol
        while len(self.unproven) > self.max_unproven:
            self.unproven.popitem(last=False)[1].drop()

    def release(self, protocol: GuardedH11Protocol) -> None:
        """No longer count `protocol` as unproven: it sent the key, or it closed."""
        self.unproven.pop(id(protocol), None)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline, a body idle timeout and the unproven-connection cap."""

    guard: ConnectionGuard

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_for: str | None = None  # "headers" or "body": which wait the timer bounds
        self._proven = False
        self._checked_headers: Headers | None = None
        self._discard_left: int | None = None  # bytes of a refused request's body still to throw away

    # -- the protocol's events ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("headers", self.guard.limits.header_timeout)
        self.guard.admit(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.release(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._discard_left is not None:
            self._discard_left -= len(data)
            if self._discard_left < 0:
                self.drop()
                return
        super().data_received(data)
        cycle = self.cycle
        if cycle is not None and CLIENT_CONNECTED not in cycle.scope:
            # A new request's cycle: its app task is created but not yet run, so it sees the key.
            cycle.scope[CLIENT_CONNECTED] = lambda: not cycle.disconnected  # type: ignore[literal-required]
        if self.conn.their_state is not h11.SEND_BODY:
            self._discard_left = None
        if self.transport.is_closing():
            return
        if self.headers is not None and self.headers is not self._checked_headers:
            self._checked_headers = self.headers  # a new request's headers were parsed
            if not self._proven and (self.guard.authorizes is None or self.guard.authorizes(self.headers)):
                self._proven = True
                self.guard.release(self)
        self._follow_state()

    def on_response_complete(self) -> None:
        if self.conn.their_state is h11.SEND_BODY:
            # Answered before its body was read (refused: no key, too large): uvicorn reads the rest and
            # throws it away, however long it is. A short rest keeps the connection for the next
            # request; past DISCARD_LIMIT_BYTES it is closed.
            self._discard_left = DISCARD_LIMIT_BYTES
        super().on_response_complete()
        # Between requests uvicorn's keep-alive timeout applies; the next header deadline starts with
        # the next request's first byte (data_received).
        self._disarm()

    # -- timers -------------------------------------------------------------------------------
    def _follow_state(self) -> None:
        state = self.conn.their_state
        if state is h11.IDLE:
            # Waiting for (the rest of) a request's headers: a deadline, not reset by trickled bytes.
            if self._timer_for != "headers":
                self._arm("headers", self.guard.limits.header_timeout)
        elif state is h11.SEND_BODY:
            self._arm("body", self.guard.limits.body_idle_timeout)  # re-armed by every chunk
        else:
            self._disarm()  # the request is in; the app has it

    def _arm(self, kind: str, seconds: float) -> None:
        self._disarm()
        self._timer_for = kind
        self._timer = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_for = None

    def _expired(self) -> None:
        kind, self._timer, self._timer_for = self._timer_for, None, None
        if self.transport.is_closing():
            return
        if kind == "body" and self.flow.read_paused:
            # The server stopped reading (back-pressure), not the client: wait again.
            self._arm("body", self.guard.limits.body_idle_timeout)
            return
        if kind == "headers" and self.conn.their_state is not h11.IDLE:
            return
        self.drop()

    def drop(self) -> None:
        """Close the connection now, telling an app still reading its body that the client left."""
        self._disarm()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.abort()


def api_key_authorizes(api_key: str | None) -> Callable[[Headers], bool]:
    """`authorizes` for a server whose clients send `Authorization: <scheme> <api_key>`, any scheme."""
    import hmac

    def authorizes(headers: Headers) -> bool:
        if api_key is None:
            return True
        for name, value in headers:
            if name == b"authorization":
                _, _, token = value.partition(b" ")
                return hmac.compare_digest(token.strip(), api_key.encode())
        return False

    return authorizes

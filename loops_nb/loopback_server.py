"""An ASGI app served by uvicorn on its own thread and event loop, bound to a loopback port.

The embedded Loops and the model gateway both run this way, so neither blocks (nor is blocked by) a
notebook's or the CLI's event loop; uvicorn captures signals only on the main thread, so the caller keeps
Ctrl-C. Each server has a `ConnectionGuard` (an app names how a request shows its key in
`app.state.authorizes`) and an `AcceptErrorLog` (docs/reference/local_loops.md#slow-clients).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from loops_nb.connection_guard import ConnectionGuard, ConnectionLimits
from loops_nb.errors import UserError

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp


log = logging.getLogger(__name__)

ACCEPT_ERROR_LOG_SECONDS = 30.0
"""At most one 'out of descriptors' log line per this many seconds and server."""


class AcceptErrorLog:
    """An event-loop exception handler that rate-limits asyncio's failed-accept reports."""

    def __init__(self, name: str, every: float = ACCEPT_ERROR_LOG_SECONDS) -> None:
        self.name = name
        self.every = every
        self.held_back = 0
        self._last: float | None = None

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if self._last is not None and now - self._last < self.every:
            self.held_back += 1
            return
        held, self.held_back, self._last = self.held_back, 0, now
        exc = context.get("exception")
        log.error(
            "%s cannot accept connections: %s (%d more such failures since the last report); raise "
            "`ulimit -n` or lower the load",
            self.name,
            exc,
            held,
        )


class LoopbackServer:
    def __init__(self, name: str, limits: ConnectionLimits | None = None) -> None:
        self.name = name
        self.limits = limits or ConnectionLimits()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self, app: ASGIApp, host: str, port: int, *, timeout: float = 60.0) -> int:
        """Bind `host:port` (0: a free port), serve `app`, and return the port once it answers."""
        import uvicorn

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise UserError(f"cannot bind the {self.name} to {host}:{port}: {exc.strerror}") from None
        bound: int = sock.getsockname()[1]
        state = getattr(app, "state", None)
        guard = ConnectionGuard(self.limits, getattr(state, "authorizes", None))
        config = uvicorn.Config(
            app,
            http=guard.protocol_class(),
            log_level="warning",
            access_log=False,
            timeout_keep_alive=75,
            limit_concurrency=None,
            backlog=4096,
        )
        server = uvicorn.Server(config)
        self._server = server
        accept_errors = AcceptErrorLog(self.name)

        async def serve() -> None:
            asyncio.get_running_loop().set_exception_handler(accept_errors)
            await server.serve(sockets=[sock])

        self._thread = threading.Thread(target=lambda: asyncio.run(serve()), name=self.name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the {self.name} did not start; see the log above")
            time.sleep(0.01)
        return bound

    def stop(self, join_timeout: float = 30.0) -> None:
        server, thread = self._server, self._thread
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(timeout=join_timeout)
        self._server = None
        self._thread = None

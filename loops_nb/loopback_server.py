"""An ASGI app served by uvicorn on its own thread and event loop, bound to a loopback port.

The embedded Loops and the model gateway both run this way, so neither blocks (nor is blocked by) a
notebook's running event loop or the CLI's. uvicorn captures signals only on the main thread, so the
caller's own Ctrl-C handling stays in charge.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from loops_nb.errors import UserError

if TYPE_CHECKING:
    import uvicorn


class LoopbackServer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.port: int | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self, app: Any, host: str, port: int, *, timeout: float = 60.0) -> int:
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
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=75,
            limit_concurrency=None,
            backlog=4096,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[sock])), name=self.name, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the {self.name} did not start; see the log above")
            time.sleep(0.01)
        return self.port

    def stop(self, join_timeout: float = 30.0) -> None:
        server, thread = self._server, self._thread
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(timeout=join_timeout)
        self._server = None
        self._thread = None

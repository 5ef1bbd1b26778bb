"""Start and stop an embedded Loops inside a script, a notebook kernel or `loops serve`.

The server runs uvicorn on its own thread and event loop, so it never blocks (or is blocked by) a
notebook's running loop. It binds loopback on a free port and requires a per-server API key, which
the SDK sends as `Authorization: Api-Key ...` when given `api_key=`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from loops_nb.errors import UserError
from loops_nb.local.allocator import tune_malloc
from loops_nb.local.app import build_app
from loops_nb.local.model_store import default_cache_dir
from loops_nb.local.state import LocalLoopsState
from loops_nb.loopback_server import LoopbackServer

if TYPE_CHECKING:
    from baseten.loops import ServiceClient

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


class EmbeddedLoops:
    """A Loops-compatible control plane, LoRA trainer and sampler served on this machine.

    >>> with EmbeddedLoops() as loops:                      # doctest: +SKIP
    ...     svc = loops.service_client()
    ...     tc = svc.create_lora_training_client(base_model="HuggingFaceTB/SmolLM2-135M-Instruct", rank=8)
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        device: str = "auto",
        dtype: str = "auto",
        memory_budget_mb: int | None = None,
        max_batch_sequences: int = 64,
        prefix_cache_mb: int | None = None,
        idle_run_seconds: float | None = None,
        preload: tuple[str, ...] = (),
    ) -> None:
        if host not in LOOPBACK_HOSTS:
            raise UserError(
                f"compute.local.host = {host!r}: the embedded Loops binds loopback only (127.0.0.1)"
            )
        tune_malloc()  # before the server's, the trainers' and the sampler's threads exist
        self.host = host
        self.port = port
        self.api_key = api_key or f"loops-local-{secrets.token_urlsafe(18)}"
        self.state = LocalLoopsState(
            Path(state_dir) if state_dir is not None else default_cache_dir() / "local_loops",
            cache_dir=Path(cache_dir) if cache_dir is not None else None,
            device=device,
            dtype=dtype,
            memory_budget_mb=memory_budget_mb,
            max_batch_sequences=max_batch_sequences,
            prefix_cache_mb=prefix_cache_mb,
            idle_run_seconds=idle_run_seconds,
        )
        self.preload = preload
        self._http = LoopbackServer("embedded Loops")

    @property
    def url(self) -> str:
        if not self._http.running:
            raise RuntimeError("the embedded Loops is not started")
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """The two variables under which any baseten-loops or tinker script uses this server."""
        return {"LOOPS_BASE_URL": self.url, "BASETEN_API_KEY": self.api_key}

    def service_client(self) -> ServiceClient:
        from baseten.loops import ServiceClient

        return ServiceClient(base_url=self.url, api_key=self.api_key)

    def start(self, timeout: float = 60.0) -> EmbeddedLoops:
        """Bind, serve on a background thread and return once the server answers."""
        if self._http.running:
            return self
        for model in self.preload:
            self.state.model_path(model)
        self.port = self._http.start(
            build_app(self.state, self.api_key), self.host, self.port, timeout=timeout
        )
        log.info("embedded Loops serving at %s (state in %s)", self.url, self.state.state_dir)
        return self

    async def astart(self) -> EmbeddedLoops:
        """`start()` for a running event loop (a notebook cell): binds without blocking the loop."""
        return await asyncio.to_thread(self.start)

    def stop(self) -> None:
        self._http.stop()
        self.state.close()

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> EmbeddedLoops:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedLoops:
        return await self.astart()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.astop()

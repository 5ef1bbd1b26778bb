"""Load: 256 attempts at once through the gateway and the embedded sampler on loopback, twice. Every
attempt is served, and the second wave leaves no more file descriptors, threads or
memory behind than the first: connections are pooled and reused, nothing leaks per attempt.

(The SDK keeps idle sampler connections for 60 s and the embedded server for 75 s, so the count does
not drop to the pre-load baseline at once; what must hold is that it does not grow with more load.)
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from polling import until

from loops_nb.model_access import ModelGateway

pytestmark = pytest.mark.asyncio(loop_scope="session")
ATTEMPTS = 256


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def collected(holds: Callable[[], bool]) -> Callable[[], bool]:
    """``holds`` read after a garbage collection: closed connections and finished threads go away
    asynchronously, so a count is read once it has had the chance to drop, not after a fixed pause."""
    return lambda: gc.collect() >= 0 and holds()


async def wave(gateway: ModelGateway, make_llm: Any, tag: str) -> None:
    llms = [make_llm(seed=i, max_tokens=4) for i in range(ATTEMPTS)]
    leases = [gateway.issue(f"{tag}/g{i // 16}/a{i % 16}", llm) for i, llm in enumerate(llms)]
    limits = httpx.Limits(max_connections=ATTEMPTS, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=600, limits=limits) as http:

        async def attempt(i: int) -> int:
            body = {"messages": [{"role": "user", "content": f"count to {i}"}], "max_tokens": 4}
            auth = {"Authorization": f"Bearer {leases[i].key}"}
            return (await http.post("/chat/completions", json=body, headers=auth)).status_code

        codes = await asyncio.gather(*(attempt(i) for i in range(ATTEMPTS)))
    for lease in leases:
        gateway.revoke(lease.key)
    assert codes == [200] * ATTEMPTS
    assert all(len(llm.capture.calls) == 1 for llm in llms), (
        "each attempt's call captured once, in its own lease"
    )


@pytest.mark.slow
async def test_256_concurrent_attempts_twice_are_all_served_and_nothing_grows(make_llm: Any) -> None:
    with ModelGateway(model_name="tiny") as gateway:
        await wave(gateway, make_llm, "first")
        gc.collect()
        fds, threads, rss = open_fds(), threading.active_count(), rss_mb()
        await wave(gateway, make_llm, "second")
        await until(
            collected(lambda: open_fds() <= fds + 8),
            f"sockets and files do not grow with load (from {fds})",
            seconds=30,
        )
        await until(
            collected(lambda: threading.active_count() <= threads + 1),
            "no thread per attempt is left behind",
            seconds=30,
        )
        assert rss_mb() < rss + 150, f"memory does not grow with load ({rss:.0f} MB -> {rss_mb():.0f} MB)"

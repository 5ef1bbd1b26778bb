"""Waiting on a condition instead of sleeping "long enough": poll it, return as soon as it holds.

The bound is generous (a loaded CI machine can be slow by orders of magnitude) and is no assertion about
speed: it only turns a condition that never comes into a failure that names it, instead of a hang.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

BOUND_SECONDS = 60.0


def wait_until(
    condition: Callable[[], object], what: str, seconds: float = BOUND_SECONDS, every: float = 0.005
) -> None:
    """Block until `condition()` is true; fail with `what` (the condition, in words) if it never is."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {seconds:g} s waiting until {what}")
        time.sleep(every)


async def until(
    condition: Callable[[], object], what: str, seconds: float = BOUND_SECONDS, every: float = 0.002
) -> None:
    """`wait_until` for a coroutine: the running event loop goes on while it waits."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {seconds:g} s waiting until {what}")
        await asyncio.sleep(every)

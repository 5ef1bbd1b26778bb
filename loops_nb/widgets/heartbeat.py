"""`Heartbeat`: re-renders the live panel every few seconds while a step runs.

Steps can take minutes; without it, elapsed time and "step k running for …" would stand still until the step
ends, and a person could not tell a slow step from a hung kernel.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger("loops_nb.widgets")


class Heartbeat:
    """Calls ``tick`` every ``interval_s`` seconds on the run's loop for as long as ``beating()`` says
    (``interval_s`` 0: never)."""

    def __init__(self, interval_s: float, *, beating: Callable[[], bool], tick: Callable[[], None]) -> None:
        self.interval_s = interval_s
        self._beating = beating
        self._tick = tick
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Beat now and then on ``loop`` (None: a run without a loop, which gets no heartbeat)."""
        self.cancel()
        self._loop = loop
        self._beat()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _beat(self) -> None:
        self._timer = None
        if not self._beating():
            return
        if self.interval_s <= 0 or self._loop is None or self._loop.is_closed():
            return
        try:
            self._tick()
        except Exception:  # a display glitch must never surface in the training loop
            log.exception("live panel heartbeat failed")
        self._timer = self._loop.call_later(self.interval_s, self._beat)

"""`BackgroundRun`: a run started as an asyncio task on the kernel's loop, so the cell returns at once.

The kernel then stays free for Stop clicks and other cells on every ipykernel, including those (6.x) that queue
a click behind a running cell. Nobody may ever await the task, so how it ended is recorded here: a cancel or an
exception the run's own ``on_end`` could not report.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from loops_nb.widgets.run_state import RunPanelState

log = logging.getLogger("loops_nb.widgets")


class BackgroundRun:
    """``show`` runs once the loop is known and before the task starts; ``finalize`` after an end that the run
    did not report itself."""

    def __init__(
        self, state: RunPanelState, *, show: Callable[[], object], finalize: Callable[[], None]
    ) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._state = state
        self._show = show
        self._finalize = finalize

    def start(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            coro.close()
            raise RuntimeError(
                "run_in_background needs a running event loop (a notebook kernel); "
                "in a script, use asyncio.run(...)"
            ) from None
        self.loop = loop
        self._show()
        self.task = loop.create_task(coro, name="loops_nb run")
        self.task.add_done_callback(self._done)
        return self.task

    def _done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            self._state.cancelled()
        elif task.exception() is not None:
            exc = task.exception()
            self._state.failed(f"{type(exc).__name__}: {exc}")
            # The task's exception is reported here; nobody may ever await it.
            log.error("background run failed", exc_info=exc)
        elif not self._state.live:
            return  # on_end already finalized
        self._finalize()

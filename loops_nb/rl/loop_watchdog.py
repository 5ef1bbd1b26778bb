"""The loop-lag watchdog: finds the attempt that blocked the event loop, and keeps others from paying for it.

In-process attempts share one event loop: blocking code in one freezes all, and the timers that fell due
meanwhile would cancel attempts that did nothing wrong as `timeout`. A thread posts a heartbeat every
`BEAT_SECONDS`; one left unanswered while the same task holds the loop for `BLOCK_SECONDS` is a block, logged
once with the attempt and its stack. An attempt's timeout is not charged for other tasks' blocks
(`blocked_seconds`); its own are (`blocks_by`), and past its timeout it is discarded as `blocked_loop`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

BEAT_SECONDS = 0.1
"""How often the thread checks the loop: the accuracy of a block's start and end."""
BLOCK_SECONDS = 2.0
"""How long one task must hold the loop to count as blocking it: far above any well-behaved step
(tokenising a prompt, parsing a reply) and below any timeout worth having."""


@dataclass
class LoopBlock:
    """The loop held by one task from `start` to `end` (monotonic seconds; `end` None while it lasts)."""

    start: float
    label: str
    """The attempt's id, or the task's name when it is not an attempt (the training step itself)."""
    stack: str
    """Where the task was blocked when the block was found (the innermost frame last)."""
    task: weakref.ref[asyncio.Task[Any]] | None
    end: float | None = None
    samples: Counter[str] = field(default_factory=Counter)
    """The innermost frame at every beat while the block lasted: where it spent its time."""

    @property
    def where(self) -> str:
        """Where the block spent most of its time, `file:line in function: code`, for a one-line report."""
        return self.samples.most_common(1)[0][0] if self.samples else "?"

    def seconds(self, now: float) -> float:
        return (self.end if self.end is not None else now) - self.start

    def by(self, task: asyncio.Task[Any] | None) -> bool:
        return task is not None and self.task is not None and self.task() is task


class LoopWatchdog:
    """Watches one running event loop from a daemon thread; `start()` it from inside that loop."""

    def __init__(self) -> None:
        self._labels: weakref.WeakKeyDictionary[asyncio.Task[Any], str] = weakref.WeakKeyDictionary()
        self._blocks: list[LoopBlock] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0

    def start(self) -> None:
        """Watch the running loop; a no-op while the thread is watching it already."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopped.clear()
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        self._thread = threading.Thread(target=self._watch, name="loops-loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def label(self, task: asyncio.Task[Any], label: str) -> None:
        """Name `task` (an attempt's) in reports; its blocks are charged to it alone."""
        self._labels[task] = label

    def blocked_seconds(self, since: float, *, exclude: asyncio.Task[Any] | None = None) -> float:
        """Seconds of loop blocks since `since` by tasks other than `exclude`, including one just ending.

        When the loop comes back from a block, the timers that fell due may run before the thread has
        seen its heartbeat answered, so a block still marked ongoing counts up to now.
        """
        now = time.monotonic()
        with self._lock:
            blocks = [b for b in self._blocks if not b.by(exclude)]
        return sum(max(0.0, (b.end if b.end is not None else now) - max(b.start, since)) for b in blocks)

    def blocks_by(self, task: asyncio.Task[Any]) -> list[LoopBlock]:
        with self._lock:
            return [b for b in self._blocks if b.by(task)]

    # -- the thread ---------------------------------------------------------------------------
    def _watch(self) -> None:
        loop = self._loop
        assert loop is not None
        # A loop that stopped running (a test's, between tests) ends the watch: start() begins another.
        while not self._stopped.is_set() and loop.is_running():
            answered = threading.Event()
            posted = time.monotonic()
            try:
                loop.call_soon_threadsafe(answered.set)
            except RuntimeError:  # the loop is closed: the run is over
                return
            if answered.wait(BEAT_SECONDS):
                self._stopped.wait(BEAT_SECONDS)
                continue
            self._watch_late_beat(loop, answered, posted)

    def _watch_late_beat(
        self, loop: asyncio.AbstractEventLoop, answered: threading.Event, posted: float
    ) -> None:
        """The heartbeat is late: while one task holds the loop, it is a block when that lasts long enough."""
        holder, since = self._holder(loop), posted
        block: LoopBlock | None = None
        while not answered.wait(BEAT_SECONDS):
            if self._stopped.is_set() or not loop.is_running():
                return
            current = self._holder(loop)
            if current is not holder:  # many short steps keep the loop busy: no one task blocks it
                holder, since = current, time.monotonic()
                block = None
                continue
            if block is None and time.monotonic() - since >= BLOCK_SECONDS:
                block = self._record(holder, since)
            if block is not None:
                block.samples[self._innermost()] += 1
        if block is not None:
            with self._lock:
                block.end = time.monotonic()
            log.warning("%s blocked the event loop for %.1f s", block.label, block.seconds(block.end))

    def _record(self, holder: asyncio.Task[Any] | None, since: float) -> LoopBlock:
        if holder is None:
            label = "a callback outside any task"
        else:
            label = (
                f"attempt {self._labels[holder]}" if holder in self._labels else f"task {holder.get_name()}"
            )
        block = LoopBlock(since, label, self._stack(), weakref.ref(holder) if holder is not None else None)
        with self._lock:
            self._blocks.append(block)
        log.warning(
            "%s is blocking the event loop, and every other attempt with it: run blocking code with "
            "`await asyncio.to_thread(...)` or loops_nb.episodes.run_blocking. It is blocked in:\n%s",
            label,
            block.stack,
        )
        return block

    def _holder(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[Any] | None:
        # A dict read under the GIL, safe from another thread: what asyncio.current_task(loop) reads on
        # Python 3.12 (the project's). Where it is missing, no task is blamed and no time is excused.
        current = getattr(asyncio.tasks, "_current_tasks", {})
        return current.get(loop)

    def _innermost(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        frames = (
            [f for f in traceback.extract_stack(frame) if not f.filename.startswith("<")] if frame else []
        )
        if not frames:
            return "?"
        last = frames[-1]
        return f"{last.filename}:{last.lineno} in {last.name}: {last.line}"

    def _stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"

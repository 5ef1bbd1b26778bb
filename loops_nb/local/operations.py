"""The trainer's operation queue: submits return at once, ops run FIFO on one worker, polls long-poll.

The SDK pipelines submits ahead of completion and relies on the server to run them strictly in acceptance
order, one at a time, and to dedupe a retried submit by its `Idempotency-Key`. Each op's compute runs on
the process's `COMPUTE_LANE`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from loops_nb.local.bad_request import BadRequest
from loops_nb.local.compute_lane import COMPUTE_LANE

log = logging.getLogger(__name__)

RESULT_TTL_SECONDS = 3600.0
"""How long a finished op's result stays pollable (the SDK documents about an hour)."""
MAX_KEPT_RESULTS = 4096


@dataclass
class Operation:
    id: str
    name: str
    fn: Callable[[], object]
    """A trainer op answers one of the SDK's response models; `run_quietly`'s work anything."""
    future: concurrent.futures.Future[object] = field(default_factory=concurrent.futures.Future)
    finished_at: float | None = None

    def poll_body(self) -> dict[str, Any] | None:
        """The `/operations/{id}` body once finished, else None."""
        if not self.future.done():
            return None
        exc = self.future.exception()
        if exc is not None:
            return {
                "status": "error",
                "error": str(exc) or type(exc).__name__,
                "error_class": type(exc).__name__,
            }
        result = self.future.result()
        assert isinstance(result, BaseModel)
        return {"status": "done", "result": result.model_dump(mode="json")}


class OperationQueue:
    """One trainer's ops, executed one at a time in acceptance order on a worker thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._ops: OrderedDict[str, Operation] = OrderedDict()
        self._lock = threading.Lock()
        self._queue: queue.Queue[Operation | None] = queue.Queue()
        self._busy = 0  # submitted and not yet finished
        self.last_activity = time.monotonic()
        """When an op was last submitted or finished (for idle-run eviction)."""
        self._worker = threading.Thread(target=self._run, name=f"loops-ops-{name}", daemon=True)
        self._worker.start()

    def submit(self, op_id: str, name: str, fn: Callable[[], BaseModel]) -> Operation:
        """Enqueue `fn` under `op_id`; a retried submit with a known id returns the existing op."""
        with self._lock:
            existing = self._ops.get(op_id)
            if existing is not None:
                return existing
            op = Operation(id=op_id, name=name, fn=fn)
            self._ops[op_id] = op
            self._busy += 1
            self.last_activity = time.monotonic()
            self._evict_locked()
        self._queue.put(op)
        return op

    def idle_for(self) -> float | None:
        """Seconds since the last op finished, or None while one is queued or running."""
        with self._lock:
            return None if self._busy else time.monotonic() - self.last_activity

    def run_quietly(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the worker, in order with the ops, without recording an op or activity."""
        op = Operation(id="", name="internal", fn=fn)
        self._queue.put(op)
        return op.future.result()

    def get(self, op_id: str) -> Operation | None:
        with self._lock:
            return self._ops.get(op_id)

    async def wait(self, op: Operation, hold_seconds: float) -> dict[str, Any] | None:
        """The poll body, waiting up to `hold_seconds` for the op to finish (a long-poll)."""
        if not op.future.done():
            # Past the hold the op is still running (None); an op that failed answers its error.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(op.future)), hold_seconds)
        return op.poll_body()

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=30)

    def _run(self) -> None:
        while True:
            op = self._queue.get()
            if op is None:
                return
            started = time.perf_counter()
            try:
                result = COMPUTE_LANE.run(op.fn)
            except Exception as exc:
                # A request's own mistake is one line; anything else is our bug: its traceback goes in the log.
                log.info(
                    "trainer %s: %s %s failed: %s",
                    self.name,
                    op.name,
                    op.id,
                    exc,
                    exc_info=not isinstance(exc, BadRequest),
                )
                op.finished_at = time.monotonic()
                op.future.set_exception(exc)
            else:
                op.finished_at = time.monotonic()
                op.future.set_result(result)
            if op.id:
                with self._lock:
                    self._busy -= 1
                    self.last_activity = time.monotonic()
            log.debug("trainer %s: %s took %.3fs", self.name, op.name, time.perf_counter() - started)

    def _evict_locked(self) -> None:
        now = time.monotonic()
        while self._ops:
            finished_at = next(iter(self._ops.values())).finished_at
            if finished_at is None:  # never drop an op that has not run yet
                return
            if now - finished_at <= RESULT_TTL_SECONDS and len(self._ops) <= MAX_KEPT_RESULTS:
                return
            self._ops.popitem(last=False)

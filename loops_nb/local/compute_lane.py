"""One thread for all of the embedded Loops' torch work: model loads, trainer ops, sampler batches.

`COMPUTE_LANE.run(fn)` runs `fn` on the lane's thread (inline when already on it), one call at a time;
callers keep their own threads for ordering and waiting. One thread, because libgomp keeps an OpenMP pool
for every thread that computes, and pools beyond the cores make each small parallel region pay a wake-up;
`isolate_threads` gives every other thread one intra-op thread, so no second pool starts. On CUDA the lane
is off (`enabled = False`). The story and its measurements: docs/reference/local_loops.md, "Memory and
precision"."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import cast

import torch

from loops_nb.local.allocator import release_free_heap

RELEASE_AFTER_SECONDS = 0.5
"""After a job this long (a trainer op, a sampler batch), the heap's free pages go back to the kernel
(`allocator.release_free_heap`); shorter jobs touch too little of the heap to be worth the trim."""


class ComputeLane:
    """A single daemon thread that runs submitted callables one at a time, first come first served."""

    def __init__(self, name: str = "loops-compute") -> None:
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.enabled = True
        """False: `run` calls on the caller's thread (the embedded Loops on CUDA sets this)."""
        self.threads: int | None = None
        """The lane's own intra-op thread count once `isolate_threads` ran (every other thread has 1)."""
        self._isolate_lock = threading.Lock()

    def on_lane(self) -> bool:
        """Whether the calling thread is the lane's thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def contended(self) -> bool:
        """Whether work is waiting for the lane (long-running work on it should wind down)."""
        return self.enabled and not self._queue.empty()

    def run[T](self, fn: Callable[[], T]) -> T:
        """Run `fn` on the lane and return its result or raise its exception."""
        if not self.enabled or self.on_lane():
            return fn()
        future: Future[object] = Future()
        self._ensure_started()
        self._queue.put((fn, future))
        return cast(T, future.result())

    def isolate_threads(self) -> None:
        """Give the lane torch's current intra-op thread count, and one to the caller and every thread whose
        first torch work comes later (idempotent); a thread that has a pool already keeps it."""
        with self._isolate_lock:
            if self.threads is not None:
                return
            threads = torch.get_num_threads()
            self.threads = threads
            if threads > 1:
                self.run(lambda: _own_thread_count(threads))
                if self.on_lane():  # only the default changes: the lane keeps its count
                    setter = threading.Thread(target=torch.set_num_threads, args=(1,))
                    setter.start()
                    setter.join()
                else:
                    torch.set_num_threads(1)  # the caller, and the default every later thread starts from

    def _ensure_started(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()

    def _work(self) -> None:
        if self.threads is not None and self.threads > 1:  # a lane started after isolation keeps its count
            _own_thread_count(self.threads)
        while True:
            fn, future = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue
            started = time.perf_counter()
            try:
                result = fn()
            except BaseException as exc:  # handed to the caller, who re-raises it on its own thread
                future.set_exception(exc)
            else:
                future.set_result(result)
            if time.perf_counter() - started >= RELEASE_AFTER_SECONDS:
                release_free_heap()


def _own_thread_count(threads: int) -> None:
    """Set the calling thread's intra-op thread count. torch gives a thread the process default on its
    first torch call, so that call comes first; the count is then the thread's own (OpenMP and MKL keep
    it per thread), whatever the default becomes afterwards."""
    torch.get_num_threads()
    torch.set_num_threads(threads)


COMPUTE_LANE = ComputeLane()
"""The process's lane: every trainer and sampler of the embedded Loops computes on it."""

"""One thread for all of the embedded Loops' torch work: model loads, trainer ops, sampler batches.

Why one thread: torch's CPU kernels run their parallel loops through OpenMP, and libgomp keeps a
separate pool of worker threads for every thread that has ever entered a parallel region. As soon as
those pools together hold more threads than there are cores, libgomp stops letting idle workers spin and
puts them to sleep after every region, so each of the thousands of small parallel regions in a forward
pays a futex wake-up. Measured on a 2-core host (SmolLM2-135M, float32): 20,000 element-wise ops on a
59 x 576 tensor took 0.5 s on a thread alone and 5.4 s on a second thread once the main thread had its
own pool; a 16-datum `forward_backward` took 8.4 s alone and 13.5 s inside the quickstart, where the
trainer's op worker, the sampler's worker and the model-loading thread each had a pool.

`COMPUTE_LANE.run(fn)` runs `fn` on the lane's thread and returns its result (inline when already on
it), one call at a time in arrival order. Callers keep their own threads for ordering and waiting (the
trainer's op queue, the sampler's scheduler); only the compute moves. A sampler batch holds the lane
until it finishes and admits no new requests while other work waits (`contended`), so trainer ops wait
at most one batch.

The lane keeps the process's OpenMP threads to itself (`isolate_threads`, called when a CPU state starts):
it computes with torch's thread count as it was, and every other thread computes on one, so it has no
pool of workers to compete with. Without that, torch work anywhere else in the process (a notebook cell
in the kernel, a caller's own reference model) starts a second pool that lives as long as its thread:
measured, one main-thread op on a large tensor made the lane's small element-wise ops 9x slower for
good (1.70 s against 0.19 s for 20,000), and the same op after `isolate_threads` left them at 0.21 s.
A thread that already has a pool of its own keeps it, so isolating after the fact does not help; that is
why a state isolates as it starts, before any model loads.

On CUDA the threads only launch kernels and the GPU can overlap a trainer's and a sampler's work, so a
state on CUDA turns the lane off (`enabled = False`): `run` then calls `fn` on the caller's thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

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
        return future.result()  # type: ignore[return-value]

    def isolate_threads(self) -> None:
        """Give the lane torch's current intra-op thread count and every other thread one (idempotent).

        "Every other thread" is the calling thread and every thread whose first torch work comes later;
        a thread that computed on several threads before keeps its pool (see the module docstring).
        """
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

"""The C allocator's settings for a process that hosts the embedded Loops.

Two glibc behaviours make a trainer's resident memory grow far past what its tensors hold:

* Each thread that allocates gets its own malloc arena (up to 8 per core), and memory freed in one arena
  is never reused by another: the trainer's op worker, the sampler's worker and the HTTP threads each keep
  a high-water mark of their own. Two arenas are enough for a trainer and a sampler; measured on the
  quickstart, this took 0.3 GB off the peak.
* glibc's mmap threshold is dynamic: once a large block served by `mmap` is freed, blocks up to that size
  (up to 32 MiB) come from the heap instead, and a heap gives pages back to the kernel only from its top.
  A forward's transient activations (a few MiB each) then stay resident after they are freed: measured on
  SmolLM2-135M, a 600-token forward with every decoder layer recomputed kept 0.89 GB resident although
  autograd held 41 MB, and a 4 x 500-token SFT request grew the process by 1.8 GB on its first call and
  0.9 GB more on its second. A fixed threshold (which also turns the dynamic one off) serves every block
  of `MMAP_THRESHOLD` or more with its own mapping, returned to the kernel on `free`, so resident memory
  follows what the tensors hold; the same forward then kept 41 MB.

A third follows from the heap's free space: `release_free_heap` hands the heap's free pages back to the
kernel after a long piece of compute work (`compute_lane`). A forward's small blocks are freed all over the
heap, and glibc's later allocations land in free chunks all over it too, so the pages touched during one
trainer op or sampler batch stay resident until the next one: measured on the quickstart's heap, 600 MB of
arena with 450 MB in use.

Other allocators (musl, macOS) ignore the calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
ARENAS = 2
MMAP_THRESHOLD = 1024 * 1024
"""Blocks of at least this many bytes get a mapping of their own: a 128-token row of a 576-wide model's
hidden states is 288 KiB, its MLP intermediate 0.75 MiB; smaller blocks reuse the heap as before."""


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has both `mallopt` and `malloc_trim`), else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt, libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def tune_malloc(arenas: int = ARENAS, mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Cap glibc's malloc arenas (for threads started from now on) and fix its mmap threshold.

    Returns whether both settings took effect (False where the C library is not glibc).
    """
    libc = _glibc()
    if libc is None:
        return False
    done = bool(libc.mallopt(M_ARENA_MAX, arenas)) and bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold))
    log.debug("malloc arenas capped at %d, mmap threshold %d bytes: %s", arenas, mmap_threshold, done)
    return done


def release_free_heap() -> bool:
    """Give the kernel back the whole free pages inside glibc's heaps (`malloc_trim(0)`).

    Returns whether glibc released anything (False where the C library is not glibc).
    """
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))

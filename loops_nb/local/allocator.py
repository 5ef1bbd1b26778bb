"""The C allocator's settings for a process that hosts the embedded Loops.

glibc gives each thread that allocates its own malloc arena (up to 8 per core), and memory freed in one
arena is never reused by another: the trainer's op worker, the sampler's worker and the HTTP threads each
keep a high-water mark of their own, and resident memory grows by their sum. Two arenas are enough for a
trainer and a sampler; measured on the quickstart, this took 0.3 GB off the peak. Other allocators (musl,
macOS) ignore the call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_ARENA_MAX = -8
ARENAS = 2


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas for threads started from now on; returns whether the cap took effect."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    done = bool(mallopt(M_ARENA_MAX, arenas))
    log.debug("malloc arenas capped at %d: %s", arenas, done)
    return done

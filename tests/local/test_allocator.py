"""glibc keeps freed activations resident unless the mmap threshold is fixed (`local/allocator.py`).

Each case runs in a fresh interpreter, since the setting is process-wide and cannot be undone: it frees
400 MiB of tensors that each sat under a small live tensor (as a forward's transients sit under the
next layer's outputs) and reads how much of it the process still holds.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys, torch
from loops_nb.local.allocator import tune_malloc
def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
if sys.argv[1] == "tuned":
    assert tune_malloc()
warm = torch.ones(1 << 20)  # one 4 MiB block mapped and freed: glibc's dynamic threshold rises past it
del warm
blocks, pins = [], []
before = rss_mib()
for _ in range(100):
    blocks.append(torch.ones(1 << 20))
    pins.append(torch.ones(64))  # a small live block above each big one
held = rss_mib() - before
blocks.clear()
print(held, rss_mib() - before)
"""


def _held_after_free(mode: str) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=300, check=True
    )
    held, kept = out.stdout.split()
    return int(held), int(kept)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_tensors_leave_the_process_once_the_mmap_threshold_is_fixed() -> None:
    held, kept = _held_after_free("tuned")
    assert held >= 350  # the 400 MiB were resident while alive
    assert kept <= 50, f"{kept} MiB of 400 freed MiB still resident with the threshold fixed"


RELEASE_SCRIPT = """
import ctypes
from loops_nb.local.allocator import release_free_heap, tune_malloc
def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
assert tune_malloc()  # as the embedded Loops runs: blocks under 1 MiB come from glibc's heap
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 512 * 1024
blocks, pins = [], []
before = rss_mib()
for _ in range(600):
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)  # touched, as a tensor's data is
    blocks.append(block)
    # A live block after each one keeps the freed ones apart and the heap from shrinking at its top; at a
    # size no free chunk of the interpreter's holds, it comes from the top, right after its block.
    pins.append(libc.malloc(size // 4))
for block in blocks:
    libc.free(block)
kept = rss_mib() - before
released = release_free_heap()
print(kept, rss_mib() - before, released)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_releasing_the_free_heap_hands_freed_pages_back() -> None:
    out = subprocess.run(
        [sys.executable, "-c", RELEASE_SCRIPT], capture_output=True, text=True, timeout=300, check=True
    )
    kept, after, released = out.stdout.split()
    assert int(kept) >= 200, f"only {kept} MiB of 300 freed MiB stayed resident: the case shows nothing"
    assert released == "True" and int(after) <= 50, f"{after} MiB still resident after the release"

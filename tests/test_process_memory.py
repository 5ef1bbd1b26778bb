"""process_memory: the per-step `memory/*` metrics count this process and the processes it started."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from loops_nb.process_memory import process_memory

HOLD = """
import sys, time
block = bytearray(300 * 1024 * 1024)
block[:: 4096] = b"x" * len(block[:: 4096])  # touch every page: resident, not just reserved
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the process tree is read from /proc")
def test_the_process_tree_counts_a_child_and_the_peak_is_this_process() -> None:
    before = process_memory()
    assert before["memory/rss_gb"] > 0 and before["memory/peak_gb"] >= before["memory/rss_gb"] * 0.5
    # A grandchild too: the shell starts Python, which holds the memory.
    child = subprocess.Popen(["sh", "-c", f"{sys.executable} -c '{HOLD}'"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        during = process_memory()
    finally:
        child.kill()
        child.wait()
    grew = during["memory/rss_gb"] - before["memory/rss_gb"]
    assert 0.29 < grew < 0.45, grew
    assert during["memory/peak_gb"] < before["memory/peak_gb"] + 0.1, "the peak is this process's own"
    time.sleep(0.2)
    subprocess.run(["true"], check=True)  # reaped children leave the sum
    assert process_memory()["memory/rss_gb"] < before["memory/rss_gb"] + 0.1

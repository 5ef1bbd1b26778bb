"""process_memory: the per-step `memory/*` metrics count this process and the processes it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from polling import wait_until

from loops_nb.process_memory import process_memory

HOLD = """
import os, sys, time
block = bytearray(300 * 1024 * 1024)
block[:: 4096] = b"x" * len(block[:: 4096])  # touch every page: resident, not just reserved
print("ready", os.getpid(), flush=True)
time.sleep(60)
"""


def holds_memory(pid: int) -> bool:
    """Whether `pid` still has resident memory: an exiting process has until it is torn down, a zombie none."""
    try:
        return "VmRSS:" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the process tree is read from /proc")
def test_the_process_tree_counts_a_child_and_the_peak_is_this_process() -> None:
    before = process_memory()
    assert before["memory/rss_gb"] > 0 and before["memory/peak_gb"] >= before["memory/rss_gb"] * 0.5
    # A grandchild too: the shell starts Python, which holds the memory (not as its last command, so the
    # shell forks it instead of exec'ing it).
    child = subprocess.Popen(
        ["sh", "-c", f"{sys.executable} -c '{HOLD}'; true"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        ready, holder = child.stdout.readline().split()
        assert ready == "ready" and int(holder) != child.pid
        during = process_memory()
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the shell and the Python it started
        child.wait()
    grew = during["memory/rss_gb"] - before["memory/rss_gb"]
    assert 0.29 < grew < 0.45, grew
    assert during["memory/peak_gb"] < before["memory/peak_gb"] + 0.1, "the peak is this process's own"
    # child.wait() waited for the shell only: the killed grandchild is torn down in its own time.
    wait_until(lambda: not holds_memory(int(holder)), "the killed grandchild has released its memory")
    subprocess.run(["true"], check=True)  # reaped children leave the sum
    assert process_memory()["memory/rss_gb"] < before["memory/rss_gb"] + 0.1

"""The run lock: one process per run directory, and it is free again however its holder died."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import loops_nb
from loops_nb.errors import UserError
from loops_nb.resources import RunLock

REPO = Path(__file__).resolve().parents[1]


def test_a_held_lock_refuses_a_second_holder_until_released(tmp_path: Path) -> None:
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    assert first.acquire()
    assert not second.acquire()
    assert second.holder() == str(os.getpid())
    first.release()
    assert second.acquire()
    second.release()


def test_a_killed_holder_frees_the_lock(tmp_path: Path) -> None:
    code = f"from loops_nb.resources import RunLock; import time; assert RunLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    assert not RunLock(tmp_path).acquire()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    lock = RunLock(tmp_path)
    while not lock.acquire():
        assert time.monotonic() < deadline, "the OS drops a dead process's flock"
        time.sleep(0.05)
    lock.release()


@pytest.mark.parametrize(
    "config",
    ["patterns/custom_runtime/in_process_direct/train_local.toml", "examples/sft_tool_use/sft_local.toml"],
)
async def test_train_refuses_a_run_directory_another_process_is_using(config: str, tmp_path: Path) -> None:
    project = loops_nb.load(
        REPO / config,
        overrides={"output.output_dir": str(tmp_path), "output.run_name": "busy", "compute.scope": "local"},
    )
    holder = RunLock(tmp_path / "busy" / "state")
    assert holder.acquire()
    try:
        with pytest.raises(UserError, match="is in use by process"):
            await project.train()
    finally:
        holder.release()


async def test_a_refused_run_leaves_the_live_runs_logs_as_they_are(tmp_path: Path) -> None:
    """The live run may be mid-way through appending a line: the refused one must not cut it off."""
    project = loops_nb.load(
        REPO / "patterns/custom_runtime/in_process_direct/train_local.toml",
        overrides={"output.output_dir": str(tmp_path), "output.run_name": "busy"},
    )
    root = tmp_path / "busy"
    root.mkdir()
    logs = {name: b'{"step": 0}\n{"step": 1, "attem' for name in ("steps.jsonl", "rollouts.jsonl")}
    for name, data in logs.items():
        (root / name).write_bytes(data)
    holder = RunLock(root / "state")
    assert holder.acquire()
    try:
        with pytest.raises(UserError, match="is in use by process"):
            await project.train()
    finally:
        holder.release()
    assert {name: (root / name).read_bytes() for name in logs} == logs

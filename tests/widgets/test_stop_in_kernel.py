"""The Stop button in a real kernel: a click sent while the cell awaits the run stops it at a step boundary.

ipykernel 7 dispatches comm messages (widget clicks) while a cell is suspended in ``await``; a cell that blocks
without awaiting receives them only after it finishes. This test sends the click exactly as a frontend does (a
``comm_msg`` on the shell channel) and checks both cases; it starts one kernel (a few seconds).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

SETUP = """\
import asyncio, os, time
from loops_nb.run_events import RunEnded, RunStarted
from loops_nb.run_events import StepRecord
from loops_nb.widgets import LiveRun
stop = asyncio.Event()
live = LiveRun(stop_event=stop)
live.show()
"""
RUNNING = "the cell is running"
"""What a cell prints once it is under way: the test clicks then, not after some time."""
MAX_STEPS = 600
"""Half a minute of steps: the click, not the end of the loop, is what stops the run."""
AWAITING_RUN = f"""\
live.on_start(RunStarted(recipe="rl", max_steps={MAX_STEPS}, start_step=0))
for step in range({MAX_STEPS}):
    if stop.is_set():
        break
    live.on_step(StepRecord(step, {{"reward/mean": 0.5}}))
    if step == 0:
        print("{RUNNING}", flush=True)
    await asyncio.sleep(0.05)
live.on_end(RunEnded(status="stopped" if stop.is_set() else "completed", steps=live.run.step))
print("status", live.run.status, "step", live.run.step)
"""
BLOCKING_RUN = """\
print("{running}", flush=True)
for i in range(6000):  # until the test has sent the click (bounded: a minute)
    if stop.is_set() or os.path.exists({clicked!r}):
        break
    time.sleep(0.01)
print("blocking cell saw the click:", stop.is_set())
"""


def run_cell(kc: Any, code: str, *, once_running: Any = None, timeout: float = 60) -> list[dict]:
    """Run `code` and return its iopub messages; `once_running()` is called when it prints RUNNING."""
    msg_id = kc.execute(code)
    outputs = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return outputs
        outputs.append(msg)
        if once_running is not None and msg["msg_type"] == "stream" and RUNNING in msg["content"]["text"]:
            once_running()
            once_running = None
    raise TimeoutError(code)


def stdout(outputs: list[dict]) -> str:
    return "".join(m["content"]["text"] for m in outputs if m["msg_type"] == "stream")


def test_stop_button_click_during_await(tmp_path: Path) -> None:
    ipykernel = pytest.importorskip("ipykernel")
    if int(ipykernel.__version__.split(".")[0]) < 7:
        pytest.skip("ipykernel < 7 queues comm messages behind a running cell; use LiveRun.run_in_background")
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        shown = run_cell(kc, SETUP)
        views = [m["content"]["data"] for m in shown if m["msg_type"] == "display_data"]
        model_id = next(
            d["application/vnd.jupyter.widget-view+json"]["model_id"]
            for d in views
            if "application/vnd.jupyter.widget-view+json" in d
        )

        def click() -> None:
            content = {"comm_id": model_id, "data": {"method": "custom", "content": {"event": "click"}}}
            kc.shell_channel.send(kc.session.msg("comm_msg", content))

        out = run_cell(kc, AWAITING_RUN, once_running=click)
        _, status, _, step = stdout(out).splitlines()[-1].split()
        assert status == "stopped" and 0 < int(step) < MAX_STEPS  # stopped by the click, not at the last step
        retired = [
            m
            for m in out
            if m["msg_type"] == "update_display_data"
            and m["content"]["data"].get("text/plain", "").startswith("run stopped")
        ]
        assert retired, "the button's output is replaced by a static line"

        # A blocking cell: the click is queued until the cell ends.
        run_cell(
            kc,
            "stop.clear(); live.stop_control.stop_event = stop; "
            "button = live.stop_control.button = live.stop_control.make_button(live.stop); "
            "h = display(button, display_id=True); mid = button.model_id",
        )
        model_id = stdout(run_cell(kc, "print(mid)")).strip()
        clicked = tmp_path / "clicked"

        def click_while_blocked() -> None:
            click()
            clicked.touch()  # only now may the cell end: the click was sent while it blocked

        blocking = BLOCKING_RUN.format(running=RUNNING, clicked=str(clicked))
        out = run_cell(kc, blocking, once_running=click_while_blocked)
        assert "saw the click: False" in stdout(out)
        assert "True" in stdout(run_cell(kc, "print(stop.is_set())"))  # delivered once the cell finished
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)

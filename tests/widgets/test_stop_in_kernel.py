"""The Stop button in a real kernel: a click sent while the cell awaits the run stops it at a step boundary.

ipykernel 7 dispatches comm messages (widget clicks) while a cell is suspended in ``await``; a cell that blocks
without awaiting receives them only after it finishes. This test sends the click exactly as a frontend does (a
``comm_msg`` on the shell channel) and checks both cases; it starts one kernel (a few seconds).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

SETUP = """\
import asyncio, time
from loops_nb.widgets import LiveRun
stop = asyncio.Event()
live = LiveRun(stop_event=stop)
live.show()
"""
AWAITING_RUN = """\
live.on_start({"recipe": "rl", "max_steps": 100, "start_step": 0})
for step in range(100):
    if stop.is_set():
        break
    live.on_step({"step": step, "reward/mean": 0.5})
    await asyncio.sleep(0.05)
live.on_end({"status": "stopped" if stop.is_set() else "completed", "steps": live.step})
print("status", live.status, "step", live.step)
"""
BLOCKING_RUN = """\
seen = None
for i in range(20):
    if stop.is_set():
        seen = i
        break
    time.sleep(0.05)
print("blocking cell saw the click:", seen is not None)
"""


def run_cell(kc: Any, code: str, *, click: Any = None, timeout: float = 30) -> list[dict]:
    msg_id = kc.execute(code)
    if click is not None:
        time.sleep(0.5)
        click()
    outputs = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return outputs
        outputs.append(msg)
    raise TimeoutError(code)


def stdout(outputs: list[dict]) -> str:
    return "".join(m["content"]["text"] for m in outputs if m["msg_type"] == "stream")


def test_stop_button_click_during_await() -> None:
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

        out = run_cell(kc, AWAITING_RUN, click=click)
        status, step = stdout(out).split()[1], int(stdout(out).split()[3])
        assert status == "stopped" and 0 < step < 100  # stopped ~0.5 s in, not after 5 s
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
            "stop.clear(); live.stop_event = stop; live.button = live._make_button(); "
            "h = display(live.button, display_id=True); mid = live.button.model_id",
        )
        model_id = stdout(run_cell(kc, "print(mid)")).strip()
        out = run_cell(kc, BLOCKING_RUN, click=click)
        assert "saw the click: False" in stdout(out)
        assert "True" in stdout(run_cell(kc, "print(stop.is_set())"))  # delivered once the cell finished
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)

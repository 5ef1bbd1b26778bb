"""LiveRun: the observer that composes the widgets, with its Stop button and script output."""

from __future__ import annotations

import asyncio
import io
import re
import threading

import pytest
from widget_fixtures import FakeDisplay, assert_static_html, fake_rl_run, sft_events

from loops_nb.widgets import LiveRun, LossCurve, RewardCurve


async def test_rl_events_render_one_throttled_panel(fake_display: FakeDisplay) -> None:
    live = LiveRun(display_fn=fake_display, max_hz=2.0)
    assert await fake_rl_run(live, steps=10) == "completed"
    assert len(fake_display.handles) == 1  # no stop event: no button, one panel
    panel = fake_display.handles[0]
    # 10 steps x (4 attempts + step + progress) = 60 events in ~0.1 s: throttled, plus the final update.
    assert 1 <= panel.updates <= 4
    bundle = panel.last._repr_mimebundle_()
    assert bundle["text/plain"].startswith("LiveRun(RL · tiny · step 10/10 ·")
    assert bundle["text/plain"].endswith("40 attempts (2 in flight) · completed)")
    html = bundle["text/html"]
    assert_static_html(html)
    assert "<svg" not in html  # the panel's chart is sanitizer-proof divs
    assert len(re.findall(r'title="step \d+: reward/mean', html)) == 10
    assert "reward/group_std_mean" in html and "kl/sample_train_v1" in html  # run health
    assert ">10,045<" in html  # sampled tokens total
    assert html.count("<details>") == 20  # the panel keeps the 20 most recent attempts
    assert isinstance(live.curve, RewardCurve) and live.curve.last == pytest.approx(0.65)


def test_sft_events_use_the_loss_curve(fake_display: FakeDisplay) -> None:
    live = LiveRun(display_fn=fake_display)
    sft_events(live)
    assert isinstance(live.curve, LossCurve)
    html = fake_display.handles[0].last.to_html()
    assert_static_html(html)
    assert "SFT · tiny · step 6/6" in html and "completed" in html
    assert len(re.findall(r'title="step \d+: loss', html)) == 6
    assert len(re.findall(r'title="step \d+: eval loss', html)) == 3
    assert ">600<" in html and ">2,400<" in html  # trained and total tokens
    assert "AttemptsTable" not in html  # SFT has no attempts
    assert str(live).splitlines()[1].startswith("LossCurve(6 steps")


async def test_script_mode_prints_one_line_per_step() -> None:
    out = io.StringIO()
    live = LiveRun(mode="text", stream=out)
    await fake_rl_run(live, steps=3, attempts_per_step=1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "run runs/fake: rl on tiny (local)"
    steps = [line for line in lines if line.startswith("step ")]
    assert [s.split()[1] for s in steps] == ["1/3", "2/3", "3/3"]
    assert all("reward/mean=" in s and "eta=" in s for s in steps)
    assert lines[-1] == "done: completed after 3 steps in 1s"


async def test_off_mode_collects_without_output(fake_display: FakeDisplay) -> None:
    out = io.StringIO()
    live = LiveRun(mode="off", stream=out, display_fn=fake_display)
    await fake_rl_run(live, steps=2)
    assert out.getvalue() == "" and fake_display.handles == []
    assert live.status == "completed" and live.curve is not None and len(live.curve.steps) == 2


async def test_stop_button_sets_the_event_and_is_retired(fake_display: FakeDisplay) -> None:
    stop = asyncio.Event()
    live = LiveRun(stop_event=stop, display_fn=fake_display)
    live.show()
    button_handle, panel = fake_display.handles
    assert type(live.button).__name__ == "Button" and button_handle.obj is live.button

    async def click_after_two_steps() -> None:
        while (live.step or 0) < 2:
            await asyncio.sleep(0.005)
        live.button.click()  # what a click in the frontend does once the kernel dispatches the comm message

    clicker = asyncio.create_task(click_after_two_steps())
    status = await fake_rl_run(live, stop, steps=10)
    await clicker
    assert status == "stopped" and live.status == "stopped" and live.step == 2
    assert stop.is_set()
    final = button_handle.last._repr_mimebundle_()
    assert final["text/plain"] == "run stopped at step 2"  # the saved notebook holds no dead widget
    assert_static_html(final["text/html"])
    assert live.button is None
    assert panel.last._repr_mimebundle_()["text/plain"].endswith("· stopped)")


async def test_stop_from_another_thread_wakes_the_loop(fake_display: FakeDisplay) -> None:
    stop = asyncio.Event()
    live = LiveRun(stop_event=stop, display_fn=fake_display)
    live.on_start({"recipe": "rl", "max_steps": 5})  # remembers the run's loop
    thread = threading.Thread(target=live.stop)
    thread.start()
    await asyncio.wait_for(stop.wait(), 2)
    thread.join()
    assert live.status == "stopping"


async def test_run_in_background_returns_at_once(fake_display: FakeDisplay) -> None:
    stop = asyncio.Event()
    live = LiveRun(stop_event=stop, display_fn=fake_display)
    task = live.run_in_background(fake_rl_run(live, stop, steps=50))
    assert not task.done() and len(fake_display.handles) == 2  # button and panel shown before the run starts
    await asyncio.sleep(0.05)
    live.stop()
    assert await asyncio.wait_for(task, 5) == "stopped"
    assert live.status == "stopped" and 0 < (live.step or 0) < 50


async def test_run_in_background_reports_a_failure(fake_display: FakeDisplay) -> None:
    live = LiveRun(display_fn=fake_display)

    async def broken() -> None:
        live.on_start({"recipe": "rl", "max_steps": 3})
        raise RuntimeError("sampler unreachable")

    task = live.run_in_background(broken())
    with pytest.raises(RuntimeError):
        await task
    await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    assert live.status == "failed: RuntimeError: sampler unreachable"
    assert "sampler unreachable" in fake_display.handles[-1].last.to_html()


def test_run_in_background_needs_a_loop() -> None:
    async def nothing() -> None: ...

    with pytest.raises(RuntimeError, match="running event loop"):
        LiveRun(mode="off").run_in_background(nothing())


def test_stop_without_an_event_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="stop_event"):
        LiveRun(mode="off").stop()

"""LiveRun: the observer that composes the widgets, with its Stop button and script output."""

from __future__ import annotations

import asyncio
import io
import re
import threading

import pytest
from polling import until
from widget_fixtures import FakeDisplay, assert_static_html, fake_rl_run, rl_attempt, rl_step, sft_events

from loops_nb.run_events import AttemptFinished, EvalRecord, RunEnded, RunStarted, StepRecord, StepRollouts
from loops_nb.widgets import LiveRun


async def test_rl_events_render_one_throttled_panel(fake_display: FakeDisplay) -> None:
    live = LiveRun(display_fn=fake_display, max_hz=2.0)
    assert await fake_rl_run(live, steps=10) == "completed"
    # No stop event: no button; the panel, its chart, then one output per step.
    panel, chart, *blocks = fake_display.handles
    # 10 steps x (4 attempts + step + progress) = 60 events in ~0.1 s: throttled, plus the final update.
    assert 1 <= panel.updates <= 4
    bundle = panel.last._repr_mimebundle_()
    first = bundle["text/plain"].splitlines()[0]
    assert first.startswith("RL · tiny · 10/10 steps ·") and first.endswith("· 40 attempts · completed")
    assert "in flight" not in first  # the final header does not keep the last progress snapshot
    assert "LiveRun(" not in bundle["text/plain"]
    html = bundle["text/html"]
    assert_static_html(html)
    chart_html = chart.last.to_html()  # the chart's output: its table where no JavaScript runs
    assert_static_html(chart_html)
    assert len(re.findall(r'title="step \d+: reward/mean', chart_html)) == 10
    assert (
        'title="step 10: reward/mean' in chart_html and 'title="step 0:' not in chart_html
    )  # numbered from 1
    assert "reward: 10 steps, last 0.65" in html  # the panel says the curve's numbers in words
    assert "reward/group_std_mean" in html and "kl/sample_train_v1" in html  # run health
    assert ">10,045<" in html  # sampled tokens total
    assert "<details>" not in html  # transcripts live in the step outputs, which are never re-rendered
    assert live.chart.kind == "reward" and str(live.chart).startswith("reward: 10 steps, last 0.65")
    # fake_rl_run sends no on_rollouts: each step's attempts are flushed as one block when the step ends.
    assert len(blocks) == 10 and all(b.updates == 0 for b in blocks[-4:])  # the last 4 keep their rows
    assert all(b.updates == 1 for b in blocks[:-4])  # older ones folded to a line, once
    last = blocks[-1].obj.to_html()
    assert_static_html(last)
    assert last.count("<details>") == 4 and "step 10: 4 attempts" in last


def rollout_rows(step: int, attempts: list[AttemptFinished]) -> StepRollouts:
    return StepRollouts(
        step,
        [
            {"step": step, "group": n // 2, "attempt": a.attempt, "trained": n % 2 == 0}
            for n, a in enumerate(attempts)
        ],
    )


def test_an_open_transcript_is_never_re_rendered(fake_display: FakeDisplay) -> None:
    """The update protocol: the panel is re-rendered, a step's attempts are displayed once and then left alone
    (a re-render would replace the <details> a person had opened)."""
    live = LiveRun(display_fn=fake_display, max_hz=1000.0, attempt_steps=3)
    live.on_start(RunStarted(recipe="rl", model="tiny", max_steps=4, start_step=0, run_dir="runs/x"))
    for step in range(4):
        attempts = [rl_attempt(step * 4 + a) for a in range(4)]
        for a in attempts:
            a.text["calls"][0]["trained"] = None  # as RLRun sends it: unknown until the step trains
            live.on_attempt(a)
        assert len(fake_display.handles) == 2 + step  # panel, chart; nothing before the step has trained
        live.on_rollouts(rollout_rows(step, attempts))
        live.on_step(rl_step(step))
        if step == 0:
            opened = fake_display.handles[2]
    live.on_end(RunEnded(status="completed", steps=4))
    panel, _chart, *blocks = fake_display.handles
    assert len(blocks) == 4
    assert opened is blocks[0] and opened.updates == 1  # left alone for the next 2 steps, folded at the 4th
    assert [b.updates for b in blocks[1:]] == [0, 0, 0]
    html = blocks[1].obj.to_html()
    assert "step 2: 4 attempts · mean reward 1 · 2 trained · 0 discarded" in html
    assert html.count(">ok · trained<") == 2 and html.count(">ok · not trained<") == 2
    assert ">g1<" in html and 'title="a5"' in html
    assert "16 attempts, 8 trained, 0 discarded" in panel.last.to_html()


def test_sft_events_use_the_loss_curve(fake_display: FakeDisplay) -> None:
    live = LiveRun(display_fn=fake_display)
    sft_events(live)
    assert live.chart.kind == "loss"
    assert len(fake_display.handles) == 2  # SFT has no attempts: the panel and its chart, no step outputs
    html = fake_display.handles[0].last.to_html()
    assert_static_html(html)
    assert "SFT · tiny · 6/6 steps" in html and "completed" in html
    chart_html = fake_display.handles[1].last.to_html()
    assert_static_html(chart_html)
    assert len(re.findall(r'title="step \d+: train loss', chart_html)) == 6
    assert len(re.findall(r'title="eval after \d+ steps: loss', chart_html)) == 3
    assert ">600<" in html and ">2,400<" in html  # trained and total tokens
    assert "attempts" not in html
    assert str(live).splitlines()[1].startswith("loss: 6 steps")


async def test_the_heartbeat_moves_the_clock_while_a_step_runs(fake_display: FakeDisplay) -> None:
    live = LiveRun(display_fn=fake_display, heartbeat_s=0.01, max_hz=1000.0)
    live.on_start(RunStarted(recipe="sft", model="tiny", max_steps=3, start_step=0))
    panel = fake_display.handles[0]
    before = panel.updates
    # No event at all (the first step is still training), yet the panel is redrawn.
    await until(lambda: panel.updates > before, "the heartbeat redraws the panel")
    assert "step 1 running for" in live.progress_line()
    live.on_end(RunEnded(status="completed", steps=3))
    settled = panel.updates
    await asyncio.sleep(0.1)
    assert panel.updates == settled, "the heartbeat stops with the run"
    assert "running for" not in live.progress_line()


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
    assert live.run.status == "completed" and len(live.chart.records) == 2


async def test_stop_button_sets_the_event_and_is_retired(fake_display: FakeDisplay) -> None:
    stop = asyncio.Event()
    live = LiveRun(stop_event=stop, display_fn=fake_display)
    live.show()
    button_handle, panel = fake_display.handles
    button = live.stop_control.button
    assert type(button).__name__ == "Button" and button_handle.obj is button

    async def click_after_two_steps() -> None:
        while (live.run.step or 0) < 2:
            await asyncio.sleep(0.005)
        button.click()  # what a click in the frontend does once the kernel dispatches the comm message

    clicker = asyncio.create_task(click_after_two_steps())
    status = await fake_rl_run(live, stop, steps=10)
    await clicker
    assert status == "stopped" and live.run.status == "stopped" and live.run.step == 2
    assert stop.is_set()
    final = button_handle.last._repr_mimebundle_()
    # The saved notebook holds no dead widget, and says how to go on.
    assert final["text/plain"].startswith("run stopped after 2 steps. To resume from its last checkpoint")
    assert 'set run_name = "fake"' in final["text/plain"] and "--output.run_name fake" in final["text/plain"]
    assert_static_html(final["text/html"])
    assert live.stop_control.button is None
    text = panel.last._repr_mimebundle_()["text/plain"]
    assert text.splitlines()[0].endswith("· stopped") and "loops run <config> --output.run_name fake" in text
    assert "--output.run_name fake" in panel.last.to_html()


async def test_stop_from_another_thread_wakes_the_loop(fake_display: FakeDisplay) -> None:
    stop = asyncio.Event()
    live = LiveRun(stop_event=stop, display_fn=fake_display)
    live.on_start(RunStarted(recipe="rl", max_steps=5))  # remembers the run's loop
    thread = threading.Thread(target=live.stop)
    thread.start()
    await asyncio.wait_for(stop.wait(), 2)
    thread.join()
    assert live.run.status == "stopping"
    line = live.progress_line()
    assert "ETA" not in line and line.endswith("stopping at the end of this step")


async def test_run_in_background_returns_at_once(fake_display: FakeDisplay) -> None:
    stop = asyncio.Event()
    live = LiveRun(stop_event=stop, display_fn=fake_display)
    task = live.run_in_background(fake_rl_run(live, stop, steps=50))
    assert not task.done() and len(fake_display.handles) == 2  # button and panel shown before the run starts
    await until(lambda: (live.run.step or 0) > 0, "the run in the background has taken a step")
    live.stop()
    assert await asyncio.wait_for(task, 5) == "stopped"
    assert live.run.status == "stopped" and 0 < (live.run.step or 0) < 50


async def test_run_in_background_reports_a_failure(fake_display: FakeDisplay) -> None:
    live = LiveRun(display_fn=fake_display)

    async def broken() -> None:
        live.on_start(RunStarted(recipe="rl", max_steps=3))
        raise RuntimeError("sampler unreachable")

    task = live.run_in_background(broken())
    with pytest.raises(RuntimeError):
        await task
    await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    assert live.run.status == "failed: RuntimeError: sampler unreachable"
    assert "sampler unreachable" in fake_display.handles[0].last.to_html()


def test_run_in_background_needs_a_loop() -> None:
    async def nothing() -> None: ...

    with pytest.raises(RuntimeError, match="running event loop"):
        LiveRun(mode="off").run_in_background(nothing())


def test_stop_without_an_event_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="stop_event"):
        LiveRun(mode="off").stop()


def test_a_failed_run_stops_the_clock_and_says_how_to_resume(fake_display: FakeDisplay) -> None:
    live = LiveRun(display_fn=fake_display)
    live.on_start(RunStarted(recipe="rl", model="tiny", max_steps=5, start_step=0, run_dir="runs/r-0102"))
    live.on_step(rl_step(0))
    live.on_end(RunEnded(status="failed", steps=1, error="RuntimeError: CUDA error", resume_step=0))
    html = fake_display.handles[0].last.to_html()
    assert_static_html(html)
    assert "failed: RuntimeError: CUDA error" in html and "ETA" not in html and "running for" not in html
    assert (
        "set run_name = &quot;r-0102&quot;" in html
        and "--output.run_name r-0102" in html
        and "(step 0)" in html
    )


def test_the_sft_chart_shows_the_held_out_loss_before_training_with_a_legend(
    fake_display: FakeDisplay,
) -> None:
    live = LiveRun(display_fn=fake_display)
    live.on_start(RunStarted(recipe="sft", model="tiny", max_steps=2, start_step=0))
    live.on_eval(EvalRecord(0, {"eval/loss": 2.5, "eval/examples": 4}))  # what SFTRun.begin sends
    for step in range(2):
        live.on_step(
            StepRecord(step, {"loss": 2.0 - 0.1 * step, **({"eval/loss": 2.2} if step == 1 else {})})
        )
    live.on_end(RunEnded(status="completed", steps=2))
    assert live.chart.kind == "loss"
    html = fake_display.handles[1].last.to_html()  # the chart's output
    assert_static_html(html)
    assert 'title="eval before training: loss 2.5"' in html and 'title="eval after 2 steps: loss 2.2"' in html
    assert ">train loss</th>" in html and ">eval loss</th>" in html  # the columns name the series
    panel = fake_display.handles[0].last.to_html()
    assert "eval before training 2.5" in live.chart.summary() and "eval before training 2.5" in panel
    assert "loss: 2 steps" in live.chart.summary()


def test_the_resume_line_names_the_run_config(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my runs").mkdir()
    live = LiveRun(mode="off")
    live.on_start(
        RunStarted(
            recipe="sft",
            max_steps=5,
            start_step=0,
            run_dir=str(tmp_path / "runs" / "sft-1"),
            config=str(tmp_path / "my runs" / "sft.toml"),
        )
    )
    live.on_end(RunEnded(status="failed", steps=2, error="boom", resume_step=2))
    hint = live.run.resume_hint() or ""
    assert "loops run 'my runs/sft.toml' --output.run_name sft-1" in hint and "(step 2)" in hint

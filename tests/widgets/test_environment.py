"""Environment detection and the throttled live display."""

from __future__ import annotations

import asyncio
import io

import pytest
from polling import until
from widget_fixtures import FakeClock, FakeDisplay

from loops_nb.widgets import LiveDisplay, environment, progress_mode
from loops_nb.widgets.environment import resolve_output


class Thing:
    def __init__(self) -> None:
        self.n = 0

    def __str__(self) -> str:
        return f"thing {self.n}"


def test_plain_python_is_a_script_and_prints_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOPS_NB_PROGRESS", raising=False)
    assert environment() == "script"
    assert resolve_output() == "text"


def test_progress_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPS_NB_PROGRESS", "off")
    assert progress_mode() == "off"
    assert resolve_output() == "off"
    assert progress_mode("text") == "text"  # an argument beats the environment
    monkeypatch.setenv("LOOPS_NB_PROGRESS", "bogus")
    assert progress_mode() == "auto"


def test_many_updates_are_throttled_and_finalize_forces_one(fake_display: FakeDisplay) -> None:
    clock, thing = FakeClock(), Thing()
    live = LiveDisplay(thing, max_hz=2.0, display_fn=fake_display, clock=clock).show()
    handle = fake_display.handles[0]
    for i in range(100):  # 100 updates over 5 simulated seconds: at most 2 per second get through
        thing.n = i
        clock.now += 0.05
        live.update()
    assert 9 <= handle.updates <= 11
    before = handle.updates
    live.update()  # too soon after the last one
    assert handle.updates == before
    live.finalize()
    assert handle.updates == before + 1
    assert handle.last is thing
    assert live.renders == handle.updates + 1  # the initial display counts too


def test_force_and_max_hz(fake_display: FakeDisplay) -> None:
    clock = FakeClock()
    live = LiveDisplay(Thing(), max_hz=1.0, display_fn=fake_display, clock=clock).show()
    assert live.update() is False
    assert live.update(force=True) is True
    clock.now += 1.0
    assert live.update() is True
    assert fake_display.handles[0].updates == 2


async def test_a_throttled_update_is_flushed_later_on_a_running_loop(fake_display: FakeDisplay) -> None:
    live = LiveDisplay(Thing(), max_hz=20.0, display_fn=fake_display).show()
    assert live.update() is False  # within 50 ms of the display: deferred, not dropped
    await until(lambda: fake_display.handles[0].updates == 1, "the deferred update is flushed")
    await asyncio.sleep(0.1)  # and flushed once: nothing else is pending
    assert fake_display.handles[0].updates == 1


def test_text_mode_prints_at_a_low_rate_and_the_final_state() -> None:
    clock, thing, out = FakeClock(), Thing(), io.StringIO()
    live = LiveDisplay(thing, mode="text", text_interval_s=30, stream=out, clock=clock).show()
    for i in range(1, 50):
        thing.n = i
        clock.now += 1
        live.update()
    thing.n = 99
    live.update()
    live.finalize()
    lines = out.getvalue().splitlines()
    assert lines[0] == "thing 0"
    assert lines[-1] == "thing 99"
    assert len(lines) <= 4


def test_off_mode_shows_nothing(fake_display: FakeDisplay) -> None:
    out = io.StringIO()
    live = LiveDisplay(Thing(), mode="off", stream=out, display_fn=fake_display).show()
    live.update(force=True)
    live.finalize()
    assert out.getvalue() == ""
    assert fake_display.handles == []

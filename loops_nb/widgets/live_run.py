"""`LiveRun`: a run observer that shows the whole run in one live notebook output, or prints lines in a script.

It is what a notebook constructs, and composes the parts that do the work: the run's state (`RunPanelState`)
rendered by a `RunPanel` (progress line with the step counter and ETA, the curve's numbers, token counts, run
health) through one throttled display handle (`LiveDisplay`), so the notebook never receives more than a couple
of updates a second and a saved notebook holds the final state; the chart as an output of its own under the panel
(`ChartOutput`); a `Heartbeat` that re-renders the panel while a step runs; an optional Stop button
(`StopControl`); and `BackgroundRun` for a run started as a task.

RL attempts are not part of the panel: each trained step's attempts are displayed once, below the panel, by an
`AttemptsLog`, and never re-rendered, so a transcript a person opens stays open while training goes on.

Stopping: ``LiveRun(stop_event=asyncio.Event())`` adds a Stop button (only in a kernel) that sets the event; pass
the same event to the loop (``project.train(observers=[live], stop=live.stop_event)``). `stop_control` says when
a click reaches a running cell; `LiveRun.run_in_background` returns at once, so a click always does.

Outside a kernel (or with ``LOOPS_NB_PROGRESS=text``) a `TerminalReporter` prints one line per step, as the CLI
does; ``LOOPS_NB_PROGRESS=off`` shows nothing, while the data is still collected.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TextIO

from loops_nb.observers import TerminalReporter
from loops_nb.run_events import (
    AttemptFinished,
    EvalRecord,
    ProgressTick,
    RunEnded,
    RunStarted,
    StepRollouts,
)
from loops_nb.step_record import StepRecord
from loops_nb.widgets.attempts_log import AttemptsLog
from loops_nb.widgets.background_run import BackgroundRun
from loops_nb.widgets.chart_output import ChartOutput
from loops_nb.widgets.environment import DisplayFn, LiveDisplay, ipython_display, resolve_output
from loops_nb.widgets.heartbeat import Heartbeat
from loops_nb.widgets.reward_curve import LossCurve, RewardCurve
from loops_nb.widgets.run_chart import RunChart
from loops_nb.widgets.run_health import RunHealth
from loops_nb.widgets.run_panel import RunPanel
from loops_nb.widgets.run_state import RunPanelState, RunState
from loops_nb.widgets.stop_control import StopControl
from loops_nb.widgets.token_counts import TokenCounts

if TYPE_CHECKING:
    from ipywidgets import Button

# The states a heartbeat keeps beating in: the run may still be starting, or stopping.
_BEATING = frozenset({RunState.WAITING, RunState.RUNNING, RunState.STOPPING})


class LiveRun:
    """A run observer (``on_start``/``on_step``/``on_attempt``/``on_progress``/``on_end``) rendering the run live.

    ``stop_event`` adds a Stop button that sets it; ``max_hz`` caps re-renders; ``mode`` overrides
    ``$LOOPS_NB_PROGRESS``; ``stream`` is where script lines go; ``attempts`` how many attempts of a step the
    attempts log shows and ``attempt_steps`` for how many recent steps; ``heartbeat_s`` how often the panel
    re-renders while a step runs (0: never); ``display_fn`` replaces IPython's ``display`` (tests, other
    frontends); ``live_chart`` shows the plotly `RunChart` under the panel (default: in a kernel, and not with a
    ``display_fn``, whose frontend may have no widgets).
    """

    def __init__(
        self,
        *,
        stop_event: asyncio.Event | None = None,
        max_hz: float = 2.0,
        mode: str | None = None,
        stream: TextIO | None = None,
        attempts: int = 32,
        attempt_steps: int = 4,
        heartbeat_s: float = 2.0,
        display_fn: DisplayFn | None = None,
        live_chart: bool | None = None,
    ) -> None:
        self.output = resolve_output(mode, display_fn)
        shows = display_fn or ipython_display
        self._chart = ChartOutput(
            live=self.output == "display" and (display_fn is None if live_chart is None else live_chart),
            display_fn=shows,
        )
        self.tokens = TokenCounts()
        self.anchor = f"loops-attempts-{uuid.uuid4().hex[:8]}"
        self.attempts = AttemptsLog(
            display_fn=shows if self.output == "display" else None,
            keep_steps=attempt_steps,
            max_rows=attempts,
        )
        self.health = RunHealth(attempts_anchor=self.anchor)
        self._run = RunPanelState()
        self._panel = RunPanel(
            self._run,
            chart=self._chart,
            tokens=self.tokens,
            health=self.health,
            attempts=self.attempts,
            anchor=self.anchor,
        )
        self._display = LiveDisplay(
            self, max_hz=max_hz, output=self.output, text_interval_s=None, display_fn=display_fn
        )
        self._reporter = TerminalReporter(stream) if self.output == "text" else None
        self._stop = StopControl(stop_event, display_fn=shows)
        self._heartbeat = Heartbeat(heartbeat_s, beating=self._beating, tick=self._tick)
        self._background = BackgroundRun(self._run, show=self.show, finalize=self.finalize)
        self._loop: asyncio.AbstractEventLoop | None = None  # the run's loop: heartbeats and stops go there

    # -- observer protocol ------------------------------------------------------------------------------------

    def on_start(self, started: RunStarted) -> None:
        self._run.start(started)
        with contextlib.suppress(RuntimeError):  # called without a loop (a synchronous test)
            self._loop = asyncio.get_running_loop()
        self._chart.on_start(self._run.info)
        if self._reporter:
            self._reporter.on_start(self._run.info)
        if self._display.shown:  # shown before the run started (run_in_background, or by hand): refresh it
            self._display.update(force=True)
        else:
            self.show()
        self._chart.refresh(show_panel=self.show)
        self._heartbeat.start(self._loop)

    def on_step(self, record: StepRecord) -> None:
        self._run.stepped(record.step)
        if not self.attempts.got_rollouts:  # a producer without on_rollouts: show its attempts per step
            self.attempts.flush(record.step)
        self._chart.chart.on_step(record)
        self._chart.refresh(show_panel=self.show)
        self.tokens.on_step(record)
        self.health.on_step(record)
        if self._reporter:
            self._reporter.on_step(record)
        self._display.update()

    def on_attempt(self, attempt: AttemptFinished) -> None:
        self.attempts.on_attempt(attempt)
        self.health.on_attempt(attempt)
        self._display.update()

    def on_rollouts(self, rollouts: StepRollouts) -> None:
        """A step trained (`StepRollouts`): its attempts (with what trained) go below the panel, once."""
        self.attempts.on_rollouts(rollouts)
        self._display.update()

    def on_progress(self, tick: ProgressTick) -> None:
        self._run.progress = tick
        if self._reporter:
            self._reporter.on_progress(tick)
        self._display.update()

    def on_eval(self, evaluation: EvalRecord) -> None:
        """RL's eval reward (`[eval]`) or SFT's held-out loss before training joins the curve."""
        self._chart.chart.on_eval(evaluation)
        self._chart.refresh(show_panel=self.show)
        if self._reporter:
            self._reporter.on_eval(evaluation)
        self._display.update()

    def on_end(self, ended: RunEnded) -> None:
        self._run.end(ended)
        if not self.attempts.got_rollouts:
            self.attempts.flush(self.step - 1 if self.step else None)
        if self._reporter:
            self._reporter.on_end(ended)
        self.finalize()

    # -- display and control ----------------------------------------------------------------------------------

    def show(self) -> LiveRun:
        """Display the Stop button (if any) and the panel; later calls do nothing."""
        if self.output == "display":
            self._stop.show(on_click=self.stop)
        self._display.show()
        return self

    def finalize(self) -> None:
        """Render the final state and retire the Stop button (called by ``on_end``)."""
        self._heartbeat.cancel()
        self._stop.retire(self._run.final_line)
        self._chart.retire()
        self._display.finalize()

    def stop(self) -> None:
        """Ask the run to stop at the next step boundary (what the Stop button does)."""
        self._stop.request(self._loop, self._stop_here)

    def _stop_here(self) -> None:
        self._stop.set()
        self._run.stop_requested()
        self._display.update(force=True)

    def run_in_background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Start ``coro`` (e.g. ``project.train(observers=[live], stop=live.stop_event)``) as a task on the
        running loop and return it at once: the cell finishes, the kernel stays free for Stop clicks and other
        cells, and ``await task`` (or ``task.result()``) gives the outcome later."""
        task = self._background.start(coro)
        self._loop = self._background.loop
        return task

    def _make_button(self) -> Button | None:
        """A Stop button for this run, not yet displayed."""
        return self._stop.make_button(self.stop)

    def _beating(self) -> bool:
        return self._run.state in _BEATING and self.output == "display"

    def _tick(self) -> None:
        if self._run.started is not None and self._display.shown:
            self._display.update()

    def resume_hint(self) -> str | None:
        """How to go on with a run that stopped or failed before its last step (None otherwise)."""
        return self._run.resume_hint()

    # -- what it shows and holds ------------------------------------------------------------------------------

    @property
    def state(self) -> RunState:
        return self._run.state

    @property
    def status(self) -> str:
        """The state in words; a failure says why (``"failed: RuntimeError: ..."``)."""
        return self._run.status

    @property
    def info(self) -> RunStarted:
        """The run's description from ``on_start`` (recipe, model, max_steps, run_dir, config, ...)."""
        return self._run.info

    @property
    def progress(self) -> ProgressTick | None:
        """The latest `ProgressTick` (RL, while the run samples), None before the first."""
        return self._run.progress

    @property
    def step(self) -> int | None:
        """Steps done (the last record's step + 1)."""
        return self._run.step

    @property
    def started(self) -> float | None:
        return self._run.started

    @property
    def step_started(self) -> float | None:
        return self._run.step_started

    @property
    def ended(self) -> float | None:
        return self._run.ended

    @property
    def resume_step(self) -> int | None:
        return self._run.resume_step

    @property
    def chart(self) -> RunChart:
        return self._chart.chart

    @property
    def live_chart(self) -> bool:
        """Whether the chart has an output of its own under the panel (else the panel draws the curve)."""
        return self._chart.live

    @property
    def curve(self) -> RewardCurve | LossCurve | None:
        """The reward (RL) or loss (SFT) curve, once the run said which."""
        return self._chart.curve

    @property
    def stop_event(self) -> asyncio.Event | None:
        return self._stop.stop_event

    @stop_event.setter
    def stop_event(self, event: asyncio.Event | None) -> None:
        self._stop.stop_event = event

    @property
    def button(self) -> Button | None:
        return self._stop.button

    @button.setter
    def button(self, button: Button | None) -> None:
        self._stop.button = button

    @property
    def heartbeat_s(self) -> float:
        return self._heartbeat.interval_s

    @heartbeat_s.setter
    def heartbeat_s(self, seconds: float) -> None:
        self._heartbeat.interval_s = seconds

    @property
    def task(self) -> asyncio.Task[Any] | None:
        """The run started by `run_in_background`."""
        return self._background.task

    def progress_line(self) -> str:
        return self._panel.progress_line()

    def __repr__(self) -> str:
        return f"<LiveRun: {self.progress_line()}>"

    def __str__(self) -> str:
        return self._panel.text()

    def to_html(self) -> str:
        return self._panel.html()

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        return {"text/plain": str(self), "text/html": self.to_html()}

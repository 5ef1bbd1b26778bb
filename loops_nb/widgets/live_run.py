"""`LiveRun`: a run observer that shows the whole run in one live notebook output, or prints lines in a script.

It is what a notebook constructs, and composes the parts that do the work: the run's state (`RunPanelState`)
rendered by a `RunPanel` (progress line with the step counter and ETA, the curve's numbers, token counts, run
health) through one throttled display handle (`LiveDisplay`), so the notebook never receives more than a couple
of updates a second and a saved notebook holds the final state; the run's `RunChart`, shown live as an output of
its own under the panel; a `Heartbeat` that re-renders the panel while a step runs; an optional Stop button
(`StopControl`); and `BackgroundRun` for a run started as a task. The parts are its attributes: ``live.run``
(where the run stands: ``live.run.status``, ``live.run.step``, ...), ``live.chart``, ``live.tokens``,
``live.health``, ``live.attempts``, ``live.stop_control``, ``live.heartbeat``, ``live.background``.

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
from typing import Any, TextIO

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
from loops_nb.widgets.environment import DisplayFn, LiveDisplay, ipython_display, resolve_output
from loops_nb.widgets.heartbeat import Heartbeat
from loops_nb.widgets.run_chart import LiveChart, RunChart
from loops_nb.widgets.run_health import RunHealth
from loops_nb.widgets.run_panel import RunPanel
from loops_nb.widgets.run_state import RunPanelState, RunState
from loops_nb.widgets.stop_control import StopControl
from loops_nb.widgets.token_counts import TokenCounts

# The states a heartbeat keeps beating in: the run may still be starting, or stopping.
_BEATING = frozenset({RunState.WAITING, RunState.RUNNING, RunState.STOPPING})


class LiveRun:
    """A run observer (``on_start``/``on_step``/``on_attempt``/``on_progress``/``on_end``) rendering the run live.

    ``stop_event`` adds a Stop button that sets it; ``max_hz`` caps re-renders; ``mode`` overrides
    ``$LOOPS_NB_PROGRESS``; ``stream`` is where script lines go; ``attempts`` how many attempts of a step the
    attempts log shows and ``attempt_steps`` for how many recent steps; ``heartbeat_s`` how often the panel
    re-renders while a step runs (0: never); ``display_fn`` replaces IPython's ``display`` (tests, other
    frontends); ``live_chart`` shows the chart as a live widget (default: in a kernel, and not with a
    ``display_fn``, whose frontend may have no widgets), else as its static figure re-rendered.
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
        self.run = RunPanelState()
        self.chart = RunChart()
        self.chart_display = LiveChart(
            self.chart,
            live=live_chart,
            display_fn=display_fn,
            max_hz=max_hz,
            output=self.output,
            text_interval_s=None,
        )
        self.tokens = TokenCounts()
        self.anchor = f"loops-attempts-{uuid.uuid4().hex[:8]}"
        self.attempts = AttemptsLog(
            display_fn=shows if self.output == "display" else None,
            keep_steps=attempt_steps,
            max_rows=attempts,
        )
        self.health = RunHealth(attempts_anchor=self.anchor)
        self.panel = RunPanel(
            self.run,
            chart=self.chart,
            tokens=self.tokens,
            health=self.health,
            attempts=self.attempts,
            anchor=self.anchor,
        )
        self._display = LiveDisplay(
            self, max_hz=max_hz, output=self.output, text_interval_s=None, display_fn=display_fn
        )
        self._reporter = TerminalReporter(stream) if self.output == "text" else None
        self.stop_control = StopControl(stop_event, display_fn=shows)
        self.heartbeat = Heartbeat(heartbeat_s, beating=self._beating, tick=self._tick)
        self.background = BackgroundRun(self.run, show=self.show, finalize=self.finalize)
        self._loop: asyncio.AbstractEventLoop | None = None  # the run's loop: heartbeats and stops go there

    @property
    def stop_event(self) -> asyncio.Event | None:
        """What the Stop button sets: pass it to the loop (``project.train(..., stop=live.stop_event)``)."""
        return self.stop_control.stop_event

    # -- observer protocol ------------------------------------------------------------------------------------

    def on_start(self, started: RunStarted) -> None:
        self.run.start(started)
        with contextlib.suppress(RuntimeError):  # called without a loop (a synchronous test)
            self._loop = asyncio.get_running_loop()
        self.chart.on_start(self.run.info)
        if self._reporter:
            self._reporter.on_start(self.run.info)
        if self._display.shown:  # shown before the run started (run_in_background, or by hand): refresh it
            self._display.update(force=True)
        else:
            self.show()
        self._chart_changed()
        self.heartbeat.start(self._loop)

    def on_step(self, record: StepRecord) -> None:
        self.run.stepped(record.step)
        if not self.attempts.got_rollouts:  # a producer without on_rollouts: show its attempts per step
            self.attempts.flush(record.step)
        self.chart.on_step(record)
        self._chart_changed()
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
        self.run.progress = tick
        if self._reporter:
            self._reporter.on_progress(tick)
        self._display.update()

    def on_eval(self, evaluation: EvalRecord) -> None:
        """RL's eval reward (`[eval]`) or SFT's held-out loss before training joins the chart."""
        self.chart.on_eval(evaluation)
        self._chart_changed()
        if self._reporter:
            self._reporter.on_eval(evaluation)
        self._display.update()

    def on_end(self, ended: RunEnded) -> None:
        self.run.end(ended)
        if not self.attempts.got_rollouts:
            self.attempts.flush(self.run.step - 1 if self.run.step else None)
        if self._reporter:
            self._reporter.on_end(ended)
        self.finalize()

    # -- display and control ----------------------------------------------------------------------------------

    def show(self) -> LiveRun:
        """Display the Stop button (if any) and the panel; later calls do nothing."""
        if self.output == "display":
            self.stop_control.show(on_click=self.stop)
        self._display.show()
        return self

    def finalize(self) -> None:
        """Render the final state and retire the Stop button and the live chart (called by ``on_end``)."""
        self.heartbeat.cancel()
        self.stop_control.retire(self.run.final_line)
        if self.chart_display.shown:
            self.chart_display.finalize()
        self._display.finalize()

    def stop(self) -> None:
        """Ask the run to stop at the next step boundary (what the Stop button does)."""
        self.stop_control.request(self._loop, self._stop_here)

    def _stop_here(self) -> None:
        self.stop_control.set()
        self.run.stop_requested()
        self._display.update(force=True)

    def run_in_background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Start ``coro`` (e.g. ``project.train(observers=[live], stop=live.stop_event)``) as a task on the
        running loop and return it at once: the cell finishes, the kernel stays free for Stop clicks and other
        cells, and ``await task`` (or ``task.result()``) gives the outcome later."""
        task = self.background.start(coro)
        self._loop = self.background.loop
        return task

    def _chart_changed(self) -> None:
        """Update the chart's output; it appears once the curve kind is known, so a live figure holds that
        kind's views from the start, and after the panel, so it sits under it."""
        if self.output != "display" or self.chart.kind is None:
            return
        if not self.chart_display.shown:
            self.show()
            self.chart_display.show()
        else:
            self.chart_display.update()

    def _beating(self) -> bool:
        return self.run.state in _BEATING and self.output == "display"

    def _tick(self) -> None:
        if self.run.started is not None and self._display.shown:
            self._display.update()

    # -- renderers --------------------------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"<LiveRun: {self.panel.progress_line()}>"

    def __str__(self) -> str:
        return self.panel.text()

    def to_html(self) -> str:
        return self.panel.html()

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        return {"text/plain": str(self), "text/html": self.to_html()}

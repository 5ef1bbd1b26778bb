"""`LiveRun`: a run observer that shows the whole run in one live notebook output, or prints lines in a script.

It composes the parts that do the work (its attributes) and renders the panel through one throttled
`LiveDisplay`. A heartbeat re-renders the panel while a step runs: steps can take minutes, and without it the
clock would stand still and a slow step look like a hung kernel. What the panel shows, and its attributes:
docs/reference/notebook_widgets.md; RL attempts: `AttemptsLog`; how a Stop click reaches a running cell:
`stop_control`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from enum import StrEnum
from html import escape
from pathlib import Path
from typing import Any, TextIO

from loops_nb.observers import TerminalReporter, eta
from loops_nb.run_events import (
    AttemptFinished,
    EvalRecord,
    ProgressTick,
    RunEnded,
    RunEvent,
    RunStarted,
    StepRecord,
    StepRollouts,
)
from loops_nb.runs_table import duration
from loops_nb.widgets.attempts_log import AttemptsLog
from loops_nb.widgets.environment import (
    DisplayFn,
    DisplayOptions,
    LiveDisplay,
    ipython_display,
    resolve_output,
)
from loops_nb.widgets.run_chart import LiveChart, RunChart
from loops_nb.widgets.run_health import RunHealth
from loops_nb.widgets.stop_control import StopControl
from loops_nb.widgets.style import GREY, UI, div, plural, tag
from loops_nb.widgets.token_counts import TokenCounts

log = logging.getLogger("loops_nb.widgets")


class RunState(StrEnum):
    """``waiting`` until the loop starts, ``running``, ``stopping`` once Stop is pressed (the loop stops at the next
    step boundary); it ends ``completed``, ``stopped``, ``failed`` (the cause kept beside it) or ``cancelled`` (a
    background task cancelled before its loop said how it ended): the words the loop's ``on_end`` uses."""

    WAITING = "waiting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


# Still going: the clock runs and the panel says what the current step is doing.
LIVE_STATES = frozenset({RunState.RUNNING, RunState.STOPPING})
# Nothing to resume: the run finished, or has not stopped yet.
NOTHING_TO_RESUME = frozenset({RunState.COMPLETED, RunState.RUNNING, RunState.WAITING})


@dataclass
class RunPanelState:
    """The run's description (``info``), its last progress tick, where it stands and its clock. Steps are counted
    as steps done (the last record's step + 1), the CLI's "step 1/3"; steps.jsonl counts from 0."""

    info: RunStarted = field(default_factory=RunStarted)
    progress: ProgressTick | None = None
    state: RunState = RunState.WAITING
    error: str | None = None  # why a failed run failed, when it said
    step: int | None = None  # steps done
    started: float | None = None
    step_started: float | None = None  # when the step now running began (the heartbeat shows it)
    ended: float | None = None
    resume_step: int | None = None  # a failed run's last checkpoint (on_end says)

    @property
    def status(self) -> str:
        """The state in words, with a failure's cause: what the panel prints and `LiveRun.status` gives."""
        if self.state is RunState.FAILED and self.error:
            return f"failed: {self.error}"
        return self.state.value

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def start(self, started: RunStarted) -> None:
        self.info = started
        if self.state is not RunState.STOPPING:  # Stop may be pressed before the run has set itself up
            self.state = RunState.RUNNING
        self.started = self.step_started = time.monotonic()
        self.step = self.info.start_step or 0

    def stepped(self, step: int) -> None:
        """Step ``step`` (0-based) ended; a producer without ``on_start`` starts the clock here."""
        if self.started is None:
            self.started = time.monotonic()
            self.state = RunState.RUNNING
        self.step = step + 1
        self.step_started = time.monotonic()

    def stop_requested(self) -> None:
        if self.state in (RunState.RUNNING, RunState.WAITING):
            self.state = RunState.STOPPING

    def end(self, end: RunEnded) -> None:
        """The loop's `RunEnded`: how the run ended, after how many steps, where it can resume."""
        said = end.status or RunState.COMPLETED
        try:
            self.state, self.error = RunState(said), None
        except ValueError:  # a word the loop never sends: shown as a failure rather than lost
            self.state, self.error = RunState.FAILED, said
        if self.state is RunState.FAILED and end.error:
            self.error = end.error
        if end.resume_step is not None:
            self.resume_step = end.resume_step
        self.ended = time.monotonic()
        if end.steps is not None:
            self.step = end.steps

    def resume_hint(self) -> str | None:
        """How to go on with a run that stopped or failed before its last step (None otherwise)."""
        total = self.info.max_steps or 0
        if not self.info.run_dir or self.state in NOTHING_TO_RESUME:
            return None
        if total and (self.step or 0) >= total:
            return None
        name = self.info.run_dir.rstrip("/").rsplit("/", 1)[-1]
        where = f" (step {self.resume_step})" if self.resume_step is not None else ""
        config = _shell_path(self.info.config) or "<config>"
        return (
            f'To resume from its last checkpoint{where}, set run_name = "{name}" in the parameters cell and run '
            f"the notebook again, or run: loops run {config} --output.run_name {name}"
        )

    def final_line(self) -> str:
        """One line for what is left where the Stop button was."""
        text = f"run {self.status} after {plural(self.step or 0, 'step')}"
        hint = self.resume_hint()
        return f"{text}. {hint}" if hint else text


def _shell_path(path: str | None) -> str | None:
    """``path`` as a shell argument: relative to the working directory when it is under it."""
    if not path:
        return None
    try:
        text = str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        text = str(path)
    return shlex.quote(text)


_BEATING = LIVE_STATES | {RunState.WAITING}  # a heartbeat beats while the run may still start, or stop
# Any state not named here (a failure, a cancel, still waiting) is drawn in red.
_STATE_COLOUR = {
    RunState.RUNNING: "#0969da",
    RunState.STOPPING: "#9a6700",
    RunState.STOPPED: "#9a6700",
    RunState.COMPLETED: "#1a7f37",
}
_FAILURE_COLOUR = "#cf222e"
_NOTE = "border-radius:4px;background:#fff8c5;color:#1f2328"


class LiveRun:
    """A run observer (``on_start``/``on_step``/``on_attempt``/``on_progress``/``on_end``) rendering the run live.

    ``max_hz`` caps re-renders; ``mode`` overrides ``$LOOPS_NB_PROGRESS``; ``stream`` is where script lines go;
    ``display_fn`` replaces IPython's ``display`` (tests, other frontends); ``heartbeat_s=0`` never beats; the
    other options: docs/reference/notebook_widgets.md, "The live panel".
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
        options = DisplayOptions(
            max_hz=max_hz, output=self.output, text_interval_s=None, display_fn=display_fn
        )
        self.chart_display = LiveChart(self.chart, live=live_chart, **options)
        self.tokens = TokenCounts()
        self.anchor = f"loops-attempts-{uuid.uuid4().hex[:8]}"
        self.attempts = AttemptsLog(
            display_fn=shows if self.output == "display" else None,
            keep_steps=attempt_steps,
            max_rows=attempts,
        )
        self.health = RunHealth(attempts_anchor=self.anchor)
        self._display = LiveDisplay(self, **options)
        self._reporter = TerminalReporter(stream) if self.output == "text" else None
        self.stop_control = StopControl(stop_event, display_fn=shows)
        self.heartbeat_s = heartbeat_s
        self._beat_timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[Any] | None = None  # a run started by run_in_background
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
        self._tell(started, self.chart, self._reporter)
        if self._display.shown:  # shown before the run started (run_in_background, or by hand): refresh it
            self._display.update(force=True)
        else:
            self.show()
        self._chart_changed()
        self._cancel_beat()
        self._beat()

    def on_step(self, record: StepRecord) -> None:
        self.run.stepped(record.step)
        if not self.attempts.got_rollouts:  # a producer without on_rollouts: show its attempts per step
            self.attempts.flush(record.step)
        self._tell(record, self.chart, self.tokens, self.health, self._reporter)
        self._chart_changed()
        self._display.update()

    def on_attempt(self, attempt: AttemptFinished) -> None:
        self._tell(attempt, self.attempts, self.health)
        self._display.update()

    def on_rollouts(self, rollouts: StepRollouts) -> None:
        """A step trained (`StepRollouts`): its attempts (with what trained) go below the panel, once."""
        self.attempts.on_rollouts(rollouts)
        self._display.update()

    def on_progress(self, tick: ProgressTick) -> None:
        self.run.progress = tick
        self._tell(tick, self._reporter)
        self._display.update()

    def on_eval(self, evaluation: EvalRecord) -> None:
        """RL's eval reward (`[eval]`) or SFT's held-out loss before training joins the chart."""
        self._tell(evaluation, self.chart, self._reporter)
        self._chart_changed()
        self._display.update()

    def on_end(self, ended: RunEnded) -> None:
        self.run.end(ended)
        if not self.attempts.got_rollouts:
            self.attempts.flush(self.run.step - 1 if self.run.step else None)
        self._tell(ended, self._reporter)
        self.finalize()

    @staticmethod
    def _tell(event: RunEvent | StepRecord, *parts: object) -> None:
        """Hand ``event`` (a `RunEvent` or `StepRecord`) to each of ``parts`` (None: one this run has not)."""
        for part in parts:
            if part is not None:
                getattr(part, event.hook)(event)

    # -- display and control ----------------------------------------------------------------------------------

    def show(self) -> LiveRun:
        """Display the Stop button (if any) and the panel; later calls do nothing."""
        if self.output == "display":
            self.stop_control.show(on_click=self.stop)
        self._display.show()
        return self

    def finalize(self) -> None:
        """Render the final state and retire the Stop button and the live chart (called by ``on_end``)."""
        self._cancel_beat()
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
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            coro.close()
            raise RuntimeError(
                "run_in_background needs a running event loop (a notebook kernel); "
                "in a script, use asyncio.run(...)"
            ) from None
        self.show()
        self.task = self._loop.create_task(coro, name="loops_nb run")
        self.task.add_done_callback(self._background_done)
        return self.task

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        """How a background run ended, recorded here since nobody may ever await the task: a cancel, or an
        exception the run's own ``on_end`` could not report."""
        if task.cancelled():
            self.run.state = RunState.CANCELLED
        elif (exc := task.exception()) is not None:
            self.run.state, self.run.error = RunState.FAILED, f"{type(exc).__name__}: {exc}"
            log.error("background run failed", exc_info=exc)
        elif not self.run.live:
            return  # on_end already finalized
        self.finalize()

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

    def _beat(self) -> None:
        """Re-render the panel now, and again in ``heartbeat_s`` seconds on the run's loop, while the run goes on."""
        self._beat_timer = None
        loop = self._loop
        if self.run.state not in _BEATING or self.output != "display":
            return
        if self.heartbeat_s <= 0 or loop is None or loop.is_closed():
            return
        try:
            if self.run.started is not None and self._display.shown:
                self._display.update()
        except Exception:  # a display glitch must never surface in the training loop
            log.exception("live panel heartbeat failed")
        self._beat_timer = loop.call_later(self.heartbeat_s, self._beat)

    def _cancel_beat(self) -> None:
        if self._beat_timer is not None:
            self._beat_timer.cancel()
            self._beat_timer = None

    # -- renderers --------------------------------------------------------------------------------------------

    def progress_line(self) -> str:
        """The step counter, elapsed time, ETA, what the current step is doing, and the state."""
        run = self.run
        total = run.info.max_steps or 0
        start = run.info.start_step or 0
        done = run.step or 0
        parts = []
        if run.info.recipe:
            parts.append(run.info.recipe.upper() + (f" · {run.info.model}" if run.info.model else ""))
        parts.append(f"{done}/{total} steps" if total else plural(done, "step"))
        now = run.ended or time.monotonic()
        if run.started is not None:
            parts.append(f"{duration(int(now - run.started))} elapsed")
            if run.state is RunState.RUNNING and total:
                parts.append(f"ETA {eta(done - start, total - start, now - run.started)}")
        if run.live and run.step_started is not None and (not total or done < total):
            parts.append(f"step {done + 1} running for {duration(int(now - run.step_started))}")
        if run.live and run.progress is not None:
            flight = run.progress.in_flight
            parts.append(
                plural(run.progress.attempts_done, "attempt") + (f" ({flight} in flight)" if flight else "")
            )
        elif not run.live and self.attempts.seen:
            parts.append(plural(self.attempts.seen, "attempt"))
        parts.append("stopping at the end of this step" if run.state is RunState.STOPPING else run.status)
        return " · ".join(parts)

    def __repr__(self) -> str:
        return f"<LiveRun: {self.progress_line()}>"

    def __str__(self) -> str:
        lines = [self.progress_line()]
        if self.chart.kind is not None:
            lines.append(str(self.chart))
        lines += [str(self.health), self.tokens.summary()]
        if self.attempts.seen:
            lines.append(self.attempts.summary())
        if hint := self.run.resume_hint():
            lines.append(hint)
        return "\n".join(lines)

    def to_html(self) -> str:
        colour = _STATE_COLOUR.get(self.run.state, _FAILURE_COLOUR)
        dot = f"display:inline-block;width:8px;height:8px;border-radius:50%;background:{colour};margin-right:6px"
        head = div(
            tag("span", "", dot) + escape(self.progress_line()), f"font:600 13px {UI};margin-bottom:6px"
        )
        if self.run.info.run_dir:
            head += div(escape(self.run.info.run_dir), f"font:11px monospace;color:{GREY};margin-bottom:6px")
        chart = ""
        if self.chart.kind is not None:  # the chart has an output of its own: its numbers in words
            chart = div(escape(self.chart.summary()), "font:11px monospace;color:#374151")
        # The numbers and the token table side by side (they wrap on a narrow page); health hints are long lines.
        top = div(
            div(chart) + div(self.tokens.to_html()),
            "display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start",
        )
        health = div(self.health.to_html(), "margin-top:6px")
        attempts = resume = ""
        if self.attempts.seen or self.attempts.steps_shown:
            where = " · each trained step's attempts below, newest last" if self.attempts.display_fn else ""
            attempts = (
                f'<div id="{self.anchor}" style="font:12px {UI};color:#374151;margin-top:8px">'
                f"{escape(self.attempts.summary())}{where}</div>"
            )
        if hint := self.run.resume_hint():
            resume = div(escape(hint), f"font:12px {UI};margin-top:8px;padding:4px 8px;{_NOTE}")
        return div(head + top + health + attempts + resume, "padding:4px 0")

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        return {"text/plain": str(self), "text/html": self.to_html()}

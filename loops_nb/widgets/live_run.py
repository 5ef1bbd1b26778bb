"""`LiveRun`: a run observer that shows the whole run in one live notebook output, or prints lines in a script.

It composes the other widgets (run health, token counts, the curve's numbers) under a progress line with the
step counter and ETA, and re-renders them through one throttled display handle, so the notebook never receives
more than a couple of updates a second and a saved notebook holds the final state. The chart is an output of its
own under the panel: a `RunChart` (plotly: reward or loss, and buttons for KL, entropy, tokens, timings and
memory), live as a plotly FigureWidget that each step sends only its new values to, so zoom and the chosen view
survive, and replaced by its static figure when the run ends. While a step runs a
heartbeat re-renders the panel every ``heartbeat_s`` seconds, so elapsed time and "step k running for …" move
even before the first step ends. The panel is plain inline-styled HTML using only what JupyterLab's sanitizer
keeps, so it reads the same live, in papermill output, offline HTML and on reopen; where no chart output is
shown (``display_fn`` frontends, no plotly widget) the panel draws the curve itself with positioned ``<div>``s.

RL attempts are not part of the panel: each trained step's attempts are displayed once, below the panel, by an
`AttemptsLog`, and never re-rendered, so a transcript a person opens stays open while training goes on. Steps
are numbered from 1 everywhere in the panel (the CLI's "step 1/3"); steps.jsonl and rollouts.jsonl count from 0.

Stopping: ``LiveRun(stop_event=asyncio.Event())`` adds a Stop button (an ipywidgets Button, only in a kernel)
that sets the event; pass the same event to the loop (``project.train(observers=[live], stop=live.stop_event)``),
which checks it between steps and saves a checkpoint. Whether a click arrives while the cell is still running
depends on the kernel. Verified with ipykernel 7.4: a cell that *awaits* (``await project.train(...)``) has comm
messages dispatched concurrently, so the click lands at once; a cell that blocks without awaiting (``train_sync``)
gets the click only after it finishes. Older ipykernels (6.x) queue comm messages behind any running cell, await
or not. `LiveRun.run_in_background` starts the run as an asyncio task and returns at once, which works everywhere.
When the run ends the button is replaced by a static line, so no dead widget is saved with the notebook.

Outside a kernel (or with ``LOOPS_NB_PROGRESS=text``) it prints one line per step, as `TerminalReporter` does;
``LOOPS_NB_PROGRESS=off`` shows nothing, while the data is still collected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from html import escape
from pathlib import Path
from typing import Any, TextIO

from loops_nb.observers import TerminalReporter, eta
from loops_nb.step_record import StepRecord
from loops_nb.widgets.attempts_log import AttemptsLog
from loops_nb.widgets.attempts_table import plural
from loops_nb.widgets.environment import LiveDisplay, ipython_display, resolve_output
from loops_nb.widgets.reward_curve import LossCurve, RewardCurve
from loops_nb.widgets.run_chart import RunChart
from loops_nb.widgets.run_health import RunHealth
from loops_nb.widgets.token_counts import TokenCounts

log = logging.getLogger("loops_nb.widgets")
_STATUS_COLOUR = {"running": "#0969da", "stopping": "#9a6700", "stopped": "#9a6700", "completed": "#1a7f37"}


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
        display_fn: Callable[..., Any] | None = None,
        live_chart: bool | None = None,
    ) -> None:
        self.stop_event = stop_event
        self.output = resolve_output(mode, display_fn)
        self.chart = RunChart()
        self.live_chart = self.output == "display" and (
            display_fn is None if live_chart is None else live_chart
        )
        self._chart_widget: Any = None
        self._chart_handle: Any = None
        self.tokens = TokenCounts()
        self.anchor = f"loops-attempts-{uuid.uuid4().hex[:8]}"
        shows = (display_fn or ipython_display) if self.output == "display" else None
        self.attempts = AttemptsLog(display_fn=shows, keep_steps=attempt_steps, max_rows=attempts)
        self.health = RunHealth(attempts_anchor=self.anchor)
        self.info: dict[str, Any] = {}
        self.progress: dict[str, Any] = {}
        self.status = "waiting"
        self.step: int | None = None  # steps done (the last record's step + 1)
        self.started: float | None = None
        self.step_started: float | None = None  # when the step now running began (the heartbeat shows it)
        self.heartbeat_s = heartbeat_s
        self.resume_step: int | None = None  # a failed run's last checkpoint (on_end says)
        self._heartbeat: asyncio.TimerHandle | None = None
        self.ended: float | None = None
        self.task: asyncio.Task[Any] | None = None
        self._display = LiveDisplay(
            self, max_hz=max_hz, output=self.output, text_interval_s=None, display_fn=display_fn
        )
        self._display_fn = display_fn
        self._reporter = TerminalReporter(stream) if self.output == "text" else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.button: Any = None
        self._button_handle: Any = None

    # -- observer protocol ------------------------------------------------------------------------------------

    def on_start(self, info: dict[str, Any]) -> None:
        self.info = dict(info)
        if self.status != "stopping":  # Stop may be pressed before the run has set itself up
            self.status = "running"
        self.started = self.step_started = time.monotonic()
        self.step = int(info.get("start_step") or 0)
        self._remember_loop()
        if self.chart.curve is None and info.get("recipe") in ("rl", "sft"):
            self.chart = RunChart(info["recipe"])
        if self._reporter:
            self._reporter.on_start(info)
        if self._display.shown:  # shown before the run started (run_in_background, or by hand): refresh it
            self._display.update(force=True)
        else:
            self.show()
        self._refresh_chart()
        self._cancel_beat()
        self._beat()

    def on_step(self, record: Mapping[str, Any]) -> None:
        record = StepRecord.of(record)
        if self.started is None:
            self.started = time.monotonic()
            self.status = "running"
        self.step = record.step + 1
        self.step_started = time.monotonic()
        if not self.attempts.got_rollouts:  # a producer without on_rollouts: show its attempts per step
            self.attempts.flush(record.step)
        self.chart.on_step(record)
        self._refresh_chart()
        self.tokens.on_step(record)
        self.health.on_step(record)
        if self._reporter:
            self._reporter.on_step(record)
        self._display.update()

    def on_attempt(self, record: dict[str, Any]) -> None:
        self.attempts.on_attempt(record)
        self.health.on_attempt(record)
        self._display.update()

    def on_rollouts(self, payload: dict[str, Any]) -> None:
        """A step trained: its attempts (with what trained) go below the panel, once."""
        self.attempts.on_rollouts(payload)
        self._display.update()

    def on_progress(self, snapshot: dict[str, Any]) -> None:
        self.progress = dict(snapshot)
        if self._reporter:
            self._reporter.on_progress(snapshot)
        self._display.update()

    def on_eval(self, line: dict[str, Any]) -> None:
        """An evaluation: RL's eval reward (`[eval]`) or SFT's held-out loss before training joins the curve."""
        self.chart.on_eval(line)
        self._refresh_chart()
        if self._reporter:
            self._reporter.on_eval(line)
        self._display.update()

    def on_end(self, summary: dict[str, Any]) -> None:
        self.status = str(summary.get("status") or "completed")
        if self.status == "failed" and summary.get("error"):
            self.status = f"failed: {summary['error']}"
        if summary.get("resume_step") is not None:
            self.resume_step = int(summary["resume_step"])
        self.ended = time.monotonic()
        if summary.get("steps") is not None:
            self.step = int(summary["steps"])
        if not self.attempts.got_rollouts:
            self.attempts.flush(self.step - 1 if self.step else None)
        if self._reporter:
            self._reporter.on_end(summary)
        self.finalize()

    @property
    def curve(self) -> RewardCurve | LossCurve | None:
        """The reward (RL) or loss (SFT) curve, once the run said which."""
        return self.chart.curve

    # -- display and control ----------------------------------------------------------------------------------

    def show(self) -> LiveRun:
        """Display the Stop button (if any) and the panel; later calls do nothing."""
        if self.output == "display" and self.button is None and self.stop_event is not None:
            self.button = self._make_button()
            if self.button is not None:
                self._button_handle = (self._display_fn or ipython_display)(self.button, display_id=True)
        self._display.show()
        return self

    def _refresh_chart(self) -> None:
        """Send the chart its new values; its output appears (under the panel) once the recipe is known, so
        the live figure holds that recipe's views from the start."""
        if self._chart_handle is None and self.live_chart and self.chart.curve is not None:
            self.show()
            self._chart_widget = self.chart.live_widget()
            if self._chart_widget is not None:
                self._chart_handle = (self._display_fn or ipython_display)(
                    self._chart_widget, display_id=True
                )
            else:
                self.live_chart = False  # no plotly widget here: the panel draws the curve
        if self._chart_widget is None:
            return
        try:
            self.chart.refresh(self._chart_widget)
        except Exception:  # a chart glitch must never surface in the training loop
            log.exception("live chart update failed")

    def finalize(self) -> None:
        """Render the final state and retire the Stop button (called by ``on_end``)."""
        self._cancel_beat()
        if self.button is not None:
            with contextlib.suppress(Exception):  # the kernel's comm may already be gone
                self.button.disabled = True
                if self._button_handle is not None:
                    self._button_handle.update(_Static(self._final_line()))
                self.button.close()
            self.button = None
        if self._chart_widget is not None:
            # A FigureWidget saves nothing: the output becomes the static figure (plotly, HTML, text).
            with contextlib.suppress(Exception):
                self._chart_handle.update(self.chart)
                # papermill (nbclient) saves every widget's last state in the notebook, closed or not, and a
                # FigureWidget's state carries plotly.js itself (5 MB); its output shows the static figure now.
                self._chart_widget._esm = ""
                self._chart_widget.close()
            self._chart_widget = None
        self._display.finalize()

    def stop(self) -> None:
        """Ask the run to stop at the next step boundary (what the Stop button does)."""
        if self.stop_event is None:
            raise RuntimeError("this LiveRun has no stop_event: pass LiveRun(stop_event=asyncio.Event())")
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        # asyncio.Event is not thread-safe: a click handled on another thread (a kernel subshell) hands the
        # whole stop over to the loop the run waits on.
        if loop is not None and running is not loop and not loop.is_closed():
            loop.call_soon_threadsafe(self._stop_here)
        else:
            self._stop_here()

    def _stop_here(self) -> None:
        assert self.stop_event is not None
        self.stop_event.set()
        if self.status in ("running", "waiting"):
            self.status = "stopping"
        if self.button is not None:
            with contextlib.suppress(Exception):  # the kernel's comm may already be gone
                self.button.disabled = True
                self.button.description = "Stopping…"
                self.button.tooltip = "Stopping at the next step boundary; a checkpoint is saved"
        self._display.update(force=True)

    def run_in_background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Start ``coro`` (e.g. ``project.train(observers=[live], stop=live.stop_event)``) as a task on the
        running loop and return it at once: the cell finishes, the kernel stays free for Stop clicks and other
        cells, and ``await task`` (or ``task.result()``) gives the outcome later."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            coro.close()
            raise RuntimeError(
                "run_in_background needs a running event loop (a notebook kernel); "
                "in a script, use asyncio.run(...)"
            ) from None
        self._loop = loop
        self.show()
        self.task = loop.create_task(coro, name="loops_nb run")
        self.task.add_done_callback(self._task_done)
        return self.task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            self.status = "cancelled"
        elif task.exception() is not None:
            exc = task.exception()
            self.status = f"failed: {type(exc).__name__}: {exc}"
            # The task's exception is reported here; nobody may ever await it.
            log.error("background run failed", exc_info=exc)
        elif self.status not in ("running", "stopping"):
            return  # on_end already finalized
        self.finalize()

    def _make_button(self) -> Any:
        try:
            import ipywidgets
        except ImportError:
            return None
        button = ipywidgets.Button(
            description="Stop",
            button_style="danger",
            icon="stop",
            tooltip="Stop at the next step boundary; a checkpoint is saved",
            layout=ipywidgets.Layout(width="auto", min_width="110px"),  # the label must never be cut
        )
        button.on_click(lambda _: self.stop())
        return button

    def _remember_loop(self) -> None:
        with contextlib.suppress(RuntimeError):  # called without a loop (a synchronous test)
            self._loop = asyncio.get_running_loop()

    def _beat(self) -> None:
        """Re-render every ``heartbeat_s`` while the run runs, so the clock moves during a long step."""
        self._heartbeat = None
        if self.status not in ("running", "stopping", "waiting") or self.output != "display":
            return
        if self.heartbeat_s <= 0 or self._loop is None or self._loop.is_closed():
            return
        if self.started is not None and self._display.shown:
            try:
                self._display.update()
            except Exception:  # a display glitch must never surface in the training loop
                log.exception("live panel heartbeat failed")
        self._heartbeat = self._loop.call_later(self.heartbeat_s, self._beat)

    def _cancel_beat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None

    def _final_line(self) -> str:
        done = self.step or 0
        text = f"run {self.status} after {plural(done, 'step')}"
        if self.resume_hint():
            text += f". {self.resume_hint()}"
        return text

    def resume_hint(self) -> str | None:
        """How to go on with a run that stopped or failed before its last step (None otherwise)."""
        total = int(self.info.get("max_steps") or 0)
        if not self.info.get("run_dir") or self.status in ("completed", "running", "waiting"):
            return None
        if total and (self.step or 0) >= total:
            return None
        name = str(self.info["run_dir"]).rstrip("/").rsplit("/", 1)[-1]
        where = f" (step {self.resume_step})" if self.resume_step is not None else ""
        config = _shell_path(self.info.get("config")) or "<config>"
        return (
            f'To resume from its last checkpoint{where}, set run_name = "{name}" in the parameters cell and run '
            f"the notebook again, or run: loops run {config} --output.run_name {name}"
        )

    # -- renderers --------------------------------------------------------------------------------------------

    def progress_line(self) -> str:
        total = int(self.info.get("max_steps") or 0)
        start = int(self.info.get("start_step") or 0)
        done = self.step or 0
        parts = []
        if self.info.get("recipe"):
            parts.append(
                str(self.info["recipe"]).upper()
                + (f" · {self.info['model']}" if self.info.get("model") else "")
            )
        parts.append(f"{done}/{total} steps" if total else plural(done, "step"))
        live = self.status in ("running", "stopping")
        now = self.ended or time.monotonic()
        if self.started is not None:
            parts.append(f"{_duration(now - self.started)} elapsed")
            if self.status == "running" and total:
                parts.append(f"ETA {eta(done - start, total - start, now - self.started)}")
        if live and self.step_started is not None and (not total or done < total):
            parts.append(f"step {done + 1} running for {_duration(now - self.step_started)}")
        if live and self.progress.get("attempts_done") is not None:
            flight = self.progress.get("in_flight")
            parts.append(
                plural(int(self.progress["attempts_done"]), "attempt")
                + (f" ({flight} in flight)" if flight else "")
            )
        elif not live and self.attempts.seen:
            parts.append(plural(self.attempts.seen, "attempt"))
        parts.append("stopping at the end of this step" if self.status == "stopping" else self.status)
        return " · ".join(parts)

    def __repr__(self) -> str:
        return f"<LiveRun: {self.progress_line()}>"

    def __str__(self) -> str:
        lines = [self.progress_line()]
        if self.curve is not None:
            lines.append(str(self.curve))
        lines += [str(self.health), self.tokens.summary()]
        if self.attempts.seen:
            lines.append(self.attempts.summary())
        if self.resume_hint():
            lines.append(str(self.resume_hint()))
        return "\n".join(lines)

    def to_html(self) -> str:
        colour = _STATUS_COLOUR.get(self.status, "#cf222e")
        head = (
            f'<div style="font:600 13px system-ui,sans-serif;margin-bottom:6px">'
            f'<span style="display:inline-block;width:8px;height:8px;border-radius:50%;background:{colour};'
            f'margin-right:6px"></span>{escape(self.progress_line())}</div>'
        )
        if self.info.get("run_dir"):
            run_dir = escape(str(self.info["run_dir"]))
            head += f'<div style="font:11px monospace;color:#6b7280;margin-bottom:6px">{run_dir}</div>'
        chart = ""
        if self.curve is not None:  # the chart (unless it has an output of its own), its numbers in words
            drawn = "" if self.live_chart else self.curve.to_dot_chart(width=440)
            chart = (
                f"{drawn}"
                f'<div style="font:11px monospace;color:#374151;margin-top:2px">{escape(self.curve.summary())}</div>'
            )
        # The chart and the token table side by side (they wrap on a narrow page); health hints are long lines.
        top = (
            f'<div style="display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start">'
            f"<div>{chart}</div><div>{self.tokens.to_html()}</div></div>"
        )
        health = f'<div style="margin-top:6px">{self.health.to_html()}</div>'
        attempts = ""
        if self.attempts.seen or self.attempts.steps_shown:
            where = " · each trained step's attempts below, newest last" if self.attempts.display_fn else ""
            attempts = (
                f'<div id="{self.anchor}" style="font:12px system-ui,sans-serif;color:#374151;margin-top:8px">'
                f"{escape(self.attempts.summary())}{where}</div>"
            )
        resume = ""
        if self.resume_hint():
            resume = (
                f'<div style="font:12px system-ui,sans-serif;margin-top:8px;padding:4px 8px;border-radius:4px;'
                f'background:#fff8c5;color:#1f2328">{escape(str(self.resume_hint()))}</div>'
            )
        return f'<div style="padding:4px 0">{head}{top}{health}{attempts}{resume}</div>'

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/plain": str(self), "text/html": self.to_html()}


class _Static:
    """A finished run's stand-in for its Stop button: plain text and HTML, nothing that needs a kernel."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {
            "text/plain": self.text,
            "text/html": f'<div style="font:12px system-ui,sans-serif;color:#57606a">{escape(self.text)}</div>',
        }


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def _shell_path(path: Any) -> str | None:
    """``path`` as a shell argument: relative to the working directory when it is under it."""
    if not path:
        return None
    try:
        text = str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        text = str(path)
    return shlex.quote(text)

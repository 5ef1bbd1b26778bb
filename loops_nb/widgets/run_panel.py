"""`RunPanel`: what the live panel shows, as one progress line, plain text and HTML.

The progress line carries the step counter, elapsed time, ETA, what the current step is doing and the state; under
it come the chart's numbers in words (the chart itself is an output of its own, under the panel), the token
counts, the run health and, for a run that stopped early, how to resume it. The HTML is inline-styled and uses
only what JupyterLab's sanitizer keeps, so it reads the same live, in papermill output, offline HTML and on
reopen. Steps are numbered from 1 everywhere in the panel.
"""

from __future__ import annotations

import time
from html import escape

from loops_nb.observers import eta
from loops_nb.widgets.attempts_log import AttemptsLog
from loops_nb.widgets.attempts_table import plural
from loops_nb.widgets.run_chart import RunChart
from loops_nb.widgets.run_health import RunHealth
from loops_nb.widgets.run_state import RunPanelState, RunState
from loops_nb.widgets.token_counts import TokenCounts

# Any state not named here (a failure, a cancel, still waiting) is drawn in red.
_STATE_COLOUR = {
    RunState.RUNNING: "#0969da",
    RunState.STOPPING: "#9a6700",
    RunState.STOPPED: "#9a6700",
    RunState.COMPLETED: "#1a7f37",
}
_FAILURE_COLOUR = "#cf222e"


class RunPanel:
    """Renders the run's state and the widgets the panel composes; ``anchor`` is the id the health hints link
    to, where the attempts are summed up."""

    def __init__(
        self,
        state: RunPanelState,
        *,
        chart: RunChart,
        tokens: TokenCounts,
        health: RunHealth,
        attempts: AttemptsLog,
        anchor: str,
    ) -> None:
        self.state = state
        self.chart = chart
        self.tokens = tokens
        self.health = health
        self.attempts = attempts
        self.anchor = anchor

    def progress_line(self) -> str:
        run = self.state
        total = run.info.max_steps or 0
        start = run.info.start_step or 0
        done = run.step or 0
        parts = []
        if run.info.recipe:
            parts.append(run.info.recipe.upper() + (f" · {run.info.model}" if run.info.model else ""))
        parts.append(f"{done}/{total} steps" if total else plural(done, "step"))
        now = run.ended or time.monotonic()
        if run.started is not None:
            parts.append(f"{_duration(now - run.started)} elapsed")
            if run.state is RunState.RUNNING and total:
                parts.append(f"ETA {eta(done - start, total - start, now - run.started)}")
        if run.live and run.step_started is not None and (not total or done < total):
            parts.append(f"step {done + 1} running for {_duration(now - run.step_started)}")
        if run.live and run.progress is not None:
            flight = run.progress.in_flight
            parts.append(
                plural(run.progress.attempts_done, "attempt") + (f" ({flight} in flight)" if flight else "")
            )
        elif not run.live and self.attempts.seen:
            parts.append(plural(self.attempts.seen, "attempt"))
        parts.append("stopping at the end of this step" if run.state is RunState.STOPPING else run.status)
        return " · ".join(parts)

    def text(self) -> str:
        lines = [self.progress_line()]
        if self.chart.kind is not None:
            lines.append(str(self.chart))
        lines += [str(self.health), self.tokens.summary()]
        if self.attempts.seen:
            lines.append(self.attempts.summary())
        if self.state.resume_hint():
            lines.append(str(self.state.resume_hint()))
        return "\n".join(lines)

    def html(self) -> str:
        colour = _STATE_COLOUR.get(self.state.state, _FAILURE_COLOUR)
        head = (
            f'<div style="font:600 13px system-ui,sans-serif;margin-bottom:6px">'
            f'<span style="display:inline-block;width:8px;height:8px;border-radius:50%;background:{colour};'
            f'margin-right:6px"></span>{escape(self.progress_line())}</div>'
        )
        if self.state.info.run_dir:
            run_dir = escape(self.state.info.run_dir)
            head += f'<div style="font:11px monospace;color:#6b7280;margin-bottom:6px">{run_dir}</div>'
        chart = ""
        if self.chart.kind is not None:  # the chart has an output of its own: its numbers in words
            chart = f'<div style="font:11px monospace;color:#374151">{escape(self.chart.summary())}</div>'

        # The numbers and the token table side by side (they wrap on a narrow page); health hints are long lines.
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
        if self.state.resume_hint():
            resume = (
                f'<div style="font:12px system-ui,sans-serif;margin-top:8px;padding:4px 8px;border-radius:4px;'
                f'background:#fff8c5;color:#1f2328">{escape(str(self.state.resume_hint()))}</div>'
            )
        return f'<div style="padding:4px 0">{head}{top}{health}{attempts}{resume}</div>'


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
    )

"""Where a watched run stands, as the live panel knows it: `RunState` and the `RunPanelState` that moves through it.

A run is ``waiting`` until its loop starts, ``running`` while it trains, ``stopping`` once Stop is pressed (the
loop stops at the next step boundary), and ends ``completed``, ``stopped``, ``failed`` (with the cause kept
beside the state) or ``cancelled`` (a background task cancelled before its loop could say how it ended). The
values are the words the loop's ``on_end`` summary uses and the panel prints, so `RunState` is a `StrEnum`.

Steps are counted as steps done (the last record's step + 1), the CLI's "step 1/3"; steps.jsonl counts from 0.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from loops_nb.run_events import ProgressTick, RunEnded, RunStarted
from loops_nb.widgets.style import plural


class RunState(StrEnum):
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
    """The run's description (``info``), its last progress tick, where it stands and its clock."""

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

    def failed(self, error: str) -> None:
        self.state, self.error = RunState.FAILED, error

    def cancelled(self) -> None:
        self.state = RunState.CANCELLED

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

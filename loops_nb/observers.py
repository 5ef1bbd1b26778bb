"""Run observers: how a run reports steps, attempts and progress to whoever watches it.

The core calls these hooks and knows nothing of terminals or notebooks; `TerminalReporter` prints
lines, and the widgets in `loops_nb.widgets` render the same events live in a notebook. Hooks are
called on the run's event loop and must return quickly.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import Protocol, TextIO

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

log = logging.getLogger("loops_nb.run")


class RunObserver(Protocol):
    """Every hook is optional: an observer defines the ones it wants. Each hook gets one typed, frozen event
    (`loops_nb.run_events`; `on_step` a `StepRecord`) and reads its fields (``ended.status``)."""

    def on_start(self, started: RunStarted) -> None: ...
    def on_step(self, record: StepRecord) -> None: ...
    def on_attempt(self, attempt: AttemptFinished) -> None: ...
    def on_rollouts(self, rollouts: StepRollouts) -> None: ...
    def on_progress(self, tick: ProgressTick) -> None: ...
    def on_eval(self, evaluation: EvalRecord) -> None: ...
    def on_end(self, ended: RunEnded) -> None: ...


class ObserverSet:
    """Fans events out; an observer that raises is logged and dropped, never stopping the run."""

    def __init__(self, observers: Sequence[object] = ()) -> None:
        self.observers = list(observers)

    def wants(self, kind: type[RunEvent]) -> bool:
        """Whether any observer handles events of ``kind``: lets the run skip building events nobody reads."""
        return any(getattr(o, kind.hook, None) is not None for o in self.observers)

    def emit(self, event: RunEvent) -> None:
        """Call each observer's hook for ``event`` (``on_end`` for a `RunEnded`, ...)."""
        hook = event.hook
        for obs in list(self.observers):
            fn = getattr(obs, hook, None)
            if fn is None:
                continue
            try:
                fn(event)
            except Exception:
                log.exception("observer %r failed in %s; it is detached", obs, hook)
                self.observers.remove(obs)


def eta(done: int, total: int, elapsed: float) -> str:
    """The time left at the pace so far, as `duration` writes it."""
    return "-" if done <= 0 or total <= done else duration(elapsed / done * (total - done))


def shown(value: object) -> str:
    """A metric's value as a step line prints it."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class TerminalReporter:
    """One line per step (and per progress tick) on a stream: the CLI's and a script's view."""

    KEYS = (
        "reward/mean",
        "reward/group_std_mean",
        "groups/zero_variance_frac",
        "loss",
        "eval/loss",
        "kl/sample_train_v1",
        "tokens/trained",
    )

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.started = time.monotonic()
        self.total = 0

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def on_start(self, run: RunStarted) -> None:
        self.started = time.monotonic()
        self.total = run.max_steps or 0
        resumed = f", resumed at step {run.start_step}" if run.start_step else ""
        self._print(f"run {run.run_dir}: {run.recipe} on {run.model} ({run.scope}){resumed}")

    def on_step(self, taken: StepRecord) -> None:
        step = taken.step
        parts = [f"step {step + 1}/{self.total}" if self.total else f"step {step + 1}"]
        parts += [
            f"{key}={shown(taken.metrics[key])}" for key in self.KEYS if taken.metrics.get(key) is not None
        ]
        parts.append(f"eta={eta(step + 1, self.total, time.monotonic() - self.started)}")
        self._print("  ".join(parts))

    def on_progress(self, tick: ProgressTick) -> None:
        self._print("  … " + ", ".join(f"{k}={v}" for k, v in tick.to_json().items()))

    def on_eval(self, line: EvalRecord) -> None:
        measures = [
            f"{k.removeprefix('eval/')}={shown(v)}"
            for k, v in line.metrics.items()
            if k in ("eval/reward_mean", "eval/tasks", "eval/attempts", "eval/loss", "eval/examples")
            or k.startswith("eval/pass_at_")
        ]
        self._print(f"eval after {line.step} steps: " + "  ".join(measures))

    def on_end(self, end: RunEnded) -> None:
        reason = f"; reason: {end.reason}" if end.reason else ""
        self._print(f"done: {end.status} after {end.steps} steps in {end.seconds or 0:.0f}s{reason}")

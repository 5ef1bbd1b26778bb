"""Run observers: how a run reports steps, attempts and progress to whoever watches it.

The core calls these hooks and knows nothing of terminals or notebooks; `TerminalReporter` prints
lines, and the widgets in `loops_nb.widgets` render the same events live in a notebook. Hooks are
called on the run's event loop and must return quickly.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TextIO

from loops_nb.step_record import StepRecord

log = logging.getLogger("loops_nb.run")


class RunObserver(Protocol):
    """Every hook is optional: an observer defines the ones it wants. A run calls `on_step` with a
    `StepRecord`, which is also a mapping of its steps.jsonl line; the built-in observers take either and
    read it through `StepRecord.of`, so a line read back from steps.jsonl replays as the live step did."""

    def on_start(self, info: dict[str, Any]) -> None: ...
    def on_step(self, record: StepRecord) -> None: ...
    def on_attempt(self, record: dict[str, Any]) -> None: ...
    # RL, after each step trains: {"step": n, "rows": [...]}, the step's rollouts.jsonl rows (step, group,
    # attempt, reward, trained, ...). on_attempt comes earlier, before anyone knows whether an attempt trains.
    def on_rollouts(self, payload: dict[str, Any]) -> None: ...
    def on_progress(self, snapshot: dict[str, Any]) -> None: ...
    def on_end(self, summary: dict[str, Any]) -> None: ...
    # RL, after each evaluation (`[eval]`): its evals.jsonl line, {"step": steps applied, "eval/reward_mean", ...};
    # SFT, the held-out loss before training: {"step": 0, "eval/loss", ...}.
    def on_eval(self, line: dict[str, Any]) -> None: ...


class ObserverSet:
    """Fans events out; an observer that raises is logged and dropped, never stopping the run."""

    def __init__(self, observers: Sequence[Any] = ()) -> None:
        self.observers = list(observers)

    def wants(self, hook: str) -> bool:
        """Whether any observer handles `hook`: lets the run skip building payloads nobody reads."""
        return any(getattr(o, hook, None) is not None for o in self.observers)

    def emit(self, hook: str, payload: Mapping[str, Any]) -> None:
        for obs in list(self.observers):
            fn = getattr(obs, hook, None)
            if fn is None:
                continue
            try:
                fn(payload)
            except Exception:
                log.exception("observer %r failed in %s; it is detached", obs, hook)
                self.observers.remove(obs)


def eta(done: int, total: int, elapsed: float) -> str:
    if done <= 0 or total <= done:
        return "-"
    seconds = elapsed / done * (total - done)
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


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

    def on_start(self, info: dict[str, Any]) -> None:
        self.started = time.monotonic()
        self.total = int(info.get("max_steps") or 0)
        resumed = f", resumed at step {info['start_step']}" if info.get("start_step") else ""
        self._print(
            f"run {info.get('run_dir')}: {info.get('recipe')} on {info.get('model')} ({info.get('scope')}){resumed}"
        )

    def on_step(self, record: Mapping[str, Any]) -> None:
        taken = StepRecord.of(record)
        step = taken.step
        parts = [f"step {step + 1}/{self.total}" if self.total else f"step {step + 1}"]
        for key in self.KEYS:
            value = taken.metrics.get(key)
            if value is not None:
                parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
        parts.append(f"eta={eta(step + 1, self.total, time.monotonic() - self.started)}")
        self._print("  ".join(parts))

    def on_progress(self, snapshot: dict[str, Any]) -> None:
        self._print("  … " + ", ".join(f"{k}={v}" for k, v in snapshot.items()))

    def on_eval(self, line: dict[str, Any]) -> None:
        """An evaluation's evals.jsonl line: the policy after ``step`` steps on the eval tasks (RL), or SFT's
        held-out loss before training (``step`` 0; later ones arrive in the step records)."""
        shown = [
            f"{k.removeprefix('eval/')}={v:.4g}" if isinstance(v, float) else f"{k.removeprefix('eval/')}={v}"
            for k, v in line.items()
            if k in ("eval/reward_mean", "eval/tasks", "eval/attempts", "eval/loss", "eval/examples")
            or k.startswith("eval/pass_at_")
        ]
        self._print(f"eval after {line.get('step')} steps: " + "  ".join(shown))

    def on_end(self, summary: dict[str, Any]) -> None:
        self._print(
            f"done: {summary.get('status')} after {summary.get('steps')} steps in {summary.get('seconds', 0):.0f}s"
        )

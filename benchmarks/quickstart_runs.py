"""Timed runs of the shipped quickstart on the embedded local Loops, shared by the benchmarks that need
whole runs (async vs sync, learning speed). A `StepClock` observer stamps each finished step.

Each step also gets the CPU seconds the process has used since the run started (`cpu_seconds`: user +
system of every thread, and of any child process it has waited for), for rows that compare CPU cost.

`python -m benchmarks.quickstart_runs '{"training.mode": "sync"}'` runs one in this process and prints
its clock as JSON; `run_quickstart_isolated` does that in a child process, so each run starts from a
fresh interpreter (and can get its own environment, e.g. OpenMP settings read at start-up).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loops_nb.run_events import StepRecord

QUICKSTART = (
    Path(__file__).resolve().parents[1] / "patterns/custom_runtime/in_process_direct/train_local.toml"
)


@dataclass
class StepClock:
    """Wall-clock seconds since the run started, at the end of each step, with its mean reward."""

    started: float = field(default_factory=time.perf_counter)
    first_step_at: float | None = None
    steps: list[tuple[float, float | None]] = field(default_factory=list)
    splits: list[tuple[float, float]] = field(default_factory=list)
    """(seconds waiting for rollouts, seconds training + publishing) of each step, as the run logs them."""
    cpu_started: float = field(default_factory=lambda: cpu_seconds())
    cpu: list[float] = field(default_factory=list)
    """CPU seconds (this process and its waited-for children) since the run started, at the end of each step."""

    def on_step(self, record: StepRecord) -> None:
        now = time.perf_counter() - self.started
        if self.first_step_at is None:
            self.first_step_at = now
        self.steps.append((now, record.number("reward/mean")))
        self.cpu.append(cpu_seconds() - self.cpu_started)
        train = (record.number("time/train_s") or 0) + (record.number("time/publish_s") or 0)
        self.splits.append((record.number("time/rollout_s") or 0, train))

    def seconds_to_reward(self, target: float) -> float | None:
        return next((t for t, reward in self.steps if reward is not None and reward >= target), None)

    def seconds_per_step_after_first(self) -> float:
        """Mean step time excluding the first step (which also pays model load and warm-up)."""
        times = [t for t, _ in self.steps]
        return (times[-1] - times[0]) / (len(times) - 1)

    def mean_split_after_first(self) -> tuple[float, float]:
        """Mean (rollout wait, train + publish) seconds per step, excluding the first step."""
        later = self.splits[1:] or self.splits
        return (sum(r for r, _ in later) / len(later), sum(t for _, t in later) / len(later))


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all its threads) and of its children it has waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def import_embedded_loops() -> None:
    """Import what a run imports only when it starts (the embedded Loops' trainer, and with it peft and the
    transformers modules peft pulls in; its sampler and server; the Loops SDK its client is, 1.6 s), so that
    a clock started afterwards counts no imports, as trl_grpo's TRL side counts none."""
    import baseten.loops  # noqa: F401

    import loops_nb.local.embedded
    import loops_nb.local.sampler
    import loops_nb.local.trainer  # noqa: F401


def run_quickstart(overrides: dict[str, Any]) -> StepClock:
    from loops_nb import load

    import_embedded_loops()

    with tempfile.TemporaryDirectory() as tmp:
        project = load(
            QUICKSTART, overrides={"output.output_dir": tmp, "training.save_every": 0, **overrides}
        )
        clock = StepClock()
        asyncio.run(project.train(observers=[clock]))
    return clock


def run_quickstart_isolated(overrides: dict[str, Any], env: dict[str, str] | None = None) -> StepClock:
    """`run_quickstart` in a fresh Python process with `env` added to this one's environment."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.quickstart_runs", json.dumps(overrides)],
        env={**os.environ, **(env or {})},
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"quickstart run {overrides} failed:\n{done.stderr[-3000:]}")
    clock = json.loads(done.stdout.strip().splitlines()[-1])
    return StepClock(
        started=0.0,
        first_step_at=clock["first_step_at"],
        steps=[tuple(s) for s in clock["steps"]],  # type: ignore[misc]
        splits=[tuple(s) for s in clock["splits"]],  # type: ignore[misc]
        cpu_started=0.0,
        cpu=list(clock.get("cpu", [])),
    )


if __name__ == "__main__":
    result = run_quickstart(json.loads(sys.argv[1]))
    print(
        json.dumps(
            {
                "first_step_at": result.first_step_at,
                "steps": result.steps,
                "splits": result.splits,
                "cpu": result.cpu,
            }
        )
    )

"""Timed runs of the shipped quickstart on the embedded local Loops, shared by the benchmarks that need
whole runs (async vs sync, learning speed). A `StepClock` observer stamps each finished step."""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

QUICKSTART = (
    Path(__file__).resolve().parents[1] / "patterns/custom_runtime/in_process_direct/train_local.toml"
)


@dataclass
class StepClock:
    """Wall-clock seconds since the run started, at the end of each step, with its mean reward."""

    started: float = field(default_factory=time.perf_counter)
    first_step_at: float | None = None
    steps: list[tuple[float, float | None]] = field(default_factory=list)

    def on_step(self, record: dict[str, Any]) -> None:
        now = time.perf_counter() - self.started
        if self.first_step_at is None:
            self.first_step_at = now
        self.steps.append((now, record.get("reward/mean")))

    def seconds_to_reward(self, target: float) -> float | None:
        return next((t for t, reward in self.steps if reward is not None and reward >= target), None)

    def seconds_per_step_after_first(self) -> float:
        """Mean step time excluding the first step (which also pays model load and warm-up)."""
        times = [t for t, _ in self.steps]
        return (times[-1] - times[0]) / (len(times) - 1)


def run_quickstart(overrides: dict[str, Any]) -> StepClock:
    from loops_nb import load

    with tempfile.TemporaryDirectory() as tmp:
        project = load(
            QUICKSTART, overrides={"output.output_dir": tmp, "training.save_every": 0, **overrides}
        )
        clock = StepClock()
        asyncio.run(project.train(observers=[clock]))
    return clock

"""`Outcome`: what a run did, as `train()` returns it and `loops run` prints it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Outcome:
    """What a run did."""

    run_dir: str
    status: str
    """`completed`, `stopped`, or `failed` when every step ran and none trained (`reason` says why; `loops run`
    exits 1). A fault that stops a run raises `RunFailed` instead."""
    steps: int
    """Optimizer steps applied when the run ended (its final checkpoint's step)."""
    start_step: int
    """The step this process started at (0, or the checkpoint it resumed from)."""
    last_metrics: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    sampler_path: str | None = None
    seconds: float = 0.0
    reason: str | None = None
    """Why a `failed` run trained nothing (e.g. every attempt was discarded as `timeout`); None otherwise."""

    def describe(self) -> list[str]:
        lines = [f"run: {self.run_dir}", f"status: {self.status} ({self.steps} steps, {self.seconds:.0f}s)"]
        if self.reason:
            lines.append(f"reason: {self.reason}")
        for key in ("reward/mean", "loss", "eval/loss"):
            if self.last_metrics.get(key) is not None:  # None when a step had no rewards
                lines.append(f"{key}: {self.last_metrics[key]:.4g}")
        if self.checkpoint:
            lines.append(f"checkpoint: {self.checkpoint}")
        if self.sampler_path:
            lines.append(f"sampler weights: {self.sampler_path}")
        return lines

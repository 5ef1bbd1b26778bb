"""`Outcome`: what a run did, as `train()` returns it and `loops run` prints it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from loops_nb.run_dir import Checkpoint, RunDirectory


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

    @classmethod
    def of(
        cls,
        run_dir: RunDirectory,
        checkpoint: Checkpoint,
        status: str = "completed",
        start: int | None = None,
        metrics: dict[str, Any] | None = None,
        seconds: float = 0.0,
        reason: str | None = None,
    ) -> Self:
        """The outcome of the run in ``run_dir`` that ended at ``checkpoint``; by default one found finished (it
        started there, and its last step record says its metrics). A recipe's subclass adds its own fields."""
        return cls(
            run_dir=str(run_dir.root),
            status=status,
            reason=reason,
            steps=checkpoint.step,
            start_step=checkpoint.step if start is None else start,
            last_metrics=run_dir.last_step_record() if metrics is None else metrics,
            checkpoint=checkpoint.path,
            sampler_path=checkpoint.sampler_path,
            seconds=seconds,
            **cls.recipe_fields(run_dir),
        )

    @classmethod
    def recipe_fields(cls, run_dir: RunDirectory) -> dict[str, Any]:
        """The fields a recipe's subclass adds, read from the run's files (RL, SFT: its evaluations)."""
        return {}

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

"""`RLOutcome`: what an RL run did, with its first and last evaluation (`[eval]`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loops_nb.rl.evaluation import EvalLog
from loops_nb.run.run_outcome import Outcome
from loops_nb.run_dir import RunDirectory
from loops_nb.run_events import EvalRecord


@dataclass
class RLOutcome(Outcome):
    """An RL run's `Outcome`; ``eval_before`` and ``eval_after`` are the `eval/*` metrics of the run's first and
    last evaluation (None without `[eval]`), ``eval_steps`` the steps every evaluation was after."""

    eval_before: dict[str, Any] | None = None
    eval_after: dict[str, Any] | None = None
    eval_steps: list[int] | None = None

    @classmethod
    def recipe_fields(cls, run_dir: RunDirectory) -> dict[str, Any]:
        """The outcome's eval fields from the run's evaluations (evals.jsonl)."""
        evals = EvalLog(run_dir.root).records()
        if not evals:
            return {}

        def metrics(record: EvalRecord) -> dict[str, Any]:
            return {"step": record.step, **{k: v for k, v in record.metrics.items() if k.startswith("eval/")}}

        return {
            "eval_before": metrics(evals[0]),
            "eval_after": metrics(evals[-1]),
            "eval_steps": [e.step for e in evals],
        }

    def describe(self) -> list[str]:
        lines = super().describe()
        if self.eval_after is not None:
            lines.append("eval: " + _compared(self.eval_before or self.eval_after, self.eval_after))
        return lines


def _compared(before: dict[str, Any], after: dict[str, Any]) -> str:
    """``reward_mean 0.12 -> 0.81, pass_at_1 ... (step 0 -> 8)``, or the one evaluation's values."""
    moved = before.get("step") != after.get("step")
    passes = sorted(
        (k for k in after if k.startswith("eval/pass_at_")), key=lambda k: int(k.rsplit("_", 1)[1])
    )
    parts = []
    for key in ["eval/reward_mean", *passes]:
        shown = _shown(after.get(key))
        if moved:
            shown = f"{_shown(before.get(key))} -> {shown}"
        parts.append(f"{key.removeprefix('eval/')} {shown}")
    steps = f"step {before['step']} -> {after['step']}" if moved else f"step {after['step']}"
    return ", ".join(parts) + f" ({steps})"


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"

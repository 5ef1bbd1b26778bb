"""What an SFT run did, as `train()` returns it: the skeleton's `Outcome` and the held-out loss, before and
after (`rl/outcome.py` is the RL recipe's)."""

from __future__ import annotations

from dataclasses import dataclass

from loops_nb.run.run_outcome import Outcome
from loops_nb.run_dir import JsonlLog, RunDirectory


@dataclass
class SFTOutcome(Outcome):
    """What an SFT run did; ``eval_loss_before`` is the held-out loss before the first step."""

    eval_loss_before: float | None = None
    eval_loss: float | None = None

    @classmethod
    def recipe_fields(cls, run_dir: RunDirectory) -> dict[str, float | None]:
        """The outcome's held-out losses from the run's evals.jsonl lines (the one at step 0, and the last)."""
        evals = list(JsonlLog(run_dir.root / "evals.jsonl").records())
        return {
            "eval_loss_before": next((e["eval/loss"] for e in evals if e.get("step") == 0), None),
            "eval_loss": evals[-1]["eval/loss"] if evals else None,
        }

    def describe(self) -> list[str]:
        lines = super().describe()
        if self.eval_loss is not None:
            before = f"{self.eval_loss_before:.4g} -> " if self.eval_loss_before is not None else ""
            lines.append(f"held-out loss: {before}{self.eval_loss:.4g}")
        return lines

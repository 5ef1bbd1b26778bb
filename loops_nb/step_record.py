"""`StepRecord`: one optimizer step, as a recipe's loop writes it to steps.jsonl and observers receive it.

Both recipes write one per step. The fields every step has are typed attributes; the recipe's metrics (RL:
`reward/mean`, `policy_version`, `discarded/<reason>`, ...; SFT: `loss`, `eval/loss`, `batch`, ...) are
`metrics`, keyed as in steps.jsonl. `to_json` is its steps.jsonl line and `StepRecord.from_json(line)` reads one
back (the shape it shares with an evals.jsonl line, `loops_nb.run_events.MetricsLine`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from loops_nb.run_events import MetricsLine


@dataclass(frozen=True)
class StepRecord(MetricsLine):
    """One optimizer step: ``step`` (0-based; it applied steps ``0..step``), ``metrics``, ``time``."""

    hook: ClassVar[str] = "on_step"

    def with_metrics(self, extra: Mapping[str, Any]) -> StepRecord:
        """This record with ``extra`` metrics after its own (e.g. the run's `memory/*`)."""
        return StepRecord(self.step, {**self.metrics, **extra}, self.time)

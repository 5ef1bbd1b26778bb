"""`StepRecord`: one optimizer step, as a recipe's loop writes it to steps.jsonl and observers receive it.

The recipe's metrics (RL: `reward/mean`, `discarded/<reason>`, ...; SFT: `loss`, `eval/loss`, ...) are
`metrics`, keyed as in steps.jsonl; the line's shape is the one it shares with evals.jsonl (`MetricsLine`).
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

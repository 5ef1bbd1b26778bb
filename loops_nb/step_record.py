"""`StepRecord`: one optimizer step, as a recipe's loop writes it to steps.jsonl and observers receive it.

Both recipes write one per step. The fields every step has are typed attributes; the recipe's metrics (RL:
`reward/mean`, `policy_version`, `discarded/<reason>`, ...; SFT: `loss`, `eval/loss`, `batch`, ...) are
`metrics`, keyed as in steps.jsonl. A record is also a read-only mapping of its steps.jsonl line, so an
observer written as `record["reward/mean"]` and one reading a line back from steps.jsonl see the same keys;
`StepRecord.of(line)` turns such a line into a record.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

_TYPED = ("step", "time")


@dataclass(frozen=True)
class StepRecord(Mapping[str, Any]):
    hook: ClassVar[str] = "on_step"
    """The observer method a record is delivered to (see `loops_nb.run_events` for the other events)."""
    step: int
    """0-based index of the optimizer step; it applied steps ``0..step``."""
    metrics: Mapping[str, Any] = field(default_factory=dict)
    """Everything else the step logged, by its steps.jsonl key."""
    time: float | None = None
    """Wall-clock time (seconds since the epoch) when the step was logged."""

    @classmethod
    def of(cls, line: Mapping[str, Any]) -> StepRecord:
        """A record from a steps.jsonl line (or a record, returned as it is)."""
        if isinstance(line, StepRecord):
            return line
        metrics = {k: v for k, v in line.items() if k not in _TYPED}
        time = line.get("time")
        return cls(int(line["step"]), metrics, float(time) if isinstance(time, int | float) else None)

    def number(self, key: str) -> float | None:
        """The metric ``key`` as a finite float; None when the step did not log it, or logged no number
        (a step without rewards logs `reward/mean` as None)."""
        value = self.metrics.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return None
        return float(value)

    def with_metrics(self, extra: Mapping[str, Any]) -> StepRecord:
        """This record with ``extra`` metrics after its own (e.g. the run's `memory/*`)."""
        return StepRecord(self.step, {**self.metrics, **extra}, self.time)

    def to_json(self) -> dict[str, Any]:
        """The steps.jsonl line: the step first, the metrics in the order they were logged, the time last."""
        line: dict[str, Any] = {"step": self.step, **self.metrics}
        if self.time is not None:
            line["time"] = self.time
        return line

    def __getitem__(self, key: str) -> Any:
        if key == "step":
            return self.step
        if key == "time" and self.time is not None:
            return self.time
        return self.metrics[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.metrics) + 1 + (self.time is not None)

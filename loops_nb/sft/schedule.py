"""The learning rate at each optimizer step: linear warm-up, then constant, linear or cosine decay.

The rate is sent with every `optim_step` (Loops takes Adam's hyper-parameters per step), so the schedule lives
here, on the client, and a resumed run continues it exactly: it is a function of the step number alone.
"""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "linear", "cosine"]


def learning_rate(
    step: int, *, total_steps: int, peak: float, schedule: Schedule = "linear", warmup_steps: int = 0
) -> float:
    """The rate for 0-based ``step`` of ``total_steps``: warm-up never at 0 (no step is wasted), and a decay that
    reaches 0 only as the last step ends, so the last step still learns (the formulas:
    docs/reference/sft.md#learning-rate-schedule)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    decay_steps = total_steps - warmup_steps
    if schedule == "constant" or decay_steps <= 0:
        return peak
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "linear":
        return peak * (1.0 - progress)
    if schedule == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown learning-rate schedule {schedule!r}")

"""GRPO advantages: reward minus the group mean, not divided by the group's standard deviation.

Dividing by the std would inflate tiny reward differences in near-uniform groups; like
tinker-cookbook and nanochat we only centre. A group whose rewards are all equal carries no signal:
every advantage is zero, so it is counted and contributes no datums.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: list[float]
    mean: float
    std: float

    @property
    def zero_variance(self) -> bool:
        return self.std == 0.0


def group_advantages(rewards: Sequence[float]) -> GroupAdvantages:
    """Advantages of one group's (kept) attempts."""
    if not rewards:
        return GroupAdvantages([], 0.0, 0.0)
    mean = math.fsum(rewards) / len(rewards)
    var = math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)
    std = math.sqrt(var)
    # Exact equality, not a tolerance: 0.1 + 0.2 and 0.3 are different rewards to the trainer too.
    if all(r == rewards[0] for r in rewards):
        return GroupAdvantages([0.0] * len(rewards), mean, 0.0)
    return GroupAdvantages([r - mean for r in rewards], mean, std)

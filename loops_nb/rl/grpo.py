"""GRPO advantages: reward minus the group mean, not divided by the group's standard deviation.

Dividing by the std would inflate tiny reward differences in near-uniform groups; like
tinker-cookbook and nanochat we only centre. A group whose rewards are all equal carries no signal:
every advantage is zero, so it is counted and contributes no datums.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loops_nb.rl.datums import SequenceDatum, sequence_datums

if TYPE_CHECKING:
    from loops_nb.rl.scheduler import GroupResult


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: list[float]
    mean: float
    std: float

    @property
    def zero_variance(self) -> bool:
        return self.std == 0.0


def group_advantages(rewards: Sequence[float]) -> GroupAdvantages:
    """Advantages of one group's (kept) attempts: each reward minus the group mean."""
    if not rewards:
        return GroupAdvantages([], 0.0, 0.0)
    # Exact equality, not a tolerance: 0.1 + 0.2 and 0.3 are different rewards to the trainer too.
    if all(r == rewards[0] for r in rewards):
        return GroupAdvantages([0.0] * len(rewards), float(rewards[0]), 0.0)
    # Rewards are capped at +-REWARD_LIMIT (1e6) by the attempt boundary, so these sums never overflow.
    mean = math.fsum(rewards) / len(rewards)
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))
    return GroupAdvantages([r - mean for r in rewards], mean, std)


def step_datums(groups: Sequence[GroupResult]) -> tuple[list[SequenceDatum], dict[str, float | None]]:
    """GRPO over a step's groups: the datums to train on and the reward statistics.

    A group with fewer than two kept attempts, or whose kept rewards are all equal, has no signal: it is
    counted in `groups/zero_variance_frac` and contributes no datum.
    """
    datums: list[SequenceDatum] = []
    rewards: list[float] = []
    group_stds: list[float] = []
    zero_variance = 0
    for group in groups:
        # The attempt boundary keeps only attempts whose reward is a finite real number (never None).
        kept = [a for a in group.attempts if a.kept and a.evidence.reward is not None]
        if len(kept) < 2:
            zero_variance += 1
            continue
        values = [float(r) for a in kept if (r := a.evidence.reward) is not None]
        rewards += values
        adv = group_advantages(values)
        group_stds.append(adv.std)
        if adv.zero_variance:
            zero_variance += 1
            continue
        for record, advantage in zip(kept, adv.advantages, strict=True):
            datums += sequence_datums(record.capture.sequences(), advantage, record.attempt.id)
    stats: dict[str, float | None] = {
        "reward/mean": statistics.fmean(rewards) if rewards else None,
        "reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward/group_std_mean": statistics.fmean(group_stds) if group_stds else 0.0,
        "groups/zero_variance_frac": zero_variance / len(groups) if groups else 0.0,
        "groups/trained": len(groups) - zero_variance,
    }
    return datums, stats

"""What one RL step leaves behind, apart from training it: its steps.jsonl metrics, one rollouts.jsonl row per
attempt, its transcript, and the observer events. Every per-attempt dict (the rollouts row, the observer's
`AttemptFinished`, the transcript entry) is a view of one `AttemptView`.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from loops_nb.llm.breaks import CAUSES
from loops_nb.llm.renderer import Renderer
from loops_nb.observers import ObserverSet
from loops_nb.rl.grpo import SequenceDatum
from loops_nb.rl.scheduler import AttemptRecord, GroupResult, RolloutScheduler
from loops_nb.run_dir import RunDirectory
from loops_nb.run_events import AttemptFinished, AttemptRow, StepRecord, StepRollouts


@dataclass(frozen=True)
class StepTraining:
    """What training one step did: the datums GRPO kept, its reward statistics, the trainer's metrics."""

    datums: list[SequenceDatum]
    stats: dict[str, float | None]
    """GRPO's reward statistics (`step_datums`)."""
    metrics: dict[str, float]
    train_s: float = 0.0
    publish_s: float = 0.0


@dataclass(frozen=True)
class AttemptView:
    """One finished attempt as the logs write it; ``trained`` is None until its step's advantages are known."""

    record: AttemptRecord
    trained: bool | None = None

    def row(self, step: int, group: GroupResult) -> AttemptRow:
        """Its rollouts.jsonl line (and `on_rollouts` row), or eval_attempts.jsonl's."""
        a = self.record
        return {
            "step": step,
            "slot": group.slot,
            "group": group.group,
            "task": group.task.id,
            "attempt": a.attempt.id,
            "reward": a.evidence.reward,
            "trained": self.trained,
            "discarded": a.evidence.discarded,
            "detail": a.evidence.detail,
            "policy_versions": a.capture.policy_versions,
            "sampled_tokens": a.capture.sampled_tokens,
            "breaks": a.capture.break_records(),
            "seconds": round(a.seconds, 3),
        }

    def finished(self, renderer: Renderer) -> AttemptFinished:
        """What `on_attempt` reports the moment the attempt finishes, every call of its transcript decoded."""
        a = self.record
        return AttemptFinished(
            attempt=a.attempt.id,
            task=a.attempt.task.id,
            reward=a.evidence.reward,
            discarded=a.evidence.discarded,
            detail=a.evidence.detail,
            policy_versions=a.capture.policy_versions,
            calls=len(a.capture.calls),
            sampled_tokens=a.capture.sampled_tokens,
            sequence_breaks=dict(a.capture.breaks),
            seconds=round(a.seconds, 3),
            text=self.transcript(renderer, full=True),
        )

    def transcript(self, renderer: Renderer, *, full: bool) -> dict[str, Any]:
        """Its entry in the step's (or evaluation's) transcript: with ``full``, every call decoded, its tokens and
        logprobs."""
        a = self.record
        out: dict[str, Any] = {
            "attempt": a.attempt.id,
            "reward": a.evidence.reward,
            "discarded": a.evidence.discarded,
            "trained": self.trained,
            "policy_versions": a.capture.policy_versions,
            "length": sum(len(c.prompt_tokens) + len(c.completion_tokens) for c in a.capture.calls),
            # Which calls started a new sequence, why, and the first tokens that differ.
            "breaks": a.capture.break_records(),
        }
        if full:
            out["calls"] = [
                {
                    "prompt": renderer.decode(c.prompt_tokens),
                    "completion": renderer.decode(c.completion_tokens),
                    "completion_tokens": c.completion_tokens,
                    "logprobs": [round(x, 5) for x in c.logprobs],
                    "trained": self.trained,
                    "finish_reason": c.finish_reason,
                    "tool_calls": c.tool_calls,
                }
                for c in a.capture.calls
            ]
            out["transcript"] = a.evidence.transcript
        return out


@dataclass
class StepLog:
    """Where an RL run's steps and attempts are written and announced."""

    run_dir: RunDirectory
    observers: ObserverSet
    renderer: Renderer
    full_transcripts: bool

    def attempt_finished(self, record: AttemptRecord) -> None:
        """`on_attempt`, as each attempt ends (whether it trains is not known yet)."""
        if self.observers.wants(AttemptFinished):
            self.observers.emit(AttemptView(record).finished(self.renderer))

    def record(
        self,
        step: int,
        groups: list[GroupResult],
        training: StepTraining,
        scheduler: RolloutScheduler,
        *,
        policy_version: int,
        rollout_s: float,
        step_started: float,
    ) -> StepRecord:
        """Write the step's rollouts and transcript, announce its rows, and return its steps.jsonl record."""
        trained_ids = {d.attempt_id for d in training.datums}
        views = [(g, AttemptView(a, a.attempt.id in trained_ids)) for g in groups for a in g.attempts]
        metrics = step_metrics(step, [v.record for _, v in views], training, scheduler, policy_version)
        metrics |= {
            "time/rollout_s": round(rollout_s, 3),
            "time/train_s": round(training.train_s, 3),
            "time/publish_s": round(training.publish_s, 3),
            "time/step_s": round(time.perf_counter() - step_started, 3),
        }
        rows = [view.row(step, group) for group, view in views]
        self.run_dir.rollouts.extend(rows)
        self.observers.emit(StepRollouts(step, rows))
        self.run_dir.write_transcript(
            f"step-{step:06d}",
            [view.transcript(self.renderer, full=self.full_transcripts) for _, view in views],
        )
        return StepRecord(step, metrics)


def step_metrics(
    step: int,
    attempts: list[AttemptRecord],
    training: StepTraining,
    scheduler: RolloutScheduler,
    policy_version: int,
) -> dict[str, Any]:
    """A step's steps.jsonl metrics, without its timings: rewards, discards, staleness, tokens, training."""
    discarded = Counter(a.evidence.discarded for a in attempts if a.evidence.discarded)
    versions = [v for a in attempts for v in a.capture.policy_versions]
    breaks = sum((a.capture.breaks for a in attempts), Counter[str]())
    return {
        "policy_version": policy_version,
        **training.stats,
        "attempts": len(attempts),
        "attempts/discarded": sum(discarded.values()),
        **{f"discarded/{k}": v for k, v in sorted(discarded.items())},
        "staleness/mean": statistics.fmean(step - v for v in versions) if versions else 0.0,
        "staleness/requeued_total": scheduler.stats.stale_requeued,
        "tokens/sampled": sum(a.capture.sampled_tokens for a in attempts),
        "tokens/trained": sum(d.trained_tokens for d in training.datums),
        "sequences/breaks": sum(breaks.values()),
        **{f"sequences/breaks/{cause}": breaks[cause] for cause in CAUSES},
        "trained": bool(training.datums),
        **training.metrics,
    }

"""The RL training loop: schedule attempts, GRPO, train, publish, checkpoint, log — and resume.

Per step: collect `groups_per_step` groups of `group_size` attempts; centre each group's rewards;
turn every kept attempt's captured sequences into datums; one optimizer step over all of them;
publish the new policy; write steps.jsonl / rollouts.jsonl / transcripts. Every `save_every` steps
(and at the end, or when stopped) the trainer state is saved and recorded in checkpoints.jsonl; a
resumed run loads the last one and continues at the next step, so every optimizer step is applied
exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from loops_nb.errors import RunFailed, UserError
from loops_nb.llm.client import LoopsLLM, SamplingDefaults
from loops_nb.llm.renderer import ChatRenderer
from loops_nb.observers import ObserverSet
from loops_nb.rl.config import RLConfig
from loops_nb.rl.datums import SequenceDatum, sequence_datums
from loops_nb.rl.grpo import group_advantages
from loops_nb.rl.policy import AdamSettings, Policy
from loops_nb.rl.scheduler import AttemptRecord, GroupResult, RolloutScheduler
from loops_nb.run_dir import Checkpoint, RunDirectory
from loops_nb.runtime import RolloutRuntime

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What a run did."""

    run_dir: str
    status: str
    steps: int
    start_step: int
    last_metrics: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    sampler_path: str | None = None
    seconds: float = 0.0

    def describe(self) -> list[str]:
        lines = [f"run: {self.run_dir}", f"status: {self.status} ({self.steps} steps, {self.seconds:.0f}s)"]
        for key in ("reward/mean", "loss", "eval/loss"):
            if self.last_metrics.get(key) is not None:  # None when a step had no rewards
                lines.append(f"{key}: {self.last_metrics[key]:.4g}")
        if self.checkpoint:
            lines.append(f"checkpoint: {self.checkpoint}")
        if self.sampler_path:
            lines.append(f"sampler weights: {self.sampler_path}")
        return lines


def step_datums(groups: list[GroupResult]) -> tuple[list[SequenceDatum], dict[str, Any]]:
    """GRPO over a step's groups: the datums to train on and the reward statistics."""
    datums: list[SequenceDatum] = []
    rewards: list[float] = []
    group_stds: list[float] = []
    zero_variance = 0
    for group in groups:
        kept = [a for a in group.attempts if a.kept]
        if len(kept) < 2:
            zero_variance += 1
            continue
        values = [float(a.evidence.reward) for a in kept]  # type: ignore[arg-type]
        rewards += values
        adv = group_advantages(values)
        group_stds.append(adv.std)
        if adv.zero_variance:
            zero_variance += 1
            continue
        for record, advantage in zip(kept, adv.advantages, strict=True):
            datums += sequence_datums(record.capture.sequences(), advantage, record.attempt.id)
    stats = {
        "reward/mean": statistics.fmean(rewards) if rewards else None,
        "reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward/group_std_mean": statistics.fmean(group_stds) if group_stds else 0.0,
        "groups/zero_variance_frac": zero_variance / len(groups) if groups else 0.0,
        "groups/trained": len(groups) - zero_variance,
    }
    return datums, stats


class RLRun:
    def __init__(
        self,
        config: RLConfig,
        run_dir: RunDirectory,
        policy: Policy,
        runtime: RolloutRuntime,
        renderer: ChatRenderer,
        observers: ObserverSet,
        *,
        custom_loss: Any = None,
        stop: asyncio.Event | None = None,
        resources: Any = None,
    ) -> None:
        self.resources = resources
        self.config = config
        self.run_dir = run_dir
        self.policy = policy
        self.runtime = runtime
        self.renderer = renderer
        self.observers = observers
        self.custom_loss = custom_loss
        self.stop = stop or asyncio.Event()
        self.adam = AdamSettings.of(config.training)
        self.defaults = SamplingDefaults(
            temperature=config.sampling.temperature,
            top_p=config.sampling.top_p,
            max_tokens=config.sampling.max_tokens,
            max_seq_len=config.model.max_seq_len,
        )

    def _make_llm(self, capture: Any, seed: int) -> LoopsLLM:
        return LoopsLLM(
            self.renderer,
            self.policy,
            capture,
            self.defaults,
            seed=seed,
            on_sampling_error=self.policy.sampling_failed,
        )

    async def resume_point(self) -> int:
        checkpoint = self.run_dir.last_checkpoint()
        if checkpoint is None:
            # Killed before its first checkpoint: whatever it logged is redone from step 0.
            self.run_dir.rewind_to(0)
            return 0
        await self.policy.load_state_with_optimizer(checkpoint.path)
        self.run_dir.rewind_to(checkpoint.step)
        log.info("resuming %s at step %d from %s", self.run_dir.root, checkpoint.step, checkpoint.path)
        return checkpoint.step

    async def execute(self, start_step: int) -> Outcome:
        t = self.config.training
        started = time.monotonic()
        try:
            tasks = await self.runtime.tasks()
        except UserError:
            raise
        except Exception as exc:  # the runtime's own code: the run stops, resumable, like a trainer fault
            raise self._failed(start_step, exc) from exc
        scheduler = RolloutScheduler(
            self.runtime,
            tasks,
            make_llm=self._make_llm,
            version=lambda: self.policy.version,
            group_size=t.group_size,
            groups_per_step=t.groups_per_step,
            max_concurrent=t.max_concurrent_rollouts,
            attempt_timeout=t.attempt_timeout_seconds,
            seed=t.seed,
            mode=t.mode,
            max_staleness=t.max_staleness,
            stale_policy=t.stale_policy,
            resources=self.resources,
            on_attempt=self._on_attempt,
            reward_range=(t.reward_min, t.reward_max),
        )
        last = self.run_dir.last_checkpoint()
        if start_step >= t.max_steps and last is not None and last.sampler_path:
            # A rerun of a finished run: nothing to train, nothing to save again.
            await scheduler.close()
            outcome = Outcome(
                run_dir=str(self.run_dir.root),
                status="completed",
                steps=start_step,
                start_step=start_step,
                last_metrics=self.run_dir.last_step_record(),
                checkpoint=last.path,
                sampler_path=last.sampler_path,
            )
            self.observers.emit("on_end", {"status": "completed", "steps": start_step, "seconds": 0.0})
            return outcome
        await self.policy.publish()
        if t.mode == "async":
            scheduler.start(start_step, t.max_steps)
        progress = asyncio.create_task(self._report_progress(scheduler))
        status, step, metrics = "completed", start_step, {}
        try:
            for step in range(start_step, t.max_steps):
                if self.stop.is_set():
                    status = "stopped"
                    break
                step_started = time.perf_counter()
                groups = await (
                    scheduler.next_groups(step) if t.mode == "async" else scheduler.collect_sync(step)
                )
                rollout_s = time.perf_counter() - step_started
                if self.policy.lost is not None:  # its attempts were discarded; so would all later ones be
                    raise self.policy.lost
                metrics = await self._train_and_log(step, groups, scheduler, rollout_s, step_started)
                if t.save_every and (step + 1) % t.save_every == 0 and step + 1 < t.max_steps:
                    await self._checkpoint(step + 1, sampler=False)
            else:
                step = t.max_steps
        except Exception as exc:
            raise self._failed(step, exc) from exc
        finally:
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress
            await scheduler.close()
        done = step if status == "stopped" else t.max_steps
        try:
            checkpoint = await self._checkpoint(done, sampler=True)
        except Exception as exc:  # e.g. a full disk or a restarted Loops: the last periodic checkpoint stands
            raise self._failed(done, exc) from exc
        outcome = Outcome(
            run_dir=str(self.run_dir.root),
            status=status,
            steps=done,
            start_step=start_step,
            last_metrics=metrics,
            checkpoint=checkpoint.path,
            sampler_path=checkpoint.sampler_path,
            seconds=time.monotonic() - started,
        )
        self.observers.emit("on_end", {"status": status, "steps": done, "seconds": outcome.seconds})
        return outcome

    def _failed(self, step: int, exc: Exception) -> RunFailed:
        # Raised, not logged: the CLI prints it once, train() raises it, and run.log gets the traceback.
        return self.run_dir.record_failure(step, exc)

    def _on_attempt(self, record: AttemptRecord) -> None:
        if not self.observers.wants("on_attempt"):
            return
        summary = {
            "attempt": record.attempt.id,
            "task": record.attempt.task.id,
            "reward": record.evidence.reward,
            "discarded": record.evidence.discarded,
            "detail": record.evidence.detail,
            "policy_versions": record.capture.policy_versions,
            "calls": len(record.capture.calls),
            "sampled_tokens": record.capture.sampled_tokens,
            "sequence_breaks": dict(record.capture.breaks),
            "seconds": round(record.seconds, 3),
        }
        self.observers.emit("on_attempt", {**summary, "text": self._transcript(record, full=True)})

    def _transcript(self, record: AttemptRecord, *, full: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "attempt": record.attempt.id,
            "reward": record.evidence.reward,
            "discarded": record.evidence.discarded,
            "policy_versions": record.capture.policy_versions,
            "length": sum(len(c.prompt_tokens) + len(c.completion_tokens) for c in record.capture.calls),
        }
        if full:
            out["calls"] = [
                {
                    "prompt": self.renderer.decode(c.prompt_tokens),
                    "completion": self.renderer.decode(c.completion_tokens),
                    "completion_tokens": c.completion_tokens,
                    "logprobs": [round(x, 5) for x in c.logprobs],
                    "trained": record.kept,
                    "finish_reason": c.finish_reason,
                    "tool_calls": c.tool_calls,
                }
                for c in record.capture.calls
            ]
            out["transcript"] = record.evidence.transcript
        return out

    async def _train_and_log(
        self, step: int, groups: list[GroupResult], scheduler: RolloutScheduler, rollout_s: float, t0: float
    ) -> dict[str, Any]:
        t = self.config.training
        datums, stats = step_datums(groups)
        train_started = time.perf_counter()
        train_metrics: dict[str, float] = {}
        if datums:
            train_metrics = await self.policy.train_step(
                datums,
                loss=t.loss if self.custom_loss is None and isinstance(t.loss, str) else "custom",
                loss_config=t.loss_config,
                adam=self.adam,
                custom_loss=self.custom_loss,
            )
            train_s = time.perf_counter() - train_started
            publish_s = await self.policy.publish()
            scheduler.policy_published()
        else:
            train_s = publish_s = 0.0
        attempts = [a for g in groups for a in g.attempts]
        trained_ids = {d.attempt_id for d in datums}
        discarded = Counter(a.evidence.discarded for a in attempts if a.evidence.discarded)
        versions = [v for a in attempts for v in a.capture.policy_versions]
        record: dict[str, Any] = {
            "step": step,
            "policy_version": self.policy.version,
            **stats,
            "attempts": len(attempts),
            "attempts/discarded": sum(discarded.values()),
            **{f"discarded/{k}": v for k, v in sorted(discarded.items())},
            "staleness/mean": statistics.fmean(step - v for v in versions) if versions else 0.0,
            "staleness/requeued_total": scheduler.stats.stale_requeued,
            "tokens/sampled": sum(a.capture.sampled_tokens for a in attempts),
            "tokens/trained": sum(d.trained_tokens for d in datums),
            "sequences/breaks": sum(sum(a.capture.breaks.values()) for a in attempts),
            "trained": bool(datums),
            **train_metrics,
            "time/rollout_s": round(rollout_s, 3),
            "time/train_s": round(train_s, 3),
            "time/publish_s": round(publish_s, 3),
            "time/step_s": round(time.perf_counter() - t0, 3),
        }
        self.run_dir.rollouts.extend(
            [
                {
                    "step": step,
                    "slot": g.slot,
                    "group": g.group,
                    "task": g.task.id,
                    "attempt": a.attempt.id,
                    "reward": a.evidence.reward,
                    "trained": a.attempt.id in trained_ids,
                    "discarded": a.evidence.discarded,
                    "detail": a.evidence.detail,
                    "policy_versions": a.capture.policy_versions,
                    "sampled_tokens": a.capture.sampled_tokens,
                    "seconds": round(a.seconds, 3),
                }
                for g in groups
                for a in g.attempts
            ]
        )
        full = self.config.output.trace == "full"
        self.run_dir.write_transcript(
            f"step-{step:06d}", [self._transcript(a, full=full) for g in groups for a in g.attempts]
        )
        self.run_dir.steps.append(record)
        self.observers.emit("on_step", record)
        return record

    async def _checkpoint(self, step: int, *, sampler: bool) -> Checkpoint:
        path = await self.policy.save_state(f"state-{step:06d}")
        sampler_path = None
        if sampler:
            fut = await self.policy.training_client.save_weights_for_sampler_async(f"final-{step:06d}")
            sampler_path = str((await fut.result_async()).path)
        checkpoint = Checkpoint(
            step=step, path=path, sampler_path=sampler_path, extra={"policy_version": self.policy.version}
        )
        self.run_dir.record_checkpoint(checkpoint)
        return checkpoint

    async def _report_progress(self, scheduler: RolloutScheduler) -> None:
        every = self.config.output.progress_every_seconds
        while True:
            await asyncio.sleep(every)
            self.observers.emit(
                "on_progress",
                {
                    "attempts_done": scheduler.finished_attempts,
                    "in_flight": scheduler.in_flight,
                    "policy_version": self.policy.version,
                },
            )

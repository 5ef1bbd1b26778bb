"""The RL training loop on the shared run skeleton (`loops_nb.run.recipe_run`): per step, `groups_per_step`
groups of `group_size` attempts, GRPO (`rl.grpo.step_datums`), one optimizer step over the kept attempts'
datums, the publish, and `rl.step_log.StepLog.record` writing the step's files.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from loops_nb.llm.client import SamplingDefaults
from loops_nb.llm.renderer import Renderer
from loops_nb.observers import ObserverSet
from loops_nb.resources import ResourceRegistry
from loops_nb.rl.config import RLConfig
from loops_nb.rl.custom_loss import TrainingLoss
from loops_nb.rl.evaluation import EvalLog, Evaluator, eval_due, eval_tasks
from loops_nb.rl.grpo import step_datums
from loops_nb.rl.outcome import RLOutcome
from loops_nb.rl.policy import Policy
from loops_nb.rl.scheduler import GroupResult, RolloutScheduler, llm_maker
from loops_nb.rl.step_log import StepLog, StepTraining
from loops_nb.run.recipe_run import RecipeRun
from loops_nb.run_dir import Checkpoint, RunDirectory
from loops_nb.run_events import ProgressTick, StepRecord
from loops_nb.runtime import RolloutRuntime


class RLRun(RecipeRun):
    """The RL recipe's steps: rollouts from the runtime, GRPO, one optimizer step, publish; and the `[eval]`
    evaluations (`rl/evaluation.py`) before the steps they are due at and after the last one."""

    outcome_type = RLOutcome

    def __init__(
        self,
        config: RLConfig,
        run_dir: RunDirectory,
        policy: Policy,
        runtime: RolloutRuntime,
        renderer: Renderer,
        observers: ObserverSet,
        *,
        stop: asyncio.Event | None = None,
        resources: ResourceRegistry | None = None,
        loss: TrainingLoss | None = None,
        eval_runtime: RolloutRuntime | None = None,
    ) -> None:
        """``loss``: the loss the recipe already resolved from the config (resolved here when not given);
        ``eval_runtime``: the runtime instance of `eval.options`' held-out tasks (None: the training one's)."""
        t = config.training
        super().__init__(
            run_dir,
            policy.training_client,
            observers,
            total_steps=t.max_steps,
            save_every=t.save_every,
            stop=stop,
        )
        self.resources = resources
        self.config = config
        self.policy = policy
        self.runtime = runtime
        self.renderer = renderer
        self.step_log = StepLog(run_dir, observers, renderer, full_transcripts=config.output.trace == "full")
        self.loss = loss if loss is not None else TrainingLoss.of(t.loss, t.loss_config)
        self.adam = t.adam_params(t.learning_rate)
        self._scheduler: RolloutScheduler | None = None
        self._progress: asyncio.Task[None] | None = None
        self.eval_runtime = eval_runtime
        self.evals = EvalLog(run_dir.root)
        self._evaluator: Evaluator | None = None

    async def load_checkpoint(self, checkpoint: Checkpoint) -> None:
        await self.policy.load_state_with_optimizer(checkpoint.path)

    def policy_version(self) -> int:
        return self.policy.version

    def rewind(self, step: int) -> None:
        super().rewind(step)
        # The policy at the checkpoint is the one those evaluations measured (at 0, when the run starts over: a
        # fresh LoRA with the same seed, the base model evaluated there).
        self.evals.keep_up_to(step)

    async def begin(self, start: int) -> None:
        t, s = self.config.training, self.config.sampling
        sampling = SamplingDefaults(s.temperature, s.top_p, s.max_tokens, self.config.model.max_seq_len)
        tasks, held_out = await eval_tasks(self.config, self.runtime, self.eval_runtime)
        self._scheduler = RolloutScheduler(
            self.runtime,
            tasks,
            make_llm=llm_maker(self.renderer, self.policy, sampling, self.policy.sampling_failed),
            version=lambda: self.policy.version,
            group_size=t.group_size,
            groups_per_step=t.groups_per_step,
            max_concurrent=t.max_concurrent_rollouts,
            attempt_timeout=t.attempt_timeout_seconds,
            seed=t.seed,
            max_staleness=t.max_staleness,
            stale_policy=t.stale_policy,
            resources=self.resources,
            on_attempt=self.step_log.attempt_finished,
            reward_range=(t.reward_min, t.reward_max),
        )
        if self.config.eval.enabled:
            self._evaluator = Evaluator(
                self.config,
                self.eval_runtime or self.runtime,
                held_out,
                log=self.evals,
                policy=self.policy,
                renderer=self.renderer,
                resources=self.resources,
                watchdog=self._scheduler.watchdog,
                on_sampling_error=self.policy.sampling_failed,
                full_transcripts=self.config.output.trace == "full",
            )
        await self.policy.publish()
        if t.mode == "async":
            self._scheduler.start(start, t.max_steps)
        self._progress = asyncio.create_task(self._report_progress(self._scheduler))

    async def end(self) -> None:
        if self._progress is not None:
            self._progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._progress
        if self._scheduler is not None:
            await self._scheduler.close()

    async def evaluate(self, step: int) -> dict[str, Any]:
        """The `eval/*` metrics of the policy after ``step`` steps: recorded ones (a resumed run), or measured
        now, recorded and given to the observers (`on_eval`)."""
        assert self._evaluator is not None, "begin() creates the evaluator"
        record = self.evals.recorded(step)
        if record is None:
            record = await self._evaluator.evaluate(step)
            self.observers.emit(record)
            if self.policy.lost is not None:
                raise self.policy.lost
        return {k: v for k, v in record.metrics.items() if k.startswith(("eval/", "time/eval"))}

    async def when_completed(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        if self._evaluator is None or not self.config.eval.at_end:
            return metrics
        return {**metrics, **(await self.evaluate(step))}

    def trained_nothing(self) -> str | None:
        scheduler = self._scheduler
        if scheduler is None or not scheduler.finished_attempts:
            return None
        discarded = scheduler.stats.discarded
        if discarded.total() < scheduler.finished_attempts:
            return None
        (reason, _), *_ = discarded.most_common(1)
        counts = ", ".join(f"{n} {why}" for why, n in discarded.most_common())
        detail = scheduler.stats.first_detail.get(reason, "").strip().splitlines()
        said = f"; the first {reason}: {detail[0][:300]}" if detail else ""
        return f"no step trained: all {scheduler.finished_attempts} attempts were discarded ({counts}){said}"

    async def train_step(self, step: int) -> StepRecord:
        scheduler = self._scheduler
        assert scheduler is not None, "begin() creates the scheduler"
        # Before the step samples: the policy evaluated is the one this step's rollouts sample.
        evaluated = await self.evaluate(step) if eval_due(self.config.eval, step) else {}
        counted = self.sampler_counters()
        step_started = time.perf_counter()
        groups = await (
            scheduler.next_groups(step)
            if self.config.training.mode == "async"
            else scheduler.collect_sync(step)
        )
        rollout_s = time.perf_counter() - step_started
        if self.policy.lost is not None:  # its attempts were discarded; so would all later ones be
            raise self.policy.lost
        training = await self._train(groups)
        scheduler.step_finished()
        record = self.step_log.record(
            step,
            groups,
            training,
            scheduler,
            policy_version=self.policy.version,
            rollout_s=rollout_s,
            step_started=step_started,
        )
        return record.with_metrics({**_counted_since(counted, self.sampler_counters()), **evaluated})

    async def _train(self, groups: list[GroupResult]) -> StepTraining:
        """GRPO over the step's groups, one optimizer step over the datums it keeps, and the publish."""
        datums, stats = step_datums(groups)
        if not datums:
            return StepTraining(datums, stats, {})
        started = time.perf_counter()
        metrics = await self.policy.train_step(datums, loss=self.loss, adam=self.adam)
        train_s = time.perf_counter() - started
        publish_s = await self.policy.publish()
        return StepTraining(datums, stats, metrics, train_s, publish_s)

    async def _report_progress(self, scheduler: RolloutScheduler) -> None:
        every = self.config.output.progress_every_seconds
        while True:
            await asyncio.sleep(every)
            self.observers.emit(
                ProgressTick(
                    attempts_done=scheduler.finished_attempts,
                    in_flight=scheduler.in_flight,
                    policy_version=self.policy.version,
                )
            )


def _counted_since(before: Mapping[str, int] | None, after: Mapping[str, int] | None) -> dict[str, int]:
    """A step's prompt tokens the sampler prefilled, and those it served from its prefix cache (the embedded
    Loops only): `sampler/prefill_tokens`, `sampler/prefix_cached_tokens`."""
    if before is None or after is None:
        return {}
    return {f"sampler/{k}": after[k] - before.get(k, 0) for k in after}

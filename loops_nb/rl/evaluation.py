"""RL evaluation: the policy's attempts on eval tasks, scored and recorded, never trained.

An evaluation runs through the same runtime, agent and `RolloutScheduler` path as training, with the eval's
own sampling and seeds; nothing here holds a training client, so its attempts never become datums. Which
tasks, the metrics and the files: docs/reference/training_loop.md#evaluation.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loops_nb.errors import UserError
from loops_nb.llm.client import PolicySource, SamplingDefaults
from loops_nb.rl.config import RLConfig, RLEvalConfig
from loops_nb.rl.loop_watchdog import LoopWatchdog
from loops_nb.rl.scheduler import AttemptRecord, RolloutScheduler, llm_maker
from loops_nb.rl.step_log import AttemptView
from loops_nb.run_dir import JsonlLog, atomic_write_json
from loops_nb.run_events import AttemptRow, EvalRecord
from loops_nb.runtime import RolloutRuntime, Task

if TYPE_CHECKING:
    from loops_nb.llm.renderer import Renderer
    from loops_nb.resources import ResourceRegistry


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of ``k`` attempts drawn from ``n`` (``c`` of them passing) passes: the
    unbiased estimator ``1 - C(n-c, k) / C(n, k)``."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_ks(attempts: int) -> list[int]:
    """The k of the pass@k an evaluation reports: 1 and the attempts per task."""
    return sorted({1, attempts})


def split_holdout(tasks: Sequence[Task], share: float, seed: int) -> tuple[list[Task], list[Task]]:
    """``(training tasks, held-out tasks)``: ``share`` of the tasks (at least one) held out, chosen by a hash of
    each task's id and ``seed``, so the split does not depend on the order `tasks()` returns them in."""
    if share <= 0:
        return list(tasks), []
    held_count = max(1, round(len(tasks) * share))
    if held_count >= len(tasks):
        raise UserError(
            f"eval.holdout = {share:g} of {len(tasks)} task(s) leaves none to train on; lower eval.holdout or "
            "give held-out tasks with eval.options"
        )
    ranked = sorted(tasks, key=lambda t: hashlib.sha256(f"{seed}:{t.id}".encode()).hexdigest())
    held = {t.id for t in ranked[:held_count]}
    return [t for t in tasks if t.id not in held], [t for t in tasks if t.id in held]


def choose_tasks(tasks: Sequence[Task], max_tasks: int | None, seed: int) -> list[Task]:
    """At most ``max_tasks`` of ``tasks`` (a seeded choice, kept in their order); all of them when unset."""
    if max_tasks is None or len(tasks) <= max_tasks:
        return list(tasks)
    chosen = set(random.Random(f"eval:{seed}").sample(range(len(tasks)), max_tasks))
    return [t for i, t in enumerate(tasks) if i in chosen]


async def eval_tasks(
    config: RLConfig, runtime: RolloutRuntime, eval_runtime: RolloutRuntime | None
) -> tuple[list[Task], list[Task]]:
    """``(training tasks, eval tasks)``: a second runtime instance's tasks (`eval.options`), a `holdout` share of
    the training tasks (which training then never samples), or the training tasks; at most `max_tasks`."""
    settings = config.eval
    tasks = list(await runtime.tasks())
    training, held = split_holdout(tasks, settings.holdout, config.training.seed)
    if eval_runtime is not None:
        held = list(await eval_runtime.tasks())
    elif settings.holdout <= 0:
        held = list(training)
    if not held and settings.enabled:
        raise UserError(f"eval: the runtime {config.runtime.factory} gave no eval tasks (eval.options)")
    return training, choose_tasks(held, settings.max_tasks, settings.seed)


def held_out_options(config: RLConfig) -> dict[str, object]:
    """The options of the held-out runtime instance: `runtime.options` updated by `eval.options`."""
    return {**config.runtime.options, **(config.eval.options or {})}


def eval_sampling(config: RLConfig) -> SamplingDefaults:
    """The eval attempts' sampling settings: `[eval]`'s, falling back to `[sampling]`'s."""
    e, s = config.eval, config.sampling
    return SamplingDefaults(
        temperature=s.temperature if e.temperature is None else e.temperature,
        top_p=s.top_p if e.top_p is None else e.top_p,
        max_tokens=s.max_tokens if e.max_tokens is None else e.max_tokens,
        max_seq_len=config.model.max_seq_len,
    )


def describe_eval(config: RLConfig, training: int, held_out: int) -> tuple[str, list[str]]:
    """`loops check`'s line about the evaluation, and its warnings."""
    e, sampling = config.eval, eval_sampling(config)
    source = (
        "held-out runtime options"
        if e.options is not None
        else f"holdout {e.holdout:g} of the training tasks"
        if e.holdout
        else "the training tasks"
    )
    cadence = ", ".join(
        part
        for part in (
            "the base model" if e.at_start else "",
            f"every {e.every} steps" if e.every else "",
            "the end" if e.at_end else "",
        )
        if part
    )
    line = (
        f"eval: {held_out} task(s) ({source}; {training} train) x {e.attempts} attempt(s), "
        f"{'greedy' if sampling.temperature == 0 else f'temperature {sampling.temperature:g}'}, "
        f"pass@{', pass@'.join(map(str, pass_ks(e.attempts)))}; "
        + (f"at {cadence}" if e.enabled and cadence else "off during training (loops eval only)")
    )
    warnings = []
    if sampling.temperature == 0 and e.attempts > 1:
        warnings.append(
            f"eval.attempts = {e.attempts} at temperature 0: greedy attempts of a task sample the same "
            "completion, so pass@k equals pass@1; use eval.attempts = 1, or a temperature above 0"
        )
    return line, warnings


def eval_due(settings: RLEvalConfig, step: int) -> bool:
    """Whether an evaluation runs before step ``step`` samples (``step`` steps applied)."""
    if not settings.enabled:
        return False
    if step == 0:
        return settings.at_start
    return bool(settings.every) and step % settings.every == 0


def summarize(
    records: Sequence[AttemptRecord], tasks: Sequence[Task], settings: RLEvalConfig
) -> dict[str, Any]:
    """The `eval/*` metrics of an evaluation's attempts."""
    by_task: dict[str, list[AttemptRecord]] = {t.id: [] for t in tasks}
    for r in records:
        by_task.setdefault(r.attempt.task.id, []).append(r)
    rewards = [float(r.evidence.reward) for r in records if r.kept and r.evidence.reward is not None]
    discarded = Counter(r.evidence.discarded for r in records if r.evidence.discarded)
    metrics: dict[str, Any] = {
        "eval/reward_mean": statistics.fmean(rewards) if rewards else None,
        "eval/reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else (0.0 if rewards else None),
    }
    for k in pass_ks(settings.attempts):
        values = [
            pass_at_k(len(rs), sum(_passed(r, settings) for r in rs), k)
            for rs in by_task.values()
            if len(rs) >= k
        ]
        metrics[f"eval/pass_at_{k}"] = statistics.fmean(values) if values else None
    metrics.update(
        {
            "eval/tasks": len(by_task),
            "eval/attempts": len(records),
            "eval/discarded": sum(discarded.values()),
            **{f"eval/discarded/{k}": v for k, v in sorted(discarded.items())},
            "eval/tokens_sampled": sum(r.capture.sampled_tokens for r in records),
        }
    )
    return metrics


def _passed(record: AttemptRecord, settings: RLEvalConfig) -> bool:
    reward = record.evidence.reward
    return record.kept and reward is not None and float(reward) >= settings.pass_threshold


@dataclass
class Evaluator:
    """Runs evaluations of ``policy`` (the run's current one, or a checkpoint's) on ``tasks`` through ``runtime``,
    with the config's `[eval]` settings and `[training]`'s concurrency, timeout and reward range, and records
    each in ``log``."""

    config: RLConfig
    runtime: RolloutRuntime
    tasks: Sequence[Task]
    _: KW_ONLY
    log: EvalLog
    policy: PolicySource
    renderer: Renderer
    resources: ResourceRegistry | None = None
    watchdog: LoopWatchdog | None = None
    """A watchdog the run shares (it stops it); None: each evaluation's scheduler has and stops its own."""
    on_sampling_error: Callable[[Exception], None] | None = None
    full_transcripts: bool = True

    async def evaluate(self, step: int) -> EvalRecord:
        """Evaluate the current policy, which has had ``step`` optimizer steps (0: the base model), and record it."""
        started = time.perf_counter()
        settings, t, sampling = self.config.eval, self.config.training, eval_sampling(self.config)
        scheduler = RolloutScheduler(
            self.runtime,
            self.tasks,
            make_llm=llm_maker(self.renderer, self.policy, sampling, self.on_sampling_error),
            version=lambda: self.policy.version,
            group_size=settings.attempts,
            groups_per_step=len(self.tasks),
            max_concurrent=t.max_concurrent_rollouts,
            attempt_timeout=t.attempt_timeout_seconds,
            seed=settings.seed,
            resources=self.resources,
            reward_range=(t.reward_min, t.reward_max),
            watchdog=self.watchdog or LoopWatchdog(),
        )
        version = self.policy.version
        try:
            # Slot 0 at every evaluation: the same attempt seeds each time, so evaluations differ by policy.
            groups = await asyncio.gather(*(scheduler.run_group(0, g, t) for g, t in enumerate(self.tasks)))
        finally:
            if self.watchdog is None:  # a watchdog the run shares is the run's to stop
                await scheduler.close()
        views = [(g, AttemptView(a, trained=False)) for g in groups for a in g.attempts]
        records = [view.record for _, view in views]
        metrics = {
            "eval/policy_version": version,
            **summarize(records, self.tasks, settings),
            "time/eval_s": round(time.perf_counter() - started, 3),
        }
        rows, transcripts = [], []
        for group, view in views:
            row = view.row(step, group)
            row["passed"] = _passed(view.record, settings)
            rows.append(row)
            transcripts.append(view.transcript(self.renderer, full=self.full_transcripts))
        return self.log.write(step, metrics, rows, transcripts)


class EvalLog:
    """A directory's `evals.jsonl` (one line per evaluation), `eval_attempts.jsonl` and eval transcripts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.evals = JsonlLog(root / "evals.jsonl")
        self.attempts = JsonlLog(root / "eval_attempts.jsonl")

    def recorded(self, step: int) -> EvalRecord | None:
        """The evaluation after ``step`` steps, if one was recorded."""
        return next((r for r in self.records() if r.step == step), None)

    def records(self) -> list[EvalRecord]:
        return [EvalRecord.from_json(line) for line in self.evals.records()]

    def write(
        self,
        step: int,
        metrics: dict[str, Any],
        attempts: list[AttemptRow],
        transcripts: list[dict[str, Any]],
    ) -> EvalRecord:
        """Record an evaluation: its attempts and transcript first, its evals.jsonl line (what marks it
        done) last, so a crash in between leaves it to be redone, never half-recorded."""
        self.attempts.extend(attempts)
        atomic_write_json(self.root / "transcripts" / f"eval-{step:06d}.json", transcripts)
        record = EvalRecord(step, metrics, time.time())
        self.evals.append(record.to_json())
        return record

    def keep_up_to(self, step: int) -> None:
        """Forget the evaluations of policies past ``step`` steps (a resume redoes those steps)."""
        self.evals.keep(lambda r: r.get("step", 0) <= step)
        recorded = {r["step"] for r in self.evals.records()}
        # Attempts of an evaluation whose evals.jsonl line never made it are redone with it.
        self.attempts.keep(lambda r: r.get("step", 0) in recorded)

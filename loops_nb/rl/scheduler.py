"""Rollout scheduling: groups of attempts per task, bounded concurrency, sync or async.

- `sync`: a step's groups are sampled with the current policy, then trained on, then the new policy
  is published before the next step samples.
- `async`: sampling continues while the trainer trains. A group may lag the trainer by at most
  `max_staleness` policy versions. `pace`: a step's groups start only once the trainer is close
  enough, so none is ever too stale. `requeue`: groups start as soon as there is room and are taken in
  the order they finish; one that turns out too stale is dropped and its task attempted again.

Attempts that raise or time out are kept with their reason (never crash the run) and do not train.
Task order is a pure function of (seed, step), so a resumed run sees the same tasks.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import ContextTooLong, LoopsLLM
from loops_nb.runtime import Attempt, AttemptServices, Evidence, RolloutRuntime, Task


@dataclass
class AttemptRecord:
    """One finished attempt: its evidence and its exact tokens."""

    attempt: Attempt
    evidence: Evidence
    capture: TokenCapture
    seconds: float

    @property
    def kept(self) -> bool:
        return self.evidence.discarded is None

    @property
    def min_version(self) -> int:
        versions = self.capture.policy_versions
        return min(versions) if versions else self.attempt.policy_version


@dataclass
class GroupResult:
    slot: int
    """The step the group was planned for."""
    group: int
    task: Task
    attempts: list[AttemptRecord]

    @property
    def min_version(self) -> int:
        return min((a.min_version for a in self.attempts), default=0)


@dataclass
class SchedulerStats:
    stale_requeued: int = 0
    paced_seconds: float = 0.0
    discarded: Counter[str] = field(default_factory=Counter)


MakeLLM = Callable[[TokenCapture, int], LoopsLLM]


class RolloutScheduler:
    def __init__(
        self,
        runtime: RolloutRuntime,
        tasks: Sequence[Task],
        *,
        make_llm: MakeLLM,
        version: Callable[[], int],
        group_size: int,
        groups_per_step: int,
        max_concurrent: int,
        attempt_timeout: float,
        seed: int,
        mode: str = "sync",
        max_staleness: int = 1,
        stale_policy: str = "requeue",
        resources: Any = None,
        on_attempt: Callable[[AttemptRecord], None] | None = None,
    ) -> None:
        self.runtime = runtime
        self.tasks = list(tasks)
        self.make_llm = make_llm
        self.version = version
        self.group_size = group_size
        self.groups_per_step = groups_per_step
        self.attempt_timeout = attempt_timeout
        self.seed = seed
        self.mode = mode
        self.max_staleness = max_staleness
        self.stale_policy = stale_policy
        self.resources = resources
        self.on_attempt = on_attempt
        self.stats = SchedulerStats()
        self._slots = asyncio.Semaphore(max_concurrent)
        self._done: asyncio.Queue[GroupResult] = asyncio.Queue()
        self._by_slot: dict[int, list[GroupResult]] = {}
        self._producer: asyncio.Task[None] | None = None
        self._version_changed = asyncio.Event()
        self._running: set[asyncio.Task[Any]] = set()
        self.in_flight = 0
        self.finished_attempts = 0

    # -- planning -----------------------------------------------------------------------------
    def plan(self, step: int) -> list[Task]:
        """The tasks of a step's groups: a shuffled pass over the tasks, reproducible from (seed, step)."""
        per_epoch = len(self.tasks)
        first = step * self.groups_per_step
        out = []
        for i in range(first, first + self.groups_per_step):
            epoch, pos = divmod(i, per_epoch)
            order = list(range(per_epoch))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            out.append(self.tasks[order[pos]])
        return out

    def attempt_seed(self, slot: int, group: int, index: int, retry: int = 0) -> int:
        return random.Random(f"{self.seed}:{slot}:{group}:{index}:{retry}").randrange(2**31)

    # -- running ------------------------------------------------------------------------------
    async def run_group(self, slot: int, group: int, task: Task, retry: int = 0) -> GroupResult:
        attempts = await asyncio.gather(
            *(self._run_attempt(slot, group, i, task, retry) for i in range(self.group_size))
        )
        return GroupResult(slot, group, task, list(attempts))

    async def _run_attempt(self, slot: int, group: int, index: int, task: Task, retry: int) -> AttemptRecord:
        seed = self.attempt_seed(slot, group, index, retry)
        capture = TokenCapture()
        async with self._slots:
            self.in_flight += 1
            started = time.perf_counter()
            llm = self.make_llm(capture, seed)
            attempt = Attempt(
                task, group, index, seed, self.version(), AttemptServices(llm, capture, self.resources)
            )
            evidence = await self._evidence(attempt)
            self.in_flight -= 1
        if evidence.discarded is None:
            if not capture.calls:
                evidence = Evidence.discard("no_model_calls", "the attempt never called the model")
            elif evidence.reward is None or not math.isfinite(evidence.reward):
                evidence = Evidence.discard("no_reward", f"reward was {evidence.reward!r}")
        if evidence.discarded:
            self.stats.discarded[evidence.discarded] += 1
        record = AttemptRecord(attempt, evidence, capture, time.perf_counter() - started)
        self.finished_attempts += 1
        if self.on_attempt is not None:
            self.on_attempt(record)
        return record

    async def _evidence(self, attempt: Attempt) -> Evidence:
        try:
            return await asyncio.wait_for(self.runtime.run_attempt(attempt), self.attempt_timeout)
        except TimeoutError:
            return Evidence.discard("timeout", f"no result within {self.attempt_timeout:g} s")
        except ContextTooLong as exc:
            return Evidence.discard("truncated", str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return Evidence.discard("error", f"{type(exc).__name__}: {exc}")

    # -- sync ---------------------------------------------------------------------------------
    async def collect_sync(self, step: int) -> list[GroupResult]:
        tasks = self.plan(step)
        return list(await asyncio.gather(*(self.run_group(step, g, t) for g, t in enumerate(tasks))))

    # -- async --------------------------------------------------------------------------------
    def start(self, first_step: int, last_step: int) -> None:
        """Begin sampling ahead for steps first_step..last_step-1 (async mode)."""
        self._producer = asyncio.create_task(self._produce(first_step, last_step))

    def policy_published(self) -> None:
        self._version_changed.set()

    async def _wait_for_version(self, at_least: int) -> None:
        started = time.perf_counter()
        while self.version() < at_least:
            self._version_changed.clear()
            await self._version_changed.wait()
        self.stats.paced_seconds += time.perf_counter() - started

    async def _produce(self, first_step: int, last_step: int) -> None:
        for slot in range(first_step, last_step):
            # A slot's groups start only when the policy is at most max_staleness versions behind it.
            # In `requeue` mode one extra step of look-ahead is allowed; stale groups are re-run.
            lead = self.max_staleness + (1 if self.stale_policy == "requeue" else 0)
            await self._wait_for_version(slot - lead)
            for g, task in enumerate(self.plan(slot)):
                self._spawn(slot, g, task, 0)

    def _spawn(self, slot: int, group: int, task: Task, retry: int) -> None:
        job = asyncio.create_task(self.run_group(slot, group, task, retry))
        self._running.add(job)

        def finished(t: asyncio.Task[GroupResult]) -> None:
            self._running.discard(t)
            if not t.cancelled() and t.exception() is None:
                self._done.put_nowait(t.result())

        job.add_done_callback(finished)

    async def next_groups(self, step: int) -> list[GroupResult]:
        """The groups step `step` trains on (async mode)."""
        if self._producer is not None and self._producer.done() and self._producer.exception():
            raise self._producer.exception()  # type: ignore[misc]
        wanted = self.groups_per_step
        if self.stale_policy == "pace":
            while len(self._by_slot.get(step, [])) < wanted:
                result = await self._done.get()
                self._by_slot.setdefault(result.slot, []).append(result)
            return self._by_slot.pop(step)
        taken: list[GroupResult] = []
        while len(taken) < wanted:
            result = await self._done.get()
            if self.version() - result.min_version > self.max_staleness:
                self.stats.stale_requeued += 1
                self._spawn(result.slot, result.group, result.task, retry=1 + self.stats.stale_requeued)
                continue
            taken.append(result)
        return taken

    async def close(self) -> None:
        jobs = [j for j in [self._producer, *self._running] if j is not None]
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)

"""Rollout scheduling: groups of attempts per task, bounded concurrency, sync or async
(docs/reference/scheduling.md).

Attempts that raise, time out, block the event loop or return what cannot train are kept with their reason
and do not train (`rl/attempt_boundary.py`); task order is a pure function of (seed, step), so a resumed run
sees the same tasks.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

from loops_nb.discard_reason import DiscardReason
from loops_nb.errors import LoopsNbError
from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import ContextTooLong, LoopsLLM, PolicySource, SamplingDefaults
from loops_nb.rl.attempt_boundary import checked_evidence
from loops_nb.rl.loop_watchdog import LoopWatchdog
from loops_nb.runtime import Attempt, AttemptServices, Evidence, RolloutRuntime, Task

if TYPE_CHECKING:
    from loops_nb.llm.renderer import Renderer
    from loops_nb.resources import ResourceRegistry

log = logging.getLogger(__name__)


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
    discarded: Counter[str] = field(default_factory=Counter)
    first_detail: dict[str, str] = field(default_factory=dict)
    """Each discard reason's first detail, for a run that must say why it trained nothing."""


MakeLLM = Callable[[TokenCapture, int], LoopsLLM]


def llm_maker(
    renderer: Renderer,
    policy: PolicySource,
    sampling: SamplingDefaults,
    on_sampling_error: Callable[[Exception], None] | None = None,
) -> MakeLLM:
    """Each attempt's `LoopsLLM`: ``policy``'s current sampling client, with the attempt's capture and seed."""
    return lambda capture, seed: LoopsLLM(
        renderer, policy, capture, sampling, seed=seed, on_sampling_error=on_sampling_error
    )


@dataclass(eq=False)
class RolloutScheduler:
    runtime: RolloutRuntime
    tasks: Sequence[Task]
    _: KW_ONLY
    make_llm: MakeLLM
    version: Callable[[], int]
    group_size: int
    groups_per_step: int
    max_concurrent: int
    attempt_timeout: float
    seed: int
    max_staleness: int = 1
    stale_policy: str = "requeue"
    resources: ResourceRegistry | None = None
    on_attempt: Callable[[AttemptRecord], None] | None = None
    reward_range: tuple[float, float] = (-1.0, 1.0)
    watchdog: LoopWatchdog = field(default_factory=LoopWatchdog)

    def __post_init__(self) -> None:
        self.stats = SchedulerStats()
        self._slots = asyncio.Semaphore(self.max_concurrent)
        self._done: asyncio.Queue[GroupResult] = asyncio.Queue()
        self._by_slot: dict[int, list[GroupResult]] = {}
        self._producer: asyncio.Task[None] | None = None
        self._version_changed = asyncio.Event()
        self._steps_done = 0
        """The policy version at `start` plus the steps finished since: the version the policy would have
        if every step had trained. A step that trains nothing (every group zero-variance) publishes no
        version, but sampling ahead must still move on, or the next slot would wait forever."""
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
            try:
                evidence = await self._evidence(attempt)
            finally:
                self.in_flight -= 1
        if evidence.discarded:
            for place in attempt.services.evidence_kept:
                if place not in evidence.detail:
                    evidence.detail += f"\n({place})"
            if (
                evidence.discarded == DiscardReason.INVALID_REWARD
                and DiscardReason.INVALID_REWARD not in self.stats.discarded
            ):
                log.warning("attempt %s is discarded: %s", attempt.id, evidence.detail)  # the first one
            self.stats.discarded[evidence.discarded] += 1
            self.stats.first_detail.setdefault(evidence.discarded, evidence.detail)
        record = AttemptRecord(attempt, evidence, capture, time.perf_counter() - started)
        self.finished_attempts += 1
        if self.on_attempt is not None:
            self.on_attempt(record)
        return record

    async def _evidence(self, attempt: Attempt) -> Evidence:
        """Run the attempt in a task of its own, timed without the loop blocks of other tasks."""
        self.watchdog.start()
        job = asyncio.ensure_future(_contained(self.runtime.run_attempt(attempt)))
        self.watchdog.label(job, attempt.id)
        started, timed_out = time.monotonic(), False
        try:
            while not job.done():
                used = time.monotonic() - started - self.watchdog.blocked_seconds(started, exclude=job)
                if used >= self.attempt_timeout:
                    timed_out = True
                    break
                await asyncio.wait({job}, timeout=self.attempt_timeout - used)
        finally:
            if not job.done():  # timed out, or the scheduler is closing
                job.cancel()
                await asyncio.wait({job})
        # Its own blocks are charged to it: one that held the loop past its timeout finished too late,
        # however it ended. A shorter block (a slow import) was reported, and the attempt trains.
        blocks = self.watchdog.blocks_by(job)
        used = time.monotonic() - started - self.watchdog.blocked_seconds(started, exclude=job)
        if blocks and used >= self.attempt_timeout:
            now = time.monotonic()
            worst = max(blocks, key=lambda b: b.seconds(now))
            return Evidence.discard(
                DiscardReason.BLOCKED_LOOP,
                f"ran past its {self.attempt_timeout:g} s timeout, {worst.seconds(now):.1f} s of it blocking "
                f"the event loop (freezing every other attempt) in {worst.where}: run blocking code with "
                "`await asyncio.to_thread(...)` (loops_nb.episodes.run_blocking)",
            )
        if timed_out:
            return Evidence.discard(DiscardReason.TIMEOUT, f"no result within {self.attempt_timeout:g} s")
        if job.cancelled():
            return Evidence.discard(
                DiscardReason.ERROR, "CancelledError: the attempt was cancelled from inside it"
            )
        exc = job.exception()
        if isinstance(exc, ContextTooLong):
            return Evidence.discard(DiscardReason.TRUNCATED, str(exc))
        if exc is not None:
            return Evidence.discard(DiscardReason.ERROR, f"{type(exc).__name__}: {exc}")
        return checked_evidence(
            job.result(),
            made_model_calls=bool(attempt.services.capture.calls),
            reward_range=self.reward_range,
            cut_off_calls=attempt.services.capture.cut_off,
        )

    # -- sync ---------------------------------------------------------------------------------
    async def collect_sync(self, step: int) -> list[GroupResult]:
        tasks = self.plan(step)
        return list(await asyncio.gather(*(self.run_group(step, g, t) for g, t in enumerate(tasks))))

    # -- async --------------------------------------------------------------------------------
    def start(self, first_step: int, last_step: int) -> None:
        """Begin sampling ahead for steps first_step..last_step-1 (async mode)."""
        self._steps_done = self.version()
        self._producer = asyncio.create_task(self._produce(first_step, last_step))

    def step_finished(self) -> None:
        """The learner is done with a step, trained (and published) or not: async pacing counts steps, not
        versions."""
        self._steps_done += 1
        self._version_changed.set()

    async def _wait_for_version(self, at_least: int) -> None:
        while max(self.version(), self._steps_done) < at_least:
            self._version_changed.clear()
            await self._version_changed.wait()

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
        if self._producer is not None and self._producer.done() and (failed := self._producer.exception()):
            raise failed
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
        self.watchdog.stop()
        jobs = [j for j in [self._producer, *self._running] if j is not None]
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)


class AttemptExited(LoopsNbError):
    """Agent code called `sys.exit()`: in the training process that would end the run, not the attempt."""


async def _contained(attempt: Awaitable[object]) -> object:
    # object, not Evidence: the attempt is user code, and `checked_evidence` checks what it returned.
    try:
        return await attempt
    except SystemExit as exc:
        raise AttemptExited(f"the attempt called sys.exit({exc.code!r})") from None

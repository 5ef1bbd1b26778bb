"""RolloutScheduler: groups, discards, deterministic plans, and the async staleness rules."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from polling import until

from loops_nb.llm.capture import ModelCall
from loops_nb.rl.scheduler import RolloutScheduler
from loops_nb.runtime import Attempt, Evidence, Task


class Clock:
    """A policy version the test moves by hand."""

    def __init__(self) -> None:
        self.version = 0


class FakeRuntime:
    """Records one model call at the attempt's policy version; tasks named 'raise'/'slow' misbehave."""

    def __init__(self, clock: Clock, delay: float = 0.0) -> None:
        self.clock = clock
        self.delay = delay
        self.started: list[tuple[str, int]] = []

    async def tasks(self):
        return [Task("t0"), Task("t1"), Task("t2")]

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        self.started.append((attempt.task.id, self.clock.version))
        if attempt.task.id == "raise":
            raise ValueError("agent bug")
        if attempt.task.id == "slow":
            await asyncio.sleep(10)
        await asyncio.sleep(self.delay)
        attempt.services.capture.record(ModelCall([1, 2], [3], [-0.5], self.clock.version, "stop"))
        return Evidence(reward=attempt.index / 2)

    async def close(self) -> None:
        pass


def settled(s: RolloutScheduler, runtime: FakeRuntime, started: int):
    """`started` attempts have started and every group the scheduler started has finished: sampling ahead
    is waiting for a policy version, so a slot started too early would have shown by now."""
    return lambda: len(runtime.started) >= started and not s._running


def scheduler(runtime, clock, tasks=None, **kw):
    # A timeout no attempt here reaches unless it means to (the 'slow' task): none is timed out for the
    # machine being slow.
    defaults = dict(group_size=3, groups_per_step=2, max_concurrent=4, attempt_timeout=60, seed=7)
    defaults.update(kw)
    return RolloutScheduler(
        runtime,
        tasks or [Task("t0"), Task("t1"), Task("t2")],
        make_llm=lambda capture, seed: None,  # the fake runtime never calls the model client
        version=lambda: clock.version,
        **defaults,
    )


async def test_sync_collects_groups_of_attempts():
    clock = Clock()
    s = scheduler(FakeRuntime(clock), clock)
    groups = await s.collect_sync(0)
    assert len(groups) == 2 and all(len(g.attempts) == 3 for g in groups)
    assert [a.evidence.reward for a in groups[0].attempts] == [0.0, 0.5, 1.0]
    assert all(a.kept for g in groups for a in g.attempts)


def test_plans_are_reproducible_and_cover_every_task_each_epoch():
    clock = Clock()
    s = scheduler(FakeRuntime(clock), clock)
    plan = [t.id for step in range(3) for t in s.plan(step)]
    assert plan == [t.id for step in range(3) for t in scheduler(FakeRuntime(clock), clock).plan(step)]
    assert sorted(plan[:3]) == ["t0", "t1", "t2"] and sorted(plan[3:6]) == ["t0", "t1", "t2"]
    assert s.attempt_seed(1, 0, 2) == s.attempt_seed(1, 0, 2) != s.attempt_seed(1, 0, 1)


async def test_failing_and_slow_attempts_are_discarded_with_their_reason():
    clock = Clock()
    s = scheduler(
        FakeRuntime(clock), clock, tasks=[Task("raise"), Task("slow")], groups_per_step=2, attempt_timeout=0.5
    )
    groups = await s.collect_sync(0)
    reasons = {g.task.id: {a.evidence.discarded for a in g.attempts} for g in groups}
    assert reasons == {"raise": {"error"}, "slow": {"timeout"}}
    assert (
        "ValueError: agent bug"
        in groups[[g.task.id for g in groups].index("raise")].attempts[0].evidence.detail
    )
    assert s.stats.discarded == {"error": 3, "timeout": 3}


async def test_async_pace_never_starts_a_step_further_ahead_than_max_staleness():
    clock = Clock()
    runtime = FakeRuntime(clock)
    s = scheduler(runtime, clock, max_staleness=1, stale_policy="pace")
    s.start(0, 4)
    first = await s.next_groups(0)
    await until(settled(s, runtime, 2 * 2 * 3), "slots 0 and 1 have run")
    # Version 0: slots 0 and 1 may start, slot 2 (needs version >= 1) may not.
    assert {g.slot for g in first} == {0}
    assert len(runtime.started) == 2 * 2 * 3
    clock.version = 1
    s.step_finished()  # trained and published
    second = await s.next_groups(1)
    await until(settled(s, runtime, 3 * 2 * 3), "slot 2 has run")
    assert {g.slot for g in second} == {1}
    assert len(runtime.started) == 3 * 2 * 3  # slot 2 started once version 1 was published, slot 3 not
    assert all(clock.version - g.min_version <= 1 for g in first + second)
    await s.close()


async def test_async_pace_moves_on_after_a_step_that_trained_nothing():
    # A step whose groups all have zero variance trains nothing and publishes no version; sampling ahead
    # must still start the next slot (it used to wait for a version that never came, and the run hung).
    clock = Clock()
    runtime = FakeRuntime(clock)
    s = scheduler(runtime, clock, max_staleness=1, stale_policy="pace")
    s.start(0, 4)
    await s.next_groups(0)
    s.step_finished()  # step 0 trained nothing: the version stays 0
    second = await asyncio.wait_for(s.next_groups(1), 60)
    await until(settled(s, runtime, 3 * 2 * 3), "slot 2 has run")
    assert {g.slot for g in second} == {1}
    assert len(runtime.started) == 3 * 2 * 3  # slot 2 started without a new version
    s.step_finished()
    third = await asyncio.wait_for(s.next_groups(2), 60)
    assert {g.slot for g in third} == {2} and clock.version == 0
    await s.close()


async def test_async_requeue_drops_groups_that_got_too_stale_and_reruns_their_task():
    clock = Clock()
    runtime = FakeRuntime(clock, delay=0.01)
    s = scheduler(runtime, clock, max_staleness=0, stale_policy="requeue")
    s.start(0, 3)
    # Slot 0 and slot 1 (one step of look-ahead) finish at version 0.
    await until(settled(s, runtime, 2 * 2 * 3), "slots 0 and 1 have run")
    clock.version = 1
    s.step_finished()  # trained and published
    groups = await s.next_groups(1)
    assert s.stats.stale_requeued >= 2
    assert all(clock.version - g.min_version <= 0 for g in groups)
    await s.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_close_cancels_outstanding_work(mode):
    """close() cancels the attempts sampling ahead (async) instead of waiting out their 5 s, and stops the
    loop watchdog's thread, which otherwise outlives the run on a loop that keeps running (a notebook's)."""
    clock = Clock()
    runtime = FakeRuntime(clock, delay=5 if mode == "async" else 0)
    s = scheduler(runtime, clock)
    if mode == "async":
        s.start(0, 10)
        await until(lambda: s.in_flight == 4, "max_concurrent attempts are running")
    else:
        await s.collect_sync(0)
    watchdog = s.watchdog._thread
    assert watchdog is not None and watchdog.is_alive()
    await s.close()
    assert s.in_flight == 0
    assert s.finished_attempts == (0 if mode == "async" else 2 * 3), "cancelled, not run to the end"
    if mode == "async":
        assert s._producer is not None and s._producer.cancelled()
    watchdog.join(60)
    assert not watchdog.is_alive()


class StuckSampler:
    """A sampling client that never answers (a loaded sampler past the agent's patience)."""

    version = 0

    @property
    def sampling_client(self) -> StuckSampler:
        return self

    async def sample_async(self, prompt, num_samples, sampling_params):
        await asyncio.Event().wait()


class StubRenderer:
    stop_token_ids = (0,)

    def render_prompt(self, messages, tools, previous):
        return [1, 2, 3], ()


class ImpatientAgent:
    """Gives up on its model call after its own timeout and returns a reward anyway; 'silent' never calls."""

    async def tasks(self):
        return [Task("impatient"), Task("silent")]

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        if attempt.task.id == "impatient":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(attempt.services.llm.chat([{"role": "user", "content": "hi"}]), 0.05)
        return Evidence(reward=0.0)

    async def close(self) -> None:
        pass


async def test_an_attempt_cut_off_in_its_model_call_is_a_timeout_not_no_model_calls():
    from loops_nb.llm.client import LoopsLLM

    clock = Clock()
    s = RolloutScheduler(
        ImpatientAgent(),
        [Task("impatient"), Task("silent")],
        make_llm=lambda capture, seed: LoopsLLM(StubRenderer(), StuckSampler(), capture),  # type: ignore[arg-type]
        version=lambda: clock.version,
        group_size=2,
        groups_per_step=2,
        max_concurrent=4,
        attempt_timeout=30,
        seed=7,
    )
    groups = await s.collect_sync(0)
    by_task = {g.task.id: g.attempts for g in groups}
    assert {a.evidence.discarded for a in by_task["impatient"]} == {"timeout"}
    assert all("cut off in flight" in a.evidence.detail for a in by_task["impatient"])
    assert all(a.capture.cut_off == 1 and not a.capture.calls for a in by_task["impatient"])
    assert {a.evidence.discarded for a in by_task["silent"]} == {"no_model_calls"}

"""The loop-lag watchdog: an attempt that blocks the event loop is reported with its stack and discarded,
and the attempts it froze are not charged for the time it held the loop."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from loops_nb.episodes import run_blocking
from loops_nb.llm.capture import ModelCall
from loops_nb.rl.scheduler import RolloutScheduler
from loops_nb.runtime import Attempt, Evidence, Task

BLOCK = 3.0
"""Longer than the watchdog's BLOCK_SECONDS (2 s) and than the attempts' timeout below."""


class OneBlocks:
    """`block` holds the loop with time.sleep; `ok` does its slow part in a thread, as it should."""

    async def tasks(self) -> list[Task]:
        return [Task("block"), Task("ok")]

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        attempt.services.capture.record(ModelCall([1, 2], [3], [-0.5], 0, "stop"))
        if attempt.task.id == "block":
            await asyncio.sleep(0.05)  # the others are in flight when it blocks
            time.sleep(BLOCK)
        else:
            await run_blocking(time.sleep, 0.5)
        return Evidence(reward=0.5)

    async def close(self) -> None:
        pass


async def test_a_blocking_attempt_is_reported_and_discarded_and_the_others_are_not_charged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = OneBlocks()
    scheduler = RolloutScheduler(
        runtime,
        await runtime.tasks(),
        make_llm=lambda capture, seed: None,
        version=lambda: 0,
        group_size=1,
        groups_per_step=4,
        max_concurrent=8,
        attempt_timeout=BLOCK - 0.5,
        seed=0,
    )
    caplog.set_level(logging.WARNING, logger="loops_nb.rl.loop_watchdog")
    try:
        block, *ok = await asyncio.gather(
            scheduler.run_group(0, 0, Task("block")),
            *(scheduler.run_group(0, g, Task("ok")) for g in (1, 2, 3)),
        )
    finally:
        await scheduler.close()
    assert [g.attempts[0].evidence.discarded for g in ok] == [None] * 3, [
        g.attempts[0].evidence.detail for g in ok
    ]
    assert block.attempts[0].evidence.discarded == "blocked_loop"
    detail = block.attempts[0].evidence.detail
    assert "time.sleep(BLOCK)" in detail and "asyncio.to_thread" in detail
    reports = [r.getMessage() for r in caplog.records if "is blocking the event loop" in r.getMessage()]
    assert reports and "attempt block/g0/a" in reports[0]
    assert "in run_attempt" in reports[0] and "time.sleep(BLOCK)" in reports[0], (
        "the stack of the blocked attempt"
    )

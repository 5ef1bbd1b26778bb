"""`episodes = "shared"`: one verifiers process (the driver's `serve`) for every attempt, on the fake driver.

It loads once for many attempts; an episode past its timeout is cancelled; one that blocks the whole
process, or a process that dies, ends the episodes in flight as discards with the cause, and the next
attempt starts a new process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import loops_nb.verifiers.episode_server as episode_server
from loops_nb.discard_reason import DiscardReason
from loops_nb.model_access import LeasedRuntime, ModelGateway
from loops_nb.rl.attempt_boundary import checked_evidence
from loops_nb.runtime import Attempt, AttemptServices, Evidence
from loops_nb.verifiers import VerifiersRuntime


async def attempt_of(runtime: VerifiersRuntime, gateway: ModelGateway, llm: Any, index: int = 0) -> Evidence:
    task = (await runtime.tasks())[0]
    evidence = await LeasedRuntime(runtime, gateway).run_attempt(
        Attempt(task, 0, index, 1, 0, AttemptServices(llm, llm.capture))
    )
    return checked_evidence(evidence, made_model_calls=bool(llm.capture.calls))


async def test_one_process_runs_every_attempt_with_each_attempts_lease(
    fake_runtime: Callable[..., VerifiersRuntime],
    gateway: ModelGateway,
    scripted: Callable[..., Any],
    tmp_path: Path,
) -> None:
    loads = tmp_path / "loads.txt"
    runtime = fake_runtime({"mode": "reward", "loads": str(loads)}, episodes="shared")
    try:
        llms = [scripted(f"reply {i}") for i in range(3)]
        results = await asyncio.gather(*(attempt_of(runtime, gateway, llm, i) for i, llm in enumerate(llms)))
    finally:
        await runtime.close()
    assert [r.reward for r in results] == [1.0, 1.0, 1.0], [r.detail for r in results]
    assert all(len(llm.capture.calls) == 1 for llm in llms), "each episode sampled through its own lease"
    assert loads.read_text().count("load") == 1, "the environment loaded once for three attempts"


async def test_a_timed_out_episode_is_cancelled_and_the_process_kept(
    fake_runtime: Callable[..., VerifiersRuntime],
    gateway: ModelGateway,
    scripted: Callable[..., Any],
    tmp_path: Path,
) -> None:
    loads = tmp_path / "loads.txt"
    runtime = fake_runtime(
        {"mode": "hang", "loads": str(loads)}, episodes="shared", episode_timeout_seconds=1.0
    )
    try:
        first = await attempt_of(runtime, gateway, scripted("x"))
        second = await attempt_of(runtime, gateway, scripted("x"))
    finally:
        await runtime.close()
    assert first.discarded == second.discarded == DiscardReason.TIMEOUT
    assert loads.read_text().count("load") == 1


async def test_a_process_that_blocks_is_replaced(
    fake_runtime: Callable[..., VerifiersRuntime],
    gateway: ModelGateway,
    scripted: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(episode_server, "CANCEL_GRACE_SECONDS", 0.5)
    loads = tmp_path / "loads.txt"
    runtime = fake_runtime(
        {"mode": "block", "loads": str(loads)}, episodes="shared", episode_timeout_seconds=1.0
    )
    try:
        first = await attempt_of(runtime, gateway, scripted("x"))
        second = await attempt_of(runtime, gateway, scripted("x"))
    finally:
        await runtime.close()
    assert first.discarded == second.discarded == DiscardReason.TIMEOUT
    assert loads.read_text().count("load") == 2, "a process that did not answer its cancel was replaced"


async def test_a_process_that_dies_discards_its_episodes_with_the_cause(
    fake_runtime: Callable[..., VerifiersRuntime], gateway: ModelGateway, scripted: Callable[..., Any]
) -> None:
    runtime = fake_runtime({"mode": "die"}, episodes="shared")
    try:
        result = await attempt_of(runtime, gateway, scripted("x"))
    finally:
        await runtime.close()
    assert result.discarded == DiscardReason.ERROR
    assert "was killed by signal 9" in result.detail


async def test_a_shared_process_that_cannot_load_discards_with_its_reason(
    fake_runtime: Callable[..., VerifiersRuntime], gateway: ModelGateway, scripted: Callable[..., Any]
) -> None:
    runtime = fake_runtime({"serve": "load_fail"}, episodes="shared")
    result = await attempt_of(runtime, gateway, scripted("x"))
    await runtime.close()
    assert result.discarded == DiscardReason.ERROR
    assert "could not load: environment 'fake-env' cannot load offline" in result.detail

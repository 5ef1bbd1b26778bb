"""`episodes = "shared"`: one verifiers process (the driver's `serve`) for every attempt, on the fake driver.

It loads once for many attempts (its ready line lists the tasks: no `list` process); an episode past its timeout is cancelled; one that blocks the whole
process, or a process that dies, ends the episodes in flight as discards with the cause, and the next
attempt starts a new process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import loops_nb.verifiers.episode_server as episode_server
from loops_nb.discard_reason import DiscardReason
from loops_nb.errors import UserError
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


def loads(tmp_path: Path) -> int:
    """How many times the fake driver loaded the environment (`list` or `serve`)."""
    return (tmp_path / "loads.txt").read_text().count("load")


@pytest_asyncio.fixture(loop_scope="function")  # close() runs on the loop that started the process
async def shared(
    fake_runtime: Callable[..., VerifiersRuntime], tmp_path: Path
) -> AsyncIterator[Callable[..., VerifiersRuntime]]:
    """`episodes = "shared"` on the fake driver, its loads counted (`loads`), each runtime closed after the test."""
    made: list[VerifiersRuntime] = []

    def make(env_args: dict[str, Any], **options: Any) -> VerifiersRuntime:
        made.append(
            fake_runtime({**env_args, "loads": str(tmp_path / "loads.txt")}, episodes="shared", **options)
        )
        return made[-1]

    yield make
    for runtime in made:
        await runtime.close()


async def test_one_process_lists_and_runs_every_attempt_with_each_attempts_lease(
    shared: Callable[..., VerifiersRuntime],
    gateway: ModelGateway,
    scripted: Callable[..., Any],
    tmp_path: Path,
) -> None:
    runtime = shared({"mode": "reward"})
    llms = [scripted(f"reply {i}") for i in range(3)]
    results = await asyncio.gather(*(attempt_of(runtime, gateway, llm, i) for i, llm in enumerate(llms)))
    assert [r.reward for r in results] == [1.0, 1.0, 1.0], [r.detail for r in results]
    assert all(len(llm.capture.calls) == 1 for llm in llms), "each episode sampled through its own lease"
    assert loads(tmp_path) == 1, "the environment loaded once (no `list` process) for three attempts"
    assert [t.id for t in await runtime.tasks()] == ["task-0", "task-1", "task-2"]


async def test_a_timed_out_episode_is_cancelled_and_the_process_kept(
    shared: Callable[..., VerifiersRuntime],
    gateway: ModelGateway,
    scripted: Callable[..., Any],
    tmp_path: Path,
) -> None:
    runtime = shared({"mode": "hang"}, episode_timeout_seconds=1.0)
    first = await attempt_of(runtime, gateway, scripted("x"))
    second = await attempt_of(runtime, gateway, scripted("x"))
    assert first.discarded == second.discarded == DiscardReason.TIMEOUT
    assert loads(tmp_path) == 1


async def test_a_process_that_blocks_is_replaced(
    shared: Callable[..., VerifiersRuntime],
    gateway: ModelGateway,
    scripted: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(episode_server, "CANCEL_GRACE_SECONDS", 0.5)
    runtime = shared({"mode": "block"}, episode_timeout_seconds=1.0)
    first = await attempt_of(runtime, gateway, scripted("x"))
    second = await attempt_of(runtime, gateway, scripted("x"))
    assert first.discarded == second.discarded == DiscardReason.TIMEOUT
    assert loads(tmp_path) == 2, "a process that did not answer its cancel was replaced"


async def test_a_process_that_dies_discards_its_episodes_with_the_cause(
    shared: Callable[..., VerifiersRuntime], gateway: ModelGateway, scripted: Callable[..., Any]
) -> None:
    result = await attempt_of(shared({"mode": "die"}), gateway, scripted("x"))
    assert result.discarded == DiscardReason.ERROR
    assert "was killed by signal 9" in result.detail


async def test_a_shared_process_that_cannot_load_refuses_the_run_in_one_line(
    shared: Callable[..., VerifiersRuntime],
) -> None:
    with pytest.raises(UserError, match="cannot load: environment 'fake-env' cannot load offline"):
        await shared({"serve": "load_fail"}).tasks()


async def test_a_replacement_that_cannot_load_discards_with_its_reason(
    shared: Callable[..., VerifiersRuntime], gateway: ModelGateway, scripted: Callable[..., Any]
) -> None:
    runtime = shared({"mode": "die", "serve": "load_fail_again"})
    first = await attempt_of(runtime, gateway, scripted("x"))
    second = await attempt_of(runtime, gateway, scripted("x"))
    assert "was killed by signal 9" in first.detail
    assert second.discarded == DiscardReason.ERROR
    assert "could not load: environment 'fake-env' cannot load offline" in second.detail

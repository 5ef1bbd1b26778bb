"""Leases and `LeasedRuntime`: a key per attempt, valid only while it runs; truncation still discards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import ContextTooLong, LoopsLLM, SamplingDefaults
from loops_nb.model_access import (
    FILES_PER_ATTEMPT,
    LeasedRuntime,
    LeaseRegistry,
    ModelAccessMode,
    ModelGateway,
    model_access_of,
    model_env,
)
from loops_nb.runtime import Attempt, AttemptServices, Evidence, Task


class AgentOverHTTP:
    """A runtime whose 'agent' calls the gateway with its attempt's env, then reports what it saw."""

    model_access = ModelAccessMode.OPENAI_HTTP

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    async def tasks(self) -> Sequence[Task]:
        return [Task("t")]

    async def run_attempt(self, attempt: Attempt) -> Evidence:
        env = model_env(attempt)
        self.seen.append(env)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": f"Bearer {env['OPENAI_API_KEY']}"}
        async with httpx.AsyncClient(timeout=60, base_url=env["OPENAI_BASE_URL"], headers=headers) as http:
            r = await http.post("/chat/completions", json=body)
        return Evidence(reward=1.0 if r.status_code == 200 else 0.0, detail=r.text)

    async def close(self) -> None:
        pass


async def test_registry_issues_distinct_keys_and_refuses_revoked_ones() -> None:
    registry = LeaseRegistry()
    a = registry.issue("a", object())  # type: ignore[arg-type]
    b = registry.issue("b", object())  # type: ignore[arg-type]
    assert a.key != b.key and len(a.key) > 30
    assert registry.get(a.key) is a
    assert registry.revoke(a.key) is a
    assert registry.get(a.key) is None and registry.revoke(a.key) is None
    assert registry.get("made-up") is None
    assert len(registry) == 1


def test_modes_and_file_budget() -> None:
    assert model_access_of(object()) is ModelAccessMode.IN_PROCESS
    assert model_access_of(AgentOverHTTP()) is ModelAccessMode.OPENAI_HTTP

    class Wrapper:
        episode = AgentOverHTTP()

    assert model_access_of(Wrapper()) is ModelAccessMode.OPENAI_HTTP
    assert FILES_PER_ATTEMPT[ModelAccessMode.OPENAI_HTTP] > FILES_PER_ATTEMPT[ModelAccessMode.IN_PROCESS]


async def test_leased_runtime_gives_each_attempt_a_key_and_revokes_it(scripted: Any) -> None:
    inner = AgentOverHTTP()
    with ModelGateway() as gateway:
        runtime = LeasedRuntime(inner, gateway)
        assert model_access_of(runtime) is ModelAccessMode.OPENAI_HTTP
        llm, _ = scripted("Monopoly")
        attempt = Attempt(Task("t"), 0, 0, 1, 0, AttemptServices(llm, llm.capture))
        evidence = await runtime.run_attempt(attempt)
        assert evidence.reward == 1.0, evidence.detail
        assert attempt.services.model_base_url == gateway.url
        key = inner.seen[0]["OPENAI_API_KEY"]
        assert gateway.registry.get(key) is None, "the lease outlived its attempt"
        assert len(llm.capture.calls) == 1
        other, _ = scripted("Chess")
        await runtime.run_attempt(Attempt(Task("t"), 0, 1, 2, 0, AttemptServices(other, other.capture)))
        assert inner.seen[1]["OPENAI_API_KEY"] != key
        assert len(gateway.registry) == 0


async def test_context_too_long_is_a_400_and_discards_the_attempt_as_truncated(scripted: Any) -> None:
    inner = AgentOverHTTP()
    with ModelGateway() as gateway:
        llm, policy = scripted("never sampled")
        tight = LoopsLLM(llm.renderer, policy, TokenCapture(), SamplingDefaults(max_seq_len=5))
        attempt = Attempt(Task("t"), 0, 0, 1, 0, AttemptServices(tight, tight.capture))
        with pytest.raises(ContextTooLong):
            await LeasedRuntime(inner, gateway).run_attempt(attempt)
    assert not tight.capture.calls


def test_model_env_without_a_lease_explains_what_to_declare(scripted: Any) -> None:
    llm, _ = scripted()
    attempt = Attempt(Task("t"), 0, 0, 1, 0, AttemptServices(llm, llm.capture))
    with pytest.raises(RuntimeError, match="model_access"):
        model_env(attempt)


async def test_a_request_accepted_before_revocation_does_not_sample_after_it(scripted: Any) -> None:
    import asyncio

    from loops_nb.model_access import gateway as gateway_module
    from loops_nb.model_access.chat_wire import parse_chat_request
    from loops_nb.model_access.delivery import Exchange, LeaseEnded

    llm, policy = scripted("late")
    registry = LeaseRegistry()
    lease = registry.issue("t/g0/a0", llm)
    registry.revoke(lease.key)
    request = parse_chat_request({"messages": [{"role": "user", "content": "hi"}]})

    async def receive() -> Any:  # a client that stays connected
        await asyncio.Event().wait()

    exchange = Exchange(lease, lambda: gateway_module._sample(lease, request), lambda _: None)
    with pytest.raises(LeaseEnded):
        await exchange.run(receive)
    assert not llm.capture.calls and not policy.prompts


def test_the_open_file_check_counts_more_per_attempt_for_agent_processes(monkeypatch: Any) -> None:
    import resource

    from loops_nb.model_access import open_file_problem

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1 << 20))
    assert FILES_PER_ATTEMPT[ModelAccessMode.OPENAI_HTTP] > FILES_PER_ATTEMPT[ModelAccessMode.IN_PROCESS]
    assert open_file_problem(64, ModelAccessMode.IN_PROCESS) is None
    problem = open_file_problem(64, ModelAccessMode.OPENAI_HTTP)
    assert problem is not None and "ulimit -n" in problem


async def test_an_episode_reads_its_attempts_model_env_without_an_attempt(scripted: Any) -> None:
    from loops_nb.episodes import Episode, EpisodeRuntime

    class AgentEpisode(Episode):
        model_access = ModelAccessMode.OPENAI_HTTP

        def tasks(self) -> list[Task]:
            return [Task("t")]

        async def run(self, task: Task) -> float:
            env = model_env()
            headers = {"Authorization": f"Bearer {env['OPENAI_API_KEY']}"}
            body = {"messages": [{"role": "user", "content": "hi"}]}
            async with httpx.AsyncClient(
                timeout=60, base_url=env["OPENAI_BASE_URL"], headers=headers
            ) as http:
                return 1.0 if (await http.post("/chat/completions", json=body)).status_code == 200 else 0.0

    runtime = EpisodeRuntime(AgentEpisode())
    assert model_access_of(runtime) is ModelAccessMode.OPENAI_HTTP
    with ModelGateway() as gateway:
        llm, _ = scripted("ok")
        evidence = await LeasedRuntime(runtime, gateway).run_attempt(
            Attempt(Task("t"), 0, 0, 1, 0, AttemptServices(llm, llm.capture))
        )
    assert evidence.reward == 1.0 and len(llm.capture.calls) == 1
    with pytest.raises(RuntimeError, match="model_access"):
        model_env()


async def test_a_client_that_left_before_its_attempt_ended_leaves_no_unretrieved_error() -> None:
    """Terminus-2's runs ended with `Future exception was never retrieved ... LeaseEnded`: the client gave up on a
    reply, then the attempt ended and failed the reply nobody was waiting for any more."""
    import asyncio
    import gc

    from loops_nb.model_access.delivery import Exchange, settle_lease

    registry = LeaseRegistry()
    lease = registry.issue("t/g0/a0", object())  # type: ignore[arg-type]  # the exchange never samples it
    sampling = asyncio.Event()

    async def sample() -> str:
        sampling.set()
        await asyncio.Event().wait()
        return "never"

    async def receive() -> Any:  # the client disconnects once sampling has begun
        await sampling.wait()
        return {"type": "http.disconnect"}

    unhandled: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    try:
        exchange = Exchange(lease, sample, lambda _: None)
        with pytest.raises(Exception, match="t/g0/a0"):
            await exchange.run(receive)
        registry.revoke(lease.key)
        await settle_lease(lease, timeout=5)
        del exchange
        for _ in range(3):
            await asyncio.sleep(0)
            gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert not unhandled, [c.get("message") for c in unhandled]

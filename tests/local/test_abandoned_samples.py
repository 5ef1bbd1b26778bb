"""A sample whose caller gave up stops decoding: queued, it is dropped; running, its rows leave the batch at
the next token while the other rows of the batch finish as they would have; over HTTP, a client that
closes the connection (an attempt past its timeout) abandons its request."""

from __future__ import annotations

import asyncio
import time

import pytest
from sampler_fixtures import sampler_model_path_fixture  # noqa: F401 - registers the fixture

from loops_nb.local.sampler import SampleAbandoned, SamplerEngine, SampleRequest


def long_request(prompt: list[int], max_tokens: int = 240) -> SampleRequest:
    return SampleRequest(prompt=prompt, temperature=0.0, max_tokens=max_tokens)


def wait_until(condition, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.002)


@pytest.fixture
def endless(sampler_model_path) -> SamplerEngine:
    """An engine that never stops at EOS, so a request runs to max_tokens unless it is abandoned."""
    with SamplerEngine(sampler_model_path, device="cpu") as engine:
        engine.eos_token_ids = set()
        yield engine


def test_a_running_request_stops_and_its_batch_mates_finish_unchanged(endless: SamplerEngine) -> None:
    mate = long_request([10, 11, 12], 60)
    expected = endless.sample(mate).choices[0].token_ids
    batches = endless.stats["batches"]
    doomed, kept = endless.submit_many([(long_request([5, 6, 7]), None), (mate, None)])
    wait_until(lambda: endless.stats["batches"] > batches, "the batch never started")
    endless.abandon(doomed)
    with pytest.raises(SampleAbandoned):
        doomed.result(timeout=20)
    assert endless.stats["abandoned_rows"] == 1
    assert kept.result(timeout=20).choices[0].token_ids == expected


def test_a_queued_request_is_dropped_before_it_runs(endless: SamplerEngine) -> None:
    batches = endless.stats["batches"]
    first = endless.submit(long_request([5, 6, 7]))
    wait_until(lambda: endless.stats["batches"] > batches, "the batch never started")
    endless.max_batch_sequences = 1  # the next request cannot join the running batch: it stays queued
    queued = endless.submit(long_request([8, 9]))
    endless.abandon(queued)
    assert queued.cancelled()
    assert len(first.result(timeout=60).choices[0].token_ids) == 240
    assert endless.stats["batches"] == batches + 1, "the dropped request never ran"


async def test_an_attempt_timing_out_over_http_abandons_its_sample(embedded_loops, tiny_chat_model) -> None:
    from baseten.loops import ModelInput, SamplingParams

    svc = embedded_loops.service_client()
    sampler = svc.create_sampling_client(base_model=str(tiny_chat_model))
    engine = embedded_loops.state.sampler(str(tiny_chat_model))
    engine.eos_token_ids = set()
    try:
        params = SamplingParams(max_tokens=480, temperature=1.0)
        before = engine.stats["abandoned_rows"]
        batches = engine.stats["batches"]
        call = sampler.sample_async(ModelInput.from_ints([5, 6, 7]), num_samples=4, sampling_params=params)
        task = asyncio.ensure_future(call)
        while engine.stats["batches"] == batches:
            await asyncio.sleep(0.01)
        task.cancel()  # what the scheduler does at attempt_timeout_seconds
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 20
        while engine.stats["abandoned_rows"] - before < 4:
            assert time.monotonic() < deadline, "the server kept decoding for a client that left"
            await asyncio.sleep(0.05)
    finally:
        engine.eos_token_ids = engine._eos_ids()
    # The server goes on serving.
    out = await sampler.sample_async(
        ModelInput.from_ints([5, 6, 7]), num_samples=1, sampling_params=SamplingParams(max_tokens=3)
    )
    assert len(out.sequences[0].tokens) <= 3

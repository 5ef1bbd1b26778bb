"""A sample whose caller gave up stops decoding: queued, it is dropped; running, its rows leave the batch at
the next token while the other rows of the batch finish as they would have; over HTTP, a client that
closes the connection (an attempt past its timeout) abandons its request."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from polling import until, wait_until
from sampler_fixtures import sampler_model_path_fixture  # noqa: F401 - registers the fixture

from loops_nb.local.row_endings import SampleAbandoned
from loops_nb.local.sampler import SamplerEngine, SampleRequest


def long_request(prompt: list[int], max_tokens: int = 240) -> SampleRequest:
    return SampleRequest(prompt=prompt, temperature=0.0, max_tokens=max_tokens)


@pytest.fixture
def decode_once_abandoned(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[SamplerEngine], threading.Event]]:
    """Hold an engine's decoding until a request is abandoned; the event returned tells that it was.

    A tiny model decodes a whole request in well under a second: quicker, on a fast machine, than a caller
    can give up on it (the server notices a closed connection every 0.5 s). Held, the request is certain to
    be running, not finished, when it is abandoned: the case these tests are about."""
    events: list[threading.Event] = []

    def hold(engine: SamplerEngine) -> threading.Event:
        abandoned = threading.Event()
        events.append(abandoned)
        abandon, record = engine.abandon, engine._endings.record

        def abandon_and_go_on(future: Any) -> None:
            abandon(future)
            abandoned.set()

        def record_once_abandoned(*args: Any) -> list[int]:
            abandoned.wait(60)
            return record(*args)

        monkeypatch.setattr(engine, "abandon", abandon_and_go_on)
        monkeypatch.setattr(engine._endings, "record", record_once_abandoned)
        return abandoned

    yield hold
    for event in events:  # a test that failed leaves no decoding held for the next one
        event.set()


@pytest.fixture
def endless(sampler_model_path) -> SamplerEngine:
    """An engine that never stops at EOS, so a request runs to max_tokens unless it is abandoned."""
    with SamplerEngine(sampler_model_path, device="cpu") as engine:
        engine.eos_token_ids = set()
        yield engine


def test_a_running_request_stops_and_its_batch_mates_finish_unchanged(
    endless: SamplerEngine, decode_once_abandoned: Callable[[SamplerEngine], threading.Event]
) -> None:
    mate = long_request([10, 11, 12], 60)
    expected = endless.sample(mate).choices[0].token_ids
    decode_once_abandoned(endless)
    batches = endless.stats["batches"]
    doomed, kept = endless.submit_many([(long_request([5, 6, 7]), None), (mate, None)])
    wait_until(lambda: endless.stats["batches"] > batches, "the batch started")
    endless.abandon(doomed)
    with pytest.raises(SampleAbandoned):
        doomed.result(timeout=60)
    assert endless.stats["abandoned_rows"] == 1
    assert kept.result(timeout=60).choices[0].token_ids == expected


def test_a_queued_request_is_dropped_before_it_runs(endless: SamplerEngine) -> None:
    batches = endless.stats["batches"]
    first = endless.submit(long_request([5, 6, 7]))
    wait_until(lambda: endless.stats["batches"] > batches, "the batch started")
    endless.max_batch_sequences = 1  # the next request cannot join the running batch: it stays queued
    queued = endless.submit(long_request([8, 9]))
    endless.abandon(queued)
    assert queued.cancelled()
    assert len(first.result(timeout=60).choices[0].token_ids) == 240
    assert endless.stats["batches"] == batches + 1, "the dropped request never ran"


async def test_an_attempt_timing_out_over_http_abandons_its_sample(
    embedded_loops, tiny_chat_model, decode_once_abandoned: Callable[[SamplerEngine], threading.Event]
) -> None:
    from baseten.loops import ModelInput, SamplingParams

    svc = embedded_loops.service_client()
    sampler = svc.create_sampling_client(base_model=str(tiny_chat_model))
    engine = embedded_loops.state.sampler(str(tiny_chat_model))
    abandoned = decode_once_abandoned(engine)
    engine.eos_token_ids = set()
    try:
        params = SamplingParams(max_tokens=480, temperature=1.0)
        before = engine.stats["abandoned_rows"]
        rows = engine.stats["rows"]
        call = sampler.sample_async(ModelInput.from_ints([5, 6, 7]), num_samples=4, sampling_params=params)
        task = asyncio.ensure_future(call)
        await until(lambda: engine.stats["rows"] >= rows + 4, "the request's four rows are decoding")
        task.cancel()  # what the scheduler does at attempt_timeout_seconds
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(abandoned.wait, 60), "the server kept decoding for a client that left"
        # Its four rows leave the batch unfinished: the 480 tokens are never decoded.
        await until(lambda: engine.stats["abandoned_rows"] - before >= 4, "its four rows were dropped")
    finally:
        engine.eos_token_ids = engine._eos_ids()
    # The server goes on serving.
    out = await sampler.sample_async(
        ModelInput.from_ints([5, 6, 7]), num_samples=1, sampling_params=SamplingParams(max_tokens=3)
    )
    assert len(out.sequences[0].tokens) <= 3

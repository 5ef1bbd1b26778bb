"""A decode batch that holds each prompt's keys and values once (`shared_prompt_kv`) against its twin, the
batch that copies them to every row (`SamplerEngine(share_prompts=False)`): seeded sampling gives the same
tokens and logprobs through both, with rows finishing early, requests joining mid-batch and prefix-cache
hits; and the shared batch holds, and its budget counts, each prompt once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from polling import wait_until
from sampler_fixtures import sampler_model_path_fixture  # noqa: F401 - registers the fixture

from loops_nb.local.sampler import SamplerEngine, SampleRequest
from loops_nb.local.sampling_types import SampleResult

PROMPT = [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]
OTHER = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module", name="twins")
def twins_fixture(sampler_model_path) -> Iterator[dict[bool, SamplerEngine]]:
    engines = {
        share: SamplerEngine(sampler_model_path, device="cpu", dtype=torch.float32, share_prompts=share)
        for share in (True, False)
    }
    assert engines[True]._share and not engines[False]._share
    yield engines
    for engine in engines.values():
        engine.close()


def assert_same(got: list[SampleResult], want: list[SampleResult]) -> None:
    for a, b in zip(got, want, strict=True):
        assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices]
        assert [c.finish_reason for c in a.choices] == [c.finish_reason for c in b.choices]
        for x, y in zip(a.choices, b.choices, strict=True):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


def sample_together(engine: SamplerEngine, requests: list[SampleRequest]) -> list[SampleResult]:
    return [future.result() for future in engine.submit_many([(r, None) for r in requests])]


def test_shared_prompts_sample_as_copied_rows_with_rows_finishing_early(twins) -> None:
    requests = [
        SampleRequest(prompt=PROMPT, n=4, temperature=1.0, max_tokens=24, seed=1),
        SampleRequest(prompt=PROMPT, n=2, temperature=0.7, top_p=0.9, max_tokens=5, seed=2),  # same prompt
        SampleRequest(prompt=OTHER, n=3, temperature=1.0, max_tokens=16, seed=3, stop_token_ids=[40, 41, 42]),
        SampleRequest(prompt=PROMPT[:7], temperature=0.0, max_tokens=9),
    ]
    shared, copied = (sample_together(twins[share], requests) for share in (True, False))
    assert_same(shared, copied)
    lengths = {len(c.token_ids) for result in shared for c in result.choices}
    assert len(lengths) > 2  # rows left the batch at different steps


def test_requests_joining_a_shared_batch_sample_as_copied_rows(twins) -> None:
    first = SampleRequest(prompt=PROMPT, n=2, temperature=1.0, max_tokens=120, seed=4, stop_token_ids=[])
    joiners = [
        SampleRequest(prompt=PROMPT, n=3, temperature=1.0, max_tokens=10, seed=5),  # a prompt held already
        SampleRequest(prompt=OTHER + OTHER, temperature=1.0, max_tokens=30, seed=6),
        SampleRequest(prompt=OTHER, temperature=0.0, max_tokens=8, prompt_logprobs=1),
    ]
    results = {}
    for share, engine in twins.items():
        joined, batches = engine.stats["joined"], engine.stats["batches"]
        running = engine.submit(first)
        wait_until(lambda e=engine, b=batches: e.stats["batches"] > b, "the batch started", every=0.001)
        later = engine.submit_many([(r, None) for r in joiners])
        results[share] = [running.result()] + [f.result() for f in later]
        assert engine.stats["joined"] - joined == len(joiners)
    assert_same(results[True], results[False])
    assert results[True][3].prompt_logprobs == results[False][3].prompt_logprobs  # one plain prefill each


def test_prefix_cache_hits_sample_as_copied_rows(twins) -> None:
    group = SampleRequest(prompt=OTHER * 4, n=4, temperature=1.0, max_tokens=12, seed=7)
    results = {share: engine.sample(group) for share, engine in twins.items()}
    assert_same([results[True]], [results[False]])
    extended = [*OTHER * 4, *results[True].choices[0].token_ids[:-1], 50, 51]
    follow = SampleRequest(prompt=extended, n=3, temperature=1.0, max_tokens=10, seed=8)
    followed = {}
    for share, engine in twins.items():
        cached = engine.stats["prefix_cached_tokens"]
        followed[share] = engine.sample(follow)
        assert engine.stats["prefix_cached_tokens"] - cached >= len(OTHER * 4)
    assert_same([followed[True]], [followed[False]])


def test_a_shared_batch_holds_its_prompt_once_and_its_rows_own_tokens(twins) -> None:
    engine = twins[True]
    job = engine._job(SampleRequest(prompt=PROMPT, n=8, temperature=1.0, max_tokens=4, seed=9), None)
    with torch.inference_mode():
        batch = engine._prefiller.prefill([job])
        assert batch.prompts is not None and batch.prompts.tokens == len(PROMPT)
        assert [slot.keys[0].shape[:3] for slot in batch.prompts.slots] == [(1, 2, len(PROMPT))]
        tokens = torch.full((8,), 40, dtype=torch.long)
        for step in range(1, 3):
            batch.advance(tokens)
            assert all(layer.keys.shape[:3] == (8, 2, step) for layer in batch.cache.layers)


def test_the_kv_budget_counts_a_shared_prompt_once(sampler_model_path) -> None:
    # 16 rows of a 20-token prompt and 8 new tokens: 20 + 16 x 8 = 148 tokens shared, 16 x 28 = 448 copied.
    requests = [SampleRequest(prompt=PROMPT, temperature=1.0, max_tokens=8, seed=i) for i in range(16)]
    batches = {}
    for share in (True, False):
        with SamplerEngine(
            sampler_model_path, device="cpu", dtype=torch.float32, max_batch_tokens=200, share_prompts=share
        ) as engine:
            sample_together(engine, requests)
            batches[share] = engine.stats["batches"]
    assert batches[True] == 1 and batches[False] > 1

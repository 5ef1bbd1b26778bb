"""The sampler's prefix cache: an agent's next call prefills only what is new, with the same numbers.

The twin of every cached call is the same call on an engine without the cache: same seed, same tokens,
logprobs within 1e-5 (float32). Counters say what was computed and what came from the cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from sampler_fixtures import (  # noqa: F401 - the *_fixture imports register the fixtures
    lora_weights,
    plain_model_fixture,
    sampler_model_path_fixture,
)

from loops_nb.local.prefix_cache import MIN_PREFIX_TOKENS, CachedSequence, PrefixCache
from loops_nb.local.sampler import SamplerEngine
from loops_nb.local.sampling_types import SampleRequest

HISTORY = [5 + (i * 7) % 90 for i in range(60)]  # a first call's prompt: 60 tokens


@pytest.fixture(scope="module")
def engines(sampler_model_path: Path) -> Iterator[tuple[SamplerEngine, SamplerEngine]]:
    """(with the prefix cache, without it) on the same float32 weights."""
    kw = {"device": "cpu", "dtype": torch.float32}
    with (
        SamplerEngine(sampler_model_path, prefix_cache_mb=64, **kw) as cached,
        SamplerEngine(sampler_model_path, prefix_cache_mb=0, **kw) as plain,
    ):
        yield cached, plain


def turn(prompt: list[int], seed: int, n: int = 1) -> SampleRequest:
    return SampleRequest(prompt=prompt, n=n, temperature=1.0, max_tokens=12, seed=seed, stop_token_ids=[])


def test_an_agents_next_call_prefills_only_its_new_tokens_with_the_same_logprobs(engines) -> None:
    cached, plain = engines
    first = cached.sample(turn(HISTORY, seed=1)).choices[0]
    assert first.token_ids == plain.sample(turn(HISTORY, seed=1)).choices[0].token_ids
    # The next call: its history exactly (prompt, then the sampled tokens), then a tool result of 8 tokens.
    second_prompt = HISTORY + first.token_ids + [40, 41, 42, 43, 44, 45, 46, 47]
    before = dict(cached.stats)
    second = cached.sample(turn(second_prompt, seed=2)).choices[0]
    twin = plain.sample(turn(second_prompt, seed=2)).choices[0]
    assert second.token_ids == twin.token_ids
    assert max(abs(a - b) for a, b in zip(second.logprobs, twin.logprobs, strict=True)) <= 1e-5
    served = cached.stats["prefix_cached_tokens"] - before.get("prefix_cached_tokens", 0)
    computed = cached.stats["prefill_tokens"] - before.get("prefill_tokens", 0)
    assert served == len(HISTORY) + len(first.token_ids) - 1, "all but the last sampled token were kept"
    assert computed == len(second_prompt) - served == 9


def test_a_group_that_shares_a_prompt_reuses_it_and_samples_as_without(engines) -> None:
    cached, plain = engines
    prompt = [9 + (i * 5) % 80 for i in range(40)]
    cached.sample(turn(prompt, seed=3))
    again = cached.sample(turn([*prompt, 11, 12], seed=4, n=3))  # shares the prompt with the kept sequence
    twin = plain.sample(turn([*prompt, 11, 12], seed=4, n=3))
    for mine, theirs in zip(again.choices, twin.choices, strict=True):
        assert mine.token_ids == theirs.token_ids
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)


def test_attempts_that_send_one_prompt_extend_it_once_and_sample_as_without(engines) -> None:
    """A step's attempts each send the same prompt as a request of their own (the quickstart's 64): when a
    kept sequence extends it, the rest of the prompt runs once for all of them, not once per request."""
    cached, plain = engines
    prompt = [7 + (i * 3) % 70 for i in range(36)]
    cached.sample(turn(prompt, seed=7))
    nxt = [*prompt, 21, 22, 23]
    before = dict(cached.stats)
    mine = [f.result() for f in cached.submit_many([(turn(nxt, seed=10 + i), None) for i in range(4)])]
    theirs = [plain.sample(turn(nxt, seed=10 + i)) for i in range(4)]
    for a, b in zip(mine, theirs, strict=True):
        assert a.choices[0].token_ids == b.choices[0].token_ids
        assert a.choices[0].logprobs == pytest.approx(b.choices[0].logprobs, abs=1e-5)
    served = cached.stats["prefix_cached_tokens"] - before.get("prefix_cached_tokens", 0)
    computed = cached.stats["prefill_tokens"] - before.get("prefill_tokens", 0)
    assert served == len(prompt), "the kept sequence served the shared prompt once"
    assert computed == 3, "the three new tokens ran once for the four requests"


def test_new_weights_under_an_adapter_drop_what_it_kept(engines, plain_model) -> None:
    cached, plain = engines
    config, weights, _ = lora_weights(plain_model, 4, ["q_proj", "v_proj"], seed=1)
    for engine in (cached, plain):
        engine.set_adapter("policy", config, weights, 1)
    first = cached.sample(turn(HISTORY, seed=5), "policy").choices[0]
    plain.sample(turn(HISTORY, seed=5), "policy")
    assert cached.prefix_cache is not None and any(key[0] == "policy" for key in cached.prefix_cache._entries)
    config2, weights2, _ = lora_weights(plain_model, 4, ["q_proj", "v_proj"], seed=2)
    for engine in (cached, plain):
        engine.set_adapter("policy", config2, weights2, 1)  # the same version number, new weights
    assert not any(key[0] == "policy" for key in cached.prefix_cache._entries)
    nxt = HISTORY + first.token_ids + [30, 31]
    mine = cached.sample(turn(nxt, seed=6), "policy").choices[0]
    theirs = plain.sample(turn(nxt, seed=6), "policy").choices[0]
    assert mine.token_ids == theirs.token_ids
    assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)


def kept(tokens: int, adapter: str | None = None, version: int | None = 0, mark: int = 0) -> CachedSequence:
    shape = (1, 2, tokens, 4)
    return CachedSequence(
        adapter,
        version,
        tuple([mark, *list(range(1, tokens))]),
        (torch.zeros(shape),),
        (torch.zeros(shape),),
    )


def test_the_cache_stays_in_its_budget_and_evicts_the_least_recently_used() -> None:
    one = kept(32).nbytes
    cache = PrefixCache(budget_bytes=2 * one)
    a, b, c = kept(32, mark=100), kept(32, mark=200), kept(32, mark=300)
    cache.store(a)
    cache.store(b)
    assert cache.lookup(None, 0, [*list(a.tokens), 7]) is not None  # a is now the most recently used
    cache.store(c)
    assert len(cache) == 2 and cache.nbytes <= cache.budget_bytes
    assert cache.lookup(None, 0, [*list(b.tokens), 7]) is None, "b was the least recently used"
    assert cache.lookup(None, 0, [*list(a.tokens), 7]) is not None
    hit = cache.lookup(None, 0, list(c.tokens[:20]) + [999] * 5)
    assert hit is not None and hit.length == 20, "a shared prefix shorter than the kept sequence is used"
    assert cache.lookup(None, 0, [*list(c.tokens[: MIN_PREFIX_TOKENS - 1]), 999]) is None
    assert (
        cache.lookup(None, 0, list(c.tokens)) is not None
        and cache.lookup(None, 0, list(c.tokens)).length == 31
    )
    cache.store(kept(32, version=1, mark=400))
    assert len(cache) == 1, "a new version of the adapter drops the older ones"
    cache.store(kept(3 * 32))
    assert len(cache) == 1, "a sequence larger than the budget is not kept"


def row(tokens: list[int], seed: int, layers: int = 2) -> CachedSequence:
    """A finished row as the sampler hands it over: per-layer keys and values of its own (random numbers)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (1, 2, len(tokens), 4)
    keys = tuple(torch.randn(shape, generator=gen) for _ in range(layers))
    values = tuple(torch.randn(shape, generator=gen) for _ in range(layers))
    return CachedSequence(None, 0, tuple(tokens), keys, values)


def joined(pieces) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    keys = [torch.cat([piece[0][i] for piece in pieces], dim=2) for i in range(len(pieces[0][0]))]
    values = [torch.cat([piece[1][i] for piece in pieces], dim=2) for i in range(len(pieces[0][1]))]
    return keys, values


def test_siblings_keep_only_what_they_add_and_a_parent_goes_with_its_children() -> None:
    prompt = list(range(100, 140))  # 40 tokens every attempt shares
    first, second = row([*prompt, 1, 2, 3, 4], seed=1), row([*prompt, 5, 6, 7, 8], seed=2)
    cache = PrefixCache(budget_bytes=10 * first.nbytes)
    cache.store(first)
    cache.store(second)
    per_token = first.nbytes // len(first.tokens)
    assert cache.nbytes == first.nbytes + 4 * per_token, "the second keeps only its 4 own tokens"
    hit = cache.lookup(None, 0, [*prompt, 5, 6, 7, 8, 9])
    assert hit is not None and hit.length == 44 and hit.sequence.tokens == second.tokens
    keys, values = joined(hit.sequence.pieces(hit.length))
    # The shared prompt's keys and values come from the first row (kept whole), the rest from the second.
    for mine, parents, own in zip(keys, first.keys, second.keys, strict=True):
        assert torch.equal(mine[:, :, :40], parents[:, :, :40]) and torch.equal(
            mine[:, :, 40:], own[:, :, 40:]
        )
    for mine, parents, own in zip(values, first.values, second.values, strict=True):
        assert torch.equal(mine[:, :, :40], parents[:, :, :40]) and torch.equal(
            mine[:, :, 40:], own[:, :, 40:]
        )
    cache.store(row(prompt[:30], seed=3))
    assert len(cache) == 2, "a sequence a kept one already holds whole adds nothing"
    cache._drop(first.key)
    assert len(cache) == 0 and cache.nbytes == 0, "the child went with its parent"


def test_a_used_child_keeps_its_parent_from_eviction() -> None:
    prompt = list(range(200, 240))
    parent, child = row([*prompt, 1], seed=4), row([*prompt, 2, 3], seed=5)
    other = row(list(range(300, 341)), seed=6)
    cache = PrefixCache(budget_bytes=parent.nbytes + other.nbytes + parent.nbytes // 2)
    cache.store(parent)
    cache.store(child)
    cache.lookup(None, 0, [*prompt, 2, 3, 4])  # uses the child, so its parent is refreshed too
    cache.store(other)  # over budget: the least recently used goes, which is neither parent nor child
    assert child.key in cache._entries and parent.key in cache._entries

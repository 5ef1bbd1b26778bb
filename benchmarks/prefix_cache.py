"""Prefix cache: an agent's next call against a cold prompt of the same length, through the SDK.

Run: `uv run python -m benchmarks prefix_cache`.

An agent's second call sends its first prompt (1,500 tokens), the exact tokens it sampled, then a tool
result (8 tokens). With the sampler's prefix cache only the new tokens are prefilled; a cold prompt of the
same length (shared prefix: none) prefills all of them. Both calls ask for one new token, so the time is the
prefill's. The aim (issue 35): the next turn costs <= 0.3x the cold prompt. A second row runs the same pair
on an embedded Loops with `prefix_cache_mb = 0`: the turn then costs what a cold prompt does.

Deliberate simplifications: the base model (no LoRA), one agent at a time, the median of 3 pairs.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from typing import Any

import torch

from benchmarks.common import MODEL, Result

HISTORY_TOKENS, TOOL_RESULT_TOKENS, FIRST_REPLY_TOKENS = 1500, 8, 32


@contextlib.contextmanager
def sampling_client(prefix_cache_mb: int | None) -> Iterator[Any]:
    from loops_nb.local.embedded import EmbeddedLoops

    device = "cpu" if not torch.cuda.is_available() else "auto"
    with EmbeddedLoops(device=device, prefix_cache_mb=prefix_cache_mb) as loops:
        yield loops.service_client().create_sampling_client(base_model=MODEL)


def next_turn_against_cold(sc: Any, seed: int) -> tuple[float, float]:
    """Seconds of (the agent's next call, a cold prompt of its length), each sampling one token."""
    from baseten.loops import ModelInput, SamplingParams

    rng = random.Random(seed)
    history = [rng.randrange(1000, 40000) for _ in range(HISTORY_TOKENS)]
    reply = SamplingParams(max_tokens=FIRST_REPLY_TOKENS, temperature=1.0, seed=seed)
    first = sc.sample(ModelInput.from_ints(history), num_samples=1, sampling_params=reply)
    sampled = list(first.sequences[0].tokens)
    following = history + sampled + [rng.randrange(1000, 40000) for _ in range(TOOL_RESULT_TOKENS)]
    cold = [rng.randrange(1000, 40000) for _ in range(len(following))]
    one = SamplingParams(max_tokens=1, temperature=1.0, seed=seed)
    times = []
    for prompt in (following, cold):
        started = time.perf_counter()
        sc.sample(ModelInput.from_ints(prompt), num_samples=1, sampling_params=one)
        times.append(time.perf_counter() - started)
    return times[0], times[1]


def measure(prefix_cache_mb: int | None) -> tuple[float, float]:
    with sampling_client(prefix_cache_mb) as sc:
        next_turn_against_cold(sc, 0)  # warm-up: the model's first forward pays for allocation
        pairs = [next_turn_against_cold(sc, seed) for seed in (1, 2, 3)]
    pairs.sort(key=lambda p: p[0] / p[1])
    return pairs[1]


def run() -> list[Result]:
    cached_turn, cached_cold = measure(None)
    plain_turn, plain_cold = measure(0)
    return [
        Result(
            f"agent's next call ({HISTORY_TOKENS}-token history + {TOOL_RESULT_TOKENS} new) vs a cold prompt "
            "of its length, prefix cache on (seconds, lower is better)",
            cached_turn,
            cached_cold,
            "s",
            "<= 0.3x (ratio >= 3.3)",
            higher_is_better=False,
        ),
        Result(
            "the same with [compute.local] prefix_cache_mb = 0 (before the cache)",
            plain_turn,
            plain_cold,
            "s",
            "-",
            higher_is_better=False,
        ),
    ]

"""Sampler path: tokens/s of a GRPO-shaped workload (one prompt, n = 16, 64 new tokens) through the
SDK against plain `model.generate`, and 16 concurrent one-sample requests against the same 16 served
one by one.

Run: `uv run python -m benchmarks sampler`.

The embedded Loops samples at its default dtype (`auto`, see benchmarks/trainer.py). It is compared with
`model.generate` in float32 (the issue's aim: >= 2x its tokens/s) and with `model.generate` at the
embedded Loops' dtype (>= 1.0); on a CPU with AMX or AVX512-BF16, a side at `dtype = "bf16-mixed"`
runs too (the opt-in that is faster than float32 there); 16 concurrent requests against the same served
one by one: >= 4x. The SDK call and the `model.generate` calls run alternately (as the trainer benchmark does), so load from
other processes falls on all alike. `model.generate` loads and runs on the embedded Loops' compute lane,
so both sides compute on one thread (`benchmarks.common.on_compute_lane`).

Deliberate simplifications: sampling at temperature 1 with EOS disabled on both sides, so every row
generates exactly 64 tokens and tokens/s compares like with like.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from benchmarks.common import MODEL, Result, median_time, model_path, on_compute_lane
from benchmarks.trainer import alternate, default_dtype, mixed_side, short

N, NEW_TOKENS, CONCURRENT = 16, 64, 16
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def reference_generate(path, prompt: list[int], dtype: torch.dtype) -> Callable[[], None]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    ids = torch.tensor([prompt] * N)

    def gen() -> None:
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
                pad_token_id=0,
            )

    return gen


@contextlib.contextmanager
def embedded_sampling(prompt: list[int], dtype: str = "auto") -> Iterator[tuple[Any, Callable[[], None]]]:
    """A sampling client of an embedded Loops at `dtype`, and one GRPO-shaped call (N samples) through it."""
    from baseten.loops import ModelInput, SamplingParams

    from loops_nb.local.embedded import EmbeddedLoops

    with EmbeddedLoops(device="cpu" if not torch.cuda.is_available() else "auto", dtype=dtype) as loops:
        sc = loops.service_client().create_sampling_client(base_model=MODEL)
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0)
        model_input = ModelInput.from_ints(prompt)
        engine = loops.state.sampler(MODEL)
        engine.eos_token_ids = set()  # benchmark only: generate the full length, as min_new_tokens does

        def grpo() -> None:
            sc.sample(model_input, num_samples=N, sampling_params=params)

        yield sc, grpo


def through_sdk(
    prompt: list[int], references: dict[str, Callable[[], None]]
) -> tuple[dict[str, float], float, float]:
    """Seconds per GRPO-shaped call of each side (ours, a bf16-mixed side where it applies, the
    references), and of 16 one-sample requests served one by one and all at once."""
    from baseten.loops import ModelInput, SamplingParams

    with contextlib.ExitStack() as stack:
        sc, grpo = stack.enter_context(embedded_sampling(prompt))
        sides = {"ours": grpo}
        if mixed_side():
            sides["mixed"] = stack.enter_context(embedded_sampling(prompt, "bf16-mixed"))[1]
        times = alternate({**sides, **references}, 3)
        model_input = ModelInput.from_ints(prompt)
        one = SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0)

        def one_by_one() -> None:
            for _ in range(CONCURRENT):
                sc.sample(model_input, num_samples=1, sampling_params=one)

        async def together() -> None:
            await asyncio.gather(
                *(sc.sample_async(model_input, num_samples=1, sampling_params=one) for _ in range(CONCURRENT))
            )

        serial_s = median_time(one_by_one, 1)
        started = time.perf_counter()
        asyncio.run(together())
        concurrent_s = time.perf_counter() - started
    return {name: wall for name, (wall, _) in times.items()}, serial_s, concurrent_s


def run() -> list[Result]:
    from transformers import AutoTokenizer

    path = model_path()
    tok = AutoTokenizer.from_pretrained(path)
    prompt = list(
        tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    dtype = default_dtype()
    references = {"fp32": on_compute_lane(lambda: reference_generate(path, prompt, torch.float32))}
    if dtype != torch.float32:
        references["same"] = on_compute_lane(lambda: reference_generate(path, prompt, dtype))
    reference_s, serial_s, concurrent_s = through_sdk(prompt, references)
    grpo_s = reference_s["ours"]
    tokens = N * NEW_TOKENS
    ours = f"sampler n=16 x 64 tokens/s, embedded Loops ({short(dtype)}, auto)"
    results = [
        Result(f"{ours} vs generate fp32", tokens / grpo_s, tokens / reference_s["fp32"], "tok/s", ">= 2.0")
    ]
    if "mixed" in reference_s:
        results.append(
            Result(
                'the same at dtype = "bf16-mixed" (bf16 linear products, float32 elsewhere) vs generate fp32',
                tokens / reference_s["mixed"],
                tokens / reference_s["fp32"],
                "tok/s",
                ">= 2.0",
            )
        )
    if "same" in reference_s:
        results.append(
            Result(
                f"{ours} vs generate {short(dtype)}",
                tokens / grpo_s,
                tokens / reference_s["same"],
                "tok/s",
                ">= 1.0",
            )
        )
    results.append(
        Result(
            "sampler 16 concurrent vs serial",
            CONCURRENT / concurrent_s,
            CONCURRENT / serial_s,
            "req/s",
            ">= 4.0",
        )
    )
    return results

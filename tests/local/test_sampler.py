"""The local sampler's compute core (`SamplerEngine`), on a tiny random Llama with a character tokenizer.

References (in `sampler_fixtures`) are plain transformers: `model.generate(do_sample=False)` for greedy
output, a teacher-forced forward over prompt + completion for logprobs, and a PEFT model for adapters. Requests are submitted together
with `submit_many` where the point is that they share a batch (left padding, seeds, joins).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from polling import wait_until
from pydantic import ValidationError
from sampler_fixtures import (  # noqa: F401 - the *_fixture imports register the fixtures
    EOS_ID,
    engine_fixture,
    generate_reference,
    lora_weights,
    plain_model_fixture,
    sampler_model_path_fixture,
    teacher_forced,
)

from loops_nb.local.sampler import SamplerClosedError, SamplerEngine, SampleRequest, SampleRequestError
from loops_nb.local.sampling_types import SampleResult

# The reference PEFT models trip a transformers deprecation inside PEFT; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")

PROMPTS = [
    [5, 6, 7],
    [10, 11, 12, 13, 14, 15, 16],
    [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31],
    [30, 31],
]


def greedy(prompt: list[int], max_tokens: int = 12, **kw) -> SampleRequest:
    return SampleRequest(prompt=prompt, temperature=0.0, max_tokens=max_tokens, **kw)


def solo(engine: SamplerEngine, request: SampleRequest, adapter: str | None = None) -> list[list[int]]:
    return [c.token_ids for c in engine.sample(request, adapter).choices]


# ---------------------------------------------------------------------------------------- correctness


def test_greedy_matches_generate_with_left_padding(engine, plain_model):
    futures = engine.submit_many([(greedy(p, 20), None) for p in PROMPTS])
    for prompt, future in zip(PROMPTS, futures, strict=True):
        choice = future.result().choices[0]
        assert choice.token_ids == generate_reference(plain_model, prompt, 20)
        assert choice.finish_reason == ("stop" if choice.token_ids[-1] == EOS_ID else "length")


def test_logprobs_match_teacher_forcing(engine, plain_model):
    for temperature in (1.0, 0.7):
        result = engine.sample(
            SampleRequest(prompt=PROMPTS[1], n=3, temperature=temperature, max_tokens=10, seed=7)
        )
        for choice in result.choices:
            # The model's own logprobs whatever the temperature (vLLM's raw_logprobs, as Loops returns).
            expected = teacher_forced(plain_model, PROMPTS[1], choice.token_ids)
            assert choice.logprobs == pytest.approx(expected, abs=1e-4)
    choice = engine.sample(greedy(PROMPTS[0], 8)).choices[0]
    assert choice.logprobs == pytest.approx(
        teacher_forced(plain_model, PROMPTS[0], choice.token_ids), abs=1e-4
    )


def test_seed_reproducible_regardless_of_batch_company(engine):
    request = SampleRequest(
        prompt=PROMPTS[1], n=2, temperature=1.0, top_k=20, top_p=0.9, max_tokens=12, seed=123
    )
    alone = solo(engine, request)
    others = [
        SampleRequest(prompt=PROMPTS[2], n=3, temperature=0.8, max_tokens=20, seed=5),
        greedy(PROMPTS[0], 15),
        SampleRequest(prompt=PROMPTS[3], n=2, temperature=1.3, max_tokens=6),
    ]
    futures = engine.submit_many([(others[0], None), (request, None), (others[1], None), (others[2], None)])
    assert [c.token_ids for c in futures[1].result().choices] == alone
    assert solo(engine, request.model_copy(update={"seed": 124})) != alone


def test_samples_differ_and_truncation_is_respected(engine, plain_model):
    result = engine.sample(SampleRequest(prompt=PROMPTS[0], n=4, temperature=1.0, max_tokens=8, seed=3))
    assert len({tuple(c.token_ids) for c in result.choices}) > 1
    # top_k=1 is greedy whatever the temperature; the logprob is still the model's own, untruncated.
    choice = engine.sample(SampleRequest(prompt=PROMPTS[0], temperature=2.0, top_k=1, max_tokens=6)).choices[
        0
    ]
    assert choice.token_ids == solo(engine, greedy(PROMPTS[0], 6))[0]
    assert choice.logprobs == pytest.approx(
        teacher_forced(plain_model, PROMPTS[0], choice.token_ids), abs=1e-4
    )
    # A tiny top_p keeps only the most likely token too.
    choice = engine.sample(
        SampleRequest(prompt=PROMPTS[0], temperature=1.0, top_p=1e-6, max_tokens=6)
    ).choices[0]
    assert choice.token_ids == solo(engine, greedy(PROMPTS[0], 6))[0]


def test_finish_reasons(engine):
    base = solo(engine, greedy(PROMPTS[1], 12))[0]
    # max_tokens
    choice = engine.sample(greedy(PROMPTS[1], 5)).choices[0]
    assert (choice.token_ids, choice.finish_reason) == (base[:5], "length")
    # stop token ids: the stop token is returned, with its logprob
    stop_token = base[4]
    first = base.index(stop_token)
    choice = engine.sample(greedy(PROMPTS[1], 12, stop_token_ids=[stop_token])).choices[0]
    assert (choice.token_ids, choice.finish_reason) == (base[: first + 1], "stop")
    assert len(choice.logprobs) == first + 1
    # stop strings: tokens up to the one completing the string, text cut before it
    tokenizer = engine.tokenizer
    full_text = tokenizer.decode(base)
    stop = tokenizer.decode(base[5:7])
    cut = full_text.index(stop)
    choice = engine.sample(greedy(PROMPTS[1], 12, stop=[stop, "never-seen"])).choices[0]
    assert choice.finish_reason == "stop"
    assert choice.text == full_text[:cut]
    assert stop in tokenizer.decode(choice.token_ids)
    assert stop not in tokenizer.decode(choice.token_ids[:-1])
    assert EOS_ID in engine.eos_token_ids


def test_prompt_logprobs(engine, plain_model):
    prompt = PROMPTS[2]
    result = engine.sample(SampleRequest(prompt=prompt, temperature=0.0, max_tokens=1, prompt_logprobs=3))
    entries = result.prompt_logprobs
    assert entries is not None and entries[0] is None and len(entries) == len(prompt)
    with torch.no_grad():
        reference = torch.log_softmax(plain_model(torch.tensor([prompt])).logits[0].float(), dim=-1)
    for i in range(1, len(prompt)):
        entry = entries[i]
        actual = entry[str(prompt[i])]
        assert actual["logprob"] == pytest.approx(reference[i - 1, prompt[i]].item(), abs=1e-4)
        assert actual["rank"] == int((reference[i - 1] > reference[i - 1, prompt[i]]).sum()) + 1
        ranks = [v["rank"] for v in entry.values()]
        assert ranks == sorted(ranks) and ranks[:3] == [1, 2, 3]
        top = reference[i - 1].topk(3)
        assert [int(k) for k in list(entry)[:3]] == top.indices.tolist()
        assert all(v["decoded_token"] == engine.tokenizer.decode([int(k)]) for k, v in entry.items())
    scoring = engine.sample(SampleRequest(prompt=prompt, temperature=0.0, max_tokens=1, prompt_logprobs=0))
    assert all(list(e) == [str(t)] for e, t in zip(scoring.prompt_logprobs[1:], prompt[1:], strict=True))


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "expected"),
    [
        (1.0, 0, 1.0, [0.5, 0.3, 0.15, 0.05]),
        (1.0, 0, 0.7, [0.5 / 0.8, 0.3 / 0.8, 0, 0]),  # the smallest set whose mass reaches p
        (1.0, 3, 0.9, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0]),  # top-p over the top-k-renormalised mass
        (1.0, 2, 1.0, [0.5 / 0.8, 0.3 / 0.8, 0, 0]),
        (0.0, 0, 1.0, [1, 0, 0, 0]),
        # Drawn from p^(1/T) renormalised; the logprob reported is still log p (checked below).
        (0.5, 0, 1.0, [0.25 / 0.365, 0.09 / 0.365, 0.0225 / 0.365, 0.0025 / 0.365]),
    ],
)
def test_select_tokens_follows_the_truncated_distribution(temperature, top_k, top_p, expected):
    from loops_nb.local.decoding import RowParams, select_tokens
    from loops_nb.local.sampling_types import SampleRequest

    probs = torch.tensor([0.3, 0.5, 0.05, 0.15])  # token order differs from probability order on purpose
    rows = 2000
    logits = probs.log().expand(rows, -1)
    u = torch.linspace(0, 1, rows + 1)[:-1, None]  # an even grid of uniforms: frequencies are exact
    request = SampleRequest(prompt=[0], temperature=temperature, top_k=top_k, top_p=top_p)
    params = RowParams.build([request] * rows, u, torch.device("cpu"))
    tokens, logprobs = select_tokens(logits, params)
    frequency = torch.bincount(tokens, minlength=4).float() / rows
    by_probability = frequency[[1, 0, 3, 2]]
    assert by_probability.tolist() == pytest.approx(expected, abs=1e-3)
    assert torch.allclose(logprobs, probs.log()[tokens], atol=1e-6)


# ---------------------------------------------------------------------------------------------- adapters


@pytest.mark.slow
def test_adapters(engine, plain_model, tmp_path):
    request = greedy(PROMPTS[1], 10)
    base = solo(engine, request)[0]
    config, weights, reference = lora_weights(plain_model, 4, ["q_proj", "v_proj"], seed=1)
    engine.set_adapter("policy", config, weights, version=1)
    assert engine.adapter_version("policy") == 1
    tuned = engine.sample(request, "policy")
    assert tuned.adapter_version == 1 and tuned.choices[0].token_ids != base
    assert tuned.choices[0].token_ids == generate_reference(reference, PROMPTS[1], 10)
    assert tuned.choices[0].logprobs == pytest.approx(
        teacher_forced(reference, PROMPTS[1], tuned.choices[0].token_ids), abs=1e-4
    )
    # The base model is untouched while an adapter is loaded.
    assert solo(engine, request)[0] == base == generate_reference(plain_model, PROMPTS[1], 10)

    # Same config, new weights: an in-place copy into the same parameters, which takes effect.
    live = dict(engine._adapters._adapters["policy"].params)
    _, weights2, reference2 = lora_weights(plain_model, 4, ["q_proj", "v_proj"], seed=2)
    engine.set_adapter("policy", config, weights2, version=2)
    assert all(engine._adapters._adapters["policy"].params[k] is v for k, v in live.items())
    again = engine.sample(request, "policy")
    assert again.adapter_version == 2
    assert again.choices[0].token_ids == generate_reference(reference2, PROMPTS[1], 10)

    # A second adapter with another rank and targets, loaded from a save_pretrained directory.
    _, _, reference3 = lora_weights(plain_model, 8, ["q_proj", "k_proj", "o_proj", "down_proj"], seed=3)
    reference3.save_pretrained(tmp_path / "ckpt")
    engine.load_adapter_dir("tinker://run/weights/ckpt-3", tmp_path / "ckpt", version=3)
    futures = engine.submit_many(
        [(request, "policy"), (request, "tinker://run/weights/ckpt-3"), (request, None)]
    )
    assert futures[0].result().choices[0].token_ids == generate_reference(reference2, PROMPTS[1], 10)
    assert futures[1].result().choices[0].token_ids == generate_reference(reference3, PROMPTS[1], 10)
    assert futures[2].result().choices[0].token_ids == base

    engine.remove_adapter("tinker://run/weights/ckpt-3")
    engine.remove_adapter("policy")
    assert engine.adapter_version("policy") is None
    with pytest.raises(SampleRequestError, match="adapter"):
        engine.sample(request, "policy")
    assert solo(engine, request)[0] == base


def test_mismatched_adapter_weights_are_refused(engine, plain_model):
    config, weights, _ = lora_weights(plain_model, 4, ["q_proj"], seed=4)
    weights = {k: v for k, v in list(weights.items())[1:]}
    with pytest.raises(ValueError, match="state_dict"):
        engine.set_adapter("broken", config, weights, version=1)
    assert engine.adapter_version("broken") is None


# ------------------------------------------------------------------------------------------ concurrency


@pytest.mark.slow
def test_concurrent_threads_coalesce_and_match_solo(engine):
    prompts = [[(7 * i + j) % 100 + 4 for j in range(3 + i % 5)] for i in range(16)]
    expected = [solo(engine, greedy(p, 16))[0] for p in prompts]
    before = dict(engine.stats)
    results: list[list[int] | None] = [None] * 16
    barrier = threading.Barrier(16)

    def call(i: int) -> None:
        barrier.wait()
        results[i] = engine.sample(greedy(prompts[i], 16)).choices[0].token_ids

    threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected
    batches = engine.stats["batches"] - before.get("batches", 0)
    assert batches < 16


def wait_for_batches(engine: SamplerEngine, count: int) -> None:
    wait_until(lambda: engine.stats["batches"] >= count, "the worker started the batch", every=0.001)


@pytest.mark.slow
def test_requests_join_a_running_batch(engine):
    long_request = greedy(PROMPTS[1], 200)
    joiners = [
        greedy(PROMPTS[2] + PROMPTS[2], 20),  # a longer prompt than the batch's cache: the cache is re-padded
        SampleRequest(prompt=PROMPTS[0], n=3, temperature=1.0, top_p=0.8, max_tokens=15, seed=11),
        greedy(PROMPTS[3], 25, prompt_logprobs=1),
    ]
    expected = [engine.sample(r) for r in [long_request, *joiners]]
    before = engine.stats["joined"]
    batches = engine.stats["batches"]
    first = engine.submit(long_request)
    wait_for_batches(engine, batches + 1)
    rest = engine.submit_many([(r, None) for r in joiners])
    results = [first.result()] + [f.result() for f in rest]
    assert engine.stats["joined"] - before == len(joiners)
    assert engine.stats["batches"] == batches + 1
    for got, want in zip(results, expected, strict=True):
        assert [c.token_ids for c in got.choices] == [c.token_ids for c in want.choices]
        for a, b in zip(got.choices, want.choices, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert results[3].prompt_logprobs == expected[3].prompt_logprobs


@pytest.mark.slow
def test_adapter_swap_waits_for_the_running_batch(engine, plain_model):
    config, weights1, _ = lora_weights(plain_model, 4, ["q_proj", "v_proj"], seed=5)
    _, weights2, _ = lora_weights(plain_model, 4, ["q_proj", "v_proj"], seed=6)
    request = greedy(PROMPTS[0], 200)
    engine.set_adapter("swap", config, weights1, version=1)
    expected = solo(engine, request, "swap")
    batches = engine.stats["batches"]
    running = engine.submit(request, "swap")
    wait_for_batches(engine, batches + 1)
    engine.set_adapter("swap", config, weights2, version=2)  # blocks until the batch is done
    assert running.done()
    result = running.result()
    assert result.adapter_version == 1 and [c.token_ids for c in result.choices] == expected
    assert engine.sample(request, "swap").adapter_version == 2
    engine.remove_adapter("swap")


@pytest.mark.slow
def test_sixteen_requests_submitted_together_decode_in_one_batch(engine):
    """What makes coalescing fast, counted rather than timed (benchmarks/sampler.py times it: 16 concurrent
    requests against 16 in a row): one by one, each request is a batch of its own; together, they share one
    batch and decode side by side, and every request samples what it samples alone."""
    requests = [
        SampleRequest(prompt=[4 + i, 5, 6 + i], temperature=1.0, max_tokens=48, seed=i) for i in range(16)
    ]
    batches = engine.stats["batches"]
    sequential = [engine.sample(r) for r in requests]
    assert engine.stats["batches"] - batches == 16
    batches = engine.stats["batches"]
    futures = engine.submit_many([(r, None) for r in requests])
    together = [f.result() for f in futures]
    assert engine.stats["batches"] - batches == 1
    assert [r.choices[0].token_ids for r in together] == [r.choices[0].token_ids for r in sequential]


async def test_sample_async_gather(engine):
    results = await asyncio.gather(*(engine.sample_async(greedy(p, 8)) for p in PROMPTS))
    assert [r.choices[0].token_ids for r in results] == [solo(engine, greedy(p, 8))[0] for p in PROMPTS]


def test_close_fails_pending_and_later_requests(sampler_model_path):
    eng = SamplerEngine(sampler_model_path, device="cpu")
    assert eng.sample(greedy(PROMPTS[0], 2)).choices[0].finish_reason in {"stop", "length"}
    eng.close()
    assert not eng._worker.is_alive()
    with pytest.raises(SamplerClosedError, match="closed"):
        eng.submit(greedy(PROMPTS[0], 2))


def test_sliding_window_model_batches_without_joins(tmp_path):
    """Sliding-window caches cannot be re-padded, so such models batch only at the start; still exact."""
    from sampler_fixtures import build_char_tokenizer
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=8,
        initializer_range=0.3,
        eos_token_id=EOS_ID,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = MistralForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    build_char_tokenizer().save_pretrained(tmp_path)
    with SamplerEngine(tmp_path, device="cpu", dtype=torch.float32) as eng:
        assert not eng._mergeable
        requests = [
            greedy(p, 12 + 3 * i, prompt_logprobs=0 if i == 1 else None) for i, p in enumerate(PROMPTS)
        ]
        futures = eng.submit_many([(r, None) for r in requests])
        for request, future in zip(requests, futures, strict=True):
            tokens = future.result().choices[0].token_ids
            assert tokens == generate_reference(model, request.prompt, request.max_tokens)


# ------------------------------------------------------------------------------------ validation and wire


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": [1], "n": 0}, "n"),
        ({"prompt": [1], "n": 1000}, "n"),
        ({"prompt": [1], "temperature": -0.5}, "temperature"),
        ({"prompt": [1], "top_p": 0.0}, "top_p"),
        ({"prompt": [1], "top_k": -5}, "top_k"),
        ({"prompt": [1], "prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt": [1], "max_tokens": 0}, "max_tokens"),
        ({"prompt": [1], "n": "2"}, "n"),
        ({"prompt": [1], "stop": [""]}, "stop"),
        ({"prompt": [1], "structured_outputs": {"json": {}}}, "structured_outputs"),
        (
            {"prompt": [], "model_input_chunks": [{"type": "image", "data": "", "format": "png"}]},
            "model_input_chunks",
        ),
        ({"prompt": []}, "prompt"),
    ],
)
def test_validation_errors_name_the_field(body, field):
    with pytest.raises(ValidationError) as info:
        SampleRequest.model_validate(body)
    assert field in str(info.value)


def test_request_defaults_and_ignored_keys():
    request = SampleRequest.model_validate(
        {
            "prompt": [3, 4],
            "n": 2,
            "temperature": 1,
            "top_p": 1.0,
            "logprobs": 0,
            "top_k": -1,
            "return_tokens_as_token_ids": True,
            "include_routed_experts": True,
        }
    )
    assert (request.top_k, request.max_tokens, request.temperature) == (None, None, 1.0)
    chunks = SampleRequest.model_validate(
        {"model_input_chunks": [{"type": "encoded_text", "tokens": [3, 4]}]}
    )
    assert chunks.prompt == [3, 4]


def test_model_level_validation(engine):
    with pytest.raises(SampleRequestError, match=r"^prompt"):
        engine.validate(SampleRequest(prompt=[500]))
    with pytest.raises(SampleRequestError, match=r"^max_tokens") as info:
        engine.validate(SampleRequest(prompt=[5] * 200, max_tokens=100))
    assert info.value.field == "max_tokens"
    assert (
        engine.validate(SampleRequest(prompt=[5] * 250)) == 6
    )  # the default 16, capped by the positions left


def test_to_wire_parses_with_the_sdk(engine):
    from baseten.loops.sampling_client import _parse_completions

    prompt = PROMPTS[1]
    result: SampleResult = engine.sample(
        SampleRequest(prompt=prompt, n=3, temperature=1.0, max_tokens=6, seed=1, prompt_logprobs=2)
    )
    wire = result.to_wire()
    parsed = _parse_completions(wire, prompt_token_ids=prompt, include_top_prompt_logprobs=True)
    assert [s.tokens for s in parsed.sequences] == [c.token_ids for c in result.choices]
    assert [s.logprobs for s in parsed.sequences] == [c.logprobs for c in result.choices]
    assert [s.stop_reason for s in parsed.sequences] == [c.finish_reason for c in result.choices]
    assert parsed.prompt_logprobs[0] is None and len(parsed.prompt_logprobs) == len(prompt)
    assert all(len(top) >= 2 for top in parsed.topk_prompt_logprobs[1:])
    assert all(None not in c["logprobs"]["token_logprobs"] for c in wire["choices"])

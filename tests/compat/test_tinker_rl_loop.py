"""An RL loop written as Tinker's docs and tinker-cookbook's `recipes/rl_loop.py` write one (GRPO-style
centred rewards, `importance_sampling` on the sampler's logprobs), through the `tinker` shim against the
embedded Loops.

One call cannot run unchanged: Tinker's `SamplingClient.sample()` returns a future and the cookbook calls
`.result()` on it, while the shim re-exports `baseten.loops.SamplingClient` (tinker/__init__.py:11), whose
`sample()` returns the `SampleResponse` itself (baseten/loops/sampling_client.py:1088-1098). That is the
SDK shim's behaviour, on Loops as locally; the xfail below pins it, and the loop itself uses the response.
"""

from __future__ import annotations

import math

import pytest

GROUP = 8
STEPS = 6
TEMPERATURE = 0.7


def reward(tokens: list[int], vocab_size: int) -> float:
    """The share of tokens from the lower half of the vocabulary: about 0.5 by chance, so groups differ."""
    return sum(t < vocab_size // 2 for t in tokens) / max(len(tokens), 1)


@pytest.fixture
def rl_setup(loops_env, tiny_chat_model_path):
    import tinker

    service_client = tinker.ServiceClient()
    training_client = service_client.create_lora_training_client(
        base_model=str(tiny_chat_model_path), rank=8, seed=0
    )
    tokenizer = training_client.get_tokenizer()
    prompt_tokens = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say anything."}],
        tokenize=True,
        add_generation_prompt=True,
        return_dict=False,
    )
    prompt = tinker.types.ModelInput.from_ints(list(prompt_tokens))
    yield training_client, tokenizer, prompt
    training_client.close()


@pytest.mark.xfail(
    raises=AttributeError,
    strict=True,
    reason="tinker shim: SamplingClient.sample() returns SampleResponse, not a future "
    "(baseten/loops/sampling_client.py:1088-1098, re-exported by tinker/__init__.py:11)",
)
def test_sample_returns_a_future_as_in_tinker(rl_setup):
    import tinker

    training_client, _, prompt = rl_setup
    sampling_client = training_client.save_weights_and_get_sampling_client()
    future = sampling_client.sample(
        prompt=prompt, num_samples=2, sampling_params=tinker.types.SamplingParams(max_tokens=4)
    )
    future.result()


@pytest.mark.slow
def test_rl_loop_loss_falls_and_no_metric_is_nan(rl_setup):
    import tinker
    from tinker import types

    training_client, tokenizer, prompt = rl_setup
    vocab = len(tokenizer)
    sampling_params = types.SamplingParams(max_tokens=8, temperature=TEMPERATURE)
    # Each step must lower the surrogate it was taken on (checked below), which holds for a step along a
    # descent direction that is small enough. No momentum (beta1 = 0): the update is then the step's own
    # gradient under Adam's positive diagonal scaling; with beta1 = 0.9 a later step moves mostly along
    # earlier steps' gradients. A rate of 1e-3: at 1e-2 Adam's near-sign steps overshoot. Measured: 1 run in
    # 8 failed at (1e-2, 0.9), 4 in 14 at (1e-2, 0), none in 14 at (1e-3, 0).
    adam = types.AdamParams(learning_rate=1e-3, beta1=0.0, beta2=0.95, eps=1e-8)
    history = []
    for _ in range(STEPS):
        sampling_client = training_client.save_weights_and_get_sampling_client()
        result = sampling_client.sample(prompt=prompt, num_samples=GROUP, sampling_params=sampling_params)
        rewards = [reward(seq.tokens, vocab) for seq in result.sequences]
        mean_reward = sum(rewards) / len(rewards)
        datums, sampled_logprobs = [], []
        for seq, r in zip(result.sequences, rewards, strict=True):
            assert seq.logprobs is not None and len(seq.logprobs) == len(seq.tokens)
            ob_len = prompt.length - 1
            model_input = prompt.append(types.EncodedTextChunk(tokens=seq.tokens[:-1]))
            n = model_input.length
            datums.append(
                types.Datum(
                    model_input=model_input,
                    loss_fn_inputs={
                        "target_tokens": tinker.TensorData(
                            data=[0] * ob_len + seq.tokens, dtype="int64", shape=[n]
                        ),
                        "logprobs": tinker.TensorData(
                            data=[0.0] * ob_len + seq.logprobs, dtype="float32", shape=[n]
                        ),
                        "advantages": tinker.TensorData(
                            data=[0.0] * ob_len + [r - mean_reward] * (n - ob_len), dtype="float32", shape=[n]
                        ),
                    },
                )
            )
            if r != mean_reward:
                sampled_logprobs.append((len(datums) - 1, ob_len, seq.logprobs))
        fwd_bwd = training_client.forward_backward(datums, loss_fn="importance_sampling").result()
        optim = training_client.optim_step(adam).result()
        # The step must lower the objective it was taken on: the same batch's surrogate loss, re-scored.
        after = training_client.forward(datums, loss_fn="importance_sampling").result().loss
        # On-policy check, as tinker-cookbook's KL(sample||train) metric: the trainer's logprobs of the
        # sampled tokens equal the sampler's, even at T != 1 (both are the model's own logprobs). Loops'
        # RL losses return 0.0 where A = 0 (its own rl_metrics skips them too), so a row whose reward is the
        # group mean has no logprobs to compare: it is left out (CI once drew two such rows).
        ratios = [
            math.exp(t - s)
            for row, ob_len, sampled in sampled_logprobs
            for t, s in zip(fwd_bwd.loss_fn_outputs[row]["logprobs"].data[ob_len:], sampled, strict=True)
        ]
        metrics = {
            "reward": mean_reward,
            "loss": fwd_bwd.loss,
            "loss_after_step": after,
            "is_ratio_mean_abs_dev": sum(abs(x - 1) for x in ratios) / max(len(ratios), 1),
            **(optim.metrics or {}),
        }
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        history.append(metrics)

    assert history[0]["is_ratio_mean_abs_dev"] < 0.01, history[0]
    assert all(m["loss_after_step"] < m["loss"] for m in history), history
    # compute_logprobs scores a sequence with the live policy: the first token has no logprob.
    scored = sampling_client.compute_logprobs(prompt)
    assert scored[0] is None and all(isinstance(v, float) and v <= 0 for v in scored[1:])

"""A supervised loop written as Tinker's docs and tinker-cookbook's `recipes/sl_loop.py` write one, run
unchanged through the `tinker` shim against the embedded Loops.

What it proves: the shim's `ServiceClient()` finds the server from `LOOPS_BASE_URL`/`BASETEN_API_KEY`; the
cookbook's pipelining (submit `forward_backward` and `optim_step`, then wait on both) works; the returned
logprobs are finite at every weighted *and* weight-0 position, so the cookbook's `logprobs · weights` mean
NLL is a number (it was NaN while weight-0 positions came back null); the loss falls; and the cookbook's
final checkpoint (`save_state` + `save_weights_for_sampler`) and resume (`create_training_client_from_state
_with_optimizer`) work.
"""

from __future__ import annotations

import math

import pytest
from tinker_style import conversation_datum, mean_nll

CONVERSATIONS = [
    [{"role": "user", "content": "Name a board game."}, {"role": "assistant", "content": "Chess."}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Teal."}],
    [{"role": "user", "content": "Name a river."}, {"role": "assistant", "content": "The Danube."}],
    [{"role": "user", "content": "Name a metal."}, {"role": "assistant", "content": "Cobalt."}],
]
STEPS = 12


def test_sl_loop_loss_falls_and_no_metric_is_nan(loops_env, tiny_chat_model_path):
    import tinker

    service_client = tinker.ServiceClient()
    training_client = service_client.create_lora_training_client(
        base_model=str(tiny_chat_model_path), rank=8, seed=0
    )
    tokenizer = training_client.get_tokenizer()
    batch = [conversation_datum(tokenizer, c) for c in CONVERSATIONS]
    assert all(0.0 in d.loss_fn_inputs["weights"].data for d in batch)  # prompts are weight 0

    history = []
    for step in range(STEPS):
        lr = 4e-2 * max(0.0, 1.0 - step / STEPS)  # the cookbook's linear decay
        adam = tinker.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.95, eps=1e-8)
        fwd_bwd_future = training_client.forward_backward(batch, loss_fn="cross_entropy")
        optim_future = training_client.optim_step(adam)
        fwd_bwd = fwd_bwd_future.result()
        optim = optim_future.result()
        logprobs = [out["logprobs"] for out in fwd_bwd.loss_fn_outputs]
        metrics = {
            **(optim.metrics or {}),
            "train_mean_nll": mean_nll(logprobs, [d.loss_fn_inputs["weights"] for d in batch]),
            "loss": fwd_bwd.loss,
        }
        assert all(math.isfinite(v) for v in metrics.values()), (step, metrics)
        history.append(metrics)

    nll = [m["train_mean_nll"] for m in history]
    assert nll[-1] < nll[0] - 0.15, nll
    # The weighted NLL the cookbook computes client-side is the trainer's own loss (a per-token mean).
    assert history[0]["train_mean_nll"] == pytest.approx(history[0]["loss"], rel=1e-3)

    state_path = training_client.save_state("final").result().path
    sampler_path = training_client.save_weights_for_sampler("final").result().path
    assert sampler_path.endswith("/sampler_weights/final")
    resumed = service_client.create_training_client_from_state_with_optimizer(state_path)
    again = resumed.forward(batch, loss_fn="cross_entropy").result()
    assert again.loss == pytest.approx(
        training_client.forward(batch, loss_fn="cross_entropy").result().loss, abs=1e-4
    )
    assert resumed.policy_version == STEPS

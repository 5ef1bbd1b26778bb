"""A loss the Loops built-ins don't have: importance sampling plus a KL penalty to the *base* model.

    [training]
    loss = "kl_loss:loss"
    loss_config = { beta = 0.1 }     # keyword arguments of the function

`@uses_reference_logprobs` makes the run add `ref_logprobs` (the base model's logprob of each target
token, scored by the version-0 policy) to every datum. The function gets the step's datums and, for
each, the trainer's current logprobs as a tensor that requires grad; the SDK differentiates what it
returns and the trainer applies that gradient (forward_backward_custom). Built-in `dro` and `dppo`
regularise towards the sampler, one step behind; this one keeps the policy near where it started.
"""

from __future__ import annotations

import torch

from loops_nb.rl.custom_loss import mean_over_active_tokens, rl_inputs, uses_reference_logprobs


@uses_reference_logprobs
def loss(data, logprobs, beta: float = 0.05):
    policy_gradient, kl, sampled, with_advantage = [], [], [], []
    for datum, lp in zip(data, logprobs, strict=True):
        x = rl_inputs(datum)  # target_tokens, logprobs (sampler), advantages, mask, ref_logprobs
        trains = (x["target_tokens"] != -100) & (x["mask"] != 0)
        policy_gradient.append(-torch.exp(lp - x["logprobs"]) * x["advantages"])
        with_advantage.append(trains & (x["advantages"] != 0))
        # k3 estimator of KL(policy || base) on the sampled tokens: exp(r) - r - 1 >= 0, r = ref - lp.
        r = x["ref_logprobs"] - lp
        kl.append(torch.exp(r) - r - 1)
        sampled.append(trains)
    pg = mean_over_active_tokens(policy_gradient, with_advantage)  # exactly the built-in normalisation
    penalty = mean_over_active_tokens(kl, sampled)
    return pg + beta * penalty, {"kl_to_base": float(penalty.detach()), "pg_loss": float(pg.detach())}

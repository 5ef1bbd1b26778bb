"""AdamW as the Loops `optim_step` drives it: hyper-parameters arrive with every step, and are checked
before anything changes.

The step's `AdamParams` is the SDK's own model (its defaults are Loops'); a `grad_clip_norm` of 0 disables
clipping.
"""

from __future__ import annotations

import math

import torch
from baseten.loops import AdamParams

from loops_nb.local.bad_request import BadRequest


def adam_hyperparameters(adam_params: AdamParams) -> AdamParams:
    """`adam_params`, checked: a value that is not a finite non-negative number is a `BadRequest`."""
    for key, value in adam_params.model_dump().items():
        if not math.isfinite(value) or value < 0:
            raise BadRequest(f"adam_params[{key!r}] must be a finite non-negative number, got {value!r}")
    return adam_params


def new_adamw(params: list[torch.nn.Parameter]) -> torch.optim.AdamW:
    # Hyper-parameters are placeholders: `set_hyperparameters` sets them from each request.
    return torch.optim.AdamW(params, lr=0.0, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)


def set_hyperparameters(optimizer: torch.optim.Optimizer, hp: AdamParams) -> None:
    """Give every parameter group the step's learning rate, betas, eps and weight decay."""
    for group in optimizer.param_groups:
        group.update(
            lr=hp.learning_rate, betas=(hp.beta1, hp.beta2), eps=hp.eps, weight_decay=hp.weight_decay
        )

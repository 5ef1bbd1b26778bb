"""AdamW as the Loops `optim_step` drives it: hyper-parameters arrive with every step, and are checked
before anything changes.

The SDK's `AdamParams` may leave any field unset (null); an unset field takes Loops' default. A
`grad_clip_norm` of 0 disables clipping.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from loops_nb.local.bad_request import BadRequest

ADAM_DEFAULTS = {
    "learning_rate": 1e-4,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-12,
    "weight_decay": 0.0,
    "grad_clip_norm": 1.0,
}


def adam_hyperparameters(adam_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """`adam_params` over the defaults; a value that is not a finite non-negative number is a `BadRequest`."""
    hp = {**ADAM_DEFAULTS, **{k: v for k, v in (adam_params or {}).items() if v is not None}}
    for key in ADAM_DEFAULTS:
        value = hp[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise BadRequest(f"adam_params[{key!r}] must be a finite non-negative number, got {value!r}")
    return hp


def new_adamw(params: list[torch.nn.Parameter]) -> torch.optim.AdamW:
    # Hyper-parameters are placeholders: `set_hyperparameters` sets them from each request.
    return torch.optim.AdamW(params, lr=0.0, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)


def set_hyperparameters(optimizer: torch.optim.Optimizer, hp: Mapping[str, Any]) -> None:
    """Give every parameter group the step's learning rate, betas, eps and weight decay."""
    for group in optimizer.param_groups:
        group.update(
            lr=float(hp["learning_rate"]),
            betas=(float(hp["beta1"]), float(hp["beta2"])),
            eps=float(hp["eps"]),
            weight_decay=float(hp["weight_decay"]),
        )

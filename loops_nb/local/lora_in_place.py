"""LoRA linear layers that add their update into the base layer's output in place.

PEFT's LoRA `Linear.forward` makes three output-sized tensors per adapted linear (B's product, its scaled
copy, the sum); `add_update_in_place` computes the same `x W^T + b + scaling * (x A^T) B^T` with one
`addmm_` into the base product (those sums were a third of a trainer step's allocations; the quickstart's
second step went from 20.6 to 18.4 s on one thread). Only the plain case takes this path: one active
adapter, no variant, no dropout at work, no LoRA bias, the input in the adapter's dtype and a base that is
exactly `torch.nn.Linear`; everything else runs PEFT's own forward.
"""

from __future__ import annotations

import types
from typing import Any, cast

import torch
import torch.nn.functional as F
from peft.tuners.lora import Linear as LoraLinear


def _plain_update(layer: LoraLinear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """(A, B, scaling) when `layer`'s output is exactly base + scaling * x A^T B^T, else None."""
    if layer.disable_adapters or layer.merged or layer.lora_variant or layer.fan_in_fan_out:
        return None
    active = layer.active_adapters
    if len(active) != 1 or active[0] not in layer.lora_A:
        return None
    name = active[0]
    dropout = layer.lora_dropout[name]
    if not (
        isinstance(dropout, torch.nn.Identity)
        or (isinstance(dropout, torch.nn.Dropout) and not dropout.training)
    ):
        return None
    base, lora_a, lora_b = layer.base_layer, layer.lora_A[name], layer.lora_B[name]
    if type(base) is not torch.nn.Linear or "forward" in vars(base) or lora_b.bias is not None:
        return None
    if not (x.dtype == lora_a.weight.dtype == base.weight.dtype):
        return None
    return lora_a.weight, lora_b.weight, float(layer.scaling[name])


def _forward(self: LoraLinear, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    update = None if args or kwargs else _plain_update(self, x)
    if update is None:
        return LoraLinear.forward(self, x, *args, **kwargs)
    lora_a, lora_b, scaling = update
    base = cast(torch.nn.Linear, self.base_layer)  # `_plain_update` checked it is exactly one
    flat = x.reshape(-1, x.shape[-1])
    out = F.linear(flat, base.weight, base.bias)
    out.addmm_(flat @ lora_a.t(), lora_b.t(), alpha=scaling)
    return out.view(*x.shape[:-1], out.shape[-1])


def add_update_in_place(model: torch.nn.Module) -> int:
    """Give every PEFT LoRA `Linear` in `model` the in-place forward; returns how many layers it covered.
    Safe to call again after adapters are added (layers already covered are left as they are)."""
    covered = 0
    for module in model.modules():
        if type(module) is LoraLinear:
            if vars(module).get("forward") is None:
                module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
            covered += 1
    return covered

"""Which layers of a model get LoRA, by module name.

The trainer puts LoRA on the usual attention and MLP projections when a model has them all, else on every
linear layer except the output head and MoE routers (PEFT's "all-linear" minus routers). `loops check`
sizes a run's adapter from the same default names before any weights are loaded, so the names live here,
apart from the trainer and torch.
"""

from __future__ import annotations

from collections.abc import Set

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NOT_TARGETS = frozenset({"lm_head", "score", "classifier", "gate", "router", "shared_expert_gate"})
"""Linear layers that must not get LoRA in the every-linear-layer fallback: heads and MoE routers."""


def choose_targets(linear_names: Set[str], model_name: str) -> list[str]:
    """LoRA targets among a model's linear layer names (the last component of each module name)."""
    if set(DEFAULT_TARGETS) <= linear_names:
        return list(DEFAULT_TARGETS)
    found = sorted(linear_names - NOT_TARGETS)
    if not found:
        raise ValueError(f"found no linear layers to put LoRA on in {model_name}")
    return found

"""The PEFT LoRA adapter a trainer puts on its base model: which layers, how a fresh one starts, and its
weights and config as the sampler and `adapter_config.json` take them.

LoRA uses alpha = 32 whatever the rank (scale 32/r), as in Thinking Machines' "LoRA Without Regret" that
Tinker follows: the best learning rate then barely moves with the rank. Dropout is 0, so a training-time
forward equals the sampler's.
"""

from __future__ import annotations

import json
import warnings
from typing import TYPE_CHECKING, Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils import get_peft_model_state_dict
from transformers.pytorch_utils import Conv1D

from loops_nb.local.lora_in_place import add_update_in_place
from loops_nb.local.lora_targets import choose_targets

if TYPE_CHECKING:
    from transformers import PreTrainedModel

LORA_ALPHA = 32


def discover_target_modules(model: torch.nn.Module) -> list[str]:
    """LoRA targets of a loaded model (see `lora_targets.choose_targets`)."""
    output_embeddings = getattr(model, "get_output_embeddings", None)
    head = output_embeddings() if callable(output_embeddings) else None
    names = {  # GPT-2 style models use transformers' Conv1D, which PEFT's LoRA also handles
        n.rsplit(".", 1)[-1]
        for n, m in model.named_modules()
        if (isinstance(m, Conv1D) or _computes_as_linear(m)) and m is not head
    }
    return choose_targets(names, type(model).__name__)


def _computes_as_linear(module: torch.nn.Module) -> bool:
    """A `Linear` whose output is `x @ W.T + b`, as PEFT's LoRA assumes: not a subclass with a forward of its own
    (DeepSeek V4's grouped `o_a_proj` multiplies each head group by its own block; LoRA's `x @ A.T @ B.T` on the
    whole input has the wrong shape there). Our bf16 product layer is a plain linear in another precision."""
    from loops_nb.local.mixed_precision import Bf16ProductLinear

    if not isinstance(module, torch.nn.Linear):
        return False
    return type(module).forward is torch.nn.Linear.forward or isinstance(module, Bf16ProductLinear)


def new_lora(base: PreTrainedModel, *, rank: int, alpha: int, targets: list[str], seed: int) -> PeftModel:
    """`base` wrapped with a fresh LoRA (B = 0, so it computes as the base), in eval mode."""
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    # Seed without touching the caller's RNG. peft 0.21 still calls transformers' deprecated
    # `is_gradient_checkpointing`; the warning is not the user's to act on.
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        torch.manual_seed(seed)
        model: PeftModel = get_peft_model(base, config)
    model.eval()
    add_update_in_place(model)
    return model


def adapter_state_dict(model: PeftModel) -> dict[str, torch.Tensor]:
    """CPU copies of the LoRA weights, keyed as PEFT saves them (no adapter name)."""
    return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(model).items()}


def lora_config_dict(model: PeftModel) -> dict[str, Any]:
    """The adapter's `LoraConfig` as JSON-able values (what `adapter_config.json` holds)."""
    cfg = model.peft_config["default"].to_dict()
    return json.loads(json.dumps(cfg, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))

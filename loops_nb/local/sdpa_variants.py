"""Our attention functions in SDPA's place: `packed_attention` in the trainer, `prompt_attention`
(`shared_prompt_kv`) in the sampler. Each takes over only a forward that hands it its layout and gives
every other call to transformers' SDPA function unchanged, so a model switched onto one computes what it
did on SDPA.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SDPA: Callable[..., tuple[torch.Tensor, None]] = sdpa_attention_forward
"""transformers' SDPA function, for every call a variant does not take over (their kwargs pass through)."""


def register_sdpa_variant(name: str, attention: Callable[..., tuple[torch.Tensor, None]]) -> None:
    """Register `attention` with transformers as the implementation `name`, on SDPA's masks."""
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, sdpa_mask)


def use_sdpa_variant(model: torch.nn.Module, name: str) -> bool:
    """Switch `model` (a trainer's or the sampler's own module tree) from SDPA to the variant `name`; returns
    whether it did. Only a model on plain SDPA without soft-capped scores switches: any other implementation
    is the user's or the model's choice, and no variant soft-caps."""
    config = model.config
    text = getattr(config, "text_config", None) or config
    if getattr(config, "_attn_implementation", None) != "sdpa" or getattr(
        text, "attn_logit_softcapping", None
    ):
        return False
    setattr(config, "_attn_implementation", name)  # noqa: B010 (a module's config is untyped)
    return True

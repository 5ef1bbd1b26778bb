"""The trainer's fast paths, per architecture, against the model itself.

- A plain head (`micro_batch.PLAIN_HEAD_TYPES`): the logits are exactly `lm_head(last_hidden_state)`, so the
  trainer runs the head on the positions the loss needs only (with 150k-262k vocabularies, all positions'
  logits would dominate a step's memory).
- Full-attention caches (`kv_cache.cache_is_full_attention`): only these let the sampler merge rows into a
  running batch and the trainer repeat a shared prompt's keys and values; linear attention (Qwen3.5/3.6),
  compressed attention (DeepSeek V4) and sliding windows (gpt-oss, Gemma 3) decline both.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from family_models import _config

from loops_nb.local.kv_cache import cache_is_full_attention
from loops_nb.local.micro_batch import has_plain_head

FULL_ATTENTION = {"qwen3": True, "llama-3": True, "qwen3.6": False, "deepseek-v4": False, "gpt-oss": False}


def gemma3() -> Any:
    import transformers as tf

    return tf.Gemma3TextConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
    )


@pytest.mark.parametrize("name", [*FULL_ATTENTION, "gemma3"])
def test_the_head_runs_on_the_hidden_states_alone_and_the_cache_kind_is_known(name: str) -> None:
    from transformers import AutoModelForCausalLM

    config = gemma3() if name == "gemma3" else _config(name, 1000, {})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 1000, (2, 40))  # past Gemma's and gpt-oss's tiny windows
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state
        head = model.get_output_embeddings()(hidden)
    assert has_plain_head(config)
    assert torch.allclose(logits, head, atol=1e-5)
    assert cache_is_full_attention(config) is FULL_ATTENTION.get(name, False)

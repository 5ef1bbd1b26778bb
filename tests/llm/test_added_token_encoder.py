"""The added-token encoder: cached first-turn tokens give exactly the whole-text tokenization."""

from __future__ import annotations

import re
from typing import Any

from sft_fixtures import build_tokenizer

from loops_nb.llm.added_token_encoder import AddedTokenEncoder

STOP = re.compile(re.escape("<|im_end|>"))


def texts(tok: Any) -> list[str]:
    system = {"role": "system", "content": "You are a weather bot.\n\nBe brief."}
    out = []
    for i in range(30):
        messages = [
            system,
            {"role": "user", "content": f"Weather in city {i}?  \n"},
            {"role": "assistant", "content": f"\n\nSunny, {i} degrees."},
        ]
        out.append(tok.apply_chat_template(messages, tokenize=False))
    return out


def test_split_encoding_equals_whole_encoding() -> None:
    for family in ("smollm2_tools", "qwen3"):
        tok = build_tokenizer(family)
        encoder = AddedTokenEncoder(tok, STOP)
        for text in texts(tok):
            ids, added = encoder.encode(text)
            whole = tok.backend_tokenizer.encode(text, add_special_tokens=False)
            assert ids == whole.ids
            assert added == [(i, *whole.offsets[i]) for i in range(len(ids)) if ids[i] in encoder.added_ids]
        assert encoder.splitting and len(encoder._cache) == 1  # one shared system turn


def test_a_tokenizer_that_breaks_independence_stops_splitting() -> None:
    from tokenizers import AddedToken

    tok = build_tokenizer("smollm2_tools")
    # lstrip makes <|im_start|> swallow the "\n" before it, so text on its two sides is no longer independent.
    tok.backend_tokenizer.add_special_tokens([AddedToken("<|im_start|>", lstrip=True, special=True)])
    encoder = AddedTokenEncoder(tok, STOP)
    for text in texts(tok):
        assert encoder.encode(text)[0] == tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
    assert not encoder.splitting

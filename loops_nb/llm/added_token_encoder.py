"""Tokenizing rendered chats fast, with the positions of added tokens (``<|im_start|>``, ``<|im_end|>``, ...).

Rendering needs, per example, its token ids and where each added token sits in the text: turn boundaries are
located through them (see `loops_nb.sft.targets`). A fast tokenizer spends most of its time per character, and
in short tool-use rows most characters are the system prompt with its tool list, identical from row to row.

Added tokens split the input before pre-tokenization, so the text on either side of one is tokenized
independently: ``tokens(a + b) == tokens(a) + tokens(b)`` when ``b`` starts with an added token. The encoder
uses that to cache the tokens of the first turn (up to the added token that follows its stop token) and tokenize
only the rest of each text. It checks the property on the first texts it splits, against a whole-text
tokenization, and stops splitting for good if a tokenizer ever disagrees.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_CACHE_SIZE = 64
_VERIFY_FIRST = 8


def alternation(tokens: Iterable[str]) -> re.Pattern[str]:
    """A pattern matching any of `tokens`, the longest first (one that never matches for none)."""
    longest_first = sorted(set(tokens), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, longest_first)) or "(?!)")


class AddedTokenEncoder:
    """Encodes text to ``(ids, added)``, where ``added`` lists ``(token index, char start, char end)`` of every
    added token in order."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop_re: re.Pattern[str]) -> None:
        self._backend = tokenizer.backend_tokenizer
        self.added_ids = frozenset(tokenizer.added_tokens_decoder)
        self._added_re = alternation(t.content for t in tokenizer.added_tokens_decoder.values())
        self._stop_re = stop_re
        self._cache: dict[str, tuple[list[int], list[tuple[int, int, int]]]] = {}
        self._verify_left = _VERIFY_FIRST
        self.splitting = True

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int, int]]]:
        cut = self._head_end(text) if self.splitting else 0
        if not cut:
            return self._encode(text)
        head = self._cache.get(text[:cut])
        if head is None:
            head = self._encode(text[:cut])
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[text[:cut]] = head
        tail_ids, tail_added = self._encode(text[cut:])
        if not tail_added or tail_added[0][:2] != (0, 0):
            # The tokenizer did not read the text at the cut as an added token (e.g. a single_word token), so
            # the two sides are not independent.
            return self._encode(text)
        ids = head[0] + tail_ids
        n = len(head[0])
        added = head[1] + [(i + n, a + cut, b + cut) for i, a, b in tail_added]
        if self._verify_left:
            self._verify_left -= 1
            whole = self._encode(text)
            if whole[0] != ids:
                self.splitting = False
                self._cache.clear()
                return whole
        return ids, added

    def encode_ids(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def _encode(self, text: str) -> tuple[list[int], list[tuple[int, int, int]]]:
        enc = self._backend.encode(text, add_special_tokens=False)
        ids, offsets, added_ids = enc.ids, enc.offsets, self.added_ids
        return ids, [(i, *offsets[i]) for i, tid in enumerate(ids) if tid in added_ids]

    def _head_end(self, text: str) -> int:
        """Where the first turn's text ends: the start of the first added token after the first stop token, or 0
        when there is none (then the text is encoded whole)."""
        stop = self._stop_re.search(text)
        if stop is None:
            return 0
        nxt = self._added_re.search(text, stop.end())
        return nxt.start() if nxt else 0

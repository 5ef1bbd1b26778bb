"""The sampler's prefix cache: keys and values of finished sequences, so a next call prefills only what is new.

What it keeps, what it saves and its bound: docs/reference/local_loops.md, "Memory and precision" ("An
agent's next call prefills only what is new"). As in a radix tree, a sequence kept after another with which
it shares a prefix holds only its own tokens and refers to that one (its `parent`) for the rest; a sequence
is evicted with everything kept on top of it, and using one refreshes its parents, so a parent outlives its
children in the least-recently-used order. Keys and values depend on the weights, so an entry serves only
the adapter and adapter version that made it; only models whose cache layers are all full attention use it
(a sliding-window or recurrent layer cannot be cut at an arbitrary prefix).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch
from torch import Tensor

MIN_PREFIX_TOKENS = 16
"""A shorter shared prefix is prefilled again: its saving is smaller than the bookkeeping."""


@dataclass(frozen=True, eq=False)
class CachedSequence:
    """One finished row's keys and values, per layer `[1, kv_heads, tokens, head_dim]`, never written to.

    `keys` and `values` hold the tokens from `start` on; the first `start` come from `parent`.
    """

    adapter: str | None
    version: int | None
    tokens: tuple[int, ...]
    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    parent: CachedSequence | None = None
    start: int = 0

    @property
    def key(self) -> tuple[str | None, int | None, tuple[int, ...]]:
        return (self.adapter, self.version, self.tokens)

    @property
    def nbytes(self) -> int:
        """The bytes this sequence holds itself (its parents' are counted with them)."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def pieces(self, length: int) -> list[tuple[tuple[Tensor, ...], tuple[Tensor, ...]]]:
        """Per-layer keys and values of the first `length` tokens, in consecutive pieces (views: a caller
        copies before it writes), the parents' first."""
        if length <= self.start:
            assert self.parent is not None
            return self.parent.pieces(length)
        head = self.parent.pieces(self.start) if self.parent is not None and self.start else []
        own = length - self.start
        return [
            *head,
            (tuple(k[:, :, :own] for k in self.keys), tuple(v[:, :, :own] for v in self.values)),
        ]

    def kept_after(self, parent: CachedSequence | None, start: int) -> CachedSequence:
        """A copy of this sequence's keys and values from `start` on, in one block, over `parent`.

        One block, not a tensor per layer: a 60-token row of a 30-layer model is 60 tensors of 46 KB, which
        the C allocator serves from its heap, where freed ones stay resident and splinter the free space the
        trainer's activations then cannot reuse; one 2.8 MB block is a mapping of its own, returned to the
        system whole when the sequence is evicted or its policy replaced.
        """
        parts = [t[:, :, start - self.start :] for t in (*self.keys, *self.values)]
        block = torch.empty(sum(t.numel() for t in parts), dtype=parts[0].dtype, device=parts[0].device)
        copies, offset = [], 0
        for part in parts:
            copy = block[offset : offset + part.numel()].view(part.shape)
            copy.copy_(part)
            copies.append(copy)
            offset += part.numel()
        layers = len(self.keys)
        return CachedSequence(
            self.adapter,
            self.version,
            self.tokens,
            tuple(copies[:layers]),
            tuple(copies[layers:]),
            parent,
            start,
        )


@dataclass(frozen=True)
class PrefixHit:
    """The kept sequence a prompt extends, and how many of its tokens the prompt shares."""

    sequence: CachedSequence
    length: int


class PrefixCache:
    """Finished sequences' keys and values by adapter, version and token ids, least recently used evicted."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: collections.OrderedDict[
            tuple[str | None, int | None, tuple[int, ...]], CachedSequence
        ] = collections.OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, adapter: str | None, version: int | None, prompt: list[int]) -> PrefixHit | None:
        """The longest prefix of `prompt` (leaving at least its last token to compute) a kept sequence shares."""
        hit = self._longest(adapter, version, prompt, len(prompt) - 1)
        if hit is not None:
            self._touch(hit.sequence)
        return hit

    def store(self, sequence: CachedSequence) -> None:
        """Keep `sequence` (its keys and values may be views into a batch's cache: what is kept is copied).

        Only the tokens past the longest prefix already kept are copied; a sequence that a kept one already
        holds whole adds nothing, and one whose own part is larger than the whole budget is not kept. Keeping
        it drops the adapter's entries of other versions, then the least recently used entries until the
        cache fits its budget.
        """
        if len(sequence.tokens) < MIN_PREFIX_TOKENS:
            return
        known = self._entries.get(sequence.key)
        if known is not None:
            self._touch(known)
            return
        hit = self._longest(sequence.adapter, sequence.version, list(sequence.tokens), len(sequence.tokens))
        if hit is not None and hit.length == len(sequence.tokens):
            self._touch(hit.sequence)
            return
        start = hit.length if hit is not None else 0
        per_token = sequence.nbytes / max(1, len(sequence.tokens) - sequence.start)
        if per_token * (len(sequence.tokens) - start) > self.budget_bytes:
            return
        for key in [k for k in self._entries if k[0] == sequence.adapter and k[1] != sequence.version]:
            self._drop(key)
        kept = sequence.kept_after(hit.sequence if hit is not None else None, start)
        self._entries[kept.key] = kept
        self.nbytes += kept.nbytes
        self._touch(kept)
        while self.nbytes > self.budget_bytes:
            self._drop(next(iter(self._entries)))

    def drop_adapter(self, adapter: str | None) -> None:
        """Forget an adapter's sequences (it was removed, or its weights were replaced in place)."""
        for key in [k for k in self._entries if k[0] == adapter]:
            self._drop(key)

    def _longest(
        self, adapter: str | None, version: int | None, tokens: list[int], limit: int
    ) -> PrefixHit | None:
        best: PrefixHit | None = None
        for key, sequence in self._entries.items():
            if key[0] != adapter or key[1] != version:
                continue
            shared = _shared_length(sequence.tokens, tokens, limit)
            if shared >= MIN_PREFIX_TOKENS and (best is None or shared > best.length):
                best = PrefixHit(sequence, shared)
        return best

    def _touch(self, sequence: CachedSequence) -> None:
        # The sequence, then its parents, to the most recent end: a parent is never evicted before its
        # children for age alone.
        node: CachedSequence | None = sequence
        while node is not None:
            if node.key in self._entries:
                self._entries.move_to_end(node.key)
            node = node.parent

    def _drop(self, key: tuple[str | None, int | None, tuple[int, ...]]) -> None:
        sequence = self._entries.pop(key, None)
        if sequence is None:  # already dropped with a parent
            return
        self.nbytes -= sequence.nbytes
        for child in [k for k, kept in self._entries.items() if kept.parent is sequence]:
            self._drop(child)


def _shared_length(tokens: tuple[int, ...], prompt: list[int], limit: int) -> int:
    n = min(len(tokens), limit)
    for i in range(n):
        if tokens[i] != prompt[i]:
            return i
    return n

"""The sampler's prefix cache: keys and values of finished sequences, so a next call prefills only what is new.

An agent's next call sends its whole history again: the previous prompt, the exact completion it sampled,
then a few new tokens (a tool result, a user turn). Without this cache every call prefilled the whole
history (a 10-turn agent prefilled its first turn ten times). When a request finishes, each of its rows'
keys and values (the prompt and all its sampled tokens but the last, which was never fed back) are kept
here under their token ids. A later prompt under the same adapter and policy version reuses the longest
prefix it shares with any kept sequence and prefills only the rest; vLLM's automatic prefix caching and
SGLang's radix attention do the same on GPUs.

Keys and values depend on the weights, so an entry is valid only for the adapter and adapter version that
made it: a new policy (`save_weights_and_get_sampling_client` publishes a new version) drops the adapter's
older entries. The cache holds at most `budget_bytes`, evicting the least recently used sequence first.
Only models whose cache layers are all full attention use it (a sliding-window or recurrent layer cannot be
cut at an arbitrary prefix).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

MIN_PREFIX_TOKENS = 16
"""A shorter shared prefix is prefilled again: its saving is smaller than the bookkeeping."""


@dataclass(frozen=True)
class CachedSequence:
    """One finished row's keys and values, per layer `[1, kv_heads, tokens, head_dim]`, never written to."""

    adapter: str | None
    version: int | None
    tokens: tuple[int, ...]
    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

    @classmethod
    def copied(
        cls,
        adapter: str | None,
        version: int | None,
        tokens: tuple[int, ...],
        keys: Sequence[Tensor],
        values: Sequence[Tensor],
    ) -> CachedSequence:
        """A sequence holding copies of `keys` and `values` (views into a batch's cache) in one block.

        One block, not a tensor per layer: a 60-token row of a 30-layer model is 60 tensors of 46 KB, which
        the C allocator serves from its heap, where freed ones stay resident and splinter the free space the
        trainer's activations then cannot reuse; one 2.8 MB block is a mapping of its own, returned to the
        system whole when the sequence is evicted or its policy replaced.
        """
        parts = [*keys, *values]
        block = torch.empty(sum(t.numel() for t in parts), dtype=parts[0].dtype, device=parts[0].device)
        copies, offset = [], 0
        for part in parts:
            copy = block[offset : offset + part.numel()].view(part.shape)
            copy.copy_(part)
            copies.append(copy)
            offset += part.numel()
        return cls(adapter, version, tokens, tuple(copies[: len(keys)]), tuple(copies[len(keys) :]))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass(frozen=True)
class PrefixHit:
    """The kept sequence a prompt extends, and how many of its tokens the prompt shares."""

    sequence: CachedSequence
    length: int

    def layers(self) -> list[tuple[Tensor, Tensor]]:
        """Each layer's keys and values of the shared prefix (views: the caller copies before it writes)."""
        n = self.length
        return [
            (k[:, :, :n], v[:, :, :n]) for k, v in zip(self.sequence.keys, self.sequence.values, strict=True)
        ]


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
        best: PrefixHit | None = None
        limit = len(prompt) - 1
        for key, sequence in self._entries.items():
            if key[0] != adapter or key[1] != version:
                continue
            shared = _shared_length(sequence.tokens, prompt, limit)
            if shared >= MIN_PREFIX_TOKENS and (best is None or shared > best.length):
                best = PrefixHit(sequence, shared)
        if best is not None:
            self._entries.move_to_end((adapter, version, best.sequence.tokens))
        return best

    def store(self, sequence: CachedSequence) -> None:
        """Keep `sequence`, dropping the adapter's entries of older versions, then the least recently used
        ones until the cache fits its budget. A sequence larger than the whole budget is not kept."""
        if sequence.nbytes > self.budget_bytes or len(sequence.tokens) < MIN_PREFIX_TOKENS:
            return
        for key in [k for k in self._entries if k[0] == sequence.adapter and k[1] != sequence.version]:
            self._drop(key)
        key = (sequence.adapter, sequence.version, sequence.tokens)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        self._entries[key] = sequence
        self.nbytes += sequence.nbytes
        while self.nbytes > self.budget_bytes:
            self._drop(next(iter(self._entries)))

    def drop_adapter(self, adapter: str | None) -> None:
        """Forget an adapter's sequences (it was removed, or its weights were replaced in place)."""
        for key in [k for k in self._entries if k[0] == adapter]:
            self._drop(key)

    def _drop(self, key: tuple[str | None, int | None, tuple[int, ...]]) -> None:
        self.nbytes -= self._entries.pop(key).nbytes


def _shared_length(tokens: tuple[int, ...], prompt: list[int], limit: int) -> int:
    n = min(len(tokens), limit)
    for i in range(n):
        if tokens[i] != prompt[i]:
            return i
    return n

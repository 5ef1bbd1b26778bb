"""One coalesced decode batch of the local sampler: KV cache bookkeeping, one token per step (its prefill is
`prefill_plan`'s).

A batch is a set of rows (one per sample: a request with `n=4` is 4 rows) decoded in lockstep through the
model's forward with a `DynamicCache` whose layers grow in place (`kv_cache`). Prompts are left-padded, so
every row's next token is at the same cache index; each row's position ids count only its real tokens and
the 2-D attention mask hides the padding, which makes a row's logits those of its prompt alone. With
`prompts` (`shared_prompt_kv`) the cache holds each row's own tokens only. Finished rows leave the batch and,
on models whose cache is all full-attention layers, requests prefilled after it started join it, their cache
left-padded to the batch's length (continuous batching: a request arriving mid-generation does not wait for
the longest completion in flight).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from loops_nb.local.decoding import RowParams
from loops_nb.local.kv_cache import bound_growth
from loops_nb.local.prefix_cache import CachedSequence
from loops_nb.local.sampling_types import PromptLogprobEntry, SampledChoice, SampleRequest, SampleResult
from loops_nb.local.shared_prompt_kv import SharedPrompts

# (input_ids, attention_mask, position_ids, cache, all_logits, shared prompts) -> logits [B, S or 1, V]
Forward = Callable[[Tensor, Tensor, Tensor, DynamicCache, bool, SharedPrompts | None], Tensor]


@dataclass(eq=False)
class Job:
    """A queued request: what it asked for, resolved against the model, and where its answer goes."""

    request: SampleRequest
    adapter: str | None
    future: Future[SampleResult]
    max_tokens: int
    stop_ids: frozenset[int]
    choices: list[SampledChoice | None] = field(default_factory=list)
    prompt_logprobs: list[PromptLogprobEntry | None] | None = None
    adapter_version: int | None = None
    expanded: list[int] | None = None
    """An image prompt's ids with its image positions set to the model's image token."""
    pixels: dict[str, Tensor] | None = None
    """An image prompt's processed images (`pixel_values`, `image_grid_thw`); such a job decodes alone."""
    abandoned: bool = False
    """Its caller gave up (the client went away): the batch drops its rows at the next token."""

    @property
    def rows(self) -> int:
        return self.request.n

    @property
    def prompt(self) -> list[int]:
        return self.expanded if self.expanded is not None else self.request.prompt

    def result(self) -> SampleResult:
        choices = [choice for choice in self.choices if choice is not None]
        assert len(choices) == len(self.choices)
        return SampleResult(
            choices=choices,
            prompt_token_ids=list(self.prompt),
            adapter=self.adapter,
            adapter_version=self.adapter_version,
            prompt_logprobs=self.prompt_logprobs,
            echo_prompt=self.expanded is not None,
        )


@dataclass(eq=False)
class Row:
    """One sample being generated: the tokens and logprobs so far."""

    job: Job
    index: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


def cache_layers(cache: DynamicCache) -> list[DynamicLayer]:
    """The cache's layers, as the full-attention layers `kv_cache.cache_is_full_attention` checked they are."""
    return cast(list[DynamicLayer], cache.layers)


def _map_layers(cache: DynamicCache, fn: Callable[[Tensor], Tensor]) -> None:
    """Replace every layer's keys and values `[B, heads, S, dim]` by `fn` of them."""
    for layer in cache_layers(cache):
        assert layer.keys is not None and layer.values is not None
        layer.keys, layer.values = fn(layer.keys), fn(layer.values)


@dataclass(eq=False)
class DecodeBatch:
    """Rows decoding together under one adapter: their KV cache, attention mask and pending logits."""

    rows: list[Row]
    cache: DynamicCache
    """Every row's keys and values; with `prompts`, only the tokens each row fed back after its prompt."""
    mask: Tensor  # [B, S] long: 1 for real tokens, 0 for left padding (the cache's columns)
    next_position: Tensor  # [B] position id of each row's next token
    logits: Tensor  # [B, V] the logits the next token is drawn from
    params: RowParams
    forward: Forward
    """The model forward the batch was prefilled with, and decodes with."""
    prompts: SharedPrompts | None = None
    """The rows' prompts, each held once (None: each row's prompt is in its own cache rows)."""

    @property
    def cache_length(self) -> int:
        return self.mask.shape[1]

    def finished_sequence(self, i: int, adapter: str | None, version: int | None) -> CachedSequence | None:
        """Row `i`'s keys and values, unpadded, as a `CachedSequence` of the prompt and every sampled token
        but the last (never fed back), viewing this batch's cache (`PrefixCache.store` copies what it keeps);
        None when the cache does not hold exactly those."""
        row = self.rows[i]
        tokens = (*row.job.prompt, *row.tokens[:-1])
        slot = None if self.prompts is None else self.prompts.slot_of(i)
        held = len(tokens) - (0 if slot is None else len(slot.prompt))  # the tokens in the row's own cache
        start = self.cache_length - held
        if start < 0 or bool(self.mask[i, :start].any()) or not bool(self.mask[i, start:].all()):
            return None
        layers = cache_layers(self.cache)
        keys = [layer.keys[i : i + 1, :, start:] for layer in layers if layer.keys is not None]
        values = [layer.values[i : i + 1, :, start:] for layer in layers if layer.values is not None]
        if len(keys) != len(layers) or len(values) != len(layers):
            return None
        if slot is not None:
            keys = [torch.cat(pair, dim=-2) for pair in zip(slot.keys, keys, strict=True)]
            values = [torch.cat(pair, dim=-2) for pair in zip(slot.values, values, strict=True)]
        return CachedSequence(adapter, version, tokens, tuple(keys), tuple(values))

    def merge(self, other: DecodeBatch) -> None:
        """Append `other`'s rows, left-padding whichever cache is shorter (needs `cache_is_mergeable`)."""
        length = max(self.cache_length, other.cache_length)
        self._pad_left(length - self.cache_length)
        other._pad_left(length - other.cache_length)
        for mine, theirs in zip(cache_layers(self.cache), cache_layers(other.cache), strict=True):
            assert mine.keys is not None and mine.values is not None
            assert theirs.keys is not None and theirs.values is not None
            mine.keys = torch.cat([mine.keys, theirs.keys])
            mine.values = torch.cat([mine.values, theirs.values])
        if self.prompts is not None and other.prompts is not None:
            self.prompts.extend(other.prompts, len(self.rows))
        self.rows += other.rows
        self.mask = torch.cat([self.mask, other.mask])
        self.next_position = torch.cat([self.next_position, other.next_position])
        self.logits = torch.cat([self.logits, other.logits])
        self.params = self.params.concat(other.params)

    def _pad_left(self, columns: int) -> None:
        if columns > 0:
            _map_layers(self.cache, lambda kv: F.pad(kv, (0, 0, columns, 0)))
            self.mask = F.pad(self.mask, (columns, 0))

    def keep(self, keep: list[int], trim: bool) -> None:
        """Drop every row not in `keep`; with `trim`, also the cache columns that are padding in all rows."""
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        if self.prompts is None:
            self.cache.reorder_cache(cast(torch.LongTensor, index))
        else:  # (`reorder_cache` skips a layer that holds no token yet)
            _map_layers(self.cache, lambda kv: kv.index_select(0, index))
            self.prompts.select(keep)
        self.rows = [self.rows[i] for i in keep]
        self.mask = self.mask[index]
        self.next_position = self.next_position[index]
        self.params = self.params.select(keep)
        if trim:
            # First column some remaining row attends to; columns before it are padding for everyone.
            first = int(self.mask.any(dim=0).int().argmax()) if self.mask.shape[1] else 0
            if first > 0:
                self.mask = self.mask[:, first:]
                _map_layers(self.cache, lambda kv: kv[:, :, first:])

    def advance(self, tokens: Tensor) -> None:
        """Feed each row's chosen token (`tokens`, one per current row) and compute the next logits."""
        self.mask = F.pad(self.mask, (0, 1), value=1)
        # Each row feeds back every token it may still sample but its last.
        still = max(row.job.max_tokens - len(row.tokens) - 1 for row in self.rows)
        bound_growth(self.cache, self.mask.shape[1] + max(0, still))
        logits = self.forward(
            tokens[:, None], self.mask, self.next_position[:, None], self.cache, False, self.prompts
        )
        self.logits = logits[:, -1]
        self.next_position = self.next_position + 1
        self.params.step = self.params.step + 1

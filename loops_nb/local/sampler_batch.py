"""One coalesced decode batch of the local sampler: prefill, KV cache bookkeeping, one token per step.

A batch is a set of rows (one per sample: a request with `n=4` is 4 rows) decoded in lockstep through the
model's forward with a `DynamicCache` whose layers grow in place (`kv_cache`). Prompts are left-padded, so
every row's next token is at the same cache index; each row's position ids count only its real tokens and
the 2-D attention mask hides the padding, which makes a row's logits those of its prompt alone. A request's
prompt is prefilled once (identical prompts from different requests too) and its cache rows copied to its
`n` samples: on models that attend with `shared_prompt_kv` its keys and values are held once for them
(the batch's cache then holds each row's own tokens only), on others copied to each row. Finished rows
leave the batch (their cache rows are dropped) and, on models whose cache is
all full-attention layers, new requests can join a running batch: they are prefilled on their own and
their cache is left-padded to the batch's length and concatenated (continuous batching, so a request
arriving mid-generation does not wait for the longest completion in flight).
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

from loops_nb.local.decoding import RowParams, draw_uniforms, prompt_logprobs
from loops_nb.local.kv_cache import bound_growth
from loops_nb.local.prefix_cache import CachedSequence, PrefixHit
from loops_nb.local.sampling_types import PromptLogprobEntry, SampledChoice, SampleRequest, SampleResult
from loops_nb.local.shared_prompt_kv import PromptSlot, SharedPrompts

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


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
    """The cache's layers, as the full-attention layers `kv_cache.cache_is_full_attention` checked they are."""
    return cast(list[DynamicLayer], cache.layers)


def _map_layers(cache: DynamicCache, fn: Callable[[Tensor], Tensor]) -> None:
    """Replace every layer's keys and values `[B, heads, S, dim]` by `fn` of them."""
    for layer in _layers(cache):
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
    prompts: SharedPrompts | None = None
    """The rows' prompts, each held once (None: each row's prompt is in its own cache rows)."""

    @classmethod
    def prefill(
        cls,
        jobs: list[Job],
        forward: Forward,
        new_cache: Callable[[], DynamicCache],
        device: torch.device,
        decode: Callable[[list[int]], list[str]],
        share: bool = False,
    ) -> DecodeBatch:
        """Run the prompts of `jobs` through the model once each and expand them to one row per sample
        (`share`: the rows share each prompt's keys and values instead of copies).

        Jobs asking for prompt logprobs need logits at every prompt position; callers prefill such a job on
        its own (it may be long) and merge, where the model allows merging.
        """
        all_logits = any(job.request.prompt_logprobs is not None for job in jobs)
        unique: dict[tuple[int, ...], int] = {}
        for job in jobs:
            unique.setdefault(tuple(job.prompt), len(unique))
        prompts = list(unique)
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        cache = new_cache()
        bound_growth(cache, width + max(job.max_tokens for job in jobs) - 1)
        logits = forward(ids, mask, positions, cache, all_logits, None)
        return cls._expanded(jobs, unique, cache, mask, positions, logits, new_cache, decode, share)

    @classmethod
    def prefill_extending(
        cls,
        jobs: list[Job],
        hit: PrefixHit,
        forward: Forward,
        new_cache: Callable[[], DynamicCache],
        device: torch.device,
        decode: Callable[[list[int]], list[str]],
        share: bool = False,
    ) -> DecodeBatch:
        """Prefill jobs with one prompt that extends a kept sequence (`prefix_cache`): the shared prefix's keys
        and values are copied into a fresh cache, and only the rest of the prompt runs through the model,
        once for all of them."""
        prompt, shared = jobs[0].prompt, hit.length
        cache = new_cache()
        bound_growth(cache, len(prompt) + max(job.max_tokens for job in jobs) - 1)
        for piece_keys, piece_values in hit.pieces():  # a kept sequence's parents' tokens first
            for layer, keys, values in zip(_layers(cache), piece_keys, piece_values, strict=True):
                layer.update(keys.to(device), values.to(device))  # copies: kept sequences are never written
        ids = torch.tensor([prompt[shared:]], dtype=torch.long, device=device)
        mask = torch.ones(1, len(prompt), dtype=torch.long, device=device)
        positions = torch.arange(shared, len(prompt), dtype=torch.long, device=device)[None]
        logits = forward(ids, mask, positions, cache, False, None)
        full_positions = torch.arange(len(prompt), dtype=torch.long, device=device)[None]
        unique = {tuple(prompt): 0}
        return cls._expanded(jobs, unique, cache, mask, full_positions, logits, new_cache, decode, share)

    @classmethod
    def _expanded(
        cls,
        jobs: list[Job],
        unique: dict[tuple[int, ...], int],
        cache: DynamicCache,
        mask: Tensor,
        positions: Tensor,
        logits: Tensor,
        new_cache: Callable[[], DynamicCache],
        decode: Callable[[list[int]], list[str]],
        share: bool,
    ) -> DecodeBatch:
        """The batch of `jobs` after their prefill: one row per sample, each prompt's cache row copied to its
        rows or, with `share`, kept once (unpadded, out of the prefill's buffers) for rows whose own cache
        starts empty."""
        width = mask.shape[1]
        rows: list[Row] = []
        source: list[int] = []
        uniforms = []
        for job in jobs:
            slot = unique[tuple(job.prompt)]
            request = job.request
            if request.prompt_logprobs is not None:
                job.prompt_logprobs = prompt_logprobs(
                    logits[slot, width - len(job.prompt) : width - 1],
                    job.prompt,
                    request.prompt_logprobs,
                    decode,
                )
            job.choices = [None] * request.n
            rows += [Row(job, i) for i in range(request.n)]
            source += [slot] * request.n
            uniforms.append(draw_uniforms(request.n, job.max_tokens, request.seed))
        steps = max(u.shape[1] for u in uniforms)
        table = torch.cat([F.pad(u, (0, steps - u.shape[1])) for u in uniforms])
        params = RowParams.build([row.job.request for row in rows], table, mask.device)
        index = torch.tensor(source, dtype=torch.long, device=mask.device)
        next_position, last_logits = positions[index, -1] + 1, logits[index, -1]
        if not share:
            if source != list(range(len(unique))):  # every layer kind selects its rows (linear attention too)
                cache.reorder_cache(cast(torch.LongTensor, index))
            return cls(rows, cache, mask[index], next_position, last_logits, params)
        slots, layers = [], _layers(cache)
        for prompt, slot in unique.items():
            start = width - len(prompt)
            kept = [
                (k, v)
                for layer in layers
                if (k := layer.keys) is not None and (v := layer.values) is not None
            ]
            keys, values = ([kv[i][slot : slot + 1, :, start:].clone() for kv in kept] for i in (0, 1))
            slots.append(PromptSlot(prompt, keys, values, (index == slot).nonzero()[:, 0]))
        own = new_cache()
        for layer, key, value in zip(_layers(own), slots[0].keys, slots[0].values, strict=True):
            layer.lazy_initialization(key, value)
            layer.keys = key.new_empty(len(rows), key.shape[1], 0, key.shape[3])
            layer.values = value.new_empty(len(rows), value.shape[1], 0, value.shape[3])
        bound_growth(own, max(job.max_tokens for job in jobs) - 1)
        empty = mask.new_zeros(len(rows), 0)
        return cls(rows, own, empty, next_position, last_logits, params, SharedPrompts(slots))

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
        layers = _layers(self.cache)
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
        for mine, theirs in zip(_layers(self.cache), _layers(other.cache), strict=True):
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

    def advance(self, tokens: Tensor, forward: Forward) -> None:
        """Feed each row's chosen token (`tokens`, one per current row) and compute the next logits."""
        self.mask = F.pad(self.mask, (0, 1), value=1)
        # Each row feeds back every token it may still sample but its last.
        still = max(row.job.max_tokens - len(row.tokens) - 1 for row in self.rows)
        bound_growth(self.cache, self.mask.shape[1] + max(0, still))
        logits = forward(
            tokens[:, None], self.mask, self.next_position[:, None], self.cache, False, self.prompts
        )
        self.logits = logits[:, -1]
        self.next_position = self.next_position + 1
        self.params.step = self.params.step + 1

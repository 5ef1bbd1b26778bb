"""How the sampler prefills the jobs that start (or join) a decode batch.

- Jobs whose prompt extends a sequence the prefix cache keeps run only their new tokens, once for all the
  jobs with that same prompt (the quickstart's 64 attempts a step send one prompt).
- The other plain jobs are prefilled together, shortest first, in groups under `MAX_PREFILL_TOKENS`.
- A job asking for prompt logprobs needs logits at every position: it is prefilled alone.

The batches are then merged into one (left-padded) where the model's cache allows; other models prefill
every job together in one batch.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

from loops_nb.local.batch_forward import BatchForward
from loops_nb.local.decoding import RowParams, draw_uniforms, prompt_logprobs
from loops_nb.local.kv_cache import bound_growth
from loops_nb.local.prefix_cache import PrefixCache, PrefixHit
from loops_nb.local.sampler_batch import DecodeBatch, Forward, Job, Row, cache_layers
from loops_nb.local.shared_prompt_kv import PromptSlot, SharedPrompts

MAX_PREFILL_TOKENS = 16384
"""Padded prompt tokens a prefill of several plain jobs runs at most (a longer prompt runs alone)."""


@dataclass
class Prefiller:
    """The sampler's prefill: its model forward, limits and prefix cache; counts what it computes."""

    model: BatchForward
    decode: Callable[[list[int]], list[str]]
    mergeable: bool
    prefix_cache: PrefixCache | None
    stats: collections.Counter[str]
    """`prefill_tokens` (prompt tokens run through the model) and `prefix_cached_tokens` (served from the
    prefix cache instead): their sum is every prompt token prefilled."""
    share_prompts: bool = False
    """A prompt's rows share its keys and values (`shared_prompt_kv`) instead of holding copies."""

    def prefill(self, jobs: list[Job]) -> DecodeBatch:
        if not self.mergeable:
            return self._text_batch(jobs)
        batches = [self._text_batch(same, hit) for same, hit in self._hits(jobs)]
        extended = {id(row.job) for batch in batches for row in batch.rows}
        rest = [job for job in jobs if id(job) not in extended]
        groups: list[list[Job]] = []
        plain = sorted((j for j in rest if j.request.prompt_logprobs is None), key=lambda j: len(j.prompt))
        for job in plain:
            if groups and len(groups[-1]) * len(job.prompt) + len(job.prompt) <= MAX_PREFILL_TOKENS:
                groups[-1].append(job)
            else:
                groups.append([job])
        groups += [[j] for j in rest if j.request.prompt_logprobs is not None]
        batches += [self._text_batch(group) for group in groups]
        batch = batches[0]
        for other in batches[1:]:
            batch.merge(other)
        return batch

    def keep_finished(self, batch: DecodeBatch, keep: list[int]) -> None:
        """Put the rows of `batch` that just finished (not in `keep`) into the prefix cache."""
        if self.prefix_cache is None:
            return
        still = set(keep)
        for i, row in enumerate(batch.rows):
            if i not in still and not row.job.abandoned:
                sequence = batch.finished_sequence(i, row.job.adapter, row.job.adapter_version)
                if sequence is not None:
                    self.prefix_cache.store(sequence)

    def _text_batch(self, jobs: list[Job], hit: PrefixHit | None = None) -> DecodeBatch:
        cached = 0 if hit is None else hit.length
        self.stats["prefill_tokens"] += sum(len(p) - cached for p in {tuple(j.prompt) for j in jobs})
        self.stats["prefix_cached_tokens"] += cached
        return self.batch(jobs, self.model.text, hit, self.share_prompts)

    def _hits(self, jobs: list[Job]) -> list[tuple[list[Job], PrefixHit]]:
        """The jobs a kept sequence extends, grouped by prompt, each group with its hit."""
        cache = self.prefix_cache
        if cache is None:
            return []
        same: dict[tuple[int, ...], list[Job]] = {}
        for job in jobs:
            if job.request.prompt_logprobs is None and job.pixels is None:
                same.setdefault(tuple(job.prompt), []).append(job)
        hits = []
        for group in same.values():
            first = group[0]
            hit = cache.lookup(first.adapter, first.adapter_version, first.prompt)
            if hit is not None:
                hits.append((group, hit))
        return hits

    def batch(
        self, jobs: list[Job], forward: Forward, hit: PrefixHit | None = None, share: bool = False
    ) -> DecodeBatch:
        """Run the prompts of `jobs` through `forward` once each and expand them to one row per sample, each
        prompt's cache row copied to its rows or, with `share`, kept once (unpadded, out of the prefill's
        buffers) for rows whose own cache starts empty.

        With `hit`, the jobs send one prompt that extends a kept sequence (`prefix_cache`): the shared
        prefix's keys and values are copied into the fresh cache, and only the rest of the prompt runs.
        Jobs asking for prompt logprobs need logits at every prompt position; `prefill` runs such a job on
        its own (it may be long) and merges, where the model allows merging.
        """
        device = self.model.device
        all_logits = any(job.request.prompt_logprobs is not None for job in jobs)
        unique: dict[tuple[int, ...], int] = {}
        for job in jobs:
            unique.setdefault(tuple(job.prompt), len(unique))
        width = max(len(p) for p in unique)
        ids = torch.zeros(len(unique), width, dtype=torch.long)
        mask = torch.zeros(len(unique), width, dtype=torch.long)
        for i, prompt in enumerate(unique):
            ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        cache = self.model.new_cache()
        bound_growth(cache, width + max(job.max_tokens for job in jobs) - 1)
        start = 0 if hit is None else hit.length
        if hit is not None:  # the kept sequence's keys and values, copied: kept ones are never written
            for piece_keys, piece_values in hit.sequence.pieces(hit.length):  # its parents' tokens first
                for layer, key, value in zip(cache_layers(cache), piece_keys, piece_values, strict=True):
                    layer.update(key.to(device), value.to(device))
        logits = forward(ids[:, start:], mask, positions[:, start:], cache, all_logits, None)
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
                    self.decode,
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
            return DecodeBatch(rows, cache, mask[index], next_position, last_logits, params, forward)
        slots, layers = [], cache_layers(cache)
        for prompt, slot in unique.items():
            begin = width - len(prompt)
            kept = [
                (k, v)
                for layer in layers
                if (k := layer.keys) is not None and (v := layer.values) is not None
            ]
            keys, values = ([kv[i][slot : slot + 1, :, begin:].clone() for kv in kept] for i in (0, 1))
            slots.append(PromptSlot(prompt, keys, values, (index == slot).nonzero()[:, 0]))
        own = self.model.new_cache()
        for layer, key, value in zip(cache_layers(own), slots[0].keys, slots[0].values, strict=True):
            layer.lazy_initialization(key, value)
            layer.keys = key.new_empty(len(rows), key.shape[1], 0, key.shape[3])
            layer.values = value.new_empty(len(rows), value.shape[1], 0, value.shape[3])
        bound_growth(own, max(job.max_tokens for job in jobs) - 1)
        empty = mask.new_zeros(len(rows), 0)
        return DecodeBatch(
            rows, own, empty, next_position, last_logits, params, forward, SharedPrompts(slots)
        )

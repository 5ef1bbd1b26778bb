"""How the sampler prefills the jobs that start (or join) a decode batch.

- Jobs whose prompt extends a sequence the prefix cache keeps run only their new tokens, once for all the
  jobs with that same prompt (the quickstart's 64 attempts a step send one prompt).
- The other plain jobs are prefilled together, shortest first, in groups under `max_prefill_tokens`.
- A job asking for prompt logprobs needs logits at every position: it is prefilled alone.

The batches are then merged into one (left-padded) where the model's cache allows; other models prefill
every job together in one batch.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

import torch

from loops_nb.local.batch_forward import BatchForward
from loops_nb.local.prefix_cache import PrefixCache, PrefixHit
from loops_nb.local.sampler_batch import DecodeBatch, Job


@dataclass
class Prefiller:
    """The sampler's prefill: its model forward, limits and prefix cache; counts what it computes."""

    forward: BatchForward
    device: torch.device
    decode: Callable[[list[int]], list[str]]
    mergeable: bool
    max_prefill_tokens: int
    prefix_cache: PrefixCache | None
    stats: collections.Counter[str]
    """`prefill_tokens` (prompt tokens run through the model) and `prefix_cached_tokens` (served from the
    prefix cache instead): their sum is every prompt token prefilled."""
    share_prompts: bool = False
    """A prompt's rows share its keys and values (`shared_prompt_kv`) instead of holding copies."""

    def prefill(self, jobs: list[Job]) -> DecodeBatch:
        if not self.mergeable:
            return self._together(jobs)
        batches = [self._extending(same, hit) for same, hit in self._hits(jobs)]
        extended = {id(row.job) for batch in batches for row in batch.rows}
        rest = [job for job in jobs if id(job) not in extended]
        groups: list[list[Job]] = []
        plain = sorted((j for j in rest if j.request.prompt_logprobs is None), key=lambda j: len(j.prompt))
        for job in plain:
            if groups and len(groups[-1]) * len(job.prompt) + len(job.prompt) <= self.max_prefill_tokens:
                groups[-1].append(job)
            else:
                groups.append([job])
        groups += [[j] for j in rest if j.request.prompt_logprobs is not None]
        batches += [self._together(group) for group in groups]
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

    def _together(self, jobs: list[Job]) -> DecodeBatch:
        self.stats["prefill_tokens"] += sum(len(p) for p in {tuple(j.prompt) for j in jobs})
        forward, new_cache, share = self.forward.text, self.forward.new_cache, self.share_prompts
        return DecodeBatch.prefill(jobs, forward, new_cache, self.device, self.decode, share)

    def _extending(self, jobs: list[Job], hit: PrefixHit) -> DecodeBatch:
        self.stats["prefill_tokens"] += len(jobs[0].prompt) - hit.length
        self.stats["prefix_cached_tokens"] += hit.length
        forward, new_cache = self.forward.text, self.forward.new_cache
        share = self.share_prompts
        return DecodeBatch.prefill_extending(jobs, hit, forward, new_cache, self.device, self.decode, share)

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

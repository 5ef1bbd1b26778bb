"""A decode batch's prompts held once: each prompt's keys and values [1, heads, prompt, dim] a layer, shared
by every row sampling from it, and attention over them and each row's own cache (what it saves:
docs/reference/local_loops.md, "Memory and precision").

`prompt_attention` scores the rows of one prompt against its keys in one product (their queries become the
query-length dimension, so no key is repeated) and each row against its own cache, and takes one softmax
over both. The trainer's `shared_prefix` expands a prompt's keys to its rows; here they never are, because a
decode step then reads the prompt's keys once for all its rows instead of once per row. A forward without
`shared_prompts` (a prefill, a batch that copies rows) is transformers' SDPA unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loops_nb.local.sdpa_variants import SDPA, register_sdpa_variant

IMPLEMENTATION = "loops_shared_prompt"
"""The name `prompt_attention` is registered under in transformers' `AttentionInterface`."""


@dataclass
class PromptSlot:
    """One prompt's keys and values and the batch rows that sample from it."""

    prompt: tuple[int, ...]
    keys: list[torch.Tensor]
    """Per layer [1, kv_heads, prompt, dim], compact (never a view of a larger buffer)."""
    values: list[torch.Tensor]
    rows: torch.Tensor
    """[R] long: the batch rows of this prompt."""


@dataclass
class SharedPrompts:
    """The prompts of a decode batch: rows index into `slots` (every row has exactly one)."""

    slots: list[PromptSlot]

    @property
    def tokens(self) -> int:
        """Prompt tokens held (each prompt once)."""
        return sum(len(slot.prompt) for slot in self.slots)

    def slot_of(self, row: int) -> PromptSlot:
        return next(slot for slot in self.slots if bool((slot.rows == row).any()))

    def select(self, keep: Sequence[int]) -> None:
        """Keep the rows `keep` (in that order, as the batch does); prompts left with no row are dropped."""
        position = {row: i for i, row in enumerate(keep)}
        slots = []
        for slot in self.slots:
            rows = [position[row] for row in slot.rows.tolist() if row in position]
            if rows:
                slot.rows = torch.tensor(rows, dtype=torch.long, device=slot.keys[0].device)
                slots.append(slot)
        self.slots = slots

    def extend(self, other: SharedPrompts, offset: int) -> None:
        """Add `other`'s slots for rows numbered from `offset`; a prompt held already is not held twice."""
        mine = {slot.prompt: slot for slot in self.slots}
        for slot in other.slots:
            rows = slot.rows + offset
            held = mine.get(slot.prompt)
            if held is None:
                slot.rows = rows
                self.slots.append(slot)
            else:
                held.rows = torch.cat([held.rows, rows])


def prompt_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    shared_prompts: SharedPrompts | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: `query` [B, H, q, D], `key`/`value` [B, KV, S, D] the rows' own
    cache, `attention_mask` bool [B, 1, q, S] (or None: all visible); returns ([B, q, H, D], None)."""
    if shared_prompts is None:
        return SDPA(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    per_kv = heads // kv_heads * length  # a key head's query heads and positions, as one dimension
    scale = scaling if scaling is not None else dim**-0.5
    layer: int = getattr(module, "layer_idx")  # noqa: B009 (every decoder attention module has one)
    grouped = query.reshape(batch, kv_heads, per_kv, dim)
    own = torch.matmul(grouped, key.transpose(-1, -2)) * scale  # [B, KV, per_kv, S]
    if attention_mask is not None:
        visible = attention_mask.expand(batch, 1, length, key.shape[2]).unsqueeze(2)
        visible = visible.expand(batch, 1, heads // kv_heads, length, key.shape[2])
        own = own.masked_fill(~visible.reshape(batch, 1, per_kv, key.shape[2]), float("-inf"))
    widest = max(slot.keys[layer].shape[2] for slot in shared_prompts.slots)
    to_prompt = own.new_full((batch, kv_heads, per_kv, widest), float("-inf"))
    for slot in shared_prompts.slots:
        rows, prompt_keys = slot.rows, slot.keys[layer][0]  # [KV, P, D]
        queries = grouped[rows].transpose(0, 1).reshape(kv_heads, -1, dim)  # [KV, R x per_kv, D]
        scores = torch.matmul(queries, prompt_keys.transpose(-1, -2)) * scale
        scores = scores.view(kv_heads, len(rows), per_kv, -1).transpose(0, 1)
        to_prompt[rows, :, :, : prompt_keys.shape[1]] = scores
    probs = torch.softmax(torch.cat([to_prompt, own], dim=-1), dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs[..., widest:], value)  # [B, KV, per_kv, D]
    for slot in shared_prompts.slots:
        rows, prompt_values = slot.rows, slot.values[layer][0]
        weights = probs[rows, :, :, : prompt_values.shape[1]].transpose(0, 1)
        summed = torch.matmul(weights.reshape(kv_heads, -1, prompt_values.shape[1]), prompt_values)
        out[rows] += summed.view(kv_heads, len(rows), per_kv, dim).transpose(0, 1)
    out = out.view(batch, heads, length, dim).transpose(1, 2).contiguous()
    return out, None


register_sdpa_variant(IMPLEMENTATION, prompt_attention)

"""Attention for a packed group: its prompt, then each row's own tokens end to end (`shared_prefix.packed_hidden`).

Under the group's 4D mask, SDPA computes every query against every key, 95% of them masked on the
quickstart's step. `packed_attention` computes only what the mask allows, with the same result within
float rounding: the prompt's causal attention, every row token against the prompt's keys in one product,
each row against its own keys (rows padded to the longest), one softmax over both. It takes over only when
called with `packed_rows`, on a layer with no sliding window, soft-capping or sinks, with dropout off and
scores no bigger than the mask; everything else goes to transformers' SDPA function unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import repeat_kv

from loops_nb.local.sdpa_variants import SDPA, register_sdpa_variant

IMPLEMENTATION = "loops_packed"
"""The name this attention is registered under in transformers' `AttentionInterface`."""


@dataclass(frozen=True)
class PackedRows:
    """Where a packed sequence's rows are: the prompt's length and each row's token count, as index tensors."""

    shared: int
    """The prompt's tokens, at the start of the sequence."""
    index: torch.Tensor
    """[R, S] each row's tokens, counted from the first token after the prompt (padding points at token 0)."""
    visible: torch.Tensor
    """[R, S, S] whether a row's query i sees its key j (j <= i and j a real token)."""
    row_of: torch.Tensor
    """[M] the row of each token after the prompt."""
    pos_of: torch.Tensor
    """[M] its position within its row."""

    @classmethod
    def of(cls, shared: int, spans: Sequence[int], device: torch.device) -> PackedRows:
        """The layout of a prompt of `shared` tokens followed by rows of `spans` tokens each."""
        widest = max(spans)
        lengths = torch.tensor(spans, device=device)
        starts = torch.cumsum(lengths, 0) - lengths
        steps = torch.arange(widest, device=device)
        real = steps[None, :] < lengths[:, None]
        index = torch.where(real, starts[:, None] + steps[None, :], 0)
        causal = torch.ones(widest, widest, dtype=torch.bool, device=device).tril()
        visible = causal[None] & real[:, None, :]
        row_of = torch.repeat_interleave(torch.arange(len(spans), device=device), lengths)
        pos_of = torch.arange(int(lengths.sum()), device=device) - starts[row_of]
        return cls(shared, index, visible, row_of, pos_of)

    @property
    def tokens(self) -> int:
        """Tokens after the prompt (M)."""
        return int(self.row_of.shape[0])

    def scores_fit(self, heads: int) -> bool:
        """Whether this layout's scores ([heads, M, prompt + longest row]) fit in the mask's cells."""
        total = self.shared + self.tokens
        return heads * self.tokens * (self.shared + int(self.index.shape[1])) <= total * total


def rows_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, rows: PackedRows, scale: float
) -> torch.Tensor:
    """Attention of the row tokens of one packed sequence: `query`/`key`/`value` [H, N, D] (keys and values
    already repeated for grouped-query heads); returns [H, M, D] for the M tokens after the prompt."""
    shared = rows.shared
    row_queries, row_keys, row_values = query[:, shared:], key[:, shared:], value[:, shared:]
    prompt_keys, prompt_values = key[:, :shared], value[:, :shared]
    to_prompt = torch.matmul(row_queries, prompt_keys.transpose(-1, -2)) * scale
    padded_values = row_values[:, rows.index]
    own = torch.matmul(row_queries[:, rows.index], row_keys[:, rows.index].transpose(-1, -2)) * scale
    own = own.masked_fill(~rows.visible, float("-inf"))
    scores = torch.cat([to_prompt, own[:, rows.row_of, rows.pos_of]], dim=-1)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs[..., :shared], prompt_values)
    own_probs = probs.new_zeros(own.shape)
    own_probs[:, rows.row_of, rows.pos_of] = probs[..., shared:]
    return out + torch.matmul(own_probs, padded_values)[:, rows.row_of, rows.pos_of]


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    packed_rows: PackedRows | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: `query` [1, H, N, D], `key`/`value` [1, KV, N, D]; returns
    ([1, N, H, D], None) as SDPA's function does, which it calls for everything it does not take over."""
    takes_over = (
        packed_rows is not None
        and query.shape[0] == 1
        and query.shape[2] == packed_rows.shared + packed_rows.tokens
        and not (dropout and module.training)
        and getattr(module, "sliding_window", None) is None
        and kwargs.get("sliding_window") is None
        and kwargs.get("softcap") is None
        and kwargs.get("s_aux") is None
        and packed_rows.scores_fit(query.shape[1])
    )
    if not takes_over:
        return SDPA(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    assert packed_rows is not None
    groups = query.shape[1] // key.shape[1]
    query, key, value = query[0], repeat_kv(key, groups)[0], repeat_kv(value, groups)[0]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    shared = packed_rows.shared
    prompt = F.scaled_dot_product_attention(
        query[:, :shared], key[:, :shared], value[:, :shared], is_causal=True, scale=scale
    )
    out = torch.cat([prompt, rows_attention(query, key, value, packed_rows, scale)], dim=1)
    return out.transpose(0, 1)[None].contiguous(), None


register_sdpa_variant(IMPLEMENTATION, packed_attention)

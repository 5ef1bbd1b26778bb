"""Shared-prefix forward: the rows of a micro-batch that share a prompt run it through the decoder once.

How rows are grouped, the two ways a group runs (packed into one sequence, or its rows on the prompt's
expanded keys and values) and what it saves: docs/reference/local_loops.md, "Memory and precision" ("A
group's shared prompt trains once"). `tests/local/test_shared_prefix.py` checks hidden states and gradients
against the plain forward.

The prompt's keys and values are kept once ([1, heads, prompt, dim] a layer) and expanded for the rows only
inside each layer's attention (`ExpandedPrefixLayer`), so across layers they cost what one row's would.
Neither cache accumulates under layer recompute (`activation_memory.checkpointed`; see the layers' notes).

Only the positions the loss needs are filled in the returned hidden states. Deliberate simplification: a
group shares exactly its rows' common prompt; rows whose prompts merely overlap (a common system prompt,
then different tasks) are not split into nested groups.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from loops_nb.local.packed_attention import IMPLEMENTATION as PACKED_ATTENTION
from loops_nb.local.packed_attention import PackedRows

if TYPE_CHECKING:
    from torch import nn

MIN_SHARED_TOKENS = 16
"""Shorter shared prompts run per row: below this the saving is smaller than a second decoder call's cost."""


PromptKey = tuple[int, ...] | None
"""The tokens before a row's first needed position (its prompt, as sharing sees it); None: nothing needed."""


def prompt_key(tokens: torch.Tensor, need: torch.Tensor) -> PromptKey:
    """`tokens` [T] before the first True of `need` [T]; None when `need` has none (nothing of it runs)."""
    needed = need.nonzero()
    return tuple(tokens[: int(needed[0, 0])].tolist()) if needed.numel() else None


def shared_groups(keys: Sequence[PromptKey]) -> tuple[list[tuple[list[int], int]], list[int]]:
    """(groups of indices whose keys are equal, at least two of them and `MIN_SHARED_TOKENS` long, with the
    key's length; the indices that share with none). None keys are in neither.

    The one grouping rule: the forward runs it on a micro-batch's rows, and the planner
    (`prefix_packing`) on candidate micro-batches to cost them as the forward will run them."""
    by_key: dict[tuple[int, ...], list[int]] = {}
    for index, key in enumerate(keys):
        if key is not None:
            by_key.setdefault(key, []).append(index)
    groups, rest = [], []
    for key, rows in by_key.items():
        if len(rows) >= 2 and len(key) >= MIN_SHARED_TOKENS:
            groups.append((rows, len(key)))
        else:
            rest += rows
    return groups, sorted(rest)


PACKED_TOKENS = 2048
"""Longest packed group (its prompt, then every row's own tokens end to end, `packed_hidden`): the attention
mask of one is square in its length (16 MB of float32 at this length)."""


def packed_length(lengths: Sequence[int], rows: Sequence[int], shared: int) -> int:
    """Tokens of a group packed as one sequence: the prompt once and each row's own tokens, unpadded."""
    return shared + sum(lengths[r] - shared for r in rows)


class ForwardSize(NamedTuple):
    """What `shared_prefix_hidden` allocates for a micro-batch, in the units the planner prices."""

    positions: int
    """Token positions the decoder runs (padding included)."""
    repeated: int
    """Row x prompt tokens of keys and values expanded for rows' suffixes (groups too long to pack)."""
    mask_cells: int
    """Cells of the packed groups' attention masks (query x key tokens)."""


def forward_size(lengths: Sequence[int], keys: Sequence[PromptKey]) -> ForwardSize:
    """The decoder's work and memory for rows of `lengths` whose prompts are `keys`: a group that packs into
    `PACKED_TOKENS` runs as one unpadded sequence with its mask; a longer one runs its prompt, then its rows
    padded to the longest on the prompt's expanded keys and values. Rows that share nothing run as one
    plain padded forward, and a micro-batch that needs no position runs no model at all
    (`micro_batch.run_micro_batch`)."""
    if all(key is None for key in keys):
        return ForwardSize(0, 0, 0)
    groups, rest = shared_groups(keys)
    if not groups:
        return ForwardSize(len(lengths) * max(lengths), 0, 0)
    positions = repeated = cells = 0
    for rows, shared in groups:
        packed = packed_length(lengths, rows, shared)
        if packed <= PACKED_TOKENS:
            positions, cells = positions + packed, cells + packed * packed
        else:
            positions += shared + len(rows) * (max(lengths[r] for r in rows) - shared)
            repeated += len(rows) * shared
    positions += len(rest) * max((lengths[r] for r in rest), default=0)
    return ForwardSize(positions, repeated, cells)


@dataclass(frozen=True)
class SharedForward:
    hidden: torch.Tensor
    """The decoder's last hidden states [B, T, H], filled at every position the loss needs."""
    computed_tokens: int
    """Token positions the decoder ran (each shared prompt once): against the rows' total tokens."""


class RecordedPrefixLayer(DynamicLayer):
    """A prompt pass's cache layer: holds the keys and values of its one call, overwritten by a second call
    (a recomputed layer's, in the backward), which returns the same tensors instead of doubling them."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = key_states, value_states
        return key_states, value_states


class ExpandedPrefixLayer(DynamicLayer):
    """The rows' pass's cache layer: attention sees the prompt's keys and values, expanded to every row, then
    the rows' own; nothing is stored, so a recomputed layer sees exactly what the first call saw. The
    expansion's backward sums the rows' gradients into the one prompt."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: int) -> None:
        super().__init__()
        self.keys, self.values, self.rows = keys, values, rows
        self.device, self.is_initialized = keys.device, True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.keys is not None and self.values is not None
        shape = (self.rows, *self.keys.shape[1:])
        return (
            torch.cat([self.keys.expand(shape), key_states], dim=-2),
            torch.cat([self.values.expand(shape), value_states], dim=-2),
        )


def recording_cache() -> DynamicCache:
    """An empty cache whose layers (made as the prompt's pass reaches them) are `RecordedPrefixLayer`s."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = RecordedPrefixLayer
    return cache


def expanded_cache(recorded: DynamicCache, rows: int) -> DynamicCache:
    """A cache over `recorded`'s prompt for `rows` rows' suffixes (`ExpandedPrefixLayer`)."""
    layers: list[Any] = []
    for layer in recorded.layers:
        assert isinstance(layer, RecordedPrefixLayer) and layer.keys is not None and layer.values is not None
        layers.append(ExpandedPrefixLayer(layer.keys, layer.values, rows))
    cache = DynamicCache()
    cache.layers = layers
    cache.layer_class_to_replicate = None
    return cache


def packed_hidden(
    decoder: nn.Module, tokens: torch.Tensor, rows: Sequence[int], shared: int, lengths: Sequence[int]
) -> list[torch.Tensor]:
    """Each row's hidden states from position `shared` on, from one sequence: the prompt, then every row's
    own tokens end to end (no padding, no expanded keys), each row's positions counted on from the prompt
    and its tokens attending to the prompt and to its own earlier tokens only (a 4D mask). No cache is
    involved, so a recomputed layer needs nothing special."""
    device = tokens.device
    spans = [lengths[r] - shared for r in rows]
    ids = torch.cat([tokens[rows[0], :shared], *(tokens[r, shared : lengths[r]] for r in rows)])
    layout = PackedRows.of(shared, spans, device)
    positions = torch.cat([torch.arange(shared, device=device), shared + layout.pos_of])
    segment = torch.cat([torch.full((shared,), -1, device=device), layout.row_of])
    size = ids.shape[0]
    causal = torch.ones(size, size, dtype=torch.bool, device=device).tril()
    allowed = causal & ((segment[None, :] == -1) | (segment[None, :] == segment[:, None]))
    dtype = next(decoder.parameters()).dtype
    mask = torch.zeros(size, size, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    # Under `packed_attention` (the trainer's own model) attention skips what the mask hides; the mask stays
    # for the layers it leaves to SDPA.
    packed = (
        {"packed_rows": layout}
        if getattr(decoder.config, "_attn_implementation", None) == PACKED_ATTENTION
        else {}
    )
    hidden = decoder(
        input_ids=ids[None],
        position_ids=positions[None],
        attention_mask=mask[None, None],
        use_cache=False,
        **packed,
    ).last_hidden_state[0]
    return list(hidden[shared:].split(spans))


def shared_prefix_hidden(
    decoder: nn.Module, tokens: torch.Tensor, need: torch.Tensor, lengths: Sequence[int]
) -> SharedForward | None:
    """The decoder's last hidden states at every needed position, each group's prompt run once; None when no
    rows share a prompt (the caller runs the plain forward)."""
    groups, rest = shared_groups([prompt_key(tokens[row], need[row]) for row in range(tokens.shape[0])])
    if not groups:
        return None
    computed = 0
    cache_kwarg = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
    parts: list[tuple[list[int], int, torch.Tensor]] = []
    for rows, shared in groups:
        computed += shared + sum(lengths[r] - shared for r in rows)
        if packed_length(lengths, rows, shared) <= PACKED_TOKENS:
            for row, states in zip(rows, packed_hidden(decoder, tokens, rows, shared, lengths), strict=True):
                parts.append(([row], shared, states[None]))
            continue
        recorded = recording_cache()
        decoder(input_ids=tokens[rows[0] : rows[0] + 1, :shared], use_cache=True, **{cache_kwarg: recorded})
        end = max(lengths[r] for r in rows)
        positions = torch.arange(shared, end, device=tokens.device)[None].expand(len(rows), -1)
        suffix = decoder(
            input_ids=tokens[rows, shared:end],
            position_ids=positions,
            use_cache=True,
            **{cache_kwarg: expanded_cache(recorded, len(rows))},
        ).last_hidden_state
        parts.append((rows, shared, suffix))
    if rest:
        end = max(lengths[r] for r in rest)
        plain = decoder(input_ids=tokens[rest, :end], use_cache=False).last_hidden_state
        parts.append((rest, 0, plain))
        computed += sum(lengths[r] for r in rest)
    width = parts[0][2].shape[-1]
    hidden = parts[0][2].new_zeros(tokens.shape[0], tokens.shape[1], width)
    for rows, start, states in parts:
        index = torch.tensor(rows, device=tokens.device)
        hidden[index, start : start + states.shape[1]] = states
    return SharedForward(hidden, computed)

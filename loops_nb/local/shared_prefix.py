"""Shared-prefix forward: the rows of a micro-batch that share a prompt run it through the decoder once.

A GRPO group's datums share their prompt (the quickstart's 16 samples share 44 tokens: about 70% of the
trainer's tokens were that prompt again). Here the rows of a micro-batch are grouped by the tokens before
the first position their loss needs; a group of two or more with at least `MIN_SHARED_TOKENS` shared tokens
runs those tokens once, with grad, and its keys and values are repeated for each row (`repeat_interleave`,
whose backward sums the rows' gradients back into the one prefix), and each row's own tokens run on top of
them. The hidden states at every position the loss needs are the unshared forward's, within float rounding,
and so are the gradients (`tests/local/test_shared_prefix.py` checks both against the plain forward).

Only the positions the loss needs are filled in the returned hidden states: a row's prompt positions before
the split are not computed for it. Rows that share nothing run as one plain padded forward, as before.
Deliberate simplification: a group shares exactly its rows' common prompt; rows whose prompts merely
overlap (a common system prompt, then different tasks) are not split into nested groups.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

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


def prefix_groups(tokens: torch.Tensor, need: torch.Tensor) -> tuple[list[tuple[list[int], int]], list[int]]:
    """(groups of rows that share the tokens before their first needed position, with that length; the rows
    that share with none). Rows with no needed position are in neither: nothing of them is computed."""
    return shared_groups([prompt_key(tokens[row], need[row]) for row in range(tokens.shape[0])])


def forward_size(lengths: Sequence[int], keys: Sequence[PromptKey]) -> tuple[int, int]:
    """(padded token positions the decoder runs for rows of `lengths` whose prompts are `keys`, row x prompt
    tokens of keys and values repeated for the rows' suffixes): what `shared_prefix_hidden` allocates, in the
    units the planner prices. Rows that share nothing run as one plain padded forward, and a micro-batch
    that needs no position runs no model at all (`micro_batch.run_micro_batch`)."""
    if all(key is None for key in keys):
        return 0, 0
    groups, rest = shared_groups(keys)
    if not groups:
        return len(lengths) * max(lengths), 0
    positions = sum(shared + len(rows) * (max(lengths[r] for r in rows) - shared) for rows, shared in groups)
    positions += len(rest) * max((lengths[r] for r in rest), default=0)
    return positions, sum(len(rows) * shared for rows, shared in groups)


@dataclass(frozen=True)
class SharedForward:
    hidden: torch.Tensor
    """The decoder's last hidden states [B, T, H], filled at every position the loss needs."""
    computed_tokens: int
    """Token positions the decoder ran (each shared prompt once): against the rows' total tokens."""


def shared_prefix_hidden(
    decoder: nn.Module, tokens: torch.Tensor, need: torch.Tensor, lengths: Sequence[int]
) -> SharedForward | None:
    """The decoder's last hidden states at every needed position, each group's prompt run once; None when no
    rows share a prompt (the caller runs the plain forward)."""
    groups, rest = prefix_groups(tokens, need)
    if not groups:
        return None
    computed = 0
    cache_kwarg = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
    parts: list[tuple[list[int], int, torch.Tensor]] = []
    for rows, shared in groups:
        prefix = decoder(input_ids=tokens[rows[0] : rows[0] + 1, :shared], use_cache=True)
        cache = prefix.past_key_values
        cache.batch_repeat_interleave(len(rows))  # differentiable: the rows' gradients sum into the prefix
        end = max(lengths[r] for r in rows)
        positions = torch.arange(shared, end, device=tokens.device)[None].expand(len(rows), -1)
        suffix = decoder(
            input_ids=tokens[rows, shared:end], position_ids=positions, use_cache=True, **{cache_kwarg: cache}
        ).last_hidden_state
        parts.append((rows, shared, suffix))
        computed += shared + sum(lengths[r] - shared for r in rows)
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

"""Micro-batches that keep a shared prompt's rows together, priced as the shared forward runs them
(docs/reference/local_loops.md, "Memory and precision": "The micro-batches keep a prompt's rows together").

`losses.micro_batches` packs rows by padded tokens (rows x longest row), which would spread a GRPO group
over micro-batches of a row or two (so nothing is shared) and overstate a group that runs its prompt once.
The cost here is what `shared_prefix.forward_size` says the forward runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from loops_nb.local.shared_prefix import PromptKey, forward_size, shared_groups

MASK_CELL_BYTES = 4
"""A packed group's attention mask, a cell (in the model's dtype, at most float32; the attention kernels keep
the one mask, not a copy per layer or head)."""


def shared_micro_batches(
    lengths: Sequence[int],
    keys: Sequence[PromptKey],
    *,
    per_token: int,
    per_repeated: int,
    budget_bytes: int,
    max_tokens: int,
    group: int = 1,
) -> list[list[int]]:
    """Datum indices per micro-batch, each costing at most `budget_bytes` and running at most `max_tokens`
    positions; `group` consecutive datums stay together (dpo pairs). A unit over the budget alone still
    gets a micro-batch of its own (the caller recomputes layers for those)."""
    count = len(lengths)
    units = [list(range(i, min(i + group, count))) for i in range(0, count, group)]
    groups, _ = shared_groups(keys)
    group_of = {i: g for g, (rows, _) in enumerate(groups) for i in rows}
    by_prompt: list[list[list[int]]] = [[] for _ in groups]
    loose: list[list[int]] = []
    idle: list[int] = []
    for unit in units:
        needing = [i for i in unit if keys[i] is not None]
        if not needing:
            idle += unit
        elif needing[0] in group_of:
            by_prompt[group_of[needing[0]]].append(unit)
        else:
            loose.append(unit)

    def longest_first(units: list[list[int]]) -> list[list[int]]:
        return sorted(units, key=lambda u: -max(lengths[i] for i in u))

    def fits(rows: list[int]) -> bool:
        size = forward_size([lengths[i] for i in rows], [keys[i] for i in rows])
        spent = per_token * size.positions + per_repeated * size.repeated + MASK_CELL_BYTES * size.mask_cells
        return size.positions <= max_tokens and spent <= budget_bytes

    batches: list[list[int]] = []
    batch: list[int] = []
    for units in [longest_first(units) for units in by_prompt] + [[u] for u in longest_first(loose)]:
        whole = [i for unit in units for i in unit]
        if batch and not fits(batch + whole) and fits(whole):
            batches.append(batch)  # a prompt whose rows fit a micro-batch runs once, not split over two
            batch = []
        for unit in units:
            if batch and not fits(batch + unit):
                batches.append(batch)
                batch = []
            batch = batch + unit
    if batch:
        batches.append(batch)
    if idle:
        batches.append(idle)
    return batches

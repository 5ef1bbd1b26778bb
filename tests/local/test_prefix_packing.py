"""The planner keeps a prompt's rows together and prices a micro-batch as the shared forward runs it.

No model here: lengths and prompt keys go in, micro-batches come out, priced with SmolLM2-135M's measured
float32 cost (what the quickstart trains on at its default 128 MiB budget).
"""

from __future__ import annotations

import math
import random

from loops_nb.local.activation_memory import RECOMPUTE_COST, ActivationCost, plan_micro_batches
from loops_nb.local.losses import micro_batches
from loops_nb.local.prefix_packing import MASK_CELL_BYTES
from loops_nb.local.shared_prefix import PromptKey, forward_size

SMOLLM2 = ActivationCost(
    full=1_213_352, checkpointed=109_565, shared_kv=184_320, shared_kv_checkpointed=6_144
)
DEFAULT_BUDGET = 128 * 2**20
GROUPS, GROUP_SIZE, PROMPT, COMPLETION = 4, 16, 44, 20


def quickstart(completion: int | None = COMPLETION) -> tuple[list[int], list[PromptKey]]:
    """4 groups x 16 rows of a 44-token prompt and ~20-token completions (exactly 20 unless None)."""
    rng = random.Random(0)
    lengths, keys = [], []
    for g in range(GROUPS):
        prompt = tuple(range(1000 * g, 1000 * g + PROMPT))
        for _ in range(GROUP_SIZE):
            lengths.append(PROMPT + (completion or COMPLETION + rng.randrange(-4, 5)))
            keys.append(prompt)
    return lengths, keys


def plan(
    lengths: list[int], keys: list[PromptKey] | None, budget: int, group: int = 1, backward: bool = True
) -> list[tuple[list[int], bool]]:
    return plan_micro_batches(
        lengths,
        SMOLLM2,
        budget_bytes=budget,
        max_tokens=16384,
        group=group,
        backward=backward,
        prompts=keys,
    )


def cost(rows: list[int], lengths: list[int], keys: list[PromptKey], recompute: bool = False) -> int:
    size = forward_size([lengths[i] for i in rows], [keys[i] for i in rows])
    per_token = SMOLLM2.checkpointed if recompute else SMOLLM2.full
    return (
        per_token * size.positions
        + SMOLLM2.repeated(recompute=recompute) * size.repeated
        + MASK_CELL_BYTES * size.mask_cells
    )


def positions(batches: list[tuple[list[int], bool]], lengths: list[int], keys: list[PromptKey]) -> int:
    return sum(forward_size([lengths[i] for i in r], [keys[i] for i in r]).positions for r, _ in batches)


def rows_that_fit(budget: int) -> int:
    """The most rows of one quickstart group a micro-batch can hold with every layer kept, by the cost model
    (the group packs: its prompt, then each row's completion, end to end)."""
    fit = 1
    while fit < GROUP_SIZE:
        packed = PROMPT + (fit + 1) * COMPLETION
        if SMOLLM2.full * packed + MASK_CELL_BYTES * packed * packed > budget:
            break
        fit += 1
    return fit


def batches_of_each_group(batches: list[tuple[list[int], bool]]) -> list[int]:
    return [sum(any(i // GROUP_SIZE == g for i in rows) for rows, _ in batches) for g in range(GROUPS)]


def test_a_group_with_room_trains_with_every_layer_kept() -> None:
    lengths, keys = quickstart(None)
    budget = 640 * 2**20  # a group's packed forward is about 440 MB; two are not
    batches = plan(lengths, keys, budget)
    assert not any(recompute for _, recompute in batches)
    # The next prompt's rows fill what a group left: a group is in at most two micro-batches.
    assert max(batches_of_each_group(batches)) <= 2 and len(batches) <= GROUPS
    assert all(cost(rows, lengths, keys) <= budget for rows, _ in batches)
    assert positions(batches, lengths, keys) < 0.45 * len(lengths) * max(lengths)


def test_at_the_default_budget_a_group_recomputes_its_layers_to_run_its_prompt_once() -> None:
    lengths, keys = quickstart()
    fit = rows_that_fit(DEFAULT_BUDGET)
    assert fit == 3  # 1.2 MB a token in float32: a prompt and three completions fill 128 MiB
    batches = plan(lengths, keys, DEFAULT_BUDGET)
    assert all(recompute for _, recompute in batches)
    assert batches_of_each_group(batches) == [1] * GROUPS
    assert all(cost(rows, lengths, keys, recompute=True) <= DEFAULT_BUDGET for rows, _ in batches)
    # Kept, a group's rows would run in micro-batches of `fit`, its prompt once in each of them: more
    # positions than the recomputed group's, even counting the recomputed forward.
    kept = sum(PROMPT + min(fit, GROUP_SIZE - i) * COMPLETION for i in range(0, GROUP_SIZE, fit))
    assert RECOMPUTE_COST * positions(batches, lengths, keys) < GROUPS * kept
    # Today's packing holds one row per micro-batch at this budget: nothing to share.
    assert len(plan(lengths, None, DEFAULT_BUDGET)) == len(lengths)


def test_a_budget_too_small_for_a_group_splits_it_and_stays_within_it() -> None:
    lengths, keys = quickstart(None)
    for budget in (200 * 2**20, 300 * 2**20, 400 * 2**20):
        batches = plan(lengths, keys, budget)
        assert sorted(i for rows, _ in batches for i in rows) == list(range(len(lengths)))
        assert all(cost(rows, lengths, keys) <= budget for rows, _ in batches)
        spread = batches_of_each_group(batches)
        assert max(spread) > 1 and max(spread) <= math.ceil(GROUP_SIZE / rows_that_fit(budget)) + 1


def test_without_shared_prompts_the_plan_is_todays() -> None:
    lengths, keys = quickstart(None)
    long = [300, 250]  # too long for the default budget's 110 tokens: their layers recompute
    lengths, keys = lengths + long, [*keys, (1,) * 40, (1,) * 40]
    today = [(rows, False) for rows in micro_batches(lengths[:-2], DEFAULT_BUDGET // SMOLLM2.full)]
    assert plan(lengths[:-2], None, DEFAULT_BUDGET) == today
    shared, unshared = plan(lengths, keys, DEFAULT_BUDGET), plan(lengths, None, DEFAULT_BUDGET)
    assert [b for b in unshared if b[1]] == [([64, 65], True)]
    # They share a 40-token prompt, and recompute as before.
    assert any({64, 65} <= set(rows) and recompute for rows, recompute in shared)
    # Prompts no row shares (each its own) pack as rows x longest row, as before.
    alone: list[PromptKey] = [(i,) * 30 for i in range(len(lengths))]
    assert plan(lengths, alone, DEFAULT_BUDGET) == unshared
    assert plan(lengths, alone, DEFAULT_BUDGET, backward=False) == plan(
        lengths, None, DEFAULT_BUDGET, backward=False
    )


def test_dpo_pairs_stay_together_and_pairs_of_a_prompt_share() -> None:
    lengths, keys = quickstart(None)
    batches = plan(lengths, keys, 300 * 2**20, group=2)
    for rows, _ in batches:
        assert len(rows) % 2 == 0
        assert all(rows[j] % 2 == 0 and rows[j + 1] == rows[j] + 1 for j in range(0, len(rows), 2))
    assert max(len(rows) for rows, _ in batches) > 2


def test_rows_that_need_nothing_get_one_micro_batch_that_runs_no_model() -> None:
    lengths, keys = quickstart()
    keys[GROUP_SIZE : 2 * GROUP_SIZE] = [None] * GROUP_SIZE  # a group whose advantages are all 0
    batches = plan(lengths, keys, DEFAULT_BUDGET)
    idle = (list(range(GROUP_SIZE, 2 * GROUP_SIZE)), False)
    assert idle in batches
    assert forward_size([lengths[i] for i in idle[0]], [None] * GROUP_SIZE) == (0, 0, 0)
    assert all(keys[i] is not None for batch in batches if batch != idle for i in batch[0])

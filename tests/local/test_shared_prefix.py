"""Shared-prefix forward-backward: a group's prompt runs once, and the numbers are the unshared ones.

The twin of every shared computation is the same request on a trainer that runs every row whole
(`share_prefixes = False`): logprobs and LoRA gradients agree within 1e-5 (float32).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from baseten.loops import Datum, ForwardBackwardOutput
from test_trainer import datum, grads, td, values

from loops_nb.local.shared_prefix import MIN_SHARED_TOKENS, prompt_key, shared_groups
from loops_nb.local.trainer import LoraTrainer

PROMPT = [1, *range(10, 10 + 29)]  # 30 tokens every row of a group shares


def rl_datum(prompt: list[int], completion: list[int], advantage: float) -> Datum:
    seq = prompt + completion
    mask = [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
    return datum(
        seq,
        logprobs=td([-3.0] * (len(seq) - 1)),
        advantages=td([advantage] * (len(seq) - 1)),
        mask=td(mask),
    )


def groups_of_datums() -> list[Datum]:
    """Two GRPO groups (their own prompts), completions of different lengths, and one lone datum."""
    other = [2, *range(60, 60 + 24)]
    data = [rl_datum(PROMPT, [40 + i, 41 + i, 42][: 2 + i % 2], 1.0 - 0.5 * i) for i in range(4)]
    data += [rl_datum(other, [90, 91 + i, 92, 93][: 3 + i % 2], 0.5 - 0.4 * i) for i in range(3)]
    data.append(rl_datum([3, 4, 5], [6, 7], 1.0))
    return data


def trained(
    path: Path, share: bool, data: list[Datum], recompute: bool = False
) -> tuple[ForwardBackwardOutput, list[torch.Tensor]]:
    trainer = LoraTrainer(path, dtype=torch.float32)
    trainer.init(8, seed=0)
    trainer.share_prefixes = share
    if recompute:  # every micro-batch recomputes its layers in the backward
        plan = trainer.plan
        trainer.plan = lambda *a, **k: [(rows, True) for rows, _ in plan(*a, **k)]  # type: ignore[method-assign]
    out = trainer.forward_backward(data, "importance_sampling")
    return out, grads(trainer)


@pytest.mark.parametrize("recompute", [False, True], ids=["layers kept", "layers recomputed"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "expanded cache"])
def test_a_shared_prompt_gives_the_unshared_logprobs_and_gradients(
    tiny_llama_path: Path, monkeypatch: pytest.MonkeyPatch, packed: bool, recompute: bool
) -> None:
    """Both ways a group runs (packed end to end under a 4D mask, or its rows padded on the prompt's expanded
    keys and values), each with layers kept and recomputed: a recomputed layer calls its cache again in the
    backward, which must neither double the prompt's keys nor change what the rows attend to."""
    from loops_nb.local import micro_batch, packed_attention, shared_prefix

    if not packed:
        monkeypatch.setattr(shared_prefix, "PACKED_TOKENS", 0)
    ran: list[bool] = []
    real = micro_batch.shared_prefix_hidden

    def spy(*args: object) -> torch.Tensor | None:
        hidden = real(*args)  # type: ignore[arg-type]
        ran.append(hidden is not None)
        return hidden

    monkeypatch.setattr(micro_batch, "shared_prefix_hidden", spy)
    packs: list[int] = []
    pack = shared_prefix.packed_hidden
    monkeypatch.setattr(shared_prefix, "packed_hidden", lambda *a: packs.append(1) or pack(*a))
    attended: list[int] = []
    rows_attention = packed_attention.rows_attention
    monkeypatch.setattr(
        packed_attention, "rows_attention", lambda *a: attended.append(1) or rows_attention(*a)
    )
    data = groups_of_datums()
    shared_out, shared_grads = trained(tiny_llama_path, True, data, recompute)
    assert ran and all(ran), "the shared path ran"
    assert len(packs) == (2 if packed else 0), "each group ran the way it was meant to"
    # A packed group's attention computes only what its mask allows: both groups in both layers, and again
    # in each recomputed layer.
    assert len(attended) == (2 * 2 * (2 if recompute else 1) if packed else 0)
    plain_out, plain_grads = trained(tiny_llama_path, False, data)
    assert shared_out.loss == pytest.approx(plain_out.loss, abs=1e-5)
    # Each group's prompt ran once: the first group's 29 shared positions for 3 rows (its row with advantage
    # 0 needs nothing and runs not at all: 31 tokens), the second group's 24 for 3 rows.
    tokens = plain_out.metrics["trainer/total_tokens"]
    assert plain_out.metrics["trainer/computed_tokens"] == tokens
    assert shared_out.metrics["trainer/total_tokens"] == tokens
    assert shared_out.metrics["trainer/computed_tokens"] == tokens - 2 * 29 - 31 - 2 * 24
    for i in range(len(data)):
        assert values(shared_out, i) == pytest.approx(values(plain_out, i), abs=1e-5)
    assert any(float(g.abs().max()) > 0 for g in plain_grads)
    for mine, theirs in zip(shared_grads, plain_grads, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5, rtol=0), float((mine - theirs).abs().max())


def test_a_recomputed_prompt_pass_holds_its_keys_once(
    tiny_llama_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prompt's pass of an expanded-cache group, recomputed in the backward, calls each cache layer a
    second time: the layer keeps the prompt's keys once (a second call overwrites) instead of appending a
    copy. The logprob twin cannot see a doubled prompt (sdpa's top-left causal mask reads only the first
    copy, and the rows' recompute runs before the prompt's), so this checks what the layer holds."""
    from loops_nb.local import shared_prefix

    monkeypatch.setattr(shared_prefix, "PACKED_TOKENS", 0)
    made: list[object] = []
    record = shared_prefix.recording_cache
    monkeypatch.setattr(shared_prefix, "recording_cache", lambda: made.append(record()) or made[-1])
    trained(tiny_llama_path, True, groups_of_datums(), recompute=True)
    assert len(made) == 2, "each group's prompt ran through a recording cache"
    for cache, shared in zip(made, (29, 24), strict=True):
        layers = cache.layers  # type: ignore[attr-defined]
        assert layers and all(layer.keys.shape[-2] == shared for layer in layers), [
            layer.keys.shape[-2] for layer in layers
        ]


def prefix_groups(tokens: torch.Tensor, need: torch.Tensor) -> tuple[list[tuple[list[int], int]], list[int]]:
    """The groups `shared_prefix_hidden` runs rows of `tokens` in, their loss needing `need`."""
    return shared_groups([prompt_key(tokens[row], need[row]) for row in range(tokens.shape[0])])


def test_rows_are_grouped_by_the_prompt_before_their_first_needed_position() -> None:
    tokens = torch.tensor(
        [[*PROMPT, 7, 8], [*PROMPT, 9, 0], [*PROMPT[:-1], 5, 6, 0], [*PROMPT, 7, 8], [*PROMPT, 7, 8]]
    )
    need = torch.zeros_like(tokens, dtype=torch.bool)
    need[:, len(PROMPT) - 1 :] = True
    need[2, len(PROMPT) - 1 :] = False  # row 2's loss needs nothing: it is computed by nobody
    need[4] = False
    need[4, 3:] = True  # row 4's loss starts early: its own prompt is 3 tokens, shared with no one
    groups, rest = prefix_groups(tokens, need)
    assert groups == [([0, 1, 3], len(PROMPT) - 1)]
    assert rest == [4]
    short = tokens[:, : MIN_SHARED_TOKENS + 1]
    short_need = torch.zeros_like(short, dtype=torch.bool)
    short_need[:, MIN_SHARED_TOKENS - 1 :] = True
    assert prefix_groups(short, short_need) == ([], [0, 1, 2, 3, 4]), (
        "a prompt under the minimum runs per row"
    )


def quickstart_shaped() -> list[Datum]:
    """3 groups of 6 rows, each group its own 30-token prompt, completions of 2 to 5 tokens, one group all
    advantage 0 but one row (its other rows need nothing), and a lone datum."""
    data = []
    for g in range(3):
        prompt = [1 + g, *range(10 + 20 * g, 10 + 20 * g + 29)]
        for i in range(6):
            advantage = (0.0 if i else 1.0) if g == 2 else 1.0 - 0.3 * i
            data.append(rl_datum(prompt, [70 + i, 71 + g, 72, 73, 74][: 2 + (i + g) % 4], advantage))
    data.append(rl_datum([3, 4, 5], [6, 7], 1.0))
    return data


@pytest.mark.parametrize("budget_tokens, recomputes", [(60, False), (45, True)])
def test_the_group_planner_gives_the_unshared_numbers_within_the_budget(
    tiny_llama_path: Path, budget_tokens: int, recomputes: bool
) -> None:
    """A budget that holds part of a group with every layer kept: the planner keeps a prompt's rows together
    (the plain planner fits one row a micro-batch), at the smaller budget recomputing layers to run a
    group's prompt once rather than twice; the saved activations stay within the budget, and the numbers
    are the unshared ones."""
    from test_memory_bounds import SavedBytes

    data = quickstart_shaped()
    results = {}
    for share in (True, False):
        trainer = LoraTrainer(tiny_llama_path, dtype=torch.float32)
        trainer.init(8, seed=0)
        trainer.share_prefixes = share
        trainer.memory_budget = budget_tokens * trainer.activation_cost().full
        plan = trainer.plan(
            trainer._parsed(data, "importance_sampling"), "importance_sampling", backward=True
        )
        probe = SavedBytes(trainer)
        out = trainer.forward_backward(data, "importance_sampling")
        forward = trainer.forward(data, "importance_sampling")
        results[share] = (plan, out, grads(trainer), forward)
        assert probe.peak <= 1.25 * trainer.memory_budget, (probe.peak, trainer.memory_budget)
    (shared_plan, shared_out, shared_grads, shared_fwd), (plain_plan, plain_out, plain_grads, plain_fwd) = (
        results[True],
        results[False],
    )
    assert all(len(rows) == 1 for rows, _ in plain_plan)
    assert any(recompute for _, recompute in shared_plan) == recomputes
    assert max(len(rows) for rows, _ in shared_plan) >= 3
    if recomputes:  # each group's rows that need a position run in one micro-batch
        assert all(len([b for b in shared_plan if any(i // 6 == g for i in b[0])]) == 1 for g in range(2))
    else:
        assert all(len({i // 6 for i in rows}) <= 2 for rows, _ in shared_plan)
    metrics = shared_out.metrics
    assert metrics["trainer/computed_tokens"] < 0.7 * metrics["trainer/total_tokens"]
    assert metrics["trainer/total_tokens"] == plain_out.metrics["trainer/total_tokens"]
    assert metrics["trainer/computed_tokens"] < 0.8 * plain_out.metrics["trainer/computed_tokens"]
    assert shared_out.loss == pytest.approx(plain_out.loss, abs=1e-5)
    assert shared_fwd.loss == pytest.approx(plain_fwd.loss, abs=1e-5)
    for i in range(len(data)):
        assert values(shared_out, i) == pytest.approx(values(plain_out, i), abs=1e-5)
        assert values(shared_fwd, i) == pytest.approx(values(plain_fwd, i), abs=1e-5)
    assert any(float(g.abs().max()) > 0 for g in plain_grads)
    for mine, theirs in zip(shared_grads, plain_grads, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5, rtol=0), float((mine - theirs).abs().max())
